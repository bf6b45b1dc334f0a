"""The helpers of the sphere-encoding and PCA-start studies (``benchmarks/sphere_encoding.py``,
``benchmarks/pca_start_pseudo_queries.py``), and their reports as generated from the committed rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from embedtune.compress.base import l2_normalize

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import pca_start_pseudo_queries  # noqa: E402
import sphere_encoding  # noqa: E402


def _unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    x[:, : d // 4] *= 3.0  # an uneven spectrum, as embeddings have
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_gain_search_keeps_the_family_codes_at_gain_one_and_never_widens_an_angle():
    docs = _unit_rows(400, 32, 0)
    own, searched, chosen, _ = sphere_encoding.decoded_halves({"docs": docs}, "klt-pq4-sphere:8", (1.0,))
    np.testing.assert_array_equal(own, searched)
    assert (chosen == 1.0).all()
    own, searched, chosen, _ = sphere_encoding.decoded_halves({"docs": docs}, "klt-pq4-sphere:8", (0.8, 1.0, 1.25))

    def cosine(decoded: np.ndarray) -> np.ndarray:
        return np.einsum("nd,nd->n", l2_normalize(decoded), docs)

    assert (cosine(searched) >= cosine(own) - 1e-6).all()
    assert (cosine(searched) > cosine(own) + 1e-6).any()  # some document gains from another gain
    assert set(np.unique(chosen)) <= {0.8, 1.0, 1.25}


def test_a_pseudo_query_scores_by_its_own_document_rank_and_a_tie_counts_against_it():
    docs = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    queries = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    gains = pca_start_pseudo_queries.own_document_gains(queries, docs, np.array([0, 2, 2]))
    np.testing.assert_allclose(gains, [1.0, 1.0 / np.log2(3.0), 1.0 / np.log2(3.0)])
    tied = pca_start_pseudo_queries.own_document_gains(np.array([[1.0, 0.0]], dtype=np.float32),
                                                       np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32), np.array([0]))
    np.testing.assert_allclose(tied, [1.0 / np.log2(3.0)])  # its twin is ranked ahead of it


def test_both_reports_are_what_their_scripts_write_from_the_committed_rows():
    for module, path in ((sphere_encoding, sphere_encoding.OUT / "REPORT.md"),
                         (pca_start_pseudo_queries, pca_start_pseudo_queries.OUT.parent / "PCA-START.md")):
        assert path.read_text(encoding="utf-8") == module.report(), f"{path} is stale; run `python benchmarks/{Path(module.__file__).name} --report`."
