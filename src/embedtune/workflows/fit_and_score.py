"""Fit any registered compressor on a query-disjoint split and score it, the same way for all.

This is the one code path behind ``embedtune compress train``, ``make demo``, the pipeline and
the protocol benchmark: ``fit`` on train (or train+val with ``final``) with the shared triplets,
``transform`` of the queries and the whole corpus, exact search, pytrec_eval.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import Compressor, get_compressor_class
from embedtune.compress.base import PseudoQueries
from embedtune.evaluate.metrics import RetrievalMetrics
from embedtune.workflows.experiment import Experiment, training_data

logger = logging.getLogger(__name__)

__all__ = ["MethodRun", "assert_no_test_queries", "build_config", "fit_and_evaluate", "summarize"]


@dataclass
class MethodRun:
    """One fitted and scored (method, dim, seed); ``details`` holds ``out_dim`` and the method's ``fit_details()``."""

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
    pseudo_queries: PseudoQueries | None = None,
) -> MethodRun:
    """Fit ``method`` on train (``final``: train+val) and evaluate on val (``final``: test).

    With ``out_dir`` the fitted compressor is saved there, with its per-epoch log (for methods
    that write one) in ``training_log.jsonl``. ``pseudo_queries`` go to the training data of a
    supervised method (only those whose config weighs them use them).
    """
    train_part, eval_part = ("train+val", "test") if final else ("train", "val")
    if not final:
        assert_no_test_queries(experiment, ["train", "val"])
    cls = get_compressor_class(method)
    compressor = cls(build_config(method, dim, seed, overrides))
    train = training_data(experiment, train_part, triplets if cls.supervised else None)
    if cls.supervised and pseudo_queries is not None:
        train.pseudo_queries = pseudo_queries
    val = None if final else training_data(experiment, "val")
    log_path = None
    if out_dir is not None:
        log_path = Path(out_dir) / "training_log.jsonl"
        log_path.unlink(missing_ok=True)
    start = time.perf_counter()
    compressor.fit(train, val, log_path=log_path)
    fit_seconds = time.perf_counter() - start
    eval_ids = experiment.part_ids(eval_part)
    queries = compressor.transform(experiment.embeddings.queries(eval_ids))
    docs = compressor.transform(experiment.embeddings.doc_embeddings)
    metrics = experiment.evaluate(eval_part, queries, docs)
    details: dict[str, Any] = {"out_dim": int(queries.shape[1]), **compressor.fit_details()}
    if out_dir is not None:
        compressor.save(out_dir)
    seed_label = f" seed={seed}" if cls.seed_dependent else ""
    logger.debug("%s (%d-d)%s: nDCG@10 %.4f on %d %s queries (fit %.1fs)", method, details["out_dim"], seed_label, metrics["ndcg@10"],
                 metrics.n_queries, eval_part, fit_seconds)
    return MethodRun(method, dim, seed, eval_part, metrics, fit_seconds, details, compressor)


def summarize(runs: list[MethodRun], metrics: tuple[str, ...] = ("ndcg@10", "recall@10")) -> dict[str, Any]:
    """Mean and sample standard deviation over seeds (std is None for a single run: there is no spread)."""
    summary: dict[str, Any] = {"method": runs[0].method, "dim": runs[0].details.get("out_dim", runs[0].dim), "seeds": [r.seed for r in runs]}
    for name in metrics:
        values = [r.metrics[name] for r in runs]
        summary[name] = statistics.fmean(values)
        summary[f"{name}_std"] = statistics.stdev(values) if len(values) > 1 else None
    summary["fit_s"] = statistics.fmean(r.fit_seconds for r in runs)
    summary.update({k: v for k, v in runs[0].details.items() if k != "out_dim"})
    return summary
