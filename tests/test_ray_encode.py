"""Sharded encoding: resumable by shard, the local and the Ray Data actor pool give the same vectors."""

from __future__ import annotations

import numpy as np
import pytest

from embedtune.encoders import SentenceEncoder
from embedtune.io import IntegrityError
from embedtune.encoders.ray_encode import ShardEncoder, encode_sharded, encode_sharded_ray, pending_shards, read_shards

TEXTS = [f"document number {i} about topic {i % 5}" for i in range(37)]
IDS = [f"d{i}" for i in range(37)]


def test_local_sharded_encode_resumes_by_shard(tiny_bert_dir, tmp_path):
    out = tmp_path / "shards"
    manifest = encode_sharded(IDS, TEXTS, str(tiny_bert_dir), out, shard_size=10)
    assert manifest["rows"] == 37 and len(manifest["shards"]) == 4 and manifest["dim"] == 32
    ids, vectors = read_shards(out)
    assert ids == IDS
    # Each shard is one encode call of its texts.
    expected = SentenceEncoder(str(tiny_bert_dir), show_progress=False).encode(TEXTS[10:20])
    np.testing.assert_array_equal(vectors[10:20], expected)
    # A lost shard is the only one encoded again.
    (out / "shard-00002.ids.txt").unlink()
    untouched = (out / "shard-00001.npy").stat().st_mtime_ns
    assert pending_shards(out, 37, 10) == [2]
    encode_sharded(IDS, TEXTS, str(tiny_bert_dir), out, shard_size=10)
    assert (out / "shard-00001.npy").stat().st_mtime_ns == untouched
    np.testing.assert_array_equal(read_shards(out)[1], vectors)


def test_a_truncated_or_damaged_shard_is_not_complete(tiny_bert_dir, tmp_path, caplog):
    """The defect: a truncated shard counted as complete, and reading it gave an error naming no file."""
    out = tmp_path / "shards"
    encode_sharded(IDS, TEXTS, str(tiny_bert_dir), out, shard_size=10)
    _, vectors = read_shards(out)
    npy = out / "shard-00001.npy"
    data = npy.read_bytes()
    npy.write_bytes(data[: len(data) - 200])  # truncated
    with pytest.raises(IntegrityError, match=r"shard-00001\.npy: sha256 differs .*Run `embedtune embed-corpus` again"):
        read_shards(out)
    assert pending_shards(out, 37, 10) == [1]
    assert any("shard-00001.npy" in r.getMessage() for r in caplog.records)
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF  # one byte of a vector
    npy.write_bytes(bytes(flipped))
    assert pending_shards(out, 37, 10) == [1]
    encode_sharded(IDS, TEXTS, str(tiny_bert_dir), out, shard_size=10)  # the rerun encodes it again
    np.testing.assert_array_equal(read_shards(out)[1], vectors)


def test_a_rerun_with_other_texts_under_the_same_ids_is_refused(tiny_bert_dir, tmp_path):
    """The defect: a resume was keyed by the ids only; edited texts would have mixed two encodings."""
    out = tmp_path / "shards"
    encode_sharded(IDS, TEXTS, str(tiny_bert_dir), out, shard_size=10)
    with pytest.raises(ValueError, match="other texts.*Fix: write to a new --out folder"):
        encode_sharded(IDS, [t + " edited" for t in TEXTS], str(tiny_bert_dir), out, shard_size=10)


def test_shard_encoder_batch_and_bad_input(tiny_bert_dir, tmp_path):
    fn = ShardEncoder(str(tiny_bert_dir), tmp_path)
    result = fn({"shard": np.array([3]), "ids": np.array([["a", "b"]], dtype=object), "texts": np.array([["document 1", "title 2"]], dtype=object)})
    assert result["rows"].tolist() == [2] and (tmp_path / "shard-00003.npy").is_file()
    with pytest.raises(ValueError, match="one id per text"):
        encode_sharded(IDS[:3], TEXTS, str(tiny_bert_dir), tmp_path / "x")
    with pytest.raises(ValueError, match="line break"):
        encode_sharded(["a\nb"], ["t"], str(tiny_bert_dir), tmp_path / "y")
    with pytest.raises(FileNotFoundError, match="run it again"):
        read_shards(tmp_path / "nothing")


@pytest.mark.slow
def test_ray_actor_pool_equals_local(tiny_bert_dir, tmp_path):
    ray = pytest.importorskip("ray")
    local = encode_sharded(IDS, TEXTS, str(tiny_bert_dir), tmp_path / "local", shard_size=10)
    # A run that finished only shard 0 before it stopped: the pool encodes the other three.
    encode_sharded(IDS, TEXTS, str(tiny_bert_dir), tmp_path / "ray", shard_size=10)
    for index in (1, 2, 3):
        (tmp_path / "ray" / f"shard-{index:05d}.ids.txt").unlink()
    (tmp_path / "ray" / "manifest.json").unlink()
    untouched = (tmp_path / "ray" / "shard-00000.npy").stat().st_mtime_ns
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        manifest = encode_sharded_ray(IDS, TEXTS, str(tiny_bert_dir), tmp_path / "ray", shard_size=10, actors=2, num_cpus=0.5,
                                      threads_per_actor=1)
    finally:
        ray.shutdown()
    assert manifest["rows"] == local["rows"] and manifest["last_run"]["backend"] == "ray (2 actors)"
    assert (tmp_path / "ray" / "shard-00000.npy").stat().st_mtime_ns == untouched
    ids, vectors = read_shards(tmp_path / "ray")
    assert ids == IDS
    np.testing.assert_allclose(vectors, read_shards(tmp_path / "local")[1], rtol=0, atol=1e-6)


def test_resuming_with_other_settings_is_refused(tiny_bert_dir, tmp_path):
    out = tmp_path / "shards"
    encode_sharded(IDS, TEXTS, str(tiny_bert_dir), out, shard_size=10)
    with pytest.raises(ValueError, match="shard_size: 10 -> 20.*new --out"):
        encode_sharded(IDS, TEXTS, str(tiny_bert_dir), out, shard_size=20)
    with pytest.raises(ValueError, match="another corpus"):
        encode_sharded(IDS[:-1] + ["other"], TEXTS, str(tiny_bert_dir), out, shard_size=10)


def test_embed_corpus_cli_writes_and_resumes_shards(tiny_bert_dir, tmp_path, capsys):
    import json

    from embedtune.cli import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in zip(IDS, TEXTS)), encoding="utf-8")
    out = tmp_path / "vectors"
    assert main(["embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--out", str(out), "--shard-size", "16"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"] == 37 and printed["shards"] == 3 and printed["last_run"]["backend"] == "local"
    ids, vectors = read_shards(out)
    assert ids == IDS and vectors.shape == (37, 32)
    expected = SentenceEncoder(str(tiny_bert_dir), show_progress=False).encode(TEXTS[16:32])
    np.testing.assert_array_equal(vectors[16:32], expected)
    untouched = (out / "shard-00000.npy").stat().st_mtime_ns
    assert main(["embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--out", str(out), "--shard-size", "16"]) == 0
    assert (out / "shard-00000.npy").stat().st_mtime_ns == untouched
