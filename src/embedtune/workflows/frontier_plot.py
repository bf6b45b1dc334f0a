"""The frontier plot: quality against bytes per vector (log x), one colour per family, the Pareto frontier marked.

matplotlib is imported inside :func:`plot_frontier`: it is heavy, and only this plot needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from embedtune.io import atomic_write
from embedtune.workflows.pareto import pareto_frontier

__all__ = ["plot_frontier"]


def plot_frontier(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    title: str = "",
    x: str = "ram_bytes",
    y: str = "ndcg@10",
    group: Callable[[Mapping[str, Any]], str] | None = None,
    chosen: Mapping[str, Any] | None = None,
    x_label: str | None = None,
    frontier_of: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """Scatter ``y`` against ``x`` (log x), one colour per group, the Pareto frontier as a step line with labels.

    ``x`` is bytes per vector unless ``x_label`` names it (e.g. dollars a month): then the axis is log 10 with its own ticks.
    ``frontier_of``: the rows the frontier is drawn over (a plan's: those it may choose), every row by default.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    group = group or (lambda r: str(r.get("family", r.get("method", "?"))))
    fig, ax = plt.subplots(figsize=(10, 6.5))
    groups = sorted({group(r) for r in rows})
    markers = "os^Dv<>Ph*Xd"
    for i, name in enumerate(groups):
        members = [r for r in rows if group(r) == name]
        ax.scatter([r[x] for r in members], [r[y] for r in members], s=22, alpha=0.6, marker=markers[i % len(markers)], label=name)
    frontier = pareto_frontier(rows if frontier_of is None else frontier_of, x, y)
    xs = [r[x] for r in frontier]
    ys = [r[y] for r in frontier]
    ax.step(xs, ys, where="post", color="black", linewidth=1.2,
            label="Pareto frontier" + ("" if frontier_of is None else " of what the plan may choose"))
    ax.scatter(xs, ys, s=60, facecolors="none", edgecolors="black", linewidths=1.2)
    for r in frontier:
        ax.annotate(str(r.get("setting", "")), (r[x], r[y]), textcoords="offset points", xytext=(4, -10), fontsize=6.5, rotation=-20)
    if chosen is not None:
        ax.scatter([chosen[x]], [chosen[y]], s=180, marker="*", color="red", zorder=5, label=f"chosen: {chosen.get('setting', '')}")
    if x_label is not None:
        ax.set_xscale("log")
        ax.set_xlabel(f"{x_label} (log scale)")
    else:
        ax.set_xscale("log", base=2)
        values = [r[x] for r in rows]
        ticks = [t for t in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
                 if min(values) <= t <= max(values)]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("bytes per vector " + ("in RAM" if x == "ram_bytes" else "on disk" if x == "disk_bytes" else x) + " (log scale)")
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=130, format="png"))
    plt.close(fig)
    return path
