"""``embedtune finetune pace`` (text) and ``embedtune finetune pace-vl`` (vision-language): one PACE recipe, as flags.

Both commands build one :class:`embedtune.finetune.PACEConfig` the same way: ``--config`` (a saved
``pace_config.json``) or ``--preset``, then every flag that was given; a flag left out keeps the
preset's (or the config's) value. The flags both share are declared once, in :func:`add_pace_flags`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path
from collections.abc import Callable
from typing import Any

from embedtune.cli.common import DeprecatedAlias, add_list_flag, command_config, command_line, format_table, print_json
from embedtune.cli.config_flags import add_config_flags, config_overrides, flag_name
from embedtune.data.beir import load_beir
from embedtune.encoders.sentence_transformer import fingerprint_model_dir
from embedtune.finetune.config import DEFAULT_PRESETS, PRESETS, TINY_VL_MODELS, PACEConfig, parse_stage2_init, preset_config
from embedtune.finetune.schema import StageConfig, VLOptions
from embedtune.io import sha256_file
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.subset_report import finetune_subsets, subset_table_rows_line
from embedtune.workflows.plots import TRAINING_PLOT_NAME, plot_pace_training
from embedtune.workflows.results import (
    describe_data,
    mmeb_summary,
    mteb_metrics,
    per_query_scores,
    write_mteb_result,
    write_results,
)

logger = logging.getLogger(__name__)

__all__ = ["register", "add_pace_flags", "config_from_args", "run_finetune", "preset_note", "PACE_FLAG_FIELDS", "TEXT_FLAG_FIELDS", "VL_FLAG_FIELDS",
           "STAGE_FLAG_FIELDS", "EVERY_STAGE_FLAG_FIELDS"]

COMMANDS = {"pace": "text", "pace-vl": "vl"}
STAGES = ("stage1", "stage2")

#: PACEConfig fields both backbones take as flags, one each (--model, --data and --out stay hand-written: paths).
PACE_FLAG_FIELDS = ("stage2_init", "stop_stage1_at_init", "batch_size", "n_negatives", "max_seq_length", "weight_temperature",
                    "lora_rank", "lora_alpha", "seed", "precision")
#: PACEConfig fields only the text backbone takes as flags.
TEXT_FLAG_FIELDS = ("train_split", "hard_pool", "save_steps", "mini_batch_size", "normalize", "deepspeed")
#: VLOptions fields ``pace-vl`` takes as flags.
VL_FLAG_FIELDS = ("image_root", "task", "instruction", "max_image_pixels")
#: StageConfig fields each stage takes as --stage1-FIELD and --stage2-FIELD.
STAGE_FLAG_FIELDS = ("steps", "learning_rate", "temperature")
#: StageConfig fields one flag sets for every stage.
EVERY_STAGE_FLAG_FIELDS = ("warmup_ratio", "weighting", "gamma")
# Flag names kept working where they differ from the generated one.
_VL_FLAG_ALIASES = {"task": ("--task-format",)}


def _stage_flag_aliases(stage: str) -> dict[str, tuple[str, ...]]:
    return {"learning_rate": (f"--{stage}-lr",)}


# A fine-tuning field's help ends with its dataclass default, "(default: VALUE...)"; a flag states the preset's instead.
_STATED_DEFAULT = re.compile(r"\s*\(default: [^()]*\)$")


def preset_note(values: dict[str, Any], every_stage: bool = False) -> Callable[[str, str], str]:
    """``(field, help) -> help``, its "(default: ...)" replaced by "(preset: VALUE)", the value the command's default
    preset (what runs without ``--preset``) gives the field (none where that is None or False: "(default: None)" says nothing). ``values``: a config as a dict,
    or, with ``every_stage``, the whole config, for a flag that sets every stage."""
    def note(name: str, help_text: str) -> str:
        if every_stage:
            stated = {values[stage][name] for stage in STAGES if values[stage] is not None}
            value = stated.pop() if len(stated) == 1 else None
        else:
            value = values.get(name)
        shown = "" if value is None or value is False else f" (preset: {value})"
        return _STATED_DEFAULT.sub("", help_text) + ("; sets every stage" if every_stage else "") + shown
    return note


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "finetune",
        help="fine-tune the embedding model (PACE)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Fine-tune a sentence-transformers model (pace) or a Qwen vision-language embedder (pace-vl) with "
                    "the same recipe and the same flags. The output's model/ folder is a sentence-transformers model.",
    )
    methods = parser.add_subparsers(dest="method", metavar="METHOD", required=True)
    presets = "; ".join(f"{name}: {text}" for name, text in PRESETS.items())
    text = methods.add_parser(
        "pace",
        help="fine-tune a text model: PACE (--preset pace), its baselines and ablations; default no-dot",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Train on (query, positive, K hard negatives) tuples mined from BEIR train qrels with the frozen model. "
            f"Presets: {presets}. Without --preset, no-dot runs (PACE's two stages with cosine in both): in the PACE "
            "study (benchmarks/RESULTS.md) direct-dot-full scored highest in-domain, but all of its gain was on test queries "
            "whose relevant documents were training positives; on the others it was below the untrained model, and it lost "
            "0.198 on ArguAna zero-shot. Pick --preset direct-dot-full only for a corpus and queries that will not change. "
            "`embedtune evaluate` ranks a dot-product model by dot product, as the model was saved. "
            "Multi-process: `accelerate launch --num_processes 2 -m embedtune finetune pace ...`."
        ),
    )
    add_pace_flags(text, "text")
    group = text.add_argument_group("text backbone")
    add_config_flags(group, PACEConfig, TEXT_FLAG_FIELDS, help_text=preset_note(preset_config(DEFAULT_PRESETS["text"]).to_dict()))
    group.add_argument("--evaluate-split", default=None, help="evaluate the final model on this qrels split (e.g. test)")

    vl = methods.add_parser(
        "pace-vl",
        help="PACE on a Qwen-VL backbone (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) from MMEB-train-style data",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "The same recipe on a vision-language embedder: the vision tower and projector stay frozen, LoRA goes on the "
            f"language model. Presets (with the paper's Appendix A values for Qwen backbones): {presets}. Tiny random "
            f"backbones for smoke runs: {', '.join(sorted(TINY_VL_MODELS))}. The output's model/ folder loads with "
            "`embedtune evaluate-mmeb --model OUT/model` and `SentenceTransformer(OUT/model, trust_remote_code=True)`; "
            "pace_config.json next to it records the run."
        ),
    )
    add_pace_flags(vl, "vl")
    group = vl.add_argument_group("vision-language backbone")
    group.add_argument("--train", dest="data", action=DeprecatedAlias, replacement="--data", help=argparse.SUPPRESS)
    add_config_flags(group, VLOptions, VL_FLAG_FIELDS, aliases=_VL_FLAG_ALIASES,
                     help_text=preset_note(preset_config(DEFAULT_PRESETS["vl"], backbone="vl").to_dict()["vl"]))
    group.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    add_list_flag(group, "--eval-tasks", default=[], metavar="FILE", help="MMEB-eval-style files scored after training")


def add_pace_flags(parser: argparse.ArgumentParser, backbone: str) -> None:
    """The flags ``pace`` and ``pace-vl`` share. One left out keeps the preset's (or --config's) value: the hand-written
    ones default to None, the generated ones (config fields) leave nothing in the namespace."""
    data_help = "BEIR folder, BEIR-layout .zip, or bundled name 'scifact'" if backbone == "text" else "MMEB-train-style .jsonl or .parquet"
    model_help = ("'minilm', 'mpnet', or a local sentence-transformers folder" if backbone == "text"
                  else "checkpoint folder or hub id of a supported family, or a tiny-* name")
    required = "" if backbone == "text" else " (required unless --config)"
    parser.add_argument("--preset", default=DEFAULT_PRESETS[backbone], choices=sorted(PRESETS),
                        help=f"recipe, baseline or ablation (default: {DEFAULT_PRESETS[backbone]}"
                             + (", the best on validation in the PACE convergence study; it specialises the model to --data's domain: "
                                "--preset no-dot or st-hardness keep it general, --preset pace is the paper's recipe)" if backbone == "text" else ", the paper's recipe)"))
    parser.add_argument("--config", default=None, metavar="JSON", help="start from a saved pace_config.json (or its folder) instead of --preset")
    parser.add_argument("--model", default=None, help=f"{model_help} " + ("(preset: minilm)" if backbone == "text" else "(required unless --config)"))
    parser.add_argument("--data", default=None, help=f"{data_help}{required}" + (" (preset: scifact)" if backbone == "text" else ""))
    parser.add_argument("--out", default=None, metavar="DIR", help="output folder: stage checkpoints, model/, pace_config.json, results.json "
                                                                   "(the training record in its 'details'; it replaces result.json), "
                                                                   "results.md, training.png; with an evaluation of a whole qrels split "
                                                                   "also mteb/<Task>.json (required unless --config)")
    parser.add_argument("--output", dest="out", action=DeprecatedAlias, replacement="--out", help=argparse.SUPPRESS)
    parser.add_argument("--overwrite", action="store_true",
                        help=OVERWRITE_HELP + " (re-running the same command into its own --out resumes instead)")
    preset = preset_config(DEFAULT_PRESETS[backbone], backbone=backbone).to_dict()
    stages = parser.add_argument_group(
        "stages (StageConfig fields)", "A flag given overrides the preset's (or --config's) value; one left out keeps it. "
        f"(preset: VALUE) is what the default preset, {DEFAULT_PRESETS[backbone]}, sets.")
    for stage in STAGES:
        add_config_flags(stages, StageConfig, STAGE_FLAG_FIELDS, prefix=f"{stage}-", aliases=_stage_flag_aliases(stage),
                         help_text=preset_note(preset[stage]))
    stages.add_argument("--steps", type=int, default=None,
                        help="steps of a one-stage preset (default: PACE's updates, stage2-init step + stage2 steps; "
                             "direct-dot-full without stage steps: 5 epochs)")
    add_config_flags(stages, StageConfig, EVERY_STAGE_FLAG_FIELDS, help_text=preset_note(preset, every_stage=True))
    batch = parser.add_argument_group("batch, loss and model (PACEConfig fields)")
    add_config_flags(batch, PACEConfig, PACE_FLAG_FIELDS, value_parsers={"stage2_init": parse_stage2_init},
                     help_text=preset_note(preset))
    batch.add_argument("--threads", type=int, default=argparse.SUPPRESS, help="torch CPU threads (the same as `embedtune --threads`)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(handler=run_finetune, backbone=backbone)


# The hand-written flags that set a PACEConfig field: paths, named as every command names them.
_PATH_FLAGS = {"model": "model", "data": "data", "out": "output_dir"}


def config_from_args(args: argparse.Namespace) -> PACEConfig:
    """The validated :class:`PACEConfig`: ``--config`` or ``--preset``, then the flags that were given."""
    backbone = args.backbone
    top_level = {**{field: getattr(args, flag) for flag, field in _PATH_FLAGS.items() if getattr(args, flag, None) is not None},
                 **config_overrides(args, PACEConfig, PACE_FLAG_FIELDS + TEXT_FLAG_FIELDS)}  # one backbone's flags only are there
    vl_options = config_overrides(args, VLOptions, VL_FLAG_FIELDS)
    per_stage = {stage: config_overrides(args, StageConfig, STAGE_FLAG_FIELDS, prefix=f"{stage}-") for stage in STAGES}
    every_stage = config_overrides(args, StageConfig, EVERY_STAGE_FLAG_FIELDS)
    if args.config:
        values = PACEConfig.load(args.config).to_dict()
        if values["backbone"] != backbone:
            command = next(name for name, family in COMMANDS.items() if family == values["backbone"])
            raise ValueError(f"{args.config} is a config for backbone={values['backbone']!r}; run it with `embedtune finetune {command}`.")
        for stage, given in per_stage.items():
            if given and values[stage] is None:
                raise ValueError(f"{flag_name(next(iter(given)), f'{stage}-')} was given but the config (preset "
                                 f"{values.get('preset')!r}) has no {stage}.")
            if values[stage] is not None:
                values[stage].update(given, **every_stage)
        if args.steps is not None:
            raise ValueError("--steps sets a one-stage preset's schedule; with --config, use --stage1-steps.")
    else:
        required = (("model", "model"), ("data", "data"), ("out", "output_dir")) if backbone == "vl" else (("out", "output_dir"),)
        for flag, name in required:
            if getattr(args, flag) is None:
                raise ValueError(f"--{flag} is required (or give --config with {name} set).")
        values = preset_config(
            args.preset, backbone=backbone, stage1_steps=per_stage["stage1"].get("steps"), stage2_steps=per_stage["stage2"].get("steps"),
            steps=args.steps, weighting=every_stage.get("weighting"), gamma=every_stage.get("gamma"),
            stage1_learning_rate=per_stage["stage1"].get("learning_rate"), stage2_learning_rate=per_stage["stage2"].get("learning_rate"),
            stage1_temperature=per_stage["stage1"].get("temperature"), stage2_temperature=per_stage["stage2"].get("temperature"),
            warmup_ratio=every_stage.get("warmup_ratio"), **top_level,
        ).to_dict()
    values.update(top_level)
    if vl_options:
        if "instruction" in vl_options and "task" not in vl_options:
            vl_options["task"] = None  # an explicit instruction replaces a task taken from --config
        values["vl"] = {**(values.get("vl") or {}), **vl_options}
    return PACEConfig(**values)


def run_finetune(args: argparse.Namespace) -> int:
    from embedtune.finetune.recipe import train_pace  # heavy optional dependency: sentence-transformers and transformers

    config = config_from_args(args)
    command = f"finetune {next(name for name, family in COMMANDS.items() if family == args.backbone)}"
    # A killed run resumes in its own folder (the marker says which command wrote it); with several
    # processes (accelerate launch) the first one alone prepares the folder.
    main_process = int(os.environ.get("RANK", "0")) == 0
    if main_process:
        prepare_output_dir(config.output_dir, args.overwrite, command=command, inputs=[args.config, config.data, config.model],
                           resume=True, legacy_names=["pace_config.json"])
    evaluate_split = getattr(args, "evaluate_split", None)
    result = train_pace(config, evaluate_split=evaluate_split, evaluate_tasks=getattr(args, "eval_tasks", ()),
                        device=getattr(args, "device", None))
    stages = [
        {**{key: getattr(stage, key) for key in ("name", "similarity", "parameters", "steps", "steps_run", "temperature", "weighting",
                                                  "gamma", "seconds", "init_checkpoint")},
         "final_loss": next((entry["loss"] for entry in reversed(stage.log_history) if "loss" in entry), None)}
        for stage in result.stages
    ]
    shown = [{**stage, "seconds": f"{stage['seconds']:.1f}"} for stage in stages]
    metrics = {key: value for key, value in (result.metrics or {}).items() if key != "per_query"}
    summary = {
        "preset": config.preset,
        "backbone": config.backbone,
        "model_dir": result.model_dir,
        "similarity": result.similarity,
        "n_training_tuples": result.n_training_tuples,
        "stage2_init_step": result.stage2_init_step,
        "seconds": result.seconds,
        "stages": stages,
        "metrics": metrics or None,
    }
    table = format_table(shown, ["name", "similarity", "parameters", "steps_run", "temperature", "weighting", "final_loss", "seconds",
                                  "init_checkpoint"])
    stage2 = f"; Stage II from Stage I step {result.stage2_init_step}" if result.stage2_init_step is not None else ""
    table += f"\nmodel: {result.model_dir} (rank with {result.similarity}{stage2})"
    if metrics and "per_dataset" in metrics:
        table += "\n" + format_table([{"dataset": name, "p@1": score} for name, score in metrics["per_dataset"].items()], ["dataset", "p@1"])
    elif metrics:
        row = {"data": str(config.data), "split": evaluate_split, **metrics}
        table += "\n" + format_table([row], ["data", "split", "n_queries", "ndcg@10", "recall@10", "recall@100", "p@1", "mrr@10"])
        subsets = finetune_subsets(result.metrics["per_query"], config.data, config.train_split, evaluate_split) \
            if evaluate_split and "per_query" in (result.metrics or {}) else None
        if subsets is not None:
            summary["subsets"] = subsets
            table += "\n" + subset_table_rows_line(subsets)
    if main_process:
        _write_outputs(args, config, result, table, evaluate_split, {"subsets": summary["subsets"]} if "subsets" in summary else None)
        finish_output_dir(config.output_dir, command)
    if args.json:
        print_json(summary)
    else:
        print(table)
    return 0


def _write_outputs(args: argparse.Namespace, config: PACEConfig, result: Any, table: str, evaluate_split: str | None,
                   extra: dict[str, Any] | None = None) -> None:
    """``training.png`` (loss, lr, validation nDCG@10 when ``validation.jsonl`` is there), and with an
    evaluation, ``results.json``, ``results.md`` and (a whole qrels split) ``mteb/<Task>.json``."""
    out = Path(config.output_dir)
    validation = out / "validation.jsonl"
    plot = plot_pace_training(result.to_dict(), out / TRAINING_PLOT_NAME, validation if validation.is_file() else None,
                              title=f"PACE ({config.preset}): {Path(str(config.model)).name} on {Path(str(config.data)).name}")
    if plot is not None:
        logger.info("training curves: %s", plot)
    if not result.metrics:
        return
    model = {"name": "finetuned", "path": result.model_dir, "fingerprint": fingerprint_model_dir(result.model_dir),
             "similarity": result.similarity, "base": str(config.model)}
    if config.backbone == "text":
        dataset = load_beir(config.data, evaluate_split)
        data = describe_data(dataset, queries="all", train_split=config.train_split)
        aggregate = {key: value for key, value in result.metrics.items() if key not in ("per_query", "n_queries", "mteb")}
        metrics = mteb_metrics({**aggregate, "n_queries": result.metrics.get("n_queries")})
        per_query = per_query_scores(result.metrics.get("per_query", {}))
        rows = [{"model": "finetuned", "split": evaluate_split, "metrics": metrics}]
    else:
        data = {"train": str(config.data), "eval_tasks": {str(path): sha256_file(path) for path in getattr(args, "eval_tasks", ())}}
        metrics, rows = mmeb_summary(result.metrics)
        per_query = {}
    path = write_results(out, task=f"finetune {args.method}", command=command_line(args),
                         config={**command_config(args), "pace_config": config.to_dict()}, data=data, model=model,
                         metrics=metrics, per_query=per_query, rows=rows, table=table, details=result.to_dict(), extra=extra)
    logger.info("results: %s", path)
    if config.backbone == "text":
        # Every metric MTEB writes for a retrieval task (the evaluation scored them all), else the defaults of an older run.
        aggregate = result.metrics.get("mteb") or {key: value for key, value in result.metrics.items() if key not in ("per_query", "n_queries")}
        logger.info("MTEB format: %s", write_mteb_result(out, dataset.name, evaluate_split, aggregate, result.seconds.get("evaluate"),
                                                         dataset_sha256=getattr(dataset, "fingerprints", None)))
