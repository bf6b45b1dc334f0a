"""A protocol grid's records as the one results layout (:mod:`embedtune.workflows.results`).

``benchmark dive`` prints :func:`protocol_summary`'s table (the held-out main comparison) and
writes every group of runs (one per dataset, backbone, stage, method, settings and k, averaged
over its seeds) as a row of ``results.json``; ``REPORT.md`` stays the full report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from embedtune.compress import get_compressor_class
from embedtune.workflows.results import format_table, mteb_metric_name, mteb_metrics, per_query_scores

__all__ = ["protocol_rows", "protocol_summary"]

_TABLE_COLUMNS = ["dataset", "backbone", "method", "dim", "nDCG@10", "Recall@10", "runs"]


def _group_key(spec: Mapping[str, Any]) -> tuple:
    overrides = ",".join(f"{k}={v}" for k, v in sorted(spec.get("overrides", {}).items()))
    return spec["dataset"], spec["backbone"], spec["stage"], spec["method"], overrides, spec["dim"]


def protocol_rows(records: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per group of finished runs that differ only in their seed, in a stable order.

    Each row: the cell, the studies it serves, ``seeds`` (seed-dependent methods only), ``n_runs``,
    mean ``metrics`` under MTEB's names, ``std`` when more than one run, and for held-out test
    rows the per-query means. Skipped runs (an infeasible head count) are left out.
    """
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for record in records.values():
        if record.get("skipped") or not record.get("metrics"):
            continue
        groups.setdefault(_group_key(record["spec"]), []).append(record)
    rows = []
    for key in sorted(groups, key=lambda k: tuple(str(part) for part in k)):
        runs = sorted(groups[key], key=lambda r: r["spec"]["seed"])
        dataset, backbone, stage, method, overrides, dim = key
        names = list(runs[0]["metrics"])
        aggregate = {name: float(np.mean([run["metrics"][name] for run in runs])) for name in names}
        row: dict[str, Any] = {
            "dataset": dataset, "backbone": backbone, "stage": stage, "method": method, "settings": overrides or "default",
            "k": dim, "dim": runs[0].get("out_dim", dim), "heads": runs[0].get("heads"),
            "studies": sorted({study for run in runs for study in run["spec"].get("studies", [])}),
        }
        if get_compressor_class(method).seed_dependent:
            row["seeds"] = [run["spec"]["seed"] for run in runs]
        row["n_runs"] = len(runs)
        row["metrics"] = mteb_metrics({**aggregate, "n_queries": runs[0].get("n_queries")})
        if len(runs) > 1:
            row["std"] = {mteb_metric_name(name): float(np.std([run["metrics"][name] for run in runs], ddof=1)) for name in names}
        if stage == "test" and runs[0].get("per_query"):
            queries = sorted(runs[0]["per_query"])
            metric_names = list(runs[0]["per_query"][queries[0]]) if queries else []
            row["per_query"] = per_query_scores({qid: {name: float(np.mean([run["per_query"][qid][name] for run in runs]))
                                                       for name in metric_names} for qid in queries})
        rows.append(row)
    return rows


def _cell(row: Mapping[str, Any], metric: str) -> str:
    mean = row["metrics"].get(metric)
    if mean is None:
        return ""
    std = row.get("std", {}).get(metric)
    return f"{mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")


def protocol_summary(records: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], str]:
    """``(metrics, per_query, rows, table)`` of a grid.

    ``table``: the held-out main comparison, mean ± std over seeds only where a method ran more than once. The headline ``metrics`` are DIVE's
    held-out main-comparison scores: those of its one cell, or with several cells their mean over
    cells (``n_cells`` says how many; MTEB averages ``main_score`` over tasks the same way), with
    ``per_query`` only for a single cell.
    """
    rows = protocol_rows(records)
    main = [row for row in rows if row["stage"] == "test" and "main" in row["studies"]]
    table_rows = [{**row, "nDCG@10": _cell(row, "ndcg_at_10"), "Recall@10": _cell(row, "recall_at_10"), "runs": row["n_runs"]}
                  for row in main]
    table = format_table(table_rows, _TABLE_COLUMNS) if table_rows else "(no held-out main-comparison runs in this grid)"
    headline = [row for row in main if row["method"] == "dive"] or main[:1]
    metrics: dict[str, Any] = {}
    per_query: dict[str, Any] = {}
    if headline:
        names = [name for name in headline[0]["metrics"] if name not in ("n_queries", "main_score")]
        metrics = {name: float(np.mean([row["metrics"][name] for row in headline])) for name in names}
        if "ndcg_at_10" in metrics:
            metrics["main_score"] = metrics["ndcg_at_10"]
        metrics["n_cells"] = len(headline)
        if len(headline) == 1:
            per_query = headline[0].get("per_query", {})
    return metrics, per_query, rows, table
