"""klt-wpq: KLT-PQ weighted for the score's error, served by FAISS as an additive quantiser in the original space.

The registry's contract (build, bytes, save, load, search, tampering) is checked for every registered
codec in ``tests/test_codec_registry.py``; here: what is particular to the weighted codec. Its search
is the ``y``-space computation ``z · ŷ``; on data with a strong shared mean its score error is lower
than plain ``klt-pq``'s at the same bytes; ``codec.faiss`` alone searches the codes in plain FAISS;
and a plan that chooses it serves exactly what it scored.
"""

from __future__ import annotations

import numpy as np
import pytest

from embedtune.index import load_index
from embedtune.evaluate.search import break_ties
from embedtune.index.codecs import CODEC_FILE, DeployedCodec, Precision, QuantizedIndex
from embedtune.index.codecs.anisotropic import ANISOTROPY_FILE
from embedtune.index.codecs.weighted import ENCODER_FILE, SCORE_WEIGHT, KltWeightedPQ, ScoreWeightedIndex, score_weighting
from embedtune.index.plan_export import plan_codec
from embedtune.index.plan_format import load_plan
from embedtune.io import IntegrityError
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.plan import run_plan
from plan_checks import assert_served_as_scored, record_builds

D = 32


def _shared_mean_corpus(n: int, seed: int = 0, mean_axis: int = 25, mean_norm: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Docs and queries sharing a large mean along an axis of small centred variance (as sentence embeddings share one)."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(1.0, 0.05, D)
    rotation = np.linalg.qr(rng.standard_normal((D, D)))[0]
    mean = mean_norm * rotation[:, mean_axis]
    docs = (rng.standard_normal((n, D)) * scales) @ rotation.T + mean
    queries = (rng.standard_normal((200, D)) * scales) @ rotation.T + mean
    return docs.astype(np.float32), queries.astype(np.float32)


def _score_error(index: QuantizedIndex, docs: np.ndarray, queries: np.ndarray) -> float:
    """Mean squared error of ``q · x̂`` against ``q · x``, centred per query (a per-query constant changes no ranking)."""
    error = queries.astype(np.float64) @ (docs - index.reconstruct(docs)).T.astype(np.float64)
    error -= error.mean(axis=1, keepdims=True)
    return float(np.mean(error**2))


def test_search_is_the_y_space_inner_product_of_the_weighted_codes():
    docs, queries = _shared_mean_corpus(3000)
    index = QuantizedIndex.build(docs, "klt-wpq:8")
    backend = index.backend
    assert isinstance(backend, ScoreWeightedIndex) and backend.sa_code_size() == 8
    scores, rows = index.search(queries, 20)
    # y = kept · S^{1/2} x is what the encoder quantises; ŷ is its product quantiser's decoding; z = kept · S^{-1/2} q.
    import faiss

    root, inverse_root = score_weighting(docs, SCORE_WEIGHT)
    to_kept = faiss.downcast_VectorTransform(backend.encoder.chain.at(0))
    kept = faiss.vector_to_array(to_kept.A).reshape(to_kept.d_out, D).astype(np.float64) @ inverse_root  # undo S^{1/2}
    assert np.allclose(kept @ kept.T, np.eye(len(kept)), atol=1e-4)  # the kept axes of y: orthonormal
    y_decoded = faiss.downcast_index(backend.encoder.index).pq.decode(backend.sa_encode(docs)).astype(np.float64)
    z = queries.astype(np.float64) @ inverse_root @ kept.T
    expected = z @ y_decoded.T
    assert np.allclose(scores, np.take_along_axis(expected, rows.astype(np.int64), axis=1), rtol=1e-4, atol=1e-4)
    # ... and the decoded documents in the original space are ŷ mapped back: q · x̂ = z · ŷ.
    assert np.allclose(queries @ index.reconstruct(docs).T, expected, rtol=1e-4, atol=1e-4)


def test_on_a_strong_shared_mean_the_weighted_codec_has_lower_score_error_than_klt_pq():
    docs, queries = _shared_mean_corpus(4000)
    plain = QuantizedIndex.build(docs, "klt-pq:8")
    weighted = QuantizedIndex.build(docs, "klt-wpq:8")
    assert plain.ram_bytes() == weighted.ram_bytes() == 8
    assert _score_error(weighted, docs, queries) < 0.7 * _score_error(plain, docs, queries)


def test_the_fit_is_deterministic_and_uses_at_most_the_fit_sample(monkeypatch):
    docs, _ = _shared_mean_corpus(3000)
    first, second = KltWeightedPQ(8).train(docs, seed=3), KltWeightedPQ(8).train(docs, seed=3)
    assert np.array_equal(first.sa_encode(docs), second.sa_encode(docs))
    import embedtune.index.codecs.transform as transform

    monkeypatch.setattr(transform, "FIT_SAMPLE", 1500)  # the default of training_sample, read when called
    sampled: list[int] = []
    real = transform.training_sample

    def recording(x, limit=None, seed=0):
        out = real(x, limit if limit is not None else transform.FIT_SAMPLE, seed)
        sampled.append(len(out))
        return out

    monkeypatch.setattr("embedtune.index.codecs.weighted.training_sample", recording)
    KltWeightedPQ(8).train(docs)
    assert sampled == [1500]


def test_codec_faiss_alone_searches_the_weighted_codes_in_plain_faiss(tmp_path):
    import faiss

    docs, queries = _shared_mean_corpus(3000)
    index = QuantizedIndex.build(docs, "klt-wpq:8")
    index.save_precision(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"precision.json", CODEC_FILE, ENCODER_FILE}
    codec = DeployedCodec.load(tmp_path)
    plain = faiss.read_index(str(tmp_path / CODEC_FILE))  # no embedtune: a FAISS additive quantiser, inner product
    assert isinstance(plain, faiss.IndexResidualQuantizer) and plain.metric_type == faiss.METRIC_INNER_PRODUCT
    plain.add_sa_codes(codec.encode(docs))
    scores, rows = index.search(queries, 10)
    # FAISS orders equal scores as its heap leaves them; embedtune by ascending row (break_ties), on every kernel.
    plain_scores, plain_rows = break_ties(*plain.search(queries, 10))
    assert np.allclose(plain_scores, scores, rtol=1e-5, atol=1e-5)
    assert np.array_equal(plain_rows, rows)
    # FAISS's own add() encodes in the unweighted metric: valid codes, not the weighted ones embedtune stores.
    assert not np.array_equal(plain.sa_encode(docs), codec.encode(docs))


def test_a_missing_or_foreign_encoder_is_refused(tmp_path):
    docs, _ = _shared_mean_corpus(3000)
    QuantizedIndex.build(docs, "klt-wpq:8").save_precision(tmp_path / "a")
    QuantizedIndex.build(docs[::-1].copy(), "klt-wpq:8").save_precision(tmp_path / "b")
    (tmp_path / "a" / ENCODER_FILE).write_bytes((tmp_path / "b" / ENCODER_FILE).read_bytes())
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        DeployedCodec.load(tmp_path / "a")
    (tmp_path / "b" / ENCODER_FILE).unlink()
    with pytest.raises((IntegrityError, FileNotFoundError), match=ENCODER_FILE):
        DeployedCodec.load(tmp_path / "b")


@pytest.fixture
def toy(tmp_path):
    """1,200 unit docs with a decaying spectrum and a shared direction, 100 noisy queries (one positive each): 8-bit codebooks
    need 4 training points a codeword."""
    from conftest import write_beir

    n_docs, n_queries = 1200, 100
    rng = np.random.default_rng(0)
    scales = np.geomspace(1.0, 0.1, D)
    docs = rng.standard_normal((n_docs, D)) * scales + 0.3
    targets = rng.permutation(n_docs)[:n_queries]
    queries = docs[targets] + 0.5 * rng.standard_normal((n_queries, D)) * scales
    docs = (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    doc_ids, query_ids = [f"d{i}" for i in range(n_docs)], [f"q{i}" for i in range(n_queries)]
    root = write_beir(tmp_path / "toy", [{"_id": i, "text": i} for i in doc_ids], [{"_id": q, "text": q} for q in query_ids],
                      [(q, doc_ids[t], 1) for q, t in zip(query_ids, targets)])
    paths = {}
    for name, ids, vectors in (("doc", doc_ids, docs), ("query", query_ids, queries)):
        np.save(tmp_path / f"{name}.npy", vectors)
        (tmp_path / f"{name}.txt").write_text("".join(i + "\n" for i in ids))
        paths[name] = (tmp_path / f"{name}.npy", tmp_path / f"{name}.txt")
    return root, paths


@pytest.mark.parametrize(("family", "files"), [("klt-wpq", (CODEC_FILE, ENCODER_FILE)),
                                               ("klt-apq", (CODEC_FILE, ENCODER_FILE, ANISOTROPY_FILE))])
def test_a_plan_that_chooses_a_weighted_codec_serves_what_it_scored(family, files, toy, tmp_path, monkeypatch):
    """4 B a vector: only a codec fits; `index build --plan`, `search` and `compress export --plan` use exactly the scored codes."""
    built = record_builds(monkeypatch)
    root, paths = toy
    experiment = load_experiment(root, doc_embeddings=paths["doc"][0], doc_ids=paths["doc"][1],
                                 query_embeddings=paths["query"][0], query_ids=paths["query"][1])
    out = tmp_path / "plan"
    plan = run_plan(experiment, out, budget_bytes=4, precisions=["float32", "int8"], work=tmp_path / "work", methods=["truncate"],
                    dims=[16], peers=[], codecs=(family,), codec_budgets=(4,), rounds=0)
    chosen = plan["chosen"]
    assert chosen["precision"] == f"{family}:4" and chosen["ram_bytes"] == 4 and chosen["tier"] == "ram"
    assert all((out / name).is_file() for name in files) and set(files) <= set(plan["files_sha256"])
    assert_served_as_scored(experiment, plan, out, built, paths["doc"][0], paths["doc"][1], tmp_path / "index")


def test_cli_plans_klt_wpq_by_name_and_index_build_serves_the_plan_codec(toy, tmp_path):
    from embedtune.cli import main

    root, paths = toy
    out = tmp_path / "plan"
    assert main(["compress", "plan", "--data", str(root), "--doc-embeddings", str(paths["doc"][0]), "--doc-ids", str(paths["doc"][1]),
                 "--query-embeddings", str(paths["query"][0]), "--query-ids", str(paths["query"][1]), "--methods", "truncate",
                 "--dims", "16", "--peers", "", "--work", str(tmp_path / "work"), "--precisions", "float32", "int8",
                 "--codecs", "klt-wpq", "--codec-budgets", "4", "--budget-bytes", "4", "--out", str(out)]) == 0
    _, compressor, precision, _ = load_plan(out)
    assert precision.name == "klt-wpq:4"
    assert main(["index", "build", "--plan", str(out), "--embeddings", str(paths["doc"][0]), "--ids", str(paths["doc"][1]),
                 "--out", str(tmp_path / "index")]) == 0
    served = load_index(tmp_path / "index")
    assert served.manifest["kind"] == "klt-wpq:4"
    docs = compressor.transform(np.load(paths["doc"][0]))
    expected = plan_codec(out).build_index(docs)
    xq = compressor.transform(np.load(paths["query"][0]))
    assert np.array_equal(served.search(xq, 10)[1], expected.search(xq, 10)[1])
