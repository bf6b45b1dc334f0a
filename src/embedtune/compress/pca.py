"""PCA (Jolliffe & Cadima 2016): project centred embeddings onto the top-``k`` principal axes.

``pca(x) = W (x − μ)``, normalised, where ``μ`` is the corpus mean and the rows of
``W ∈ R^{k×d}`` are the top-``k`` right singular vectors of the centred corpus matrix. The DIVE
paper (§4.8, Table 4) fits it on the frozen corpus embeddings (``train.doc_embeddings``) with no
retrieval labels; queries are projected with the same mean and axes.

The axes are the top eigenvectors of the scatter matrix ``Σ_n (x_n − μ)(x_n − μ)ᵀ``, accumulated
in float64 blocks so the corpus never has to be copied whole (Quora's 523k × 4096 matrix would
need 17 GB in float64); they equal the SVD's right singular vectors. Signs follow
scikit-learn's ``svd_flip(u_based_decision=False)``: the largest-magnitude entry of every
component is positive, so the fit is deterministic.

A large corpus is fitted on a sample (:func:`fit_sample_rows`): ``min(N, max(65536, 100·d))``
rows drawn with the config's seed, by default. The top axes of a d×d scatter matrix are settled
long before millions of rows (the sample's retention matched the full fit's, see ``compress fit
--help``), and the fit then costs the same at 3M rows as at 77k. ``fit_sample=0`` fits on every
row, as before; every corpus up to the sample size is fitted on every row anyway (the fit then
does not depend on the seed).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import ClassVar, Any

import numpy as np

from embedtune.constraints import Constraint, Options
from embedtune.compress.base import Compressor, CompressorConfig, TrainingData, check_output_dim
from embedtune.compress.export_layers import ExportLayer, linear_layers
from embedtune.compress.registry import register
from embedtune.runtime import map_single_threaded, single_threaded, thread_budget

logger = logging.getLogger(__name__)

__all__ = ["PCAConfig", "PCACompressor", "UncentredPCAConfig", "UncentredPCACompressor", "flip_signs", "principal_axes",
           "fit_sample_rows", "FIT_SAMPLE_MIN_ROWS", "FIT_SAMPLE_ROWS_PER_DIM"]

_BLOCK_ROWS = 16384
#: The default sample: at least this many rows ...
FIT_SAMPLE_MIN_ROWS = 65536
#: ... and at least this many per input dimension (a d×d scatter matrix has d² / 2 entries to settle).
FIT_SAMPLE_ROWS_PER_DIM = 100
FIT_SAMPLE_HELP = (f"rows PCA is fitted on: 'auto' = min(N, max({FIT_SAMPLE_MIN_ROWS}, {FIT_SAMPLE_ROWS_PER_DIM}·d)) rows drawn "
                   "with the seed (ArguAna, MiniLM, k=128: samples of only 10.7·d rows kept nDCG@10 retention within 0.004 of the "
                   "full fit's, benchmarks/pca_fit_sample.py, so a fit takes seconds at millions of rows); a number: that many "
                   "(at most N); 0 or 'all': every row")


def parse_fit_sample(value: int | str) -> int | str:
    """``fit_sample`` as stored: ``"auto"``, or a row count (0 = every row; ``"all"`` is read as 0)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "all"):
            return "auto" if text == "auto" else 0
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"fit_sample must be 'auto', 'all' or a row count >= 0; got {value!r}.") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"fit_sample must be 'auto', 'all' or a row count >= 0; got {value!r}.")
    return value


def fit_sample_rows(n: int, d: int, fit_sample: int | str = "auto") -> int:
    """How many of ``n`` rows of ``d`` dimensions PCA is fitted on under the rule ``fit_sample``."""
    rule = parse_fit_sample(fit_sample)
    if rule == "auto":
        return min(n, max(FIT_SAMPLE_MIN_ROWS, FIT_SAMPLE_ROWS_PER_DIM * d))
    return n if rule == 0 else min(n, int(rule))


@dataclass
class PCAConfig(CompressorConfig):
    """``dim`` (the number of components ``k``) and whether to centre."""

    center: bool = field(
        default=True,
        metadata={"help": "Subtract the corpus mean before projecting (classic PCA). False projects the raw vector onto "
                  "the same axes: DIVE's init='pca' start, for unit-norm input."},
    )

    fit_sample: int | str = field(default="auto", metadata={"help": FIT_SAMPLE_HELP})

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {"center": [Options((True, False))]}

    def __post_init__(self) -> None:
        super().__post_init__()
        self.fit_sample = parse_fit_sample(self.fit_sample)


@dataclass
class UncentredPCAConfig(PCAConfig):
    """:class:`PCAConfig` with ``center=False`` by default (the ``pca-uncentred`` baseline)."""

    center: bool = field(default=False, metadata={"help": PCAConfig.__dataclass_fields__["center"].metadata["help"]})


def flip_signs(components: np.ndarray) -> np.ndarray:
    """Make the largest-|·| entry of each row positive (scikit-learn's V-based ``svd_flip``)."""
    pivots = np.argmax(np.abs(components), axis=1)
    signs = np.sign(components[np.arange(len(components)), pivots])
    signs[signs == 0] = 1.0
    return components * signs[:, None]


def principal_axes(xb: np.ndarray, k: int, complete_basis: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, top-``k`` principal axes and their variances of the rows of ``xb``.

    ``complete_basis`` allows ``k`` up to ``d`` with fewer than ``k`` rows: the axes beyond the
    data's rank are then an orthonormal completion (zero variance), e.g. for a full rotation.

    Returns:
        ``mean`` (d,) float64, ``components`` (k, d) float64 with sign-normalised unit rows
        ordered by decreasing variance, ``explained_variance`` (k,) float64 (scatter / (n − 1)).
    """
    n, d = xb.shape
    if not 1 <= k <= (d if complete_basis else min(n, d)):
        raise ValueError(f"pca: dim={k} needs 1 <= dim <= min(n_docs={n}, d={d}).")
    mean = np.zeros(d, dtype=np.float64)
    for start in range(0, n, _BLOCK_ROWS):
        mean += xb[start : start + _BLOCK_ROWS].sum(axis=0, dtype=np.float64)
    mean /= n
    # The scatter is a sum of per-block products, each a BLAS call on one thread, added in block order: the same axes on
    # any thread count. The blocks are computed side by side, a few at a time, so no more than that many d × d
    # scatters are held.
    starts = range(0, n, _BLOCK_ROWS)
    workers = max(1, min(thread_budget(), len(starts)))

    def block_scatter(start: int) -> np.ndarray:
        centred = np.subtract(xb[start : start + _BLOCK_ROWS], mean, dtype=np.float64)
        return centred.T @ centred  # one operand: BLAS syrk

    scatter = np.zeros((d, d), dtype=np.float64)
    for first in range(0, len(starts), workers):
        for part in map_single_threaded(block_scatter, starts[first : first + workers], workers):
            scatter += part
    with single_threaded():
        eigenvalues, eigenvectors = np.linalg.eigh(scatter)  # ascending
    top = np.argsort(eigenvalues, kind="stable")[::-1][:k]
    components = flip_signs(eigenvectors[:, top].T)
    explained_variance = np.maximum(eigenvalues[top], 0.0) / max(n - 1, 1)
    return mean, components, explained_variance


@register
class PCACompressor(Compressor):
    """Centre with the corpus mean (unless ``center=False``), project onto the top-``k`` components, normalise.

    Attributes:
        mean_ : ndarray of shape (d,), float32. Corpus mean.
        components_ : ndarray of shape (k, d), float32. Principal axes, one per row.
        explained_variance_ : ndarray of shape (k,), float32. Variance along each axis.
    """

    method = "pca"
    non_finite_input_reaches_output = True
    config_class = PCAConfig
    supervised = False
    supports_unsupervised = True
    seed_dependent = False
    help = "corpus PCA onto the top-k principal axes"

    def __init__(self, config: PCAConfig | None = None) -> None:
        super().__init__(config)
        self.mean_: np.ndarray | None = None
        self.components_: np.ndarray | None = None
        self.explained_variance_: np.ndarray | None = None
        self.fit_rows_: int | None = None

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        check_output_dim(self.method, self.config.dim, train.dim)
        start = time.perf_counter()
        rows = train.doc_embeddings
        picked = self.fit_rows(len(rows), train.dim)
        if picked is not None:
            rows = np.asarray(rows[picked])
        m = len(rows)
        self.fit_rows_ = m
        mean, components, variance = principal_axes(rows, self.config.dim)
        # Uncentred: the same axes, applied to the raw vector (a zero mean keeps one transform and one export).
        self.mean_ = mean.astype(np.float32) if self.config.center else np.zeros_like(mean, dtype=np.float32)
        self.components_ = np.ascontiguousarray(components, dtype=np.float32)
        self.explained_variance_ = variance.astype(np.float32)
        n_docs, d = train.doc_embeddings.shape
        logger.debug("pca: %d components of %d of %d docs x %d-d in %.2fs", self.config.dim, m, n_docs, d, time.perf_counter() - start)

    def fit_rows(self, n_docs: int, dim: int) -> np.ndarray | None:
        """``fit_sample``'s rows of an ``n_docs`` × ``dim`` corpus: drawn with the config's seed, or None when it keeps every row."""
        m = fit_sample_rows(n_docs, dim, self.config.fit_sample)
        if m >= n_docs:
            return None
        # Sorted row numbers: a memory-mapped corpus is read front to back.
        return np.sort(np.random.default_rng(self.config.seed).choice(n_docs, size=m, replace=False))

    def fit_details(self) -> dict[str, Any]:
        """The rows the axes were fitted on (``fit_sample``'s rule applied to this corpus)."""
        return {} if self.fit_rows_ is None else {"fit_rows": int(self.fit_rows_), "fit_sample": self.config.fit_sample}

    def _transform(self, X: np.ndarray) -> np.ndarray:
        assert self.mean_ is not None and self.components_ is not None
        # W (x - mu) as W x - W mu, the exported Dense layer's form: no centred copy of X, a pass over
        # memory that cost about half as much as the product itself (768 -> 128).
        out = X @ self.components_.T
        if self.mean_.any():
            out -= self.mean_ @ self.components_.T
        return out

    def export_layers(self) -> list[ExportLayer]:
        """``W (x − μ) = W x − W μ``: one ``Dense`` with weight ``W`` and bias ``−W μ``, then ``Normalize``."""
        self._check_fitted()
        assert self.mean_ is not None and self.components_ is not None
        components = self.components_.astype(np.float64)
        return linear_layers(self.components_, -(components @ self.mean_.astype(np.float64)))

    def _state_dict(self) -> dict[str, np.ndarray]:
        assert self.mean_ is not None and self.components_ is not None and self.explained_variance_ is not None
        return {"mean": self.mean_, "components": self.components_, "explained_variance": self.explained_variance_}

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        mean = np.asarray(state["mean"], dtype=np.float32)
        components = np.ascontiguousarray(state["components"], dtype=np.float32)
        if components.shape != (self.config.dim, self.input_dim_) or mean.shape != (self.input_dim_,):
            raise ValueError(
                f"expected mean ({self.input_dim_},) and components ({self.config.dim}, {self.input_dim_}); "
                f"got {mean.shape} and {components.shape}."
            )
        self.mean_, self.components_ = mean, components
        self.explained_variance_ = np.asarray(state["explained_variance"], dtype=np.float32)


@register
class UncentredPCACompressor(PCACompressor):
    """PCA's axes without centring: ``W x``, normalised (``PCAConfig(center=False)``).

    DIVE's ``init="pca"`` start is this projection (for unit-norm input), so comparing DIVE with
    the stronger of ``pca`` and ``pca-uncentred`` separates what training adds from what the
    start gives.
    """

    method = "pca-uncentred"
    config_class = UncentredPCAConfig
    help = "corpus PCA axes without centring (DIVE's PCA-rotated start)"
