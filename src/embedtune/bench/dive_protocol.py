"""The DIVE paper's evaluation protocol (§4, Figures 1–8, Tables 3–4) as one resumable grid.

Phase 1 runs the main comparison (held-out test, final seeds) and every validation-only
selection study (ablation, head count, learning-rate candidates). Phase 2 retrains each
supervised baseline at its validation-selected learning rate on train+val and scores it on
the held-out test queries. Selection never reads a test query.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

from embedtune.bench.datasets import expand_dataset
from embedtune.bench.grid import RunSpec, RunStore, dedupe, make_spec, run_grid
from embedtune.bench.protocol_config import ProtocolConfig, audited_methods
from embedtune.compress import get_compressor_class
from embedtune.runtime import set_threads
from embedtune.workflows.experiment import Experiment, load_experiment
from embedtune.workflows.fit_and_score import fit_and_evaluate
from embedtune.workflows.triplets import shared_triplets

logger = logging.getLogger(__name__)

__all__ = ["plan_phase_one", "plan_phase_two", "select_preset", "selection_records", "ProtocolExecutor", "run_protocol"]


def _dive_heads(config: ProtocolConfig) -> dict[str, Any]:
    # H=4 wherever k·H <= d, otherwise the largest feasible H (resolved by DIVE's 'auto').
    return {"heads": "auto", "max_heads": config.heads}


def _datasets(config: ProtocolConfig) -> list[tuple[str, str]]:
    return [entry for spec in config.datasets for entry in expand_dataset(spec.name, spec.path)]


def plan_phase_one(config: ProtocolConfig) -> list[RunSpec]:
    specs: list[RunSpec] = []
    for dataset, path in _datasets(config):
        for backbone in config.backbones:
            for dim in backbone.dims:
                def spec(stage, method, seed, overrides=None, study=""):
                    merged = {**config.method_overrides.get(method, {}), **(overrides or {})}
                    return make_spec(dataset, path, backbone.name, backbone.model, stage, method, dim, seed, merged, study)

                if {"main", "unsupervised", "significance", "dynamics"} & set(config.studies):
                    for method in config.methods:
                        # A seed-free method (Compressor.seed_dependent False): one run stands for all seeds (std 0).
                        seeds = config.final_seeds if get_compressor_class(method).seed_dependent else config.final_seeds[:1]
                        for seed in seeds:
                            overrides = _dive_heads(config) if method == "dive" else {}
                            specs.append(spec("test", method, seed, overrides, "main"))
                if "ablation" in config.studies:
                    for name, overrides in config.ablations.items():
                        for seed in config.selection_seeds:
                            specs.append(spec("val", "dive", seed, {**_dive_heads(config), **overrides}, f"ablation:{name}"))
                if "heads" in config.studies:
                    for heads in config.head_values:
                        for seed in config.selection_seeds:
                            # Infeasible H (k·H > d) are skipped at run time and recorded as such.
                            specs.append(spec("val", "dive", seed, {"heads": heads}, f"heads:{heads}"))
                if "variants" in config.studies:
                    # DIVE options beyond the paper, retrained on train+val and scored on held-out test.
                    for name, overrides in config.variants.items():
                        for seed in config.final_seeds:
                            specs.append(spec("test", "dive", seed, {**_dive_heads(config), **overrides}, f"variant:{name}"))
                if "preset" in config.studies:
                    # Candidates for the validated "best" preset: validation only.
                    for name, overrides in config.preset_candidates.items():
                        for seed in config.selection_seeds:
                            specs.append(spec("val", "dive", seed, {**_dive_heads(config), **overrides}, f"candidate:{name}"))
                if "lr_audit" in config.studies:
                    for method in audited_methods():
                        if method not in config.methods:
                            continue
                        for lr in config.lr_candidates.get(method, []):
                            for seed in config.selection_seeds:
                                specs.append(spec("val", method, seed, {"learning_rate": lr}, f"lr_audit:{lr}"))
    return dedupe(specs)


def select_learning_rates(config: ProtocolConfig, records: dict[str, dict[str, Any]]) -> dict[tuple[str, str, int, str], float]:
    """Per (dataset, backbone, dim, method): the candidate with the best mean validation nDCG@10."""
    scores: dict[tuple[str, str, int, str], dict[float, list[float]]] = {}
    for record in records.values():
        spec = record["spec"]
        tags = [t for t in spec.get("studies", []) if t.startswith("lr_audit:")]
        if spec["stage"] != "val" or not tags:
            continue
        if record.get("skipped"):
            continue
        key = (spec["dataset"], spec["backbone"], spec["dim"], spec["method"])
        scores.setdefault(key, {}).setdefault(float(tags[0].split(":", 1)[1]), []).append(record["metrics"]["ndcg@10"])
    return {key: max(by_lr, key=lambda lr: (statistics.fmean(by_lr[lr]), -lr)) for key, by_lr in scores.items()}


def select_preset(records: dict[str, dict[str, Any]]) -> tuple[str, dict[str, float]] | None:
    """The preset candidate with the best validation nDCG@10, averaged over every cell.

    A cell is one (dataset, backbone, dim); each candidate's score is the mean over cells of its
    mean over seeds, using only cells every candidate has finished (so a partial grid compares
    like with like). Ties go to the candidate name that sorts first. None when no candidate ran.
    """
    by_candidate: dict[str, dict[tuple, list[float]]] = {}
    for record in records.values():
        spec = record["spec"]
        if spec["stage"] != "val" or record.get("skipped") or "metrics" not in record:
            continue
        for tag in spec.get("studies", []):
            if tag.startswith("candidate:"):
                cell = (spec["dataset"], spec["backbone"], spec["dim"])
                by_candidate.setdefault(tag.split(":", 1)[1], {}).setdefault(cell, []).append(record["metrics"]["ndcg@10"])
    if not by_candidate:
        return None
    cells = set.intersection(*(set(cells) for cells in by_candidate.values()))
    if not cells:
        return None
    scores = {name: statistics.fmean(statistics.fmean(values[c]) for c in cells) for name, values in by_candidate.items()}
    best = min(scores, key=lambda name: (-scores[name], name))
    return best, scores


def plan_phase_two(config: ProtocolConfig, records: dict[str, dict[str, Any]]) -> list[RunSpec]:
    paths = dict(_datasets(config))
    models = {b.name: b.model for b in config.backbones}
    specs = []
    if "preset" in config.studies:
        chosen = select_preset(records)
        if chosen is not None:
            name, _ = chosen
            overrides = {**config.method_overrides.get("dive", {}), **_dive_heads(config), **config.preset_candidates[name]}
            for dataset, path in _datasets(config):
                for backbone in config.backbones:
                    for dim in backbone.dims:
                        for seed in config.final_seeds:
                            specs.append(make_spec(dataset, path, backbone.name, backbone.model, "test", "dive", dim, seed, overrides, f"preset_best:{name}"))
    if "lr_audit" not in config.studies:
        return dedupe(specs)
    for (dataset, backbone, dim, method), lr in select_learning_rates(config, records).items():
        default_lr = get_compressor_class(method).config_class().learning_rate  # type: ignore[attr-defined]
        overrides = {**config.method_overrides.get(method, {}), **({} if lr == default_lr else {"learning_rate": lr})}
        for seed in config.final_seeds:
            specs.append(make_spec(dataset, paths[dataset], backbone, models[backbone], "test", method, dim, seed, overrides, f"lr_selected:{lr}"))
    return dedupe(specs)


class ProtocolExecutor:
    """Runs one spec; keeps each (dataset, backbone) experiment and its triplets in memory."""

    def __init__(self, config: ProtocolConfig, cache_dir: Path) -> None:
        self.config = config
        self.cache_dir = cache_dir
        self._experiments: dict[tuple[str, str], Experiment] = {}
        self.embedding_seconds: dict[str, float] = {}

    def experiment(self, spec: RunSpec) -> Experiment:
        key = (spec.dataset, spec.backbone)
        if key not in self._experiments:
            self._experiments.clear()  # one experiment at a time keeps memory flat on big grids
            start = time.perf_counter()
            self._experiments[key] = load_experiment(
                spec.dataset_path, spec.model, self.config.qrels_split, self.config.split_seed, self.config.fractions,
                encoder_options={"show_progress": True}, protocol=self.config.protocol, val_fraction=self.config.val_fraction,
            )
            self.embedding_seconds[f"{spec.dataset}/{spec.backbone}"] = time.perf_counter() - start
            manifest = self.cache_dir / "splits" / f"{spec.dataset.replace('/', '__')}.json"
            self._experiments[key].split.save(manifest)  # type: ignore[union-attr]
        return self._experiments[key]

    def __call__(self, spec: RunSpec) -> dict[str, Any]:
        experiment = self.experiment(spec)
        cls = get_compressor_class(spec.method)
        overrides = spec.overrides_dict
        heads = overrides.get("heads")
        if spec.method == "dive" and isinstance(heads, int) and heads * spec.dim > experiment.embeddings.dim:
            return {"skipped": f"k·H = {spec.dim}·{heads} > d = {experiment.embeddings.dim}", "metrics": {}}
        part = "train+val" if spec.stage == "test" else "train"
        triplets = None
        if cls.supervised:
            name = f"{spec.dataset.replace('/', '__')}-{spec.backbone}-{part}.json"
            triplets = shared_triplets(experiment, part, self.config.mining(), self.config.split_seed, self.cache_dir / "triplets" / name)
        overrides = {**overrides, "progress": False} if "progress" in {f for f in cls.config_class.__dataclass_fields__} else overrides
        run = fit_and_evaluate(experiment, spec.method, spec.dim, spec.seed, spec.stage == "test", triplets, overrides)
        compressor = run.compressor
        return {
            "config": compressor.config.to_dict() if compressor is not None else {},
            "metrics": run.metrics.aggregate,
            "n_queries": run.metrics.n_queries,
            "per_query": {qid: {"ndcg@10": v["ndcg@10"], "recall@10": v["recall@10"]} for qid, v in run.metrics.per_query.items()},
            "history": compressor.history_ if compressor is not None else [],
            "fit_seconds": run.fit_seconds,
            "heads": run.details.get("heads"),
            "out_dim": run.details.get("out_dim"),
            "input_dim": experiment.embeddings.dim,
            "n_triplets": int(len(triplets)) if triplets is not None else 0,
        }


def selection_records(config: ProtocolConfig, store: RunStore, records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The records phase two selects from: this run's, plus finished selection runs in the results folder.

    Selection runs finished by earlier invocations (e.g. one dataset's candidates with more
    seeds) count too, as long as their dataset and backbone are in ``config``; validation runs
    only, so selection never reads a test score.
    """
    cells = {(dataset, backbone.name) for dataset, _ in _datasets(config) for backbone in config.backbones}
    merged = {
        record["spec"]["key"]: record
        for record in store.all_records()
        if "metrics" in record and record["spec"].get("stage") == "val" and (record["spec"]["dataset"], record["spec"]["backbone"]) in cells
    }
    merged.update(records)
    return merged


def run_protocol(
    config: ProtocolConfig, progress: bool = True, phase_two: bool = True, workers: int = 1
) -> dict[str, dict[str, Any]]:
    """Run (or resume) both phases; return every record by run key.

    ``phase_two=False`` stops after the selection runs, e.g. to finish the candidates of every
    dataset (in separate processes) before one global selection.

    ``workers > 1`` starts ``workers - 1`` more processes on the same results folder; runs are
    shared out through claim files (see :mod:`embedtune.bench.grid`), each worker uses
    ``config.threads`` threads, and phase two starts only once every phase-one run is finished.
    The records, and so the report, do not depend on the number of workers.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer; got {workers!r}.")
    if workers == 1:
        return _run_protocol(config, progress, phase_two)
    import multiprocessing

    # Embed (or load) every corpus here first, so the workers read the cache instead of
    # encoding the same corpus side by side.
    warm = ProtocolExecutor(config, Path(config.results_dir))
    for spec in {(s.dataset, s.backbone): s for s in plan_phase_one(config)}.values():
        warm.experiment(spec)
    del warm
    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools
    helpers = [context.Process(target=_run_protocol, args=(config, False, phase_two), daemon=True) for _ in range(workers - 1)]
    for helper in helpers:
        helper.start()
    try:
        records = _run_protocol(config, progress, phase_two)
    except BaseException:
        for helper in helpers:
            helper.terminate()
        raise
    for helper in helpers:
        helper.join()
    failed = [helper.exitcode for helper in helpers if helper.exitcode not in (0, None)]
    if failed:
        raise RuntimeError(f"{len(failed)} benchmark worker(s) failed (exit codes {failed}); re-run to resume.")
    return records


def _run_protocol(config: ProtocolConfig, progress: bool, phase_two: bool) -> dict[str, dict[str, Any]]:
    set_threads(config.threads)
    root = Path(config.results_dir)
    store = RunStore(root)
    executor = ProtocolExecutor(config, root)
    start = time.perf_counter()
    records = run_grid(plan_phase_one(config), store, executor, progress)
    if phase_two:
        records.update(run_grid(plan_phase_two(config, selection_records(config, store, records)), store, executor, progress))
    logger.info("protocol finished in %.1fs (embedding: %s)", time.perf_counter() - start, executor.embedding_seconds)
    return records
