"""Aggregation rules of the DIVE protocol: mean ± sample std over seeds, and CQADupStack's
equal-weight average over its communities (the paper's rule, §4.2)."""

from __future__ import annotations

import statistics
from typing import Iterable

__all__ = ["mean_std", "equal_weight_average"]


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and *sample* standard deviation (n − 1); the std of one value is 0.0."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_std needs at least one value.")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def equal_weight_average(per_community: dict[str, float]) -> float:
    """Average over communities with equal weight, whatever their query counts."""
    if not per_community:
        raise ValueError("no community scores to average.")
    return statistics.fmean(per_community.values())
