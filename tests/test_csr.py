"""CSR (sentence-transformers' SparseAutoEncoder) as a compressor: config, k-sparse codes, bytes, persistence, registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

from conftest import write_beir
from embedtune.compress import TrainingData, available_methods, get_compressor_class, load_compressor, make_compressor, unsupervised_methods
from embedtune.compress.csr import CSRCompressor, CSRConfig, index_bytes, sparse_code_bytes
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.plan import run_plan

torch.set_num_threads(1)  # tiny tensors on a busy machine

D, M, K = 24, 64, 4
FAST = {"dim": M, "active": K, "epochs": 2, "batch_size": 32, "progress": False, "device": "cpu", "seed": 7}


@pytest.fixture(scope="module")
def corpus() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(150, D)).astype(np.float32)


@pytest.fixture(scope="module")
def fitted(corpus) -> CSRCompressor:
    return make_compressor("csr", **FAST).fit_unsupervised(corpus)


def test_config_validates_with_the_fix():
    with pytest.raises(ValueError, match="4 × active"):
        CSRConfig(dim=16, active=5)
    with pytest.raises(ValueError, match="k_aux"):
        CSRConfig(dim=16, k_aux=17)
    with pytest.raises(ValueError, match="value_bytes"):
        CSRConfig(value_bytes=1)
    with pytest.raises(ValueError, match="active must be a positive integer"):
        CSRConfig(active=0)
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        CSRConfig(contrastive_weight=-1.0)
    # s-t's defaults, capped so the 4k term fits a narrow latent width.
    assert (CSRConfig().active_latents, CSRConfig().aux_latents) == (8, 512)
    assert (CSRConfig(dim=8).active_latents, CSRConfig(dim=8).aux_latents) == (2, 8)


def test_codes_are_k_sparse_unit_rows_of_the_latent_width(fitted, corpus):
    out = fitted.transform(corpus)
    assert out.shape == (len(corpus), M) and fitted.output_dim == M
    assert out.dtype == np.float32
    np.testing.assert_array_equal((out != 0).sum(axis=1), K)
    assert (out >= 0).all()  # CSR's ReLU after the top-k
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert fitted.fit_details()["active"] == K and len(fitted.history_) == FAST["epochs"]
    assert {"reconstruction_loss_k", "reconstruction_loss_4k", "reconstruction_loss_aux", "loss"} <= set(fitted.history_[-1])


def test_transform_is_sentence_transformers_module_on_unit_rows(fitted, corpus):
    module = SparseAutoEncoder(D, hidden_dim=M, k=K, k_aux=M)
    module.load_state_dict(fitted.model_.state_dict())
    module.eval()
    with torch.inference_mode():
        expected = module({"sentence_embedding": F.normalize(torch.from_numpy(corpus), dim=-1)})["sentence_embedding"]
    np.testing.assert_allclose(fitted.transform(corpus), F.normalize(expected, dim=-1).numpy(), atol=1e-6)


def test_save_load_round_trip_is_equal(fitted, corpus, tmp_path):
    fitted.save(tmp_path / "csr")
    for loaded in (load_compressor(tmp_path / "csr"), CSRCompressor.load(tmp_path / "csr")):
        assert loaded.config == fitted.config
        np.testing.assert_array_equal(loaded.transform(corpus), fitted.transform(corpus))
    # The tied decoder is stored once (as the encoder's weight).
    assert not any(".decoder." in name for name in fitted._state_dict())


def test_a_seed_fixes_the_fit(fitted, corpus):
    again = make_compressor("csr", **FAST).fit_unsupervised(corpus)
    np.testing.assert_array_equal(again.transform(corpus), fitted.transform(corpus))
    assert again.state_sha256() == fitted.state_sha256()
    other = make_compressor("csr", **{**FAST, "seed": 8}).fit_unsupervised(corpus)
    assert not np.array_equal(other.transform(corpus), fitted.transform(corpus))


def test_bytes_count_indices_and_values():
    assert [index_bytes(m) for m in (256, 257, 1536, 65536, 65537)] == [1, 2, 2, 2, 4]
    assert sparse_code_bytes(8, 1536) == 32 and sparse_code_bytes(16, 1536) == 64  # uint16 index + fp16 value
    assert sparse_code_bytes(8, 1536, value_bytes=4) == 48
    assert make_compressor("csr", dim=1536, active=16).code_bytes == 64
    with pytest.raises(ValueError, match="value_bytes"):
        sparse_code_bytes(8, 1536, value_bytes=3)


def test_registered_as_an_unsupervised_method():
    assert "csr" in available_methods() and "csr" in unsupervised_methods()
    cls = get_compressor_class("csr")
    assert cls is CSRCompressor and not cls.supervised and cls.help


def test_contrastive_term_needs_triplets_and_uses_them(corpus):
    rng = np.random.default_rng(1)
    queries = corpus[:20] + 0.1 * rng.normal(size=(20, D)).astype(np.float32)
    triplets = np.array([(q, q, (q + 7) % len(corpus)) for q in range(20)], dtype=np.int64)
    labelled = TrainingData([f"q{i}" for i in range(20)], queries, [f"d{i}" for i in range(len(corpus))], corpus,
                            {f"q{i}": {f"d{i}": 1} for i in range(20)}, triplets)
    supervised = make_compressor("csr", **FAST, contrastive_weight=1.0)
    assert not supervised.is_unsupervised
    supervised.fit(labelled)
    assert "base_loss" in supervised.history_[-1] and supervised.history_[-1]["stage"] == "csr"
    with pytest.raises(ValueError, match="needs training triplets"):
        make_compressor("csr", **FAST, contrastive_weight=1.0).fit(TrainingData.corpus_only(corpus))
    # Without labels the contrastive term is switched off (and recorded so).
    label_free = make_compressor("csr", **FAST, contrastive_weight=1.0).fit_unsupervised(corpus)
    assert label_free.config.contrastive_weight == 0.0 and label_free.is_unsupervised


def test_plan_scores_csr_as_a_peer_at_its_bytes_and_never_chooses_it(tmp_path):
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((60, D)).astype(np.float32)
    targets = rng.permutation(60)[:40]
    queries = docs[targets] + 0.6 * rng.standard_normal((40, D)).astype(np.float32)
    doc_ids, query_ids = [f"d{i}" for i in range(60)], [f"q{i}" for i in range(40)]
    root = write_beir(tmp_path / "toy", [{"_id": i, "text": i} for i in doc_ids], [{"_id": q, "text": q} for q in query_ids],
                      [(q, doc_ids[t], 1) for q, t in zip(query_ids, targets)])
    for name, ids, vectors in (("doc", doc_ids, docs), ("query", query_ids, queries)):
        np.save(tmp_path / f"{name}.npy", vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        (tmp_path / f"{name}.txt").write_text("".join(i + "\n" for i in ids))
    experiment = load_experiment(root, doc_embeddings=tmp_path / "doc.npy", doc_ids=tmp_path / "doc.txt",
                                 query_embeddings=tmp_path / "query.npy", query_ids=tmp_path / "query.txt")
    # float16 at 12 dims: a 24 B budget, which k = 8 (uint8 index + fp16 value) of 4 × 24 = 96 latents fill.
    plan = run_plan(experiment, tmp_path / "plan", budget_bytes=24, methods=("truncate",), dims=(12,), precisions=("float16",),
                    peers=("csr",), rounds=0)
    csr_rows = [r for r in plan["sweep"] if r["method"] == "csr"]
    assert [(r["setting"], r["ram_bytes"], r["dim"], r["choosable"]) for r in csr_rows] == [("csr+k8-96/sparse-fp16", 24, 96, False)]
    assert plan["chosen"]["method"] != "csr"
