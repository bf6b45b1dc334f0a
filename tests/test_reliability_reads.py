"""Nothing lost on read: every vector is finite, every file read is checked against its digest, a full disk is named.

Each test reproduces a defect of an earlier version (a number computed from a damaged or foreign
file, a traceback, or a message naming no file). Tiny synthetic vectors and a stub encoder.
"""

from __future__ import annotations

import errno
import json
import shutil

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.encoders import ray_encode
from embedtune.encoders.cache import EmbeddingCache, cache_key
from embedtune.encoders.ray_encode import encode_sharded, pending_shards, read_shards
from embedtune.errors import EmbedtuneError, NonFiniteError, NoSpaceError
from embedtune.io import (
    IntegrityError,
    atomic_write,
    no_space_error,
    read_json_verified,
    sha256_file,
    sha256_json,
    write_json_with_digest,
    writing,
)


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected" not in err
    return err


# -- every reader of vectors refuses NaN and infinity ------------------------------------------------
@pytest.mark.parametrize("kind", ["flat", "sq8"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_index_build_without_an_adapter_refuses_nan_and_inf(tmp_path, capsys, value, kind):
    docs = np.random.default_rng(0).normal(size=(80, 8)).astype(np.float32)
    docs[41, 6] = value
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(80)))
    code = main(["index", "build", "--embeddings", str(tmp_path / "docs.npy"), "--ids", str(tmp_path / "ids.txt"),
                 "--kind", kind, "--out", str(tmp_path / "index"), "--chunk-size", "16"])
    assert code == 2
    assert f"{tmp_path / 'docs.npy'}: vectors row 41 (0-based) holds {value!r} at column 6" in _error(capsys)
    assert not (tmp_path / "index").exists()


def test_the_embedding_cache_never_stores_or_serves_non_finite_vectors(tmp_path):
    cache = EmbeddingCache(tmp_path / "cache", use_bundled=False)
    ids = [f"d{i}" for i in range(6)]
    bad = np.ones((6, 4), np.float32)
    bad[2, 1] = np.nan
    with pytest.raises(NonFiniteError, match="row 2 .*holds nan at column 1"):
        cache.get_or_compute({"k": "nan"}, ids, lambda lo, hi: bad[lo:hi], shard_size=4)
    # An entry holding NaN (written by an older version) is not served: it is encoded again.
    good = np.ones((6, 4), np.float32)
    key = cache_key({"k": "old"})
    folder = cache.entry(key)
    folder.mkdir(parents=True)
    np.save(folder / "embeddings.npy", bad)
    (folder / "ids.json").write_text(json.dumps(ids))
    write_json_with_digest(folder / "meta.json", {"key": key, "shape": [6, 4], "nbytes_file": (folder / "embeddings.npy").stat().st_size,
                                                  "sha256": sha256_file(folder / "embeddings.npy"), "ids_sha256": sha256_json(ids)})
    vectors, hit = cache.get_or_compute({"k": "old"}, ids, lambda lo, hi: good[lo:hi], shard_size=4)
    assert not hit
    np.testing.assert_array_equal(vectors, good)


# -- the embedding cache's partial shards ------------------------------------------------------------
def _interrupted(cache: EmbeddingCache, full: np.ndarray, ids: list[str]) -> None:
    calls = []

    def flaky(lo, hi):
        calls.append(lo)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed mid-encode")
        return full[lo:hi]

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute({"k": 1}, ids, flaky, shard_size=3)


@pytest.mark.parametrize("damage", ["flip", "no record", "swapped"])
def test_a_damaged_partial_shard_is_encoded_again_not_sealed(tmp_path, damage):
    cache = EmbeddingCache(tmp_path / "cache", use_bundled=False)
    ids = [f"d{i}" for i in range(10)]
    full = np.arange(40, dtype=np.float32).reshape(10, 4) + 1
    _interrupted(cache, full, ids)
    partial = cache.entry(cache_key({"k": 1})) / "partial"
    shard = partial / "0000000003-0000000006.npy"
    assert shard.is_file()
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[-3] ^= 0x40  # one byte of the last row
        shard.write_bytes(bytes(data))
    elif damage == "no record":
        shard.with_suffix(".json").unlink(missing_ok=True)
        np.save(shard, full[3:6] * 7)  # a shard whose digests were never written
    else:
        other = partial / "0000000000-0000000003.npy"
        shutil.copyfile(other, shard)  # another shard's rows, same shape
    calls = []
    vectors, hit = cache.get_or_compute({"k": 1}, ids, lambda lo, hi: (calls.append(lo), full[lo:hi])[1], shard_size=3)
    assert not hit and 3 in calls
    np.testing.assert_array_equal(vectors, full)


# -- embed-corpus shards -----------------------------------------------------------------------------
class _StubSentenceEncoder:
    """Stands in for the model: a text's vector depends on the text only."""

    backend = "torch"

    def __init__(self, model, show_progress=False, **options):
        self.batch_size = 4

    def encode(self, texts, kind="document", progress=None):
        vectors = np.stack([np.random.default_rng(sum(map(ord, t))).normal(size=6) for t in texts]).astype(np.float32)
        if progress is not None:
            progress(len(texts))
        return vectors


@pytest.fixture
def stub_encoder(monkeypatch):
    monkeypatch.setattr(ray_encode, "SentenceEncoder", _StubSentenceEncoder)


def _corpus(prefix: str, n: int = 30) -> tuple[list[str], list[str]]:
    return [f"{prefix}{i}" for i in range(n)], [f"{prefix} text {i}" for i in range(n)]


def test_a_shard_copied_from_a_run_over_another_corpus_is_not_resumed(tmp_path, stub_encoder):
    ids, texts = _corpus("a")
    other_ids, other_texts = _corpus("b")
    encode_sharded(ids, texts, "stub", tmp_path / "a", shard_size=10, show_progress=False)
    encode_sharded(other_ids, other_texts, "stub", tmp_path / "b", shard_size=10, show_progress=False)
    reference = read_shards(tmp_path / "a")
    # An interrupted run of corpus a, then shard 1 of corpus b copied in (its record too).
    (tmp_path / "a" / "manifest.json").unlink()
    for suffix in (".npy", ".ids.txt", ".json"):
        shutil.copyfile(tmp_path / "b" / f"shard-00001{suffix}", tmp_path / "a" / f"shard-00001{suffix}")
    assert pending_shards(tmp_path / "a", 30, 10, ids) == [1]
    encode_sharded(ids, texts, "stub", tmp_path / "a", shard_size=10, show_progress=False)
    got = read_shards(tmp_path / "a")
    assert got[0] == ids
    np.testing.assert_array_equal(got[1], reference[1])


def test_reading_shards_of_another_corpus_is_refused_even_with_every_digest_recomputed(tmp_path, stub_encoder):
    ids, texts = _corpus("a")
    other_ids, other_texts = _corpus("b")
    encode_sharded(ids, texts, "stub", tmp_path / "a", shard_size=10, show_progress=False)
    encode_sharded(other_ids, other_texts, "stub", tmp_path / "b", shard_size=10, show_progress=False)
    for suffix in (".npy", ".ids.txt", ".json"):
        shutil.copyfile(tmp_path / "b" / f"shard-00002{suffix}", tmp_path / "a" / f"shard-00002{suffix}")
    manifest_path = tmp_path / "a" / "manifest.json"
    manifest, _ = read_json_verified(manifest_path, "")
    record, _ = read_json_verified(tmp_path / "a" / "shard-00002.json", "")
    manifest["shard_sha256"][2] = {"npy": record["npy_sha256"], "ids": record["ids_sha256"]}
    write_json_with_digest(manifest_path, manifest)
    with pytest.raises(IntegrityError, match="other ids than the corpus"):
        read_shards(tmp_path / "a")
    # The manifest's own record of the corpus gone too: run.json still knows which corpus the folder is for.
    manifest.pop("ids_sha256", None)
    write_json_with_digest(manifest_path, manifest)
    with pytest.raises(IntegrityError, match=r"run\.json: its shards hold other ids"):
        read_shards(tmp_path / "a")


def test_shards_holding_nan_are_refused_when_read_back(tmp_path, stub_encoder):
    ids, texts = _corpus("a")
    encode_sharded(ids, texts, "stub", tmp_path / "a", shard_size=10, show_progress=False)
    npy = tmp_path / "a" / "shard-00001.npy"
    block = np.load(npy)
    block[4, 2] = np.inf
    np.save(npy, block)
    for path, key in ((tmp_path / "a" / "shard-00001.json", "npy_sha256"),):
        record, _ = read_json_verified(path, "")
        record[key] = sha256_file(npy)
        write_json_with_digest(path, record)
    manifest, _ = read_json_verified(tmp_path / "a" / "manifest.json", "")
    manifest["shard_sha256"][1]["npy"] = sha256_file(npy)
    write_json_with_digest(tmp_path / "a" / "manifest.json", manifest)
    with pytest.raises(NonFiniteError, match=r"shard-00001\.npy: vectors row 4 \(0-based\) holds inf at column 2"):
        read_shards(tmp_path / "a")


def test_a_run_record_holding_a_list_is_a_clear_error(tmp_path, stub_encoder, capsys):
    ids, texts = _corpus("a")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run.json").write_text("[1, 2]\n")
    with pytest.raises(EmbedtuneError, match=r"run\.json: expected a JSON object .*found a list.*Fix:"):
        encode_sharded(ids, texts, "stub", tmp_path / "a", shard_size=10, show_progress=False)


# -- a full disk names the file and the fix ----------------------------------------------------------
def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _short_write(*args, **kwargs):
    raise OSError("160 requested and 0 written")  # numpy's text for a full disk, no errno


@pytest.mark.parametrize("fault", [_full_disk, _short_write])
def test_a_full_disk_in_the_embedding_cache_names_the_entry_and_the_fix(tmp_path, monkeypatch, fault):
    from embedtune.encoders import cache as cache_module

    monkeypatch.setattr(cache_module, "atomic_save_npy", fault)
    cache = EmbeddingCache(tmp_path / "cache", use_bundled=False)
    with pytest.raises(NoSpaceError) as caught:
        cache.get_or_compute({"k": 1}, ["a", "b"], lambda lo, hi: np.ones((hi - lo, 4), np.float32))
    message = str(caught.value)
    assert str(tmp_path / "cache") in message and "EMBEDTUNE_CACHE" in message and "disk is full" in message


def test_a_full_disk_in_embed_corpus_names_the_shard_and_the_fix(tmp_path, monkeypatch, stub_encoder):
    monkeypatch.setattr(ray_encode, "atomic_save_npy", _full_disk)
    ids, texts = _corpus("a")
    with pytest.raises(NoSpaceError, match=r"shard-00000\.npy: could not write it: the disk is full.*--out"):
        encode_sharded(ids, texts, "stub", tmp_path / "a", shard_size=10, show_progress=False)


def test_no_space_error_leaves_other_errors_alone(tmp_path):
    assert no_space_error(OSError(errno.EACCES, "Permission denied"), tmp_path) is None
    assert no_space_error(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path / "x") is not None
    with pytest.raises(PermissionError), writing(tmp_path / "x"):
        raise PermissionError(errno.EACCES, "Permission denied")


# -- query files read like every other text file -----------------------------------------------------
@pytest.mark.parametrize("suffix,text", [(".tsv", "q1\tfirst query\nq2\tsecond query\n"),
                                         (".jsonl", '{"_id": "q1", "text": "first query"}\n{"_id": "q2", "text": "second query"}\n')])
def test_a_query_file_with_a_byte_order_mark_reads_as_without(tmp_path, suffix, text):
    from embedtune.data.query_files import read_query_file

    path = tmp_path / f"queries{suffix}"
    path.write_bytes("\ufeff".encode("utf-8") + text.encode("utf-8"))
    assert read_query_file(path) == [("q1", "first query"), ("q2", "second query")]


@pytest.mark.parametrize("fault", [_full_disk, _short_write])
def test_every_atomic_write_names_its_file_on_a_full_disk(tmp_path, fault):
    with pytest.raises(NoSpaceError, match=r"out\.bin: could not write it: the disk is full .*--out"):
        atomic_write(tmp_path / "out.bin", fault)
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def _plan_inputs(tmp_path, nan_row: int | None = None) -> list[str]:
    from conftest import write_beir

    rng = np.random.default_rng(0)
    docs = rng.normal(size=(60, 16)).astype(np.float32)
    queries = docs[:30] + 0.3 * rng.normal(size=(30, 16)).astype(np.float32)
    if nan_row is not None:
        docs[nan_row, 3] = np.nan
    data = write_beir(tmp_path / "beir", [{"_id": f"d{i}", "text": ""} for i in range(60)], [{"_id": f"q{i}", "text": ""} for i in range(30)],
                      [(f"q{i}", f"d{i}", 1) for i in range(30)])
    for name, array, prefix in (("docs", docs, "d"), ("queries", queries, "q")):
        np.save(tmp_path / f"{name}.npy", array)
        (tmp_path / f"{name}.txt").write_text("".join(f"{prefix}{i}\n" for i in range(len(array))))
    return ["compress", "plan", "--data", str(data), "--doc-embeddings", str(tmp_path / "docs.npy"), "--doc-ids", str(tmp_path / "docs.txt"),
            "--query-embeddings", str(tmp_path / "queries.npy"), "--query-ids", str(tmp_path / "queries.txt"),
            "--budget-bytes", "8", "--methods", "pca", "--dims", "8", "--precisions", "int8", "--out", str(tmp_path / "plan")]


def test_compress_plan_on_its_own_vectors_refuses_a_nan(tmp_path, capsys):
    assert main(_plan_inputs(tmp_path, nan_row=17)) == 2
    assert f"{tmp_path / 'docs.npy'}: vectors row 17 (0-based) holds nan at column 3" in _error(capsys)


def test_a_full_disk_during_compress_plan_names_the_file_and_the_fix(tmp_path, capsys, monkeypatch):
    from embedtune import io as embedtune_io

    command = _plan_inputs(tmp_path)
    monkeypatch.setattr(embedtune_io, "current_umask", _full_disk)  # the last step of every atomic write
    code = main(command)
    err = _error(capsys)
    assert code == 2
    assert f"{tmp_path / 'plan'}" in err and "could not write it: the disk is full" in err and "--out" in err


# -- an exported model's precision files -------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tiny_bert_dir, tmp_path_factory):
    """Two exports of the tiny model + PCA-16 with int8 codes, fitted on different vectors."""
    from sentence_transformers import SentenceTransformer

    from embedtune.compress import make_compressor
    from embedtune.index.codecs import Precision
    from embedtune.index.plan_export import export_plan
    from embedtune.index.plan_format import write_plan

    root = tmp_path_factory.mktemp("exported")
    base = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    texts = [f"document number {i} about topic" for i in range(40)]
    models = {}
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        docs = base.encode(texts)
        docs = (docs + 0.5 * np.std(docs) * rng.standard_normal(docs.shape)).astype(np.float32)
        compressor = make_compressor("pca", dim=16).fit_unsupervised(docs)
        write_plan(root / f"plan{seed}", compressor, Precision("int8"), docs, {"chosen": {"setting": "pca-16/int8"}})
        models[seed] = export_plan(root / f"plan{seed}", str(tiny_bert_dir), root / f"model{seed}")
    vectors = np.random.default_rng(5).normal(size=(20, 16)).astype(np.float32)
    return models, vectors


def _copy_model(models, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(models[0], folder)
    return folder, folder / "embedtune_precision"


@pytest.mark.parametrize("damage", ["flip calibration.safetensors", "swap the two calibration files", "no digest",
                                    "the other export's precision", "the other export's calibration, digests recomputed"])
def test_an_exported_models_precision_files_are_checked(exported, tmp_path, damage):
    from embedtune.index.codecs import DeployedCodec

    models, vectors = exported
    folder, precision = _copy_model(models, tmp_path)
    reference = DeployedCodec.load(folder).encode(vectors)
    if damage == "flip calibration.safetensors":
        data = bytearray((precision / "calibration.safetensors").read_bytes())
        data[-7] ^= 0x01
        (precision / "calibration.safetensors").write_bytes(bytes(data))
    elif damage == "swap the two calibration files":
        a, b = (precision / "calibration.safetensors").read_bytes(), (precision / "calibration.json").read_bytes()
        (precision / "calibration.safetensors").write_bytes(b)
        (precision / "calibration.json").write_bytes(a)
    elif damage == "no digest":
        values = json.loads((precision / "precision.json").read_text())
        (precision / "precision.json").write_text(json.dumps({k: v for k, v in values.items() if k not in ("content_sha256", "files_sha256")}))
        data = bytearray((precision / "calibration.safetensors").read_bytes())
        data[-7] ^= 0x01
        (precision / "calibration.safetensors").write_bytes(bytes(data))
    elif damage == "the other export's precision":
        shutil.rmtree(precision)
        shutil.copytree(models[1] / "embedtune_precision", precision)
    else:
        shutil.copyfile(models[1] / "embedtune_precision" / "calibration.safetensors", precision / "calibration.safetensors")
        values, _ = read_json_verified(precision / "precision.json", "")
        values["files_sha256"]["calibration.safetensors"] = sha256_file(precision / "calibration.safetensors")
        write_json_with_digest(precision / "precision.json", values)
    try:
        codes = DeployedCodec.load(folder).encode(vectors)
    except EmbedtuneError as error:
        assert "embedtune_precision" in str(error) and "Fix" in str(error) or "Write it again" in str(error)
        return
    np.testing.assert_array_equal(codes, reference)  # only an intact result may come back
    pytest.fail(f"{damage}: loaded without an error")


def test_a_full_disk_during_compress_export_names_the_folder(exported, tmp_path, capsys, monkeypatch, tiny_bert_dir):
    from sentence_transformers import SentenceTransformer

    def full(*args, **kwargs):
        raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })')

    monkeypatch.setattr(SentenceTransformer, "save", full)
    models, _ = exported
    code = main(["compress", "export", "--plan", str(models[0].parent / "plan0"), "--model", str(tiny_bert_dir),
                 "--out", str(tmp_path / "m")])
    err = _error(capsys)
    assert code == 2 and f"{tmp_path / 'm'}: could not write it: the disk is full" in err and "--out" in err
    assert not (tmp_path / "m").exists()


def test_a_full_disk_stays_an_os_error_for_best_effort_writes(tmp_path):
    try:
        atomic_write(tmp_path / "marker.json", _full_disk)
    except OSError as error:  # a best-effort write (a marker, a log) tolerates it as before
        assert isinstance(error, NoSpaceError) and error.errno == errno.ENOSPC
    else:
        pytest.fail("the write did not fail")


def test_a_full_disk_in_a_staging_folder_is_named_where_the_user_looks(tmp_path):
    staging, out = tmp_path / ".model.abc123", tmp_path / "model"
    with pytest.raises(NoSpaceError, match=r"model/sub/weights\.bin: could not write it") as caught, writing(out, staging=staging):
        atomic_write(staging / "sub" / "weights.bin", _full_disk)
    assert ".model.abc123" not in str(caught.value)
