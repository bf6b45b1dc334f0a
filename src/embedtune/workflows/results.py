"""One results layout for every command that scores something, and an MTEB-format export.

Each such command writes ``OUT/results.json``:

.. code-block:: text

    {
      "schema": "embedtune-results/1",
      "embedtune_version": "0.4.0",
      "command": ["embedtune", "evaluate", "--model", "minilm", ...],   # argv, or the API call
      "task": "evaluate",                                              # which command wrote it
      "config": {...},                                                 # the resolved settings
      "data": {"name", "source", "split", "queries", "fingerprints": {file: sha256}},
      "model": {"name", "path", "fingerprint", ...},                  # the encoder of the embeddings
      "metrics": {"ndcg_at_10": ..., "recall_at_10": ..., "main_score": ...},   # the headline result
      "per_query": {query_id: {"ndcg_at_10": ..., ...}},               # of the headline result
      "rows": [{..., "metrics": {...}}],                               # every scored row of the table
      "table": "<the table the command printed>",
      "details": {...}                                                 # the command's full record, where it has one
    }

next to ``OUT/results.md``, the same table as printed. Metric names are MTEB's (``ndcg_at_10``,
``precision_at_1``, ``main_score``: nDCG@10 for retrieval), so the numbers read the same as an
MTEB result. :func:`write_mteb_result` writes ``OUT/mteb/<TaskName>.json`` in MTEB's own result
format when a run scored a whole qrels split, the only case an MTEB score compares with.

The file's name, writer and readers (which also take the older ``report.json``,
``pipeline_result.json`` and ``result.json`` of earlier runs) live in
:mod:`embedtune.result_files`, re-exported here.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embedtune import __version__
from embedtune.data.beir import BeirDataset
from embedtune.encoders.dataset import DatasetEmbeddings
from embedtune.io import atomic_write_json
from embedtune.result_files import (
    LEGACY_RESULT_NAMES,
    REQUIRED_KEYS,
    RESULTS_NAME,
    SCHEMA,
    TABLE_NAME,
    find_results,
    format_table,
    json_safe,
    mteb_metric_name,
    mteb_metrics,
    read_results,
    results_details,
    write_results,
)
from embedtune.workflows.fit_and_score import MethodRun

if TYPE_CHECKING:  # train_compressor prints through this module's tables
    from embedtune.workflows.experiment import Experiment
    from embedtune.workflows.train_compressor import CompressionResult

__all__ = [
    "RESULTS_NAME",
    "TABLE_NAME",
    "MTEB_DIR",
    "SCHEMA",
    "REQUIRED_KEYS",
    "mteb_metric_name",
    "mteb_metrics",
    "per_query_scores",
    "describe_data",
    "describe_model",
    "mteb_task_name",
    "json_safe",
    "write_results",
    "write_mteb_result",
    "installed_mteb_version",
    "read_results",
    "results_details",
    "find_results",
    "LEGACY_RESULT_NAMES",
    "write_compression_results",
    "runs_summary",
    "compression_rows",
    "pipeline_summary",
    "format_table",
    "mmeb_summary",
]

MTEB_DIR = "mteb"
# The MTEB release whose result format (TaskResult: scores[split] = [{..., "main_score", "hf_subset", "languages"}])
# write_mteb_result follows; a string, since MTEB releases before 1.12.x parse the field with packaging.Version.
MTEB_FORMAT_VERSION = "2.26.24"

# BEIR folder names -> MTEB task names, so that OUT/mteb/<TaskName>.json sits beside MTEB's own results.
_MTEB_TASKS = {
    "scifact": "SciFact", "arguana": "ArguAna", "nfcorpus": "NFCorpus", "fiqa": "FiQA2018", "scidocs": "SCIDOCS",
    "trec-covid": "TRECCOVID", "quora": "QuoraRetrieval", "nq": "NQ", "hotpotqa": "HotpotQA", "msmarco": "MSMARCO",
    "fever": "FEVER", "climate-fever": "ClimateFEVER", "dbpedia-entity": "DBPedia", "webis-touche2020": "Touche2020",
    "touche2020": "Touche2020",
}
# Languages of the datasets above (all English); other datasets get none rather than a guess.
_ENGLISH = set(_MTEB_TASKS)


def per_query_scores(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """``{query_id: {metric: value}}`` under MTEB's metric names, query ids sorted."""
    return {str(qid): {mteb_metric_name(name): json_safe(value) for name, value in values.items()} for qid, values in sorted(per_query.items())}


def describe_data(dataset: BeirDataset, queries: str | None = None, **extra: Any) -> dict[str, Any]:
    """The dataset's name, source, qrels split, which queries were scored, and each file's sha256."""
    return json_safe({"name": dataset.name, "source": dataset.source, "split": dataset.split, "queries": queries,
                      "fingerprints": dict(sorted(dataset.fingerprints.items())), **extra})


def describe_model(embeddings: DatasetEmbeddings | None = None, name: str | None = None, **extra: Any) -> dict[str, Any]:
    """The encoder behind ``embeddings`` (name, folder, sha256 of its files, text recipe), or just ``name``."""
    described = dict(embeddings.model) if embeddings is not None and embeddings.model else {}
    if name is not None:
        described.setdefault("name", name)
    if embeddings is not None:
        described.setdefault("dim", embeddings.dim)
    return json_safe({**described, **extra})


def mteb_task_name(dataset_name: str) -> str:
    """MTEB's task name of a BEIR dataset (``scifact`` -> ``SciFact``); other names are kept."""
    return _MTEB_TASKS.get(dataset_name.lower(), dataset_name)


def installed_mteb_version() -> tuple[str, str]:
    """``(version, source)``: the installed mteb's version, else :data:`MTEB_FORMAT_VERSION` and a note saying
    that mteb is not installed. Read from the package metadata, so mteb (heavy) is never imported."""
    try:
        return importlib.metadata.version("mteb"), "the installed mteb"
    except importlib.metadata.PackageNotFoundError:
        return MTEB_FORMAT_VERSION, ("mteb is not installed: the MTEB release whose result format this file follows "
                                     "(written by embedtune in MTEB's layout)")


def write_mteb_result(
    out: str | Path,
    dataset_name: str,
    split: str,
    metrics: Mapping[str, Any],
    evaluation_time: float | None = None,
    languages: Sequence[str] | None = None,
    dataset_sha256: Mapping[str, str] | None = None,
) -> Path:
    """``out/mteb/<TaskName>.json`` in MTEB's result format, for one scored qrels split.

    ``metrics``: embedtune's names (``ndcg@10``...) or MTEB's; pass
    :func:`~embedtune.evaluate.metrics.mteb_retrieval_metrics` for the set MTEB itself reports
    (nDCG, MAP, recall, precision and MRR at 1 to 1000). ``languages`` defaults to
    ``["eng-Latn"]`` for the English BEIR datasets MTEB knows, else ``[]``.

    MTEB itself did not run: ``written_by`` says so, and ``embedtune_version`` what did.
    ``mteb_version`` is the installed mteb's version when mteb is installed, else
    :data:`MTEB_FORMAT_VERSION`, the MTEB release whose ``TaskResult`` reads this file as written
    (a string either way, as MTEB's loader requires); ``mteb_version_source`` says which of the
    two it is (tests/test_cli_details.py loads the file with ``TaskResult`` where mteb
    is installed). A local BEIR copy
    has no Hugging Face revision: ``dataset_revision`` says so, and ``dataset_sha256`` (and
    results.json) hold its files' sha256.
    """
    task_name = mteb_task_name(dataset_name)
    if languages is None:
        languages = ["eng-Latn"] if dataset_name.lower() in _ENGLISH else []
    scores = mteb_metrics(metrics) if any("@" in name for name in metrics) else json_safe(dict(metrics))
    mteb_version, mteb_source = installed_mteb_version()
    document = {
        "task_name": task_name,
        "dataset_revision": "dataset revision not available (a local BEIR copy; see dataset_sha256)",  # MTEB requires a string
        "dataset_sha256": dict(sorted((dataset_sha256 or {}).items())),
        "mteb_version": mteb_version,
        "mteb_version_source": mteb_source,
        "written_by": f"embedtune {__version__}, in MTEB's result layout (MTEB itself did not run)",
        "embedtune_version": __version__,
        "evaluation_time": evaluation_time,
        "kg_co2_emissions": None,
        "scores": {split: [{**scores, "hf_subset": "default", "languages": list(languages)}]},
    }
    safe_name = re.sub(r"[^A-Za-z0-9._-]", "_", task_name)
    return atomic_write_json(Path(out) / MTEB_DIR / f"{safe_name}.json", json_safe(document))


def runs_summary(runs: Sequence[MethodRun]) -> dict[str, Any]:
    """Mean metrics over ``runs`` (one per seed) under MTEB's names, their per-query means, and the
    sample std of each metric only when more than one run exists (one run has no spread)."""
    names = list(runs[0].metrics.aggregate)
    aggregate = {name: float(np.mean([run.metrics[name] for run in runs])) for name in names}
    queries = sorted(runs[0].metrics.per_query)
    per_query = {qid: {name: float(np.mean([run.metrics.per_query[qid][name] for run in runs])) for name in names} for qid in queries}
    summary: dict[str, Any] = {
        "n_runs": len(runs),
        "metrics": mteb_metrics({**aggregate, "n_queries": runs[0].metrics.n_queries}),
        "per_query": per_query_scores(per_query),
    }
    if len(runs) > 1:
        summary["std"] = {mteb_metric_name(name): float(np.std([run.metrics[name] for run in runs], ddof=1)) for name in names}
    return summary


def compression_rows(result: CompressionResult) -> list[dict[str, Any]]:
    """One row per method of a :func:`~embedtune.workflows.fit_compressor` run: its output dim, the
    seeds it ran (seed-free methods: none), fit time, and :func:`runs_summary`."""
    rows = []
    for method, runs in result.runs.items():
        first = runs[0]
        row: dict[str, Any] = {"method": method, "dim": first.details.get("out_dim", first.dim), "queries": first.eval_part,
                               **{k: v for k, v in first.details.items() if k != "out_dim"}}
        if first.compressor is None or type(first.compressor).seed_dependent:
            row["seeds"] = [run.seed for run in runs]
        if "selected_epoch" in first.details:  # best-epoch selection: the epoch each seed kept (0 = the untrained start)
            row["selected_epochs"] = [run.details.get("selected_epoch") for run in runs]
        row["fit_seconds"] = float(np.mean([run.fit_seconds for run in runs]))
        rows.append({**row, **runs_summary(runs)})
    return rows


def write_compression_results(
    out: str | Path,
    result: CompressionResult,
    experiment: Experiment,
    method: str,
    *,
    command: Sequence[str] | None = None,
    config: Mapping[str, Any] | None = None,
    model_name: str | None = None,
    table: str = "",
) -> Path:
    """``out/results.json`` of a :func:`~embedtune.workflows.fit_compressor` run (``task: "compress train"``).

    The headline is ``method``'s row; ``details`` is the full report (``result.report``, the
    ``report.json`` of earlier releases). :func:`fit_compressor` writes it with ``command=None``;
    ``compress train`` rewrites it with its argv, flags and printed table.
    """
    rows = compression_rows(result)
    main = next(row for row in rows if row["method"] == method)
    compressor = result.runs[method][0].compressor
    resolved = {**(config or {}), "method": method, "preset": result.preset.name,
                "compressor": compressor.config.to_dict() if compressor is not None else None,
                "triplets": result.report.get("triplets")}
    data = describe_data(experiment.dataset, queries=result.report["queries"], split_seed=result.report.get("split_seed"))
    provenance = experiment.provenance or {}
    model = describe_model(experiment.embeddings, name=provenance.get("model", model_name or result.report.get("model")),
                           **({"vectors": provenance["vectors"]} if "vectors" in provenance else {}))
    return write_results(out, task="compress train", command=command, config=resolved, data=data, model=model,
                         metrics=main["metrics"], per_query=main["per_query"], rows=rows, table=table, details=result.report,
                         extra={key: result.report[key] for key in ("subsets", "new_documents") if key in result.report})


def pipeline_summary(result: Mapping[str, Any], method: str) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """``(metrics, per_query, rows)`` of a :func:`~embedtune.workflows.run_pipeline` result for :func:`write_results`.

    The headline is the fine-tuned model under ``method`` (no variant), mean over its seeds; each
    row keeps its own metrics and per-query nDCG@10 under MTEB's names.
    """
    rows = []
    for row in result["rows"]:
        aggregate = row.get("metrics") or {"ndcg@10": row["ndcg@10"], "recall@10": row["recall@10"]}
        plain = {key: value for key, value in row.items() if key not in ("metrics", "per_query_ndcg@10", "ndcg@10", "recall@10")}
        rows.append({**plain, "metrics": mteb_metrics({**aggregate, "n_queries": row["n_queries"]}),
                     "per_query": {qid: {"ndcg_at_10": value} for qid, value in sorted(row["per_query_ndcg@10"].items())}})
    chosen = [row for row in result["rows"] if row["model"] == "finetuned" and row["method"] == method and not row.get("variant")]
    if not chosen:
        return {}, {}, rows
    names = list(chosen[0].get("metrics") or {"ndcg@10": None, "recall@10": None})
    aggregate = {name: float(np.mean([(row.get("metrics") or row)[name] for row in chosen])) for name in names}
    queries = sorted(chosen[0]["per_query_ndcg@10"])
    per_query = {qid: {"ndcg_at_10": float(np.mean([row["per_query_ndcg@10"][qid] for row in chosen]))} for qid in queries}
    return mteb_metrics({**aggregate, "n_queries": chosen[0]["n_queries"]}), per_query, rows


# The MMEB groups evaluate_mmeb reports beside each dataset's Precision@1 (PACE Table 1).
_MMEB_GROUPS = ("classification", "vqa", "retrieval", "grounding", "ind", "ood", "overall")


def mmeb_summary(result: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(metrics, rows)`` of an MMEB evaluation (:func:`embedtune.evaluate.mmeb.evaluate_mmeb`):
    the group means as ``precision_at_1`` per group, ``main_score`` the overall one; one row per dataset."""
    metrics = {f"{group}_precision_at_1": json_safe(result[group]) for group in _MMEB_GROUPS if group in result}
    if "overall" in result:
        metrics["main_score"] = json_safe(result["overall"])
    rows = [{"dataset": name, "metrics": {"precision_at_1": json_safe(score), "main_score": json_safe(score)}}
            for name, score in result.get("per_dataset", {}).items()]
    return metrics, rows
