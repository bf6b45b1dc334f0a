"""How far a codec is from the limit: its distortion beside the Gaussian rate-distortion bound.

For a source with covariance eigenvalues ``λ_1 … λ_d`` coded at ``R`` bits per vector, the
Gaussian source is the hardest one (Shannon; Cover & Thomas, *Elements of Information Theory*,
§10.3.3): no codec of any kind can have a lower mean squared error on it than the reverse
water-filling level

    D(θ) = Σ_i min(θ, λ_i)    with    R(θ) = Σ_i max(0, ½ log2(λ_i / θ)),

the water level ``θ`` chosen so that ``R(θ)`` equals the budget. A real corpus is not Gaussian, so
a codec built for it may reach that bound or pass it; the gap ``10 log10(MSE / D)`` in dB says how
far a setting is from it (0 dB: at the bound; positive: above it).

:func:`distortion_report` measures a codec where it is used: the mean squared error of the
reconstructed vectors (summed over dimensions, averaged over vectors), the mean squared error of
the inner products against float queries, and the bound and gap at the codec's bits.

>>> import numpy as np
>>> gaussian_bound(np.array([4.0, 1.0]), bits=2)     # θ = 1/2: both axes active, min(θ, 4) + min(θ, 1)
1.0
>>> gaussian_bound(np.array([4.0, 1.0]), bits=0.5)   # θ = 2: the second axis gets no bits, min(θ, 4) + 1
3.0
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from embedtune.runtime import single_threaded

__all__ = ["corpus_spectrum", "water_level", "gaussian_bound", "gap_db", "distortion_report", "SPECTRUM_SAMPLE"]

#: Rows used to estimate a corpus's covariance spectrum (a random sample beyond this; the spectrum of d <= 4096
#: dimensions is stable long before).
SPECTRUM_SAMPLE = 100_000


def corpus_spectrum(x: np.ndarray, sample: int = SPECTRUM_SAMPLE, seed: int = 0) -> np.ndarray:
    """The eigenvalues of the covariance of ``x``'s rows (centred), descending, clipped at 0: ``(d,)`` float64."""
    x = np.asarray(x)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"the spectrum needs a (n >= 2, d) matrix; got shape {x.shape}.")
    if len(x) > sample:
        rows = np.sort(np.random.default_rng(seed).choice(len(x), size=sample, replace=False))
        x = x[rows]
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean(axis=0)
    with single_threaded():  # the same bound on any thread count
        eigenvalues = np.linalg.eigvalsh(centred.T @ centred / len(centred))
    return np.clip(eigenvalues[::-1], 0.0, None)


def water_level(eigenvalues: np.ndarray, bits: float) -> float:
    """The reverse water-filling level ``θ`` at which ``Σ max(0, ½ log2(λ_i / θ))`` equals ``bits``."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    lam = lam[lam > 0]
    if bits < 0:
        raise ValueError(f"bits must be >= 0; got {bits}.")
    if lam.size == 0:
        return 0.0
    if bits == 0:
        return float(lam.max())
    # Exact: with the k largest eigenvalues active, θ = (Π_{i<=k} λ_i)^(1/k) · 2^(-2 bits / k); the right k is the
    # largest whose θ stays below its smallest active eigenvalue.
    lam = np.sort(lam)[::-1]
    logs = np.cumsum(np.log2(lam))
    theta = float(lam[0])
    for k in range(1, lam.size + 1):
        candidate = 2.0 ** ((logs[k - 1] - 2.0 * bits) / k)
        if candidate <= lam[k - 1] * (1 + 1e-12):
            theta = candidate
        else:
            break
    return theta


def gaussian_bound(eigenvalues: np.ndarray, bits: float) -> float:
    """The least mean squared error (summed over dimensions) any codec of ``bits`` bits per vector can reach on a
    Gaussian source with these covariance eigenvalues: ``Σ min(θ, λ_i)`` at the water level ``θ``."""
    lam = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0.0, None)
    return float(np.minimum(water_level(lam, bits), lam).sum())


def gap_db(mse: float, bound: float) -> float | None:
    """``10 log10(mse / bound)``: dB above the bound (None when either is not positive)."""
    if not (mse > 0 and bound > 0) or not (math.isfinite(mse) and math.isfinite(bound)):
        return None
    return 10.0 * math.log10(mse / bound)


def distortion_report(x: np.ndarray, x_hat: np.ndarray | None, bits: float, queries: np.ndarray | None = None,
                      eigenvalues: np.ndarray | None = None, query_hat: np.ndarray | None = None,
                      sample: int = 20_000, seed: int = 0) -> dict[str, Any]:
    """Distortion of ``x_hat`` (the decoded codes) against ``x``, and the Gaussian bound at ``bits`` per vector.

    Both errors are measured after removing their mean (over vectors for ``mse``, over vectors per
    query for ``score_mse``): a constant offset shifts every score of a query alike, so it changes no
    ranking, and a codec may drop it (the transform codecs do, for the axes they leave out). The
    bound is over the centred covariance, for the same reason: a known mean costs no bits.

    Args:
        x: ``(n, d)`` the vectors that were coded.
        x_hat: ``(n, d)`` what the codes decode to, or None for a codec that cannot decode (binary Hamming codes):
            then only the bound is given.
        bits: bits per vector in RAM (``8 × ram_bytes``).
        queries: ``(m, d)`` float queries in the same space: adds ``score_mse``, the mean of
            ``(q·x - q·x_hat)²`` over queries and (a sample of) the vectors.
        eigenvalues: ``x``'s covariance spectrum, when the caller has it (:func:`corpus_spectrum`).
        query_hat: the queries the index actually scores with, when they differ from ``queries``
            (none here: every codec takes the float query).
        sample: the score error is measured on at most this many vectors.

    Returns:
        ``{"mse", "score_mse", "bound_mse", "gap_db", "bits"}`` (None where not measurable).
    """
    x = np.asarray(x, dtype=np.float32)
    lam = corpus_spectrum(x) if eigenvalues is None else np.asarray(eigenvalues)
    bound = gaussian_bound(lam, bits)
    report: dict[str, Any] = {"bits": float(bits), "bound_mse": bound, "mse": None, "score_mse": None, "gap_db": None}
    if x_hat is None:
        return report
    x_hat = np.asarray(x_hat, dtype=np.float32)
    if x_hat.shape != x.shape:
        raise ValueError(f"x_hat has shape {x_hat.shape}, x {x.shape}: they must match.")
    error = x.astype(np.float64) - x_hat
    error -= error.mean(axis=0)  # a constant offset moves every score of a query alike: it never changes a ranking
    mse = float(np.mean(np.sum(error ** 2, axis=1)))
    report.update(mse=mse, gap_db=gap_db(mse, bound))
    if queries is not None and len(queries):
        rows = np.arange(len(x)) if len(x) <= sample else np.sort(np.random.default_rng(seed).choice(len(x), sample, replace=False))
        q = np.asarray(queries, dtype=np.float32)
        qh = q if query_hat is None else np.asarray(query_hat, dtype=np.float32)
        exact = q @ x[rows].T
        approx = qh @ x_hat[rows].T
        score_error = exact.astype(np.float64) - approx
        score_error -= score_error.mean(axis=1, keepdims=True)  # per query, as above: only differences between documents rank
        report["score_mse"] = float(np.mean(score_error ** 2))
    return report
