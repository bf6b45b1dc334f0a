"""The DIVE paper's evaluation protocol (§4, Figures 1–8, Tables 3–4) as one resumable grid.

Phase 1 runs the main comparison (held-out test, final seeds) and every validation-only
selection study (ablation, head count, learning-rate candidates). Phase 2 retrains each
supervised baseline at its validation-selected learning rate on train+val and scores it on
the held-out test queries. Selection never reads a test query.

Every record carries the inputs that shaped it (:func:`run_inputs`: the model, the resolved
compressor config, the split manifest's digest, the data files' sha256 and the triplet mining),
and a re-run compares them with the current config's before anything runs: a results folder
never mixes configs (see :mod:`embedtune.bench.grid`). Records written before that are checked
against the split and triplet files beside them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

from embedtune.bench.datasets import expand_dataset
from embedtune.bench.grid import (
    GridPlan,
    RunSpec,
    RunStore,
    StaleRecordsError,
    dedupe,
    input_differences,
    make_spec,
    plan_grid,
    run_grid,
    spec_from_record,
)
from embedtune.bench.protocol_config import ProtocolConfig, audited_methods
from embedtune.compress import get_compressor_class
from embedtune.compress.presets import MiningOptions
from embedtune.data.beir import load_beir
from embedtune.data.splits import QuerySplit, query_disjoint_split, train_qrels_split
from embedtune.data.triplets import MINING_DEFAULTS
from embedtune.runtime import set_threads
from embedtune.workflows.experiment import Experiment, load_experiment
from embedtune.workflows.fit_and_score import build_config, fit_and_evaluate
from embedtune.workflows.triplets import shared_triplets

logger = logging.getLogger(__name__)

__all__ = ["plan_phase_one", "plan_phase_two", "select_preset", "selection_records", "ProtocolExecutor", "run_protocol",
           "plan_protocol", "protocol_split", "run_inputs"]


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


def protocol_split(config: ProtocolConfig, dataset_path: str | Path) -> QuerySplit:
    """The query split ``config`` gives the dataset at ``dataset_path``, without embedding anything.

    The same split :func:`embedtune.workflows.load_experiment` makes for the protocol.
    """
    dataset = load_beir(dataset_path, config.qrels_split)
    if config.protocol == "beir-train":
        return train_qrels_split(load_beir(dataset_path, "train"), dataset, config.val_fraction, config.split_seed)
    return query_disjoint_split(dataset, config.fractions, config.split_seed)


def _split_inputs(manifest: dict[str, Any]) -> dict[str, Any]:
    """What of a split manifest shapes a run: seed, qrels, fractions, counts and the query ids (as a sha256)."""
    ids = json.dumps(manifest["query_ids"], sort_keys=True).encode("utf-8")
    return {"seed": manifest["seed"], "qrels_split": manifest["qrels_split"], "fractions": manifest["fractions"],
            "counts": manifest["counts"], "query_ids_sha256": hashlib.sha256(ids).hexdigest()}


def _mining_inputs(values: dict[str, Any]) -> dict[str, Any]:
    """The mining of the shared triplets, every option spelled out (the reference only matters with a margin)."""
    mining = {key: values.get(key, default) for key, default in MINING_DEFAULTS.items()}
    if mining["false_negative_margin"] is None:
        mining["false_negative_reference"] = MINING_DEFAULTS["false_negative_reference"]
    return {"negatives": values["negatives"], "n_negatives": values["n_negatives"], "seed": values["seed"], **mining}


def _run_config(spec: RunSpec, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    cls = get_compressor_class(spec.method)
    values = dict(spec.overrides_dict if overrides is None else overrides)
    if "progress" in cls.config_class.__dataclass_fields__:
        values["progress"] = False  # what ProtocolExecutor runs with
    with warnings.catch_warnings():  # e.g. an ablation's "this is the w/o ... setting": the fit says it
        warnings.simplefilter("ignore")
        return build_config(spec.method, spec.dim, spec.seed, values).to_dict()


def run_inputs(config: ProtocolConfig, spec: RunSpec, split: QuerySplit) -> dict[str, Any]:
    """Everything that shapes the record of ``spec`` besides its key: what a finished record is checked against.

    ``model`` (alias or path), ``config`` (the compressor's resolved config), ``split`` (seed,
    qrels, fractions, counts and a sha256 of the query ids), ``data`` (sha256 of each source
    file) and, for supervised methods, ``mining`` (negatives, their number, the mining seed, the
    false-negative filter and the cap).
    """
    inputs: dict[str, Any] = {
        "model": spec.model,
        "config": _run_config(spec),
        "split": _split_inputs(split.manifest()),
        "data": dict(sorted(split.fingerprints.items())),
    }
    if get_compressor_class(spec.method).supervised:
        mining: MiningOptions = config.mining()
        inputs["mining"] = _mining_inputs({**mining.filter_options(), "negatives": mining.negatives,
                                           "n_negatives": mining.n_negatives, "seed": config.split_seed})
    return json.loads(json.dumps(inputs, sort_keys=True))


class ProtocolExecutor:
    """Runs one spec; keeps each (dataset, backbone) experiment and its triplets in memory.

    It is also the grid's :class:`embedtune.bench.grid.RecordCheck`: it says which inputs a run
    would have now (:meth:`expected_inputs`, which loads the data but embeds nothing) and which
    a finished record was made with (:meth:`recorded_inputs`).
    """

    def __init__(self, config: ProtocolConfig, cache_dir: Path) -> None:
        self.config = config
        self.cache_dir = cache_dir
        self.source = config.source
        self._experiments: dict[tuple[str, str], Experiment] = {}
        self._splits: dict[str, QuerySplit] = {}
        self._files: dict[Path, dict[str, Any] | None] = {}
        self.embedding_seconds: dict[str, float] = {}

    def split(self, spec: RunSpec) -> QuerySplit:
        """The split of ``spec``'s dataset under this config (loaded once, nothing embedded)."""
        if spec.dataset not in self._splits:
            self._splits[spec.dataset] = protocol_split(self.config, spec.dataset_path)
        return self._splits[spec.dataset]

    def expected_inputs(self, spec: RunSpec) -> dict[str, Any]:
        return run_inputs(self.config, spec, self.split(spec))

    def recorded_inputs(self, spec: RunSpec, record: dict[str, Any]) -> dict[str, Any]:
        """``record``'s own inputs, or for older records what the split and triplet files beside them say.

        A compressor config field missing from a record (added to embedtune after it was written)
        counts as that field's default, which is the behaviour the record was made with.
        """
        inputs = dict(record["inputs"]) if isinstance(record.get("inputs"), dict) else self._derived_inputs(spec, record)
        if isinstance(inputs.get("config"), dict) and inputs["config"]:
            inputs["config"] = {**_run_config(spec, {}), **inputs["config"]}
        return inputs

    def _json_file(self, path: Path) -> dict[str, Any] | None:
        if path not in self._files:
            try:
                self._files[path] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._files[path] = None
        return self._files[path]

    def _derived_inputs(self, spec: RunSpec, record: dict[str, Any]) -> dict[str, Any]:
        inputs: dict[str, Any] = {"model": record.get("spec", {}).get("model", spec.model)}
        if record.get("config"):
            inputs["config"] = record["config"]
        manifest = self._json_file(self.cache_dir / "splits" / f"{spec.dataset.replace('/', '__')}.json")
        if manifest is not None and "query_ids" in manifest:
            inputs["split"] = _split_inputs(manifest)
            inputs["data"] = dict(sorted(manifest.get("source_sha256", {}).items()))
        if get_compressor_class(spec.method).supervised:
            part = "train+val" if spec.stage == "test" else "train"
            triplets = self._json_file(self.cache_dir / "triplets" / f"{spec.dataset.replace('/', '__')}-{spec.backbone}-{part}.json")
            meta = (triplets or {}).get("meta")
            if isinstance(meta, dict) and {"negatives", "n_negatives", "seed"} <= set(meta):
                inputs["mining"] = _mining_inputs(meta)
        return inputs

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
            return {"skipped": f"k·H = {spec.dim}·{heads} > d = {experiment.embeddings.dim}", "metrics": {},
                    "inputs": run_inputs(self.config, spec, experiment.split)}  # type: ignore[arg-type]
        part = "train+val" if spec.stage == "test" else "train"
        triplets = None
        if cls.supervised:
            name = f"{spec.dataset.replace('/', '__')}-{spec.backbone}-{part}.json"
            triplets = shared_triplets(experiment, part, self.config.mining(), self.config.split_seed, self.cache_dir / "triplets" / name)
        overrides = {**overrides, "progress": False} if "progress" in {f for f in cls.config_class.__dataclass_fields__} else overrides
        run = fit_and_evaluate(experiment, spec.method, spec.dim, spec.seed, spec.stage == "test", triplets, overrides)
        compressor = run.compressor
        return {
            "inputs": run_inputs(self.config, spec, experiment.split),  # type: ignore[arg-type]
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


def selection_records(config: ProtocolConfig, store: RunStore, records: dict[str, dict[str, Any]],
                      check: ProtocolExecutor | None = None) -> dict[str, dict[str, Any]]:
    """The records phase two selects from: this run's, plus finished selection runs in the results folder.

    Selection runs finished by earlier invocations (e.g. one dataset's candidates with more
    seeds) count too, as long as their dataset and backbone are in ``config``; validation runs
    only, so selection never reads a test score. With ``check``, a record made with other inputs
    (another split, mining or data) is left out.
    """
    cells = {(dataset, backbone.name) for dataset, _ in _datasets(config) for backbone in config.backbones}
    merged = {
        record["spec"]["key"]: record
        for record in store.all_records()
        if "metrics" in record and record["spec"].get("stage") == "val" and (record["spec"]["dataset"], record["spec"]["backbone"]) in cells
    }
    if check is not None:
        stale = []
        for key, record in list(merged.items()):
            try:
                spec = spec_from_record(record["spec"])
                differs = bool(input_differences(check.recorded_inputs(spec, record), check.expected_inputs(spec)))
            except (KeyError, TypeError, ValueError):
                differs = True
            if differs:
                stale.append(key)
                del merged[key]
        if stale:
            logger.info("selection: %d validation records made with other inputs are left out (e.g. %s)", len(stale), stale[0])
    merged.update(records)
    return merged


def run_protocol(
    config: ProtocolConfig, progress: bool = True, phase_two: bool = True, workers: int = 1, rerun_changed: bool = False
) -> dict[str, dict[str, Any]]:
    """Run (or resume) both phases; return every record by run key.

    ``phase_two=False`` stops after the selection runs, e.g. to finish the candidates of every
    dataset (in separate processes) before one global selection.

    ``workers > 1`` starts ``workers - 1`` more processes on the same results folder; runs are
    shared out through claim files (see :mod:`embedtune.bench.grid`), each worker uses
    ``config.threads`` threads, and phase two starts only once every phase-one run is finished.
    The records, and so the report, do not depend on the number of workers.

    A finished record made with other inputs than ``config``'s (split, mining, data, model or
    compressor config) stops the run with :class:`embedtune.bench.grid.StaleRecordsError` naming
    the differing fields; ``rerun_changed=True`` runs such records again.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer; got {workers!r}.")
    if workers == 1:
        return _run_protocol(config, progress, phase_two, rerun_changed)
    import multiprocessing

    # Embed (or load) every corpus here first, so the workers read the cache instead of
    # encoding the same corpus side by side.
    warm = ProtocolExecutor(config, Path(config.results_dir))
    # Check the finished records before embedding anything: other inputs stop here (unless rerun_changed).
    stale = plan_grid(plan_phase_one(config), RunStore(config.results_dir), warm).changed
    if stale and not rerun_changed:
        raise StaleRecordsError(Path(config.results_dir), stale, config.source)
    for spec in {(s.dataset, s.backbone): s for s in plan_phase_one(config)}.values():
        warm.experiment(spec)
    del warm
    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools
    helpers = [context.Process(target=_run_protocol, args=(config, False, phase_two, rerun_changed), daemon=True)
               for _ in range(workers - 1)]
    for helper in helpers:
        helper.start()
    try:
        records = _run_protocol(config, progress, phase_two, rerun_changed)
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


def _run_protocol(config: ProtocolConfig, progress: bool, phase_two: bool, rerun_changed: bool = False) -> dict[str, dict[str, Any]]:
    set_threads(config.threads)
    root = Path(config.results_dir)
    store = RunStore(root)
    executor = ProtocolExecutor(config, root)
    start = time.perf_counter()
    records = run_grid(plan_phase_one(config), store, executor, progress, desc="protocol grid, phase 1", check=executor,
                       rerun_changed=rerun_changed)
    if phase_two:
        records.update(run_grid(plan_phase_two(config, selection_records(config, store, records, executor)), store, executor, progress,
                                desc="protocol grid, phase 2", check=executor, rerun_changed=rerun_changed))
    logger.debug("protocol finished in %.1fs (embedding: %s)", time.perf_counter() - start, executor.embedding_seconds)
    return records


def plan_protocol(config: ProtocolConfig, rerun_changed: bool = False) -> dict[str, GridPlan]:
    """What :func:`run_protocol` would do, without running or writing anything: one plan per phase.

    Phase two is planned only once phase one has nothing left to do (its runs depend on the
    selection). Loads the datasets (to check finished records' inputs) but embeds nothing.
    """
    store = RunStore(config.results_dir)
    check = ProtocolExecutor(config, Path(config.results_dir))
    plans = {"phase one": plan_grid(plan_phase_one(config), store, check, rerun_changed)}
    one = plans["phase one"]
    if not one.todo and not one.changed:
        plans["phase two"] = plan_grid(plan_phase_two(config, selection_records(config, store, one.finished, check)), store, check,
                                       rerun_changed)
    return plans
