"""Embedding-geometry diagnostics of PACE (Figure 2a, Figure 4): angular–norm coupling,
directional anisotropy, and the PCA view of directions coloured by norm.

Plain numpy helpers (float32 in, numbers/arrays out) and the PNG figures. Loading a model and
embedding a BEIR split for them is :func:`embedtune.workflows.diagnose.diagnose_model`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GeometryReport",
    "angular_norm_coupling",
    "random_pair_cosine",
    "pca_2d",
    "norm_percentiles",
    "plot_norm_pca",
    "plot_coupling",
    "diagnose_embeddings",
]


def _rows(x: np.ndarray, name: str) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (n, d); got {x.shape}.")
    return x


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, np.finfo(np.float32).tiny)


def angular_norm_coupling(xq: np.ndarray, xp: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Pearson ``r`` between the standardised ``log(‖q‖·‖p⁺‖)`` and ``cos(q, p⁺)`` over matched pairs.

    Figure 4(a): direct dot-product training gives a strongly negative ``r`` (paper: -0.78),
    PACE a near-zero one (paper: -0.11).

    Args:
        xq: queries, shape (n, d); xp: their positives, shape (n, d), row-aligned.

    Returns:
        ``(r, z, cos)``: ``z`` the standardised log norm product and ``cos`` the cosines, shape (n,).
    """
    xq, xp = _rows(xq, "xq"), _rows(xp, "xp")
    assert xq.shape == xp.shape, f"xq {xq.shape} and xp {xp.shape} must be row-aligned pairs"
    if len(xq) < 3:
        raise ValueError(f"need at least 3 pairs for a correlation; got {len(xq)}.")
    log_norm_product = np.log(np.linalg.norm(xq, axis=1).astype(np.float64)) + np.log(np.linalg.norm(xp, axis=1).astype(np.float64))
    spread = log_norm_product.std()
    cos = np.sum(_unit(xq).astype(np.float64) * _unit(xp).astype(np.float64), axis=1)
    # Norms equal up to float32 rounding (e.g. a model ending in Normalize) leave r undefined.
    if spread < 1e-5 or cos.std() < 1e-7:
        return float("nan"), np.zeros_like(log_norm_product), cos
    z = (log_norm_product - log_norm_product.mean()) / spread
    r = float(np.corrcoef(z, cos)[0, 1])
    return r, z, cos


def random_pair_cosine(xq: np.ndarray, xc: np.ndarray, n_pairs: int = 10000, seed: int = 0) -> tuple[float, np.ndarray]:
    """Cosines of uniformly random (query, candidate) pairs (Figure 2b, Figure 4b); higher = more anisotropic.

    Returns:
        ``(mean, cosines)`` with ``cosines`` of shape (n_pairs,).
    """
    xq, xc = _rows(xq, "xq"), _rows(xc, "xc")
    rng = np.random.default_rng(seed)
    qi = rng.integers(len(xq), size=n_pairs)
    ci = rng.integers(len(xc), size=n_pairs)
    cos = np.sum(_unit(xq)[qi] * _unit(xc)[ci], axis=1)
    return float(cos.mean()), cos


def pca_2d(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First two principal components of ``x`` (centred SVD).

    Returns:
        ``(projected, explained_variance_ratio)``: shapes (n, 2) and (2,).
    """
    x = _rows(x, "x").astype(np.float64)
    centred = x - x.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    variance = singular**2
    return (centred @ vt[:2].T).astype(np.float32), (variance[:2] / max(variance.sum(), 1e-300)).astype(np.float32)


def norm_percentiles(x: np.ndarray) -> np.ndarray:
    """Percentile rank (0-100) of each row's L2 norm within ``x``."""
    norms = np.linalg.norm(_rows(x, "x"), axis=1)
    ranks = np.argsort(np.argsort(norms, kind="stable"), kind="stable")
    return (100.0 * ranks / max(len(norms) - 1, 1)).astype(np.float32)


def plot_norm_pca(xq: np.ndarray, xc: np.ndarray, path: str | Path, title: str = "") -> Path:
    """PNG of the PCA projection of the L2-normalised embeddings, coloured by norm percentile
    (Figure 2a / Figure 7): circles are queries, triangles candidates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xq, xc = _rows(xq, "xq"), _rows(xc, "xc")
    both = np.concatenate([xq, xc])
    projected, ratio = pca_2d(_unit(both))
    percentile = norm_percentiles(both)
    fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=120)
    n = len(xq)
    ax.scatter(projected[:n, 0], projected[:n, 1], c=percentile[:n], cmap="viridis", vmin=0, vmax=100, s=8, marker="o", label="queries")
    points = ax.scatter(projected[n:, 0], projected[n:, 1], c=percentile[n:], cmap="viridis", vmin=0, vmax=100, s=10, marker="^", label="candidates")
    fig.colorbar(points, ax=ax, label="L2-norm percentile")
    ax.set_xlabel(f"PC1 ({100 * ratio[0]:.1f}%)")
    ax.set_ylabel(f"PC2 ({100 * ratio[1]:.1f}%)")
    ax.set_title(title or "PCA of L2-normalised embeddings")
    ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_coupling(z: np.ndarray, cos: np.ndarray, r: float, path: str | Path, title: str = "") -> Path:
    """PNG scatter of the standardised log norm product against cos(q, p⁺) (Figure 4a)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4), dpi=120)
    ax.scatter(z, cos, s=6, alpha=0.6)
    ax.set_xlabel("standardised log(‖q‖·‖p⁺‖)")
    ax.set_ylabel("cos(q, p⁺)")
    ax.set_title(f"{title} r = {r:.3f}".strip())
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


@dataclass
class GeometryReport:
    """Diagnostics of one model on one sample of matched pairs.

    Attributes:
        coupling_r: Pearson r(standardised log(‖q‖·‖p⁺‖), cos(q, p⁺)).
        random_pair_cosine: mean cosine of random (query, candidate) pairs.
        positive_cosine: mean cos(q, p⁺).
        query_norm / candidate_norm: mean and std of the norms.
        figures: written PNG paths.
    """

    n_pairs: int
    coupling_r: float
    random_pair_cosine: float
    positive_cosine: float
    query_norm_mean: float
    query_norm_std: float
    candidate_norm_mean: float
    candidate_norm_std: float
    figures: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: an undefined statistic (NaN) becomes ``None``."""
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}


def diagnose_embeddings(
    xq: np.ndarray, xp: np.ndarray, out_dir: str | Path | None = None, n_random_pairs: int = 10000, seed: int = 0, label: str = ""
) -> GeometryReport:
    """All diagnostics for row-aligned (query, positive) embeddings; PNGs go to ``out_dir`` if given."""
    xq, xp = _rows(xq, "xq"), _rows(xp, "xp")
    r, z, cos = angular_norm_coupling(xq, xp)
    random_mean, _ = random_pair_cosine(xq, xp, n_random_pairs, seed)
    q_norms, p_norms = np.linalg.norm(xq, axis=1), np.linalg.norm(xp, axis=1)
    figures: dict[str, str] = {}
    if out_dir is not None:
        out_dir = Path(out_dir)
        figures["pca"] = str(plot_norm_pca(xq, xp, out_dir / "pca_norm_percentile.png", title=f"{label} PCA, coloured by norm percentile".strip()))
        figures["coupling"] = str(plot_coupling(z, cos, r, out_dir / "angular_norm_coupling.png", title=label))
    return GeometryReport(
        n_pairs=len(xq),
        coupling_r=r,
        random_pair_cosine=random_mean,
        positive_cosine=float(cos.mean()),
        query_norm_mean=float(q_norms.mean()),
        query_norm_std=float(q_norms.std()),
        candidate_norm_mean=float(p_norms.mean()),
        candidate_norm_std=float(p_norms.std()),
        figures=figures,
    )
