"""Fit any registered compressor on a query-disjoint split and score it, the same way for all.

This is the one code path behind ``embedtune compress train``, ``make demo`` and the protocol
benchmark: shared deterministic triplets, ``fit`` on train (or train+val with ``final``),
``transform`` of the queries and the whole corpus, exact search, pytrec_eval.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import Compressor, get_compressor_class
from embedtune.data.triplets import check_mining_options, load_triplets, mine_triplets, mining_options, save_triplets
from embedtune.evaluate.metrics import RetrievalMetrics
from embedtune.experiment import Experiment, training_data

logger = logging.getLogger(__name__)

__all__ = ["MethodRun", "assert_no_test_queries", "shared_triplets", "build_config", "fit_and_evaluate", "summarize"]


@dataclass
class MethodRun:
    method: str
    dim: int
    seed: int
    eval_part: str
    metrics: RetrievalMetrics
    fit_seconds: float
    details: dict[str, Any] = field(default_factory=dict)
    compressor: Compressor | None = field(default=None, repr=False)

    def row(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "dim": self.dim,
            "seed": self.seed,
            "queries": self.eval_part,
            "ndcg@10": self.metrics["ndcg@10"],
            "recall@10": self.metrics["recall@10"],
            "n_queries": self.metrics.n_queries,
            "fit_s": round(self.fit_seconds, 2),
            **self.details,
        }


def shared_triplets(
    experiment: Experiment,
    part: str,
    n_negatives: int = 4,
    negatives: str = "hard",
    seed: int = 2027,
    path: str | Path | None = None,
    *,
    skip_top: int = 0,
    false_negative_margin: float | None = None,
    false_negative_reference: str = "pair",
    max_triplets_per_query: int | None = None,
) -> np.ndarray:
    """Mine (or reload from ``path``) the triplets of one split part; every method gets these.

    ``skip_top``, ``false_negative_margin``, ``false_negative_reference`` and
    ``max_triplets_per_query`` are :func:`embedtune.data.triplets.mine_triplets`'s false-negative
    filter and cap. The file at ``path`` is reused only if its metadata equals this call's; the
    options enter the metadata only when they differ from their defaults, so files mined before
    they existed still match a default call, and a file mined with other options never does.
    """
    check_mining_options(negatives, skip_top, false_negative_margin, false_negative_reference, max_triplets_per_query, where="shared_triplets")
    robust = mining_options(skip_top, false_negative_margin, false_negative_reference, max_triplets_per_query)
    query_ids = experiment.part_ids(part)
    meta = {
        "dataset": experiment.dataset.name,
        "qrels_split": experiment.dataset.split,
        "part": part,
        "split_seed": experiment.split.seed if experiment.split else None,
        "n_negatives": n_negatives,
        "negatives": negatives,
        "seed": seed,
        "source_sha256": experiment.dataset.fingerprints,
        **robust,
    }
    if path is not None and Path(path).is_file():
        stored = load_triplets(path)
        if stored.meta == meta:
            return stored.rows(query_ids, experiment.embeddings.doc_ids)
        logger.info("%s was mined with other settings; mining again", path)
    triplets = mine_triplets(
        query_ids,
        experiment.embeddings.queries(query_ids),
        experiment.embeddings.doc_ids,
        np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32),
        experiment.qrels_for(query_ids),
        n_negatives=n_negatives,
        negatives=negatives,  # type: ignore[arg-type]
        seed=seed,
        **robust,
    )
    if path is not None:
        save_triplets(path, triplets, query_ids, experiment.embeddings.doc_ids, meta)
    return triplets


def assert_no_test_queries(experiment: Experiment, parts: list[str]) -> None:
    """Selection studies must never see a held-out test query; fail loudly if one would."""
    if experiment.split is None:
        raise ValueError("selection runs need a query-disjoint split.")
    held_out = set(experiment.split.test)
    for part in parts:
        leaked = held_out.intersection(experiment.part_ids(part))
        if leaked:
            raise AssertionError(f"selection part {part!r} contains {len(leaked)} held-out test queries (e.g. {sorted(leaked)[0]!r}).")


def build_config(method: str, dim: int, seed: int, overrides: dict[str, Any] | None = None):
    """The method's config with ``dim``, ``seed`` and overrides; unknown keys are an error."""
    cls = get_compressor_class(method)
    known = {f.name for f in dataclasses.fields(cls.config_class)}
    values = {"dim": dim, "seed": seed}
    for key, value in (overrides or {}).items():
        if key not in known:
            raise ValueError(f"{method} has no setting {key!r}; valid settings: {', '.join(sorted(known))}.")
        values[key] = value
    return cls.config_class(**values)


def fit_and_evaluate(
    experiment: Experiment,
    method: str,
    dim: int,
    seed: int = 2027,
    final: bool = False,
    triplets: np.ndarray | None = None,
    overrides: dict[str, Any] | None = None,
    out_dir: str | Path | None = None,
) -> MethodRun:
    """Fit ``method`` on train (``final``: train+val) and evaluate on val (``final``: test)."""
    train_part, eval_part = ("train+val", "test") if final else ("train", "val")
    if not final:
        assert_no_test_queries(experiment, ["train", "val"])
    cls = get_compressor_class(method)
    compressor = cls(build_config(method, dim, seed, overrides))
    train = training_data(experiment, train_part, triplets if cls.supervised else None)
    fit_kwargs: dict[str, Any] = {}
    signature = inspect.signature(compressor.fit).parameters
    if not final and "val" in signature:
        fit_kwargs["val"] = training_data(experiment, "val")
    if out_dir is not None and "log_path" in signature:
        fit_kwargs["log_path"] = Path(out_dir) / "training_log.jsonl"
        Path(fit_kwargs["log_path"]).unlink(missing_ok=True)
    start = time.perf_counter()
    compressor.fit(train, **fit_kwargs)
    fit_seconds = time.perf_counter() - start
    eval_ids = experiment.part_ids(eval_part)
    queries = compressor.transform(experiment.embeddings.queries(eval_ids))
    docs = compressor.transform(experiment.embeddings.doc_embeddings)
    metrics = experiment.evaluate(eval_part, queries, docs)
    details: dict[str, Any] = {"out_dim": int(queries.shape[1])}
    if getattr(compressor, "heads_", None) is not None:
        details["heads"] = int(compressor.heads_)
    if out_dir is not None:
        compressor.save(out_dir)
    logger.info("%s k=%d seed=%d: nDCG@10 %.4f on %d %s queries (fit %.1fs)", method, dim, seed, metrics["ndcg@10"], metrics.n_queries, eval_part, fit_seconds)
    return MethodRun(method, dim, seed, eval_part, metrics, fit_seconds, details, compressor)


def summarize(runs: list[MethodRun], metrics: tuple[str, ...] = ("ndcg@10", "recall@10")) -> dict[str, Any]:
    """Mean and sample standard deviation over seeds (std is 0.0 for a single seed)."""
    summary: dict[str, Any] = {"method": runs[0].method, "dim": runs[0].details.get("out_dim", runs[0].dim), "seeds": [r.seed for r in runs]}
    for name in metrics:
        values = [r.metrics[name] for r in runs]
        summary[name] = statistics.fmean(values)
        summary[f"{name}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    summary["fit_s"] = statistics.fmean(r.fit_seconds for r in runs)
    summary.update({k: v for k, v in runs[0].details.items() if k == "heads"})
    return summary
