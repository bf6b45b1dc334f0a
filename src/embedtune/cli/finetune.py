"""``embedtune finetune pace`` (text) and ``embedtune finetune pace-vl`` (vision-language): one PACE recipe, as flags.

Both commands build one :class:`embedtune.finetune.PACEConfig` the same way: ``--config`` (a saved
``pace_config.json``) or ``--preset``, then every flag that was given; a flag left out keeps the
preset's (or the config's) value. The flags both share are declared once, in :func:`add_pace_flags`.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from embedtune.cli.common import DeprecatedAlias, add_list_flag, command_config, command_line, format_table, print_json
from embedtune.data.beir import load_beir
from embedtune.encoders.sentence_transformer import fingerprint_model_dir
from embedtune.finetune.config import DEFAULT_PRESETS, PRESETS, TINY_VL_MODELS, PACEConfig, parse_stage2_init, preset_config
from embedtune.finetune.loss_choices import WEIGHTINGS
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

__all__ = ["register", "add_pace_flags", "config_from_args", "run_finetune"]

COMMANDS = {"pace": "text", "pace-vl": "vl"}


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
    group.add_argument("--train-split", default=None, help="qrels split with the training (query, positive) pairs (preset: train)")
    group.add_argument("--hard-pool", type=int, default=None, help="negatives are drawn from the frozen model's top-N (preset: 50)")
    group.add_argument("--save-steps", type=int, default=None, help="save a Stage I checkpoint every N steps; the init step is always saved (preset: 500)")
    group.add_argument("--mini-batch-size", type=int, default=None,
                       help="GradCache mini-batch size (exact gradients, constant memory). Default: on a CPU, the size that keeps a "
                            "step's activations under 1 GiB when the whole batch would not (MiniLM: 10 texts; a run then peaks "
                            "near 3 GB instead of 20 GB); on a GPU, none")
    group.add_argument("--normalize", default=None, choices=["global", "local"], help="unit-mean focal weights over the global batch or per process (preset: global)")
    group.add_argument("--deepspeed", default=None, help="DeepSpeed JSON config (GPU), e.g. configs/deepspeed_zero2.json")
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
    group.add_argument("--image-root", default=None, help="folder image paths are relative to (default: the data file's)")
    group.add_argument("--task-format", default=None, metavar="FORMAT",
                       help="Table 5 instruction for every query: vqa, classification, t2i, i2t, composed, or 'auto' (by dataset name)")
    group.add_argument("--instruction", default=None, help="literal instruction for every query (instead of --task-format)")
    group.add_argument("--max-image-pixels", type=int, default=None, help="pixels per image at most (preset: 1605632)")
    group.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    add_list_flag(group, "--eval-tasks", default=[], metavar="FILE", help="MMEB-eval-style files scored after training")


def _temperature(text: str) -> float | str:
    return "auto" if text == "auto" else float(text)


def add_pace_flags(parser: argparse.ArgumentParser, backbone: str) -> None:
    """The flags ``pace`` and ``pace-vl`` share. Each defaults to None: "the preset's (or --config's) value"."""
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
    stages = parser.add_argument_group("stages")
    stages.add_argument("--stage1-steps", type=int, default=None, help="Stage I schedule length (preset: one epoch)")
    stages.add_argument("--stage2-steps", type=int, default=None, help="Stage II schedule length (preset: one epoch)")
    stages.add_argument("--steps", type=int, default=None,
                        help="steps of a one-stage preset (default: PACE's updates, stage2-init step + stage2 steps; "
                             "direct-dot-full without stage steps: 5 epochs)")
    stages.add_argument("--stage2-init", type=parse_stage2_init, default=None,
                        help="Stage II init checkpoint: fraction of Stage I steps, a step, or 'final' (preset: 0.25)")
    stages.add_argument("--stop-stage1-at-init", action="store_true", default=None,
                        help="end Stage I at the Stage II init checkpoint (same weights, less compute)")
    stages.add_argument("--stage1-lr", type=float, default=None, help="Stage I learning rate (preset: 2e-5)")
    stages.add_argument("--stage2-lr", type=float, default=None, help="Stage II learning rate (preset: 2e-6)")
    stages.add_argument("--stage1-temperature", type=_temperature, default=None, help="Stage I τ: a number or 'auto' (preset: 0.1)")
    stages.add_argument("--stage2-temperature", type=_temperature, default=None,
                        help="Stage II τ: 'auto' (τ1 × median ‖q‖·‖c‖) or a number (preset: " + ("auto" if backbone == "text" else "100, the paper's") + ")")
    stages.add_argument("--warmup-ratio", type=float, default=None, help="linear warmup fraction of each stage (preset: 0.05)")
    stages.add_argument("--weighting", default=None, choices=list(WEIGHTINGS), help="every stage's loss weighting (preset: focal)")
    stages.add_argument("--gamma", type=float, default=None, help="every stage's focal γ (preset: 2)")
    batch = parser.add_argument_group("batch, loss and model")
    batch.add_argument("--batch-size", type=int, default=None, help="queries per batch and process (preset: 32)")
    batch.add_argument("--n-negatives", type=int, default=None, help="hard negatives per query (preset: 5)")
    batch.add_argument("--max-seq-length", type=int, default=None, help="cap on tokens per text (preset: " + ("the model's" if backbone == "text" else "8192") + ")")
    batch.add_argument("--weight-temperature", type=float, default=None, help="τ_w of the cosine focal confidence (preset: 0.1)")
    batch.add_argument("--lora-rank", type=int, default=None, help="LoRA rank (preset: 32)")
    batch.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 × rank)")
    batch.add_argument("--seed", type=int, default=None, help="training, data order and mining seed (preset: " + ("2027" if backbone == "text" else "0") + ")")
    batch.add_argument("--precision", default=None, choices=["auto", "bf16", "fp32"], help="auto: bf16 on a supporting GPU, else fp32 (preset: auto)")
    batch.add_argument("--threads", type=int, default=argparse.SUPPRESS, help="torch CPU threads (the same as `embedtune --threads`)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(handler=run_finetune, backbone=backbone)


# flag -> PACEConfig field; the flags of one backbone only are absent from the other's namespace
_TOP_LEVEL = {
    "model": "model", "data": "data", "out": "output_dir", "train_split": "train_split", "stage2_init": "stage2_init",
    "stop_stage1_at_init": "stop_stage1_at_init", "save_steps": "save_steps", "batch_size": "batch_size",
    "mini_batch_size": "mini_batch_size", "n_negatives": "n_negatives", "hard_pool": "hard_pool", "max_seq_length": "max_seq_length",
    "weight_temperature": "weight_temperature", "normalize": "normalize", "lora_rank": "lora_rank", "lora_alpha": "lora_alpha",
    "seed": "seed", "deepspeed": "deepspeed", "precision": "precision",
}
_VL_OPTIONS = {"image_root": "image_root", "task_format": "task", "instruction": "instruction", "max_image_pixels": "max_image_pixels"}
# flag -> (stage, StageConfig field), applied on top of --config
_PER_STAGE = {
    "stage1_steps": ("stage1", "steps"), "stage2_steps": ("stage2", "steps"), "stage1_lr": ("stage1", "learning_rate"),
    "stage2_lr": ("stage2", "learning_rate"), "stage1_temperature": ("stage1", "temperature"),
    "stage2_temperature": ("stage2", "temperature"),
}


def _given(args: argparse.Namespace, names: dict[str, str]) -> dict[str, Any]:
    return {field: getattr(args, flag) for flag, field in names.items() if getattr(args, flag, None) is not None}


def config_from_args(args: argparse.Namespace) -> PACEConfig:
    """The validated :class:`PACEConfig`: ``--config`` or ``--preset``, then the flags that were given."""
    backbone = args.backbone
    top_level = _given(args, _TOP_LEVEL)
    vl_options = _given(args, _VL_OPTIONS)
    if args.config:
        values = PACEConfig.load(args.config).to_dict()
        if values["backbone"] != backbone:
            command = next(name for name, family in COMMANDS.items() if family == values["backbone"])
            raise ValueError(f"{args.config} is a config for backbone={values['backbone']!r}; run it with `embedtune finetune {command}`.")
        for flag, (stage, name) in _PER_STAGE.items():
            if getattr(args, flag) is None:
                continue
            if values[stage] is None:
                raise ValueError(f"--{flag.replace('_', '-')} was given but the config (preset {values.get('preset')!r}) has no {stage}.")
            values[stage][name] = getattr(args, flag)
        for stage in ("stage1", "stage2"):
            for flag, name in (("warmup_ratio", "warmup_ratio"), ("weighting", "weighting"), ("gamma", "gamma")):
                if values[stage] is not None and getattr(args, flag) is not None:
                    values[stage][name] = getattr(args, flag)
        if args.steps is not None:
            raise ValueError("--steps sets a one-stage preset's schedule; with --config, use --stage1-steps.")
    else:
        required = (("model", "model"), ("data", "data"), ("out", "output_dir")) if backbone == "vl" else (("out", "output_dir"),)
        for flag, name in required:
            if getattr(args, flag) is None:
                raise ValueError(f"--{flag} is required (or give --config with {name} set).")
        values = preset_config(
            args.preset, backbone=backbone, stage1_steps=args.stage1_steps, stage2_steps=args.stage2_steps, steps=args.steps,
            weighting=args.weighting, gamma=args.gamma, stage1_learning_rate=args.stage1_lr, stage2_learning_rate=args.stage2_lr,
            stage1_temperature=args.stage1_temperature, stage2_temperature=args.stage2_temperature, warmup_ratio=args.warmup_ratio,
            **top_level,
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
