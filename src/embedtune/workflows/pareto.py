"""Reading a quality-per-byte sweep: its Pareto frontier, the best row within a budget, and the plan's choice.

Plain functions over rows (mappings with a byte count ``x``, default ``ram_bytes``, and a quality
``y``, default ``ndcg@10``), shared by ``compress plan`` (:func:`embedtune.workflows.plan.run_plan`)
and the frontier study (``benchmarks/frontier.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["pareto_frontier", "best_within", "choose"]


def pareto_frontier(rows: Sequence[Mapping[str, Any]], x: str = "ram_bytes", y: str = "ndcg@10") -> list[Mapping[str, Any]]:
    """The rows no other row beats: none has ``x`` at most theirs and ``y`` higher. Sorted by ``x``."""
    ordered = sorted(rows, key=lambda r: (r[x], -r[y]))
    frontier, best = [], -math.inf
    for row in ordered:
        if row[y] > best:
            frontier.append(row)
            best = row[y]
    return frontier


def best_within(rows: Sequence[Mapping[str, Any]], budget: float, x: str = "ram_bytes", y: str = "ndcg@10") -> Mapping[str, Any] | None:
    """The row with the highest ``y`` among those with ``x <= budget`` (ties: fewer bytes, then name order), or None."""
    eligible = [r for r in rows if r[x] <= budget]
    if not eligible:
        return None
    return max(eligible, key=lambda r: (r[y], -r[x], str(r.get("setting", ""))))


def choose(
    rows: Sequence[Mapping[str, Any]],
    budget_bytes: float | None = None,
    target_retention: float | None = None,
    reference: float | None = None,
    y: str = "ndcg@10",
    x: str = "ram_bytes",
) -> Mapping[str, Any]:
    """The plan's choice: the cheapest row keeping ``target_retention`` of ``reference``, or the best within ``budget_bytes``.

    With both, the cheapest row within the budget that meets the target. Raises when nothing qualifies,
    naming the closest row. ``x`` is a row's cost in bytes per vector: its codes (``ram_bytes``), or its codes and its
    tables' share (``amortized_bytes``).
    """
    if budget_bytes is None and target_retention is None:
        raise ValueError("give a byte budget (--budget-bytes) or a retention target (--target-retention).")
    pool = list(rows)
    if budget_bytes is not None:
        pool = [r for r in pool if r[x] <= budget_bytes]
        if not pool:
            cheapest = min(rows, key=lambda r: r[x])
            counted = "" if x == "ram_bytes" else " with its tables' share"
            raise ValueError(f"no setting fits {budget_bytes:g} bytes per vector{counted}; the cheapest is {cheapest['setting']} "
                             f"at {cheapest[x]:,.6g} bytes. Raise --budget-bytes or add smaller dims/precisions.")
    if target_retention is None:
        return best_within(pool, budget_bytes, x=x, y=y)  # type: ignore[arg-type,return-value]
    if reference is None or reference <= 0:
        raise ValueError("a retention target needs the reference score (the uncompressed float32 model's).")
    meeting = [r for r in pool if r[y] >= target_retention * reference]
    if not meeting:
        best = max(pool, key=lambda r: r[y])
        raise ValueError(f"no setting keeps {target_retention:.3f} of the reference {y} {reference:.4f}"
                         f"{'' if budget_bytes is None else f' within {budget_bytes:g} bytes'}; the best is {best['setting']} "
                         f"at {best[y] / reference:.3f}. Lower --target-retention or raise --budget-bytes.")
    return min(meeting, key=lambda r: (r[x], -r[y], str(r.get("setting", ""))))
