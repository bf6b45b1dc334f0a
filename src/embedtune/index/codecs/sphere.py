"""Sphere rescoring: rank a code's candidates by the direction of their decoded vectors, with nothing but the codes.

A cosine model's documents all have norm 1, and a quantiser that decodes each code to the mean of its
cells (k-means, Lloyd-Max: the error-minimising decode) shrinks every document towards the centre by
an amount that depends on its cells: one document may decode to norm 0.6, its neighbour to 0.95. The
plain score ``q · x̂`` then ranks the second above the first even where the first points nearer the
query. Since the true norm is known (1 for every row), the decoded norm is pure error, and

    score(q, x) = q · x̂ / ‖x̂‖

ranks by the decoded direction alone. It costs no byte in RAM: ``‖x̂‖`` is a function of the code.

Served over FAISS, the codes' own search finds each query's top ``N`` (:data:`SPHERE_CANDIDATES`) by the
plain score, and :func:`sphere_rescore` decodes those ``N`` codes (``reconstruct_batch``: from RAM,
nothing read from disk) and ranks them by the score above. On SciFact, ArguAna and NPL (all-MiniLM-L6-v2,
halves coded by tables fitted on the other) the top 100 gave the same nDCG@10 as rescoring every
document (``benchmarks/near_limit.py``).

The numpy reference codecs (``klt-sq-sphere``, ``klt-tcq-sphere``) decode every document onto the
sphere inside their scan instead (:meth:`embedtune.index.codecs.textbook.RotatedCodeIndex.on_sphere`).

Every family that scores this way needs rows of one norm and says so
(``CodecFamily.requires_common_norm``); :func:`common_norm` refuses others with the fix.

>>> import numpy as np
>>> from embedtune.index.codecs import Precision, QuantizedIndex
>>> rng = np.random.default_rng(0)
>>> docs = rng.standard_normal((2000, 32)).astype(np.float32)
>>> docs /= np.linalg.norm(docs, axis=1, keepdims=True)          # a cosine model's unit vectors
>>> index = QuantizedIndex.build(docs, Precision("klt-pq4-sphere:8"))
>>> scores, rows = index.search(docs[:3], 10)
>>> bool((np.abs(scores) <= 1.0 + 1e-5).all())                   # each a cosine with a decoded direction
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embedtune.evaluate.search import break_ties
from embedtune.index.codecs.faiss_scan import faiss_index_search
from embedtune.index.codecs.precision_registry import faiss_index_of

__all__ = ["SPHERE_CANDIDATES", "COMMON_NORM_TOLERANCE", "SPHERE_SUFFIX", "SphereRanked", "common_norm", "plain_family_name",
           "row_norms", "shares_one_norm", "sphere_rescore", "sphere_search"]

#: Candidates per query the codes' own search returns for :func:`sphere_rescore` (FAISS users' usual ``k_factor`` for
#: k = 10, as for refinement).
SPHERE_CANDIDATES = 100
#: How far (relative to their median) the rows' norms may spread for a sphere-scoring codec to take them as one norm.
COMMON_NORM_TOLERANCE = 1e-2
#: What a sphere family's name adds to its plain family's: ``klt-pq4-sphere`` is ``klt-pq4``'s codes, ranked by direction.
SPHERE_SUFFIX = "-sphere"
#: Rows whose norms are taken at once (float64: 65,536 × 768 is 400 MB).
_NORM_BLOCK = 16_384
#: Queries decoded per step: ``block × N × d`` float32 at once (256 × 100 × 768: 79 MB).
_QUERY_BLOCK = 256


def plain_family_name(name: str) -> str | None:
    """``"klt-apq:32"`` for ``"klt-apq-sphere:32"`` (the family whose codes it ranks by direction), else None."""
    family, sep, budget = str(name).partition(":")
    return f"{family.removesuffix(SPHERE_SUFFIX)}:{budget}" if sep and family.endswith(SPHERE_SUFFIX) else None


def row_norms(x: np.ndarray, block: int = _NORM_BLOCK) -> np.ndarray:
    """``(n,)`` float64: each row's norm, a block of rows at a time (a large or memory-mapped corpus is never copied whole)."""
    return np.concatenate([np.linalg.norm(np.asarray(x[start : start + block], dtype=np.float64), axis=1)
                           for start in range(0, len(x), block)]) if len(x) else np.zeros(0)


def shares_one_norm(x: np.ndarray) -> bool:
    """Whether every row of ``x`` (finite) is within :data:`COMMON_NORM_TOLERANCE` of the rows' median norm."""
    if np.ndim(x) != 2 or not len(x):
        return False
    norms = row_norms(x)
    if not np.isfinite(norms).all():
        return False
    radius, spread = _radius_and_spread(norms)
    return radius > 0 and spread <= COMMON_NORM_TOLERANCE


def _radius_and_spread(norms: np.ndarray) -> tuple[float, float]:
    """The rows' median norm, and how far the farthest row is from it, relative to it."""
    radius = float(np.median(norms))
    return radius, float(np.max(np.abs(norms - radius))) / max(radius, 1e-30)


def common_norm(name: str, x: np.ndarray) -> float:
    """The norm all of ``x``'s rows share (their median, every row within :data:`COMMON_NORM_TOLERANCE` of it), or an
    error naming the codec ``name`` that needs it and what to do instead."""
    x = np.asarray(x)
    if x.ndim != 2 or not len(x):
        raise ValueError(f"codec {name!r}: expected a non-empty (n, d) matrix; got shape {x.shape}.")
    norms = row_norms(x)
    if not np.isfinite(norms).all():  # the same words as every codec's fit (transform.training_sample)
        bad = int(np.flatnonzero(~np.isfinite(norms))[0])
        raise ValueError(f"the vectors to fit a codec on hold NaN or inf (row {bad}); drop or re-encode those rows first.")
    radius, spread = _radius_and_spread(norms)
    if radius <= 0 or spread > COMMON_NORM_TOLERANCE:
        plain = plain_family_name(name) or name
        raise ValueError(f"codec {name!r} scores each document by the direction of its decoded vector, which needs rows of one "
                         f"norm, but these rows' norms range from {norms.min():.4g} to {norms.max():.4g} (a dot-product model's "
                         f"vectors, or vectors compressed without normalising). Normalise the rows first if the model scores by "
                         f"cosine, or use {plain!r}.")
    return radius


def _rotated_decoder(index: Any) -> tuple[Any, Any] | None:
    """``(inner index, query map)`` when ``index`` is one orthonormal ``LinearTransform`` (no bias) in front of an index:
    then ``q · x̂ = (Aq) · ŷ`` and ``‖x̂‖ = ‖ŷ‖``, so candidates are decoded in the rotated space (through FAISS's transform back to 384 dims
    it was about 14 times slower for a 384 × 192 KLT). None for any other index."""
    import faiss

    if not isinstance(index, faiss.IndexPreTransform) or index.chain.size() != 1:
        return None
    step = faiss.downcast_VectorTransform(index.chain.at(0))
    if not isinstance(step, faiss.LinearTransform) or step.have_bias or not step.is_orthonormal or step.d_out > step.d_in:
        return None
    return faiss.downcast_index(index.index), step


def sphere_search(index: Any, xq: np.ndarray, k: int, candidates: int = SPHERE_CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
    """``(D, I)``: the top ``k`` of FAISS index ``index`` (or a wrapper around one) for float queries ``xq``: the codes'
    own search finds each query's top ``candidates``, :func:`sphere_rescore` ranks them by direction."""
    _, rows = faiss_index_search(index, xq, min(index.ntotal, max(int(k), int(candidates))))
    return sphere_rescore(faiss_index_of(index), xq, rows, k)


def sphere_rescore(index: Any, xq: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(D, I)``: candidates ``rows`` (``(nq, N)``, ``-1`` for none) of FAISS index ``index`` ranked by
    ``q · x̂ / ‖x̂‖``, their codes decoded with ``reconstruct_batch``; the top ``k``, ties by row."""
    xq = np.ascontiguousarray(xq, dtype=np.float32)
    rotated = _rotated_decoder(index)
    if rotated is not None:
        index, step = rotated
        xq = np.ascontiguousarray(step.apply(xq), dtype=np.float32)
    rows = np.asarray(rows, dtype=np.int64)
    nq, n = rows.shape
    scores = np.full((nq, n), -np.inf, dtype=np.float32)
    for start in range(0, nq, _QUERY_BLOCK):
        part = rows[start : start + _QUERY_BLOCK]
        valid = part >= 0
        if not valid.any():
            continue
        decoded = np.zeros((part.size, xq.shape[1]), dtype=np.float32)
        flat = valid.ravel()
        decoded[flat] = index.reconstruct_batch(np.ascontiguousarray(part.ravel()[flat]))
        decoded = decoded.reshape(len(part), n, -1).astype(np.float64)
        norms = np.linalg.norm(decoded, axis=2)
        dots = np.einsum("qnd,qd->qn", decoded, xq[start : start + _QUERY_BLOCK].astype(np.float64))
        scores[start : start + len(part)] = np.where(valid, dots / np.maximum(norms, 1e-30), -np.inf)
    D, I = break_ties(scores, rows)
    k = min(int(k), n)
    return D[:, :k], I[:, :k]


class SphereRanked:
    """What makes a deployable codec family a ``-sphere`` one, mixed in before it (``class KltPQ4Sphere(SphereRanked,
    KltPQ4)``): the same fit and codes, rows of one norm required, each query's top :data:`SPHERE_CANDIDATES` ranked by
    :func:`sphere_rescore` (``FamilyCodecPrecision.search``, and the index store for a planned one)."""

    requires_common_norm = True
    sphere_candidates = SPHERE_CANDIDATES

    def train(self, x: np.ndarray, seed: int = 0) -> Any:
        common_norm(self.name, x)  # type: ignore[attr-defined]
        return super().train(x, seed)  # type: ignore[misc]
