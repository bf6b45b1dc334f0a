"""One results file per run: ``OUT/results.json``, its layout, and the older names it replaces.

Every command (and library call) that finishes a run with an output folder writes
``OUT/results.json`` in one layout, with ``task`` saying which command wrote it:

.. code-block:: text

    {
      "schema": "embedtune-results/1",
      "embedtune_version": "0.4.0",
      "command": ["embedtune", "evaluate", "--model", "minilm", ...],   # argv, or None from Python
      "task": "evaluate",                                              # which command wrote it
      "config": {...}, "data": {...}, "model": {...},
      "metrics": {"ndcg_at_10": ..., "main_score": ...}, "per_query": {...}, "rows": [...], "table": "...",
      "details": {...}                                                 # the command's full record, where it has one
    }

``details`` holds what earlier releases wrote into a file of their own:

=========================  ======================================  ==========================
command                    earlier file (read, never written)      ``details``
=========================  ======================================  ==========================
``compress train``         ``report.json``                         the report
``diagnose``               ``report.json``                         the diagnosis
``pipeline``               ``pipeline_result.json``                the pipeline's summary
``finetune pace``          ``result.json``                         the training record
=========================  ======================================  ==========================

Readers go through :func:`read_results` or :func:`results_details`, which take a folder of an
earlier run too: with no ``results.json`` there, the older file is read and a deprecation note
is logged (and warned, as a ``DeprecationWarning``). :func:`write_results` is the one writer.
This module is a foundation layer (numpy and the standard library) so that the methods layer
(``finetune``) writes the same file as the workflows.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedtune import __version__
from embedtune.io import atomic_write_bytes, atomic_write_json

logger = logging.getLogger(__name__)

__all__ = [
    "format_table",
    "RESULTS_NAME",
    "TABLE_NAME",
    "SCHEMA",
    "LEGACY_SCHEMA",
    "REQUIRED_KEYS",
    "LEGACY_RESULT_NAMES",
    "json_safe",
    "mteb_metric_name",
    "mteb_metrics",
    "write_results",
    "find_results",
    "read_results",
    "results_details",
]

RESULTS_NAME = "results.json"
TABLE_NAME = "results.md"
SCHEMA = "embedtune-results/1"
# What read_results puts in ``schema`` for a file of an earlier release, converted on reading.
LEGACY_SCHEMA = "embedtune-results/legacy"
REQUIRED_KEYS = ("schema", "embedtune_version", "command", "task", "config", "data", "model", "metrics", "per_query", "rows", "table")
# embedtune's metric prefix -> MTEB's; "ndcg@10" -> "ndcg_at_10", "p@1" -> "precision_at_1".
_MTEB_PREFIX = {"ndcg": "ndcg", "recall": "recall", "p": "precision", "precision": "precision", "mrr": "mrr", "map": "map"}
# The names earlier releases wrote beside (or instead of) results.json, in the order a folder is searched.
LEGACY_RESULT_NAMES = ("report.json", "pipeline_result.json", "result.json")


def json_safe(value: Any) -> Any:
    """Plain JSON: numpy scalars to numbers, NaN/inf to None, tuples to lists, paths to strings."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    return str(value)


def mteb_metric_name(name: str) -> str:
    """``ndcg@10`` -> ``ndcg_at_10``, ``p@1`` -> ``precision_at_1``; a name without ``@k`` is kept."""
    base, sep, cutoff = name.partition("@")
    if not sep:
        return name
    prefix = base.rsplit("_", 1)
    head, metric = (prefix[0] + "_", prefix[1]) if len(prefix) == 2 else ("", base)
    return f"{head}{_MTEB_PREFIX.get(metric.lower(), metric.lower())}_at_{cutoff}"


def mteb_metrics(aggregate: Mapping[str, Any], main: str | None = "ndcg@10") -> dict[str, Any]:
    """Metrics under MTEB's names, plus ``main_score`` (the value of ``main``, when present)."""
    metrics = {mteb_metric_name(name): json_safe(value) for name, value in aggregate.items()}
    if main is not None and main in aggregate:
        metrics["main_score"] = json_safe(aggregate[main])
    return metrics


def _table_markdown(task: str, command: Sequence[str], table: str) -> str:
    shown = " ".join(command) if command else f"embedtune {task}"
    return f"# {task}\n\n`{shown}`\n\n```text\n{table.rstrip()}\n```\n"


def write_results(
    out: str | Path,
    *,
    task: str,
    command: Sequence[str] | None,
    config: Mapping[str, Any],
    data: Mapping[str, Any],
    model: Mapping[str, Any],
    metrics: Mapping[str, Any],
    per_query: Mapping[str, Mapping[str, Any]] | None = None,
    rows: Sequence[Mapping[str, Any]] = (),
    table: str = "",
    details: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``out/results.json`` (the layout in this module's docstring) and ``out/results.md``; return the JSON path.

    Args:
        out: the run's output folder (created).
        task: the command, e.g. ``"evaluate"`` or ``"compress train"``.
        command: its argv (``["embedtune", ...]``), or None when called from Python.
        config: the resolved settings.
        data: what was scored (``embedtune.workflows.results.describe_data``).
        model: the encoder (``embedtune.workflows.results.describe_model``).
        metrics: the headline result under MTEB's names with ``main_score``.
        per_query: the headline result's per-query values.
        rows: one mapping per scored row of the printed table, each with its own ``metrics``.
        table: the table exactly as the command printed it.
        details: the command's full record (what ``report.json``, ``pipeline_result.json`` or
            ``result.json`` held in earlier releases).
        extra: more top-level keys (they may not replace the layout's own).
    """
    out = Path(out)
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "embedtune_version": __version__,
        "command": list(command) if command else None,
        "task": task,
        "config": json_safe(config),
        "data": json_safe(data),
        "model": json_safe(model),
        "metrics": json_safe(metrics),
        "per_query": json_safe(per_query or {}),
        "rows": json_safe(list(rows)),
        "table": table,
    }
    if details is not None:
        document["details"] = json_safe(details)
    for key, value in (extra or {}).items():
        if key in document:
            raise ValueError(f"write_results: extra key {key!r} would replace the layout's own.")
        document[key] = json_safe(value)
    path = atomic_write_json(out / RESULTS_NAME, document)
    atomic_write_bytes(out / TABLE_NAME, _table_markdown(task, document["command"] or [], table).encode("utf-8"))
    return path


def find_results(folder: str | Path) -> Path | None:
    """``folder/results.json``, else the first older name (:data:`LEGACY_RESULT_NAMES`) there, else None."""
    folder = Path(folder)
    for name in (RESULTS_NAME, *LEGACY_RESULT_NAMES):
        if (folder / name).is_file():
            return folder / name
    return None


def _legacy_task(name: str, content: Mapping[str, Any]) -> str:
    if name == "pipeline_result.json":
        return "pipeline"
    if name == "result.json":
        return "finetune pace"
    return "compress train" if "comparisons" in content or "results" in content else "diagnose"


def _deprecated(path: Path) -> None:
    message = (f"{path}: read under its older name; embedtune now writes {RESULTS_NAME} (its 'details' hold what "
               f"{path.name} held). Rerun the command to write it, or keep reading this file: older names are read "
               "for one more release.")
    logger.warning(message)
    warnings.warn(message, DeprecationWarning, stacklevel=3)


def read_results(path: str | Path) -> dict[str, Any]:
    """Load a results file, or the folder holding one, in the layout of this module.

    A folder without ``results.json`` but with a file of an earlier release (``report.json``,
    ``pipeline_result.json``, ``result.json``), or such a file itself, is converted on reading:
    ``schema`` is :data:`LEGACY_SCHEMA`, ``task`` the command that wrote it, ``details`` its
    content, ``legacy_file`` its name; a deprecation note is logged.

    Raises:
        FileNotFoundError: no results file in the folder (the message lists the names looked for).
        ValueError: a ``results.json`` that lacks keys of the layout (named).
    """
    path = Path(path)
    if path.is_dir():
        found = find_results(path)
        if found is None:
            raise FileNotFoundError(f"{path}: no {RESULTS_NAME} (nor an older {', '.join(LEGACY_RESULT_NAMES)}); "
                                    "it is written by commands run with --out.")
        path = found
        if path.name == RESULTS_NAME:
            document = _read_layout(path)
            legacy = next((path.parent / name for name in LEGACY_RESULT_NAMES if (path.parent / name).is_file()), None)
            if "details" not in document and legacy is not None:  # an earlier release wrote both files
                document = {**document, "details": read_results(legacy)["details"], "legacy_file": legacy.name}
            return document
    document = json.loads(path.read_text(encoding="utf-8"))
    if path.name in LEGACY_RESULT_NAMES and not (isinstance(document, dict) and document.get("schema") == SCHEMA):
        _deprecated(path)
        content = document if isinstance(document, dict) else {"value": document}
        return {"schema": LEGACY_SCHEMA, "embedtune_version": None, "command": None, "task": _legacy_task(path.name, content),
                "config": content.get("config", {}), "data": {}, "model": {}, "metrics": {}, "per_query": {},
                "rows": content.get("rows", []), "table": "", "details": content, "legacy_file": path.name}
    return _check_layout(path, document)


def _read_layout(path: Path) -> dict[str, Any]:
    return _check_layout(path, json.loads(path.read_text(encoding="utf-8")))


def _check_layout(path: Path, document: Any) -> dict[str, Any]:
    missing = [key for key in REQUIRED_KEYS if key not in document] if isinstance(document, dict) else list(REQUIRED_KEYS)
    if missing:
        raise ValueError(f"{path}: not an embedtune results file (missing {missing}); it is written by commands with --out.")
    return document


def results_details(folder: str | Path) -> dict[str, Any] | None:
    """The ``details`` (the command's full record) of the results file in ``folder``, or None where there is none.

    An earlier run's ``report.json`` / ``pipeline_result.json`` / ``result.json`` is read whole,
    with a deprecation note, also beside a ``results.json`` of that release (which had no
    ``details``).
    """
    if find_results(folder) is None:
        return None
    return read_results(folder).get("details")


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """The rows as an aligned text table (what commands print and ``results.md`` keeps); floats
    with 4 decimals, a missing or None cell blank."""

    def cell(value: Any) -> str:
        if value is None:
            return ""
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    widths = {c: max([len(c), *(len(cell(r.get(c))) for r in rows)]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns), "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(cell(row.get(c)).ljust(widths[c]) for c in columns) for row in rows]
    return "\n".join(line.rstrip() for line in lines)
