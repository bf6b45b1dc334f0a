"""How many corpus rows a plan fits and trains on: a sample sized by the data, so a plan's cost stops growing with the corpus.

The rule (:func:`fit_sample_size`): ``min(N, max(65,536, 100 * d))`` rows of an ``N x d`` corpus,
the one rule PCA applies on its own (:func:`embedtune.compress.pca.fit_sample_rows`), declared
there once. 65,536 is what the transform codecs already fit on (``FIT_SAMPLE``) and what FAISS's
k-means samples per 256-centroid codebook at most (256 points per centroid); ``100 * d`` keeps at
least 100 rows per dimension for a covariance (PCA, the KLT) of a wide model. The rows are a seeded random
sample in corpus order (:func:`fit_sample_rows`): the same corpus and seed give the same rows.
A caller may override the size (``compress plan --fit-sample``); the plan records what it used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embedtune.compress.pca import FIT_SAMPLE_MIN_ROWS, FIT_SAMPLE_ROWS_PER_DIM

__all__ = ["MIN_FIT_SAMPLE", "ROWS_PER_DIMENSION", "fit_sample_size", "fit_sample_rows", "fit_sample_record"]

#: The fewest rows the rule samples (unless the corpus is smaller), and the rows per dimension it keeps at least:
#: PCA's own constants, so a plan and a PCA fit sample alike.
MIN_FIT_SAMPLE = FIT_SAMPLE_MIN_ROWS
ROWS_PER_DIMENSION = FIT_SAMPLE_ROWS_PER_DIM
_RULE = f"min(N, max({MIN_FIT_SAMPLE:,}, {ROWS_PER_DIMENSION} * d))"


def fit_sample_size(n_rows: int, dim: int, override: int | None = None) -> int:
    """Rows to fit on: ``override`` (at most ``n_rows``) when given, else ``min(n_rows, max(65,536, 100 * dim))``.

    Raises:
        ValueError: ``override`` is below 1, or ``n_rows`` / ``dim`` is negative / not positive.
    """
    if n_rows < 0 or dim < 1:
        raise ValueError(f"a corpus has a non-negative row count and a positive dimension; got {n_rows} x {dim}.")
    if override is not None:
        if isinstance(override, bool) or int(override) < 1:
            raise ValueError(f"the fit sample is a positive number of rows (--fit-sample); got {override!r}.")
        return min(int(n_rows), int(override))
    return min(int(n_rows), max(MIN_FIT_SAMPLE, ROWS_PER_DIMENSION * int(dim)))


def fit_sample_rows(n_rows: int, size: int, seed: int = 2027) -> np.ndarray:
    """The rows of the sample: all of ``range(n_rows)`` when ``size >= n_rows``, else ``size`` of them drawn with ``seed``, ascending."""
    if size >= n_rows:
        return np.arange(n_rows, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n_rows, size=size, replace=False)).astype(np.int64)


def fit_sample_record(n_rows: int, dim: int, size: int, seed: int, override: int | None = None) -> dict[str, Any]:
    """What a plan records about its sample: the rows, of how many, the rule (or the override), the seed."""
    return {"rows": int(size), "of": int(n_rows), "share": (size / n_rows) if n_rows else None,
            "rule": f"--fit-sample {override}" if override is not None else _RULE, "seed": int(seed),
            "sampled": bool(size < n_rows)}
