"""Fit a compressor with a named preset, over seeds, next to baselines: what ``compress train`` runs.

>>> from embedtune.workflows import load_experiment, fit_compressor
>>> experiment = load_experiment("scifact", "minilm")
>>> result = fit_compressor(experiment, "dive", 128, preset="robust", seeds=[2027], final=True,
...                         compare=["frozen", "pca"], out="runs/dive-128")   # doctest: +SKIP
>>> result.summaries["dive"]["ndcg@10"]                                       # doctest: +SKIP

Fitted compressors land at ``OUT/<method>/`` when one seed ran, and at ``OUT/<method>/seed-N/``
only when several did; ``OUT/report.json`` holds the report and ``OUT/triplets-<part>.json``
the shared triplets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import Preset, get_compressor_class
from embedtune.compress.presets import MiningOptions
from embedtune.data.triplets import explain_no_triplets
from embedtune.errors import NoQueriesError
from embedtune.io import atomic_write_json
from embedtune.workflows.experiment import Experiment
from embedtune.workflows.fit_and_score import MethodRun, fit_and_evaluate, summarize
from embedtune.workflows.triplets import shared_triplets

logger = logging.getLogger(__name__)

__all__ = ["CompressionResult", "fit_compressor", "compressor_dir", "resolve_preset", "REPORT_NAME"]

REPORT_NAME = "report.json"


@dataclass
class CompressionResult:
    """What :func:`fit_compressor` ran.

    Attributes:
        report: the JSON-safe report (also ``OUT/report.json``).
        runs: per method, one :class:`MethodRun` per seed, each holding its fitted compressor.
        summaries: per method, mean and sample std over seeds (see :func:`summarize`).
        preset: the preset applied to the main method.
        out: the output folder, or None.
    """

    report: dict[str, Any]
    runs: dict[str, list[MethodRun]]
    summaries: dict[str, dict[str, Any]]
    preset: Preset
    out: Path | None = None
    triplets: np.ndarray | None = field(default=None, repr=False)


def compressor_dir(out: str | Path, method: str, seed: int, n_seeds: int) -> Path:
    """Where a fitted compressor is saved: ``OUT/<method>/``, with ``seed-N/`` below only when several seeds ran."""
    return Path(out) / method if n_seeds == 1 else Path(out) / method / f"seed-{seed}"


def resolve_preset(method: str, preset: str | Preset | None) -> Preset:
    """A :class:`Preset` object, a preset name of ``method``, or None (the method's default preset)."""
    if isinstance(preset, Preset):
        return preset
    return get_compressor_class(method).get_preset(preset)


def _mining(preset: Preset, mining: MiningOptions | Mapping[str, Any] | None) -> MiningOptions:
    if mining is None:
        return preset.mining
    if isinstance(mining, MiningOptions):
        return mining
    return preset.mining.replace(**dict(mining))


def fit_compressor(
    experiment: Experiment,
    method: str = "dive",
    dim: int = 128,
    preset: str | Preset | None = None,
    seeds: Sequence[int] = (2027,),
    final: bool = False,
    settings: Mapping[str, Any] | None = None,
    mining: MiningOptions | Mapping[str, Any] | None = None,
    compare: Sequence[str] = (),
    out: str | Path | None = None,
    mining_seed: int | None = None,
    labels: Mapping[str, Any] | None = None,
) -> CompressionResult:
    """Fit ``method`` (and each ``compare`` method) on train, score it on val (``final``: train+val, test).

    Args:
        experiment: a dataset with embeddings and a query-disjoint split (:func:`load_experiment`).
        method: the registry name of the compressor to fit.
        dim: the output dimension k.
        preset: a :class:`Preset`, one of ``method``'s preset names, or None for its default
            (DIVE: :data:`embedtune.compress.ROBUST`). It sets config fields and the mining.
        seeds: training seeds; a method whose output does not depend on the seed runs once.
        final: train on train+val and score the held-out test queries.
        settings: config fields of ``method`` over the preset's (compared methods keep their defaults).
        mining: the triplet mining: a :class:`MiningOptions`, or a mapping of changes to the
            preset's (e.g. ``{"false_negative_margin": None}``).
        compare: more methods to fit and score beside ``method`` on the same triplets.
        out: folder for the fitted compressors, the triplets and ``report.json``.
        mining_seed: the mining seed (default: the experiment's split seed, else 2027).
        labels: more JSON-safe fields for the report, e.g. ``{"model": "minilm"}``.

    Returns:
        A :class:`CompressionResult`.
    """
    methods = [method] + [m for m in dict.fromkeys(compare) if m != method]
    classes = {m: get_compressor_class(m) for m in methods}  # fail fast on a typo, before any encoding
    chosen = resolve_preset(method, preset)
    overrides = {**chosen.settings, **(settings or {})}
    triplet_mining = _mining(chosen, mining)
    seeds = list(seeds)
    if not seeds:
        raise ValueError("fit_compressor: give at least one seed.")
    out = Path(out) if out is not None else None
    train_part = "train+val" if final else "train"
    if mining_seed is None:
        mining_seed = experiment.split.seed if experiment.split is not None else 2027
    needs_triplets = any(cls.supervised for cls in classes.values())
    triplets = None
    if needs_triplets:
        path = out / f"triplets-{train_part}.json" if out else None
        triplets = shared_triplets(experiment, train_part, triplet_mining, mining_seed, path)
        if len(triplets) == 0:
            train_ids = experiment.part_ids(train_part)
            step, why = explain_no_triplets(train_ids, experiment.embeddings.doc_ids, experiment.qrels_for(train_ids),
                                            skip_top=triplet_mining.skip_top,
                                            false_negative_margin=triplet_mining.false_negative_margin,
                                            false_negative_reference=triplet_mining.false_negative_reference)
            fix = {
                "false_negative_filter": "Loosen it with --false-negative-margin (e.g. 0.01), turn it off with "
                                         "--false-negative-margin none, or use --preset best.",
                "skip_top": "Lower skip_top.",
            }.get(step, "Check the qrels and the corpus of the training queries.")
            raise NoQueriesError(f"no training triplets survived mining ({train_part} queries): {why}. {fix}")
    runs: dict[str, list[MethodRun]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {}
    for name, cls in classes.items():
        method_seeds = seeds if cls.seed_dependent else seeds[:1]
        method_overrides = overrides if name == method else {}
        runs[name] = [
            fit_and_evaluate(experiment, name, dim, seed, final, triplets, method_overrides,
                             compressor_dir(out, name, seed, len(method_seeds)) if out else None)
            for seed in method_seeds
        ]
        summary = summarize(runs[name])
        summary["n_queries"] = runs[name][0].metrics.n_queries
        summaries[name] = summary
        results[name] = {"summary": summary, "runs": [run.row() for run in runs[name]]}
        history = runs[name][0].compressor.history_ if runs[name][0].compressor is not None else None
        if history and name == method:
            results[name]["history_seed0"] = history
    report: dict[str, Any] = {
        "dataset": experiment.dataset.name,
        **(labels or {}),
        "queries": "test (held-out)" if final else "val",
        "preset": chosen.name,
        "split_seed": experiment.split.seed if experiment.split is not None else None,
        "results": results,
    }
    if needs_triplets:
        report["triplets"] = {
            "negatives": triplet_mining.negatives,
            "n_negatives": triplet_mining.n_negatives,
            **triplet_mining.non_default(),
            "n_triplets": int(len(triplets)),  # type: ignore[arg-type]
        }
    if out:
        atomic_write_json(out / REPORT_NAME, report)
    return CompressionResult(report, runs, summaries, chosen, out, triplets)
