"""Pieces shared by the DIVE protocol report and its "beyond the paper" sections: grouping runs,
paired tests between two groups, a Markdown table and a learning-curve PNG."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from embedtune.workflows.significance import PairedTest, align_by_query, paired_test

__all__ = ["group_runs", "paired_runs_test", "compare_runs", "md_table", "plot_curves"]


def group_runs(records: list[dict], study: str) -> dict[tuple, list[dict]]:
    """Runs tagged ``study`` (or ``study:label``), keyed by (backbone, dataset, dim, method, label).

    CQADupStack communities stay separate here; :func:`embedtune.bench.dive_report._collapse_communities` merges them.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        spec = record["spec"]
        if record.get("skipped"):
            continue
        for tag in spec.get("studies", []):
            name, _, label = tag.partition(":")
            if name == study:
                groups[(spec["backbone"], spec["dataset"], spec["dim"], spec["method"], label)].append(record)
    for runs in groups.values():
        by_seed: dict[int, str] = {}
        for record in runs:
            seed, key = record["spec"]["seed"], record["spec"]["key"]
            if seed in by_seed:
                # Two configs wrote into one folder (e.g. a method override changed): pooling them would mix settings.
                raise ValueError(
                    f"results for study {study!r} hold two runs of one setting and seed: {by_seed[seed]} and {key}. "
                    "Each protocol config needs its own --results folder; move one set of runs elsewhere."
                )
            by_seed[seed] = key
    return groups


def _per_query_mean(runs: list[dict], metric: str = "ndcg@10") -> dict[str, float]:
    queries = runs[0]["per_query"].keys()
    return {q: statistics.fmean(r["per_query"][q][metric] for r in runs) for q in queries}


def paired_runs_test(a_runs: list[dict], b_runs: list[dict], n_resamples: int) -> PairedTest:
    """Paired test of ``a − b`` on per-query nDCG@10, each side averaged over its seeds."""
    return paired_test(*align_by_query(_per_query_mean(a_runs), _per_query_mean(b_runs)), n_resamples)


def compare_runs(a_runs: list[dict], b_runs: list[dict], n_resamples: int) -> tuple[str, str, str]:
    """:func:`paired_runs_test` as text: ``(Δ, 95 % CI, p)``."""
    test = paired_runs_test(a_runs, b_runs, n_resamples)
    return f"{test.mean_difference:+.4f}", f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}]", f"{test.p_value:.4f}"


def plot_curves(path: Path, title: str, curves: dict[str, list[float]], ylabel: str) -> None:
    """A PNG of one line per curve against the epoch (1-based)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, values in curves.items():
        ax.plot(range(1, len(values) + 1), values, label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table: one header row, then ``rows`` (cells as ``str``)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
