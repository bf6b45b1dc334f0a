"""Fit a compressor with a named preset, over seeds, next to baselines: what ``compress train`` runs.

>>> from embedtune.workflows import load_experiment, fit_compressor
>>> experiment = load_experiment("scifact", "minilm")
>>> result = fit_compressor(experiment, "dive", 128, preset="robust", seeds=[2027], final=True,
...                         compare=["frozen", "pca"], out="runs/dive-128")   # doctest: +SKIP
>>> result.summaries["dive"]["ndcg@10"]                                       # doctest: +SKIP

Fitted compressors land at ``OUT/<method>/`` when one seed ran, and at ``OUT/<method>/seed-N/``
only when several did; ``OUT/results.json`` holds the report (its ``details``; ``report.json``
in earlier releases) and ``OUT/triplets-<part>.json`` the shared triplets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import Preset, describe_method, get_compressor_class
from embedtune.compress.presets import SAFETY_NET_MINING, MiningOptions
from embedtune.data.triplets import explain_no_triplets
from embedtune.errors import NoQueriesError
from embedtune.workflows.experiment import Experiment
from embedtune.workflows.fit_and_score import MethodRun, fit_and_evaluate, summarize
from embedtune.evaluate.subsets import subset_means
from embedtune.workflows.results import write_compression_results
from embedtune.workflows.new_documents import NewDocuments, score_new_documents, withhold_new_documents
from embedtune.workflows.pseudo_queries import recipe_pseudo_queries
from embedtune.workflows.significance import align_by_query, paired_test
from embedtune.workflows.subset_report import per_query_means, subset_block
from embedtune.workflows.triplets import shared_triplets

logger = logging.getLogger(__name__)

__all__ = ["CompressionResult", "fit_compressor", "compressor_dir", "resolve_preset", "selected_epochs", "training_notes",
           "require_mined_triplets", "with_both_pca_variants",
           "REPORT_NAME", "PCA_VARIANTS", "UNTRAINED_WON"]

# The file earlier releases wrote the report into; now results.json's "details" (embedtune.result_files).
REPORT_NAME = "report.json"
#: The PCA baselines DIVE's gain is reported against (the stronger of them): centred and uncentred.
PCA_VARIANTS = ("pca", "pca-uncentred")
#: What the output says when best-epoch selection kept epoch 0.
UNTRAINED_WON = "the untrained initialisation won"


@dataclass
class CompressionResult:
    """What :func:`fit_compressor` ran.

    Attributes:
        report: the JSON-safe report (also ``OUT/results.json``'s ``details``).
        runs: per method, one :class:`MethodRun` per seed, each holding its fitted compressor.
        summaries: per method, mean and sample std over seeds (see :func:`summarize`), with
            ``selected_epochs`` (one per seed) for methods that select their epoch.
        preset: the preset applied to the main method.
        out: the output folder, or None.
        comparisons: per compared method, the paired test of the main method against it on
            per-query nDCG@10 (per-query means over seeds): ``mean_difference`` (main − other),
            ``p_value``, ``ci_low``, ``ci_high``, ``n_queries``.
        notes: plain-language lines about what training did (e.g. :data:`UNTRAINED_WON`) and the
            main method's gain over the stronger PCA variant.
    """

    report: dict[str, Any]
    runs: dict[str, list[MethodRun]]
    summaries: dict[str, dict[str, Any]]
    preset: Preset
    out: Path | None = None
    triplets: np.ndarray | None = field(default=None, repr=False)
    comparisons: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: All, seen and unseen (see :mod:`embedtune.workflows.subset_report`); None when no method is supervised.
    subsets: dict[str, Any] | None = None
    #: The new-documents protocol's block (``fit_compressor(new_documents=...)``), else None.
    new_documents: dict[str, Any] | None = None


def compressor_dir(out: str | Path, method: str, seed: int, n_seeds: int) -> Path:
    """Where a fitted compressor is saved: ``OUT/<method>/``, with ``seed-N/`` below only when several seeds ran."""
    return Path(out) / method if n_seeds == 1 else Path(out) / method / f"seed-{seed}"


def resolve_preset(method: str, preset: str | Preset | None) -> Preset:
    """A :class:`Preset` object, a preset name of ``method``, or None (the method's default preset)."""
    if isinstance(preset, Preset):
        return preset
    return get_compressor_class(method).get_preset(preset)


def with_both_pca_variants(method: str, compare: Sequence[str]) -> list[str]:
    """``compare`` with the other PCA variant added when one is there and ``method`` is supervised.

    A supervised method's gain is reported against the stronger of centred and uncentred PCA
    (DIVE's PCA-rotated start is the uncentred one), so the pair of :data:`PCA_VARIANTS` is
    compared together. ``compress train`` calls this before :func:`fit_compressor`.

    Raises:
        ValueError: ``method`` is not a registered compressor.
    """
    compare = list(compare)
    present = [name for name in PCA_VARIANTS if name in compare]
    if present and get_compressor_class(method).supervised:
        return [*compare, *(name for name in PCA_VARIANTS if name not in compare and name != method)]
    return compare


def _mining(preset: Preset, mining: MiningOptions | Mapping[str, Any] | None, supervised_main: bool = True) -> MiningOptions:
    # An unsupervised main method has no mining of its own: supervised methods compared beside it
    # get the safety net's mining, as they would as the main method.
    base = preset.mining if supervised_main else SAFETY_NET_MINING
    if mining is None:
        return base
    if isinstance(mining, MiningOptions):
        return mining
    return base.replace(**dict(mining))


def selected_epochs(runs: Sequence[MethodRun]) -> list[int] | None:
    """The epoch each run's best-epoch selection kept (0 = the untrained start), or None when the method does not select."""
    epochs = [getattr(run.compressor, "selected_epoch_", None) if run.compressor is not None else None for run in runs]
    return None if any(epoch is None for epoch in epochs) else [int(epoch) for epoch in epochs]  # type: ignore[arg-type]


def training_notes(method: str, epochs: Sequence[int] | None) -> list[str]:
    """Plain lines about what best-epoch selection kept; says :data:`UNTRAINED_WON` when it kept epoch 0."""
    if not epochs:
        return []
    if all(epoch == 0 for epoch in epochs):
        runs = "every seed" if len(epochs) > 1 else "the run"
        return [f"{method}: selection kept epoch 0 on {runs}: {UNTRAINED_WON} (no trained epoch beat its start on the held-out selection data)."]
    if any(epoch == 0 for epoch in epochs):
        n = sum(epoch == 0 for epoch in epochs)
        return [f"{method}: selection kept epoch 0 on {n} of {len(epochs)} seeds ({UNTRAINED_WON} there); epochs {list(epochs)}."]
    return []


def _queries_label(experiment: Experiment, final: bool) -> str:
    if not final:
        return "val"
    if experiment.split is not None and experiment.split.qrels_split.startswith("train+"):
        return f"all judged {experiment.split.qrels_split.split('+', 1)[1]}"
    return "test (held-out)"


def _per_query_mean(runs: Sequence[MethodRun]) -> dict[str, float]:
    """Per-query nDCG@10, averaged over a method's seeds."""
    queries = runs[0].metrics.per_query
    return {qid: float(np.mean([run.metrics.per_query[qid]["ndcg@10"] for run in runs])) for qid in queries}


def _compare(main: Sequence[MethodRun], other: Sequence[MethodRun]) -> dict[str, Any]:
    a, b = align_by_query(_per_query_mean(main), _per_query_mean(other))
    return paired_test(a, b).to_dict()


def require_mined_triplets(experiment: Experiment, part: str, triplets: np.ndarray, mining: MiningOptions) -> None:
    """Raise, naming the mining step that emptied them and the fix, if no triplet was mined for ``part``."""
    if len(triplets) > 0:
        return
    train_ids = experiment.part_ids(part)
    step, why = explain_no_triplets(train_ids, experiment.embeddings.doc_ids, experiment.qrels_for(train_ids),
                                    skip_top=mining.skip_top,
                                    false_negative_margin=mining.false_negative_margin,
                                    false_negative_reference=mining.false_negative_reference)
    fix = {
        "false_negative_filter": "Loosen it with --false-negative-margin (e.g. 0.01), turn it off with "
                                 "--false-negative-margin none, or use --preset best.",
        "skip_top": "Lower skip_top.",
    }.get(step, "Check the qrels and the corpus of the training queries.")
    raise NoQueriesError(f"no training triplets survived mining ({part} queries): {why}. {fix}")


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
    new_documents: float | None = None,
    pseudo_queries: str | None = None,
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
        out: folder for the fitted compressors, the triplets and ``results.json`` (the report in its ``details``).
        mining_seed: the mining seed (default: the experiment's split seed, else 2027).
        labels: more JSON-safe fields for the report, e.g. ``{"model": "minilm"}``.
        new_documents: withhold this hashed fraction of the corpus from fitting and selection
            (:mod:`embedtune.data.new_documents`), then also score every method on the scored
            part's queries whose positives are all withheld, searching the whole corpus.
        pseudo_queries: ``title`` or ``first-sentence``: give ``method`` one training-only
            pseudo-query per fitting document (:func:`~embedtune.workflows.pseudo_queries.build_pseudo_queries`,
            mined like the real triplets); its config's ``pseudo_query_weight`` weighs them.
            None: the preset's (:attr:`Preset.pseudo_queries`); ``"none"``: off.

    Returns:
        A :class:`CompressionResult`.
    """
    methods = [method] + [m for m in dict.fromkeys(compare) if m != method]
    classes = {m: get_compressor_class(m) for m in methods}  # fail fast on a typo, before any encoding
    chosen = resolve_preset(method, preset)
    overrides = {**chosen.settings, **(settings or {})}
    triplet_mining = _mining(chosen, mining, classes[method].supervised)
    seeds = list(seeds)
    if not seeds:
        raise ValueError("fit_compressor: give at least one seed.")
    out = Path(out) if out is not None else None
    train_part = "train+val" if final else "train"
    eval_part = "test" if final else "val"
    view: NewDocuments | None = None
    if new_documents is not None:
        view = withhold_new_documents(experiment, new_documents, part=eval_part)
        experiment = view.fit
    if mining_seed is None:
        mining_seed = experiment.split.seed if experiment.split is not None else 2027
    needs_triplets = any(cls.supervised for cls in classes.values())
    triplets = None
    if needs_triplets:
        path = out / f"triplets-{train_part}.json" if out else None
        triplets = shared_triplets(experiment, train_part, triplet_mining, mining_seed, path)
        require_mined_triplets(experiment, train_part, triplets, triplet_mining)
    pseudo, pseudo_note = recipe_pseudo_queries(experiment, method, pseudo_queries, chosen.pseudo_queries, triplet_mining, mining_seed)
    runs: dict[str, list[MethodRun]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {}
    for name, cls in classes.items():
        method_seeds = seeds if cls.seed_dependent else seeds[:1]
        # Compared methods run with their own default preset's settings (the safety net for supervised ones).
        method_overrides = overrides if name == method else dict(cls.get_preset(None).settings)
        runs[name] = [
            fit_and_evaluate(experiment, name, dim, seed, final, triplets, method_overrides,
                             compressor_dir(out, name, seed, len(method_seeds)) if out else None, pseudo if name == method else None)
            for seed in method_seeds
        ]
        epochs = selected_epochs(runs[name])
        if epochs is not None:
            for run, epoch in zip(runs[name], epochs):
                run.details["selected_epoch"] = epoch
        summary = summarize(runs[name])
        summary["n_queries"] = runs[name][0].metrics.n_queries
        if epochs is not None:
            summary["selected_epoch"] = epochs[0] if len(epochs) == 1 else None
            summary["selected_epochs"] = epochs
        summaries[name] = summary
        results[name] = {"summary": summary, "runs": [run.row() for run in runs[name]]}
        history = runs[name][0].compressor.history_ if runs[name][0].compressor is not None else None
        if history and name == method:
            results[name]["history_seed0"] = history
    comparisons = {name: _compare(runs[method], runs[name]) for name in runs if name != method}
    subsets = None
    if needs_triplets:
        per_query = {name: per_query_means([run.metrics.per_query for run in method_runs]) for name, method_runs in runs.items()}
        subsets = subset_block(per_query, experiment.qrels_for(experiment.part_ids(eval_part)),
                               experiment.qrels_for(experiment.part_ids(train_part)), method, train_part)
    new_block = _new_documents_block(view, runs, method) if view is not None else None
    notes = [line for name in runs for line in training_notes(name, summaries[name].get("selected_epochs"))]
    if pseudo_note:
        notes.append(pseudo_note)
    if chosen.name == "static-corpus" and describe_method(method).module.startswith("embedtune.compress.dive"):
        from embedtune.compress.dive import STATIC_CORPUS_WARNING  # DIVE's module (torch): only where its preset was chosen

        logger.warning(STATIC_CORPUS_WARNING)
        notes.append(STATIC_CORPUS_WARNING)
    pca_runs = [name for name in PCA_VARIANTS if name in runs and name != method]
    gain: dict[str, Any] | None = None
    if pca_runs:
        strongest = max(pca_runs, key=lambda name: summaries[name]["ndcg@10"])
        gain = {"baseline": strongest, "baseline_ndcg@10": summaries[strongest]["ndcg@10"], **comparisons[strongest]}
        others = [f"{name} {summaries[name]['ndcg@10']:.4f}" for name in pca_runs]
        notes.append(
            f"{method} − the stronger PCA variant ({strongest}; {', '.join(others)}): {gain['mean_difference']:+.4f} nDCG@10 "
            f"(p {gain['p_value']:.2g}, 95 % CI [{gain['ci_low']:+.4f}, {gain['ci_high']:+.4f}], {gain['n_queries']} queries)."
        )
    report: dict[str, Any] = {
        "dataset": experiment.dataset.name,
        **(labels or {}),
        "queries": _queries_label(experiment, final),
        "protocol": "beir-train" if experiment.split is not None and experiment.split.qrels_split.startswith("train+") else "paper",
        "n_queries": next(iter(summaries.values()))["n_queries"],
        "preset": chosen.name,
        "split_seed": experiment.split.seed if experiment.split is not None else None,
        "qrels": experiment.split.qrels_split if experiment.split is not None else experiment.dataset.split,
        "results": results,
        "comparisons": {name: {"against": name, **test} for name, test in comparisons.items()},
        "notes": notes,
    }
    if experiment.provenance:  # what the vectors are wins over a label: precomputed vectors say so
        report["model"] = experiment.provenance["model"]
        report["provenance"] = experiment.provenance
    if gain is not None:
        report["gain_over_pca"] = gain
    if subsets is not None:
        report["subsets"] = subsets
    if new_block is not None:
        report["new_documents"] = new_block
    if pseudo is not None:
        report["pseudo_queries"] = {"source": pseudo.source, "n_queries": len(pseudo.ids), "n_triplets": int(len(pseudo.triplets)),
                                    "weight": overrides.get("pseudo_query_weight", 0.0)}
    if needs_triplets:
        report["triplets"] = {
            "negatives": triplet_mining.negatives,
            "n_negatives": triplet_mining.n_negatives,
            **triplet_mining.non_default(),
            "n_triplets": int(len(triplets)),  # type: ignore[arg-type]
        }
    compression = CompressionResult(report, runs, summaries, chosen, out, triplets, comparisons, notes, subsets, new_block)
    if out:  # the report is results.json's "details" (report.json in earlier releases)
        write_compression_results(out, compression, experiment, method)
    return compression


def _new_documents_block(view: NewDocuments, runs: Mapping[str, Sequence[MethodRun]], main: str) -> dict[str, Any]:
    """Every method scored on the new-document queries (seed means), with paired tests of ``main`` against each."""
    per_query = {}
    for name, method_runs in runs.items():
        scored = [score_new_documents(view, run.compressor).per_query for run in method_runs if run.compressor is not None]
        per_query[name] = per_query_means(scored)
    methods = {name: subset_means(scores, {})["all"] for name, scores in per_query.items()}
    comparisons = {}
    for name, scores in per_query.items():
        if name != main:
            a, b = align_by_query({q: v["ndcg@10"] for q, v in per_query[main].items()}, {q: v["ndcg@10"] for q, v in scores.items()})
            comparisons[name] = {"against": name, **paired_test(a, b).to_dict()}
    return {**view.describe(), "methods": methods, "comparisons": comparisons, "main": main}
