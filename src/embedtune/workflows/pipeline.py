"""Fine-tune, then compress: PACE on the train qrels, a compressor on the fine-tuned embeddings, evaluation.

``run_pipeline`` chains the two halves of embedtune on one dataset, with one split shared by
both so that no test query is ever trained on:

1. PACE fine-tunes the model on the (query, positive) pairs of ``qrels/<train_split>.tsv``;
2. the corpus and queries are embedded with the fine-tuned model (ranked by its training
   similarity: dot product after a PACE Stage II);
3. each compressor is fitted on the same train queries (the ``beir-train`` protocol: train
   qrels, ``val_fraction`` held out for selection) and evaluated once on every judged query of
   ``qrels/<test_split>.tsv``, next to the uncompressed model and, optionally, the base model
   under the same compressors.

The run is resumable: a finished fine-tuning (``<out>/finetune/results.json``, or the
``result.json`` of an earlier release) is reused when its recipe matches, embeddings come from
the embedding cache, and the result is written atomically to ``<out>/results.json`` (the summary
in its ``details``; ``pipeline_result.json`` in earlier releases).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from embedtune.compress import get_compressor_class
from embedtune.data.beir import load_beir
from embedtune.evaluate.subsets import query_subsets, training_positives
from embedtune.finetune.recipe import train_pace
from embedtune.result_files import RESULTS_NAME, find_results, results_details, write_results
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.fit_and_score import fit_and_evaluate
from embedtune.workflows.pipeline_config import PipelineConfig
from embedtune.workflows.results import describe_data, pipeline_summary
from embedtune.workflows.significance import align_by_query, paired_test
from embedtune.workflows.subset_report import SUBSET_DEFINITION
from embedtune.workflows.triplets import shared_triplets

logger = logging.getLogger(__name__)

__all__ = ["PipelineConfig", "run_pipeline", "paired_comparisons", "subset_comparisons", "compressor_dir", "RESULT_NAME",
           "COMPRESSORS_DIR"]

RESULT_NAME = RESULTS_NAME
# What earlier releases wrote the summary into (still read by embedtune.result_files, never written).
LEGACY_RESULT_NAME = "pipeline_result.json"
COMPRESSORS_DIR = "compressors"
# PACEConfig fields that do not change the trained weights: a finished run with other values is reused.
_RECIPE_NEUTRAL = {"output_dir", "save_steps", "logging_steps", "deepspeed", "precision", "preset"}


def _finished_finetune(directory: Path, pace_config: Any) -> dict[str, Any] | None:
    """The saved PACE result in ``directory`` if its recipe matches ``pace_config``; else None.

    The training record is ``results.json``'s ``details`` (an earlier release's ``result.json`` is
    read too, with a deprecation note)."""
    result_path = find_results(directory)
    if result_path is None:
        return None
    saved = results_details(directory)
    if not isinstance(saved, dict):
        return None
    wanted = {k: v for k, v in pace_config.to_dict().items() if k not in _RECIPE_NEUTRAL}
    found = {k: v for k, v in saved.get("config", {}).items() if k not in _RECIPE_NEUTRAL}
    if wanted != found:
        changed = sorted(k for k in set(wanted) | set(found) if wanted.get(k) != found.get(k))
        raise ValueError(
            f"{result_path}: a fine-tuning with another recipe is already there (fields {changed} differ); "
            "choose a new --out, or delete that folder to retrain."
        )
    if not Path(saved.get("model_dir", "")).is_dir():
        return None
    return saved


def _per_query_ndcg(metrics: Any) -> dict[str, float]:
    return {qid: values["ndcg@10"] for qid, values in sorted(metrics.per_query.items())}


def _label(row: dict[str, Any]) -> str:
    return row["method"] + (f" ({row['variant']})" if row["variant"] else "")


def subset_comparisons(rows: list[dict[str, Any]], groups: dict[str, list[str]], n_resamples: int = 10_000) -> dict[str, Any]:
    """:func:`paired_comparisons` restricted to the ``seen`` and to the ``unseen`` test queries, with counts."""
    out: dict[str, Any] = {"definition": SUBSET_DEFINITION, "counts": {name: len(ids) for name, ids in groups.items()}}
    for subset in ("seen", "unseen"):
        keep = set(groups[subset])
        if not keep:
            out[subset] = []
            continue
        restricted = [{**row, "per_query_ndcg@10": {q: v for q, v in row["per_query_ndcg@10"].items() if q in keep}} for row in rows]
        out[subset] = paired_comparisons(restricted, n_resamples)
    return out


def paired_comparisons(rows: list[dict[str, Any]], n_resamples: int = 10_000) -> list[dict[str, Any]]:
    """Paired tests on per-query nDCG@10 (means over seeds) between the pipeline's rows.

    Within each model, every compressor and the uncompressed ``full`` row against ``dive``
    (unit heads); across models, the fine-tuned minus the base model for the same compressor.
    Each entry: ``{"a", "b", "mean_a", "mean_b", "difference", "ci_low", "ci_high", "p_value", "n_queries"}``.
    """
    groups: dict[tuple[str, str], list[dict[str, float]]] = {}
    for row in rows:
        groups.setdefault((row["model"], _label(row)), []).append(row["per_query_ndcg@10"])
    means = {key: {q: statistics.fmean(run[q] for run in runs) for q in runs[0]} for key, runs in groups.items()}
    pairs = [((model, name), (model, "dive")) for model, name in means if name != "dive" and (model, "dive") in means]
    pairs += [(("finetuned", name), ("base", name)) for model, name in means if model == "finetuned" and ("base", name) in means]
    comparisons = []
    for a, b in pairs:
        scores_a, scores_b = align_by_query(means[a], means[b])
        test = paired_test(scores_a, scores_b, n_resamples)
        comparisons.append({"a": f"{a[0]}: {a[1]}", "b": f"{b[0]}: {b[1]}",
                            "mean_a": float(scores_a.mean()), "mean_b": float(scores_b.mean()),
                            "difference": test.mean_difference, "ci_low": test.ci_low, "ci_high": test.ci_high,
                            "p_value": test.p_value, "n_queries": test.n_queries})
    return comparisons


def compressor_dir(out_dir: str | Path, label: str, method: str, variant: str = "", seed: int | None = None) -> Path:
    """Where ``run_pipeline`` saves a fitted compressor: ``OUT/compressors/<model>/<method>[-<variant>][/s<seed>]``.

    ``label`` is ``finetuned`` (pair it with ``OUT/finetune/model``) or ``base`` (the base model).
    """
    folder = Path(out_dir) / COMPRESSORS_DIR / label / (method + (f"-{variant}" if variant else ""))
    return folder / f"s{seed}" if seed is not None else folder


def _evaluate_model(
    model: str, similarity: str, label: str, pace_config: Any, config: PipelineConfig, out_dir: Path
) -> list[dict[str, Any]]:
    experiment = load_experiment(
        pace_config.data, model, config.test_split, config.split_seed, protocol="beir-train", val_fraction=config.val_fraction,
        encoder_options={"normalize": similarity == "cosine", "max_seq_length": pace_config.max_seq_length, "show_progress": True},
    )
    full = experiment.evaluate("test")
    # No "seed" on rows that no seed shaped (the uncompressed model, seed-free compressors).
    rows = [{"model": label, "similarity": similarity, "method": "full", "variant": "", "dim": experiment.embeddings.dim,
             "ndcg@10": full["ndcg@10"], "recall@10": full["recall@10"], "n_queries": full.n_queries,
             "metrics": dict(full.aggregate), "per_query_ndcg@10": _per_query_ndcg(full)}]
    preset = get_compressor_class("dive").get_preset(config.dive_preset)
    mining = config.mining if config.mining is not None else preset.mining
    triplets = shared_triplets(experiment, "train+val", mining, config.split_seed, out_dir / "triplets" / f"{label}.json")
    runs = [(method, "", config.compressor_overrides.get(method, {})) for method in config.methods]
    runs += [(overrides.get("method", "dive"), name, {k: v for k, v in overrides.items() if k != "method"})
             for name, overrides in config.variants.items()]
    for method, variant, overrides in runs:
        cls = get_compressor_class(method)
        if method == "dive":
            overrides = {**preset.settings, **overrides}
        for seed in config.seeds if cls.seed_dependent else config.seeds[:1]:  # a seed-free method runs once
            # Saved, so that the combination scored here can be deployed: the fine-tuned model + this compressor.
            folder = compressor_dir(out_dir, label, method, variant, seed if cls.seed_dependent else None)
            run = fit_and_evaluate(experiment, method, config.dim, seed, final=True, triplets=triplets, overrides=overrides,
                                   out_dir=folder)
            rows.append({"model": label, "similarity": similarity, "method": method, "variant": variant,
                         "dim": run.details.get("out_dim", config.dim), **({"seed": seed} if cls.seed_dependent else {}),
                         "compressor": str(folder),
                         "ndcg@10": run.metrics["ndcg@10"], "recall@10": run.metrics["recall@10"], "n_queries": run.metrics.n_queries,
                         "fit_seconds": run.fit_seconds, "metrics": dict(run.metrics.aggregate),
                         "per_query_ndcg@10": _per_query_ndcg(run.metrics)})
    return rows


def run_pipeline(pace_config: Any, config: PipelineConfig, out_dir: str | Path) -> dict[str, Any]:
    """Fine-tune with ``pace_config``, compress with ``config``, evaluate; return (and save) the result.

    Args:
        pace_config: a :class:`embedtune.finetune.PACEConfig`; its ``output_dir`` is replaced by
            ``<out_dir>/finetune``.
        config: the compressors and the evaluation.
        out_dir: the run folder (``finetune/``, ``triplets/``, ``compressors/`` with every fitted
            compressor (see :func:`compressor_dir`), ``results.json`` with the summary in its ``details``).

    Returns:
        ``{"model_dir", "similarity", "rows", "comparisons", "seconds", ...}``; each row is one
        (model, method, seed) with held-out nDCG@10, Recall@10, the per-query nDCG@10 and the
        folder of its saved compressor (``compressor``);
        ``comparisons`` are the paired tests of :func:`paired_comparisons`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pace_config = dataclasses.replace(pace_config, output_dir=str(out_dir / "finetune"))
    if pace_config.train_split == config.test_split:
        raise ValueError(f"pipeline: PACE trains on qrels/{pace_config.train_split}.tsv, which is also the test split; "
                         "pick a different --test-split (or --train-split).")
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    saved = _finished_finetune(out_dir / "finetune", pace_config)
    if saved is None:
        result = train_pace(pace_config)
        model_dir, similarity = result.model_dir, result.similarity
    else:
        logger.info("pipeline: reusing the finished fine-tuning in %s", out_dir / "finetune")
        model_dir, similarity = saved["model_dir"], saved["similarity"]
    seconds["finetune"] = time.perf_counter() - start

    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    rows += _evaluate_model(model_dir, similarity, "finetuned", pace_config, config, out_dir)
    seconds["finetuned_compress_eval"] = time.perf_counter() - start
    if config.compare_base:
        start = time.perf_counter()
        rows += _evaluate_model(pace_config.model, "cosine", "base", pace_config, config, out_dir)
        seconds["base_compress_eval"] = time.perf_counter() - start
    summary = {
        "model_dir": model_dir,
        "similarity": similarity,
        "data": pace_config.data,
        "protocol": f"beir-train: fit on qrels/{pace_config.train_split}.tsv, test on every judged query of qrels/{config.test_split}.tsv",
        "pipeline_config": dataclasses.asdict(config),
        "rows": rows,
        "comparisons": paired_comparisons(rows),
        "seconds": seconds,
    }
    # Seen and unseen relative to the train qrels, which both the fine-tuning and the compressors fitted on.
    seen = training_positives(load_beir(pace_config.data, pace_config.train_split).qrels)
    test_qrels = load_beir(pace_config.data, config.test_split).qrels
    groups = query_subsets({q: test_qrels[q] for q in rows[0]["per_query_ndcg@10"] if q in test_qrels}, seen)
    for row in rows:
        for subset in ("seen", "unseen"):
            ids = [q for q in groups[subset] if q in row["per_query_ndcg@10"]]
            row[f"ndcg@10_{subset}"] = statistics.fmean(row["per_query_ndcg@10"][q] for q in ids) if ids else None
    summary["subsets"] = subset_comparisons(rows, groups)
    _write_summary(out_dir, summary, pace_config, config)
    return summary


def _write_summary(out_dir: Path, summary: dict[str, Any], pace_config: Any, config: PipelineConfig) -> Path:
    """``out_dir/results.json`` (``task: "pipeline"``, the summary as ``details``); ``embedtune pipeline``
    rewrites it with its argv and printed table."""
    metrics, per_query, rows = pipeline_summary(summary, (config.methods or ["dive"])[0])
    model = {"name": "finetuned", "path": summary["model_dir"], "similarity": summary["similarity"], "base": str(pace_config.model)}
    data = describe_data(load_beir(pace_config.data, config.test_split), queries=f"every judged query of qrels/{config.test_split}.tsv",
                         train_split=pace_config.train_split)
    return write_results(out_dir, task="pipeline", command=None, config=summary["pipeline_config"], data=data, model=model,
                         metrics=metrics, per_query=per_query, rows=rows, details=summary,
                         extra={"comparisons": summary["comparisons"]})
