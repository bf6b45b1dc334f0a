"""``embedtune finetune pace-vl``: PACE on a Qwen vision-language backbone from MMEB-train-style data.

A sibling of ``finetune pace`` (text): same presets idea, its own flags because the data (JSONL or
parquet with image paths), the backbone (Qwen-VL family) and the loop (single process) differ.
Every override flag defaults to None, so only what is given changes the preset (or ``--config``).
"""

from __future__ import annotations

import argparse
from typing import Any

from embedtune.cli.common import print_json, print_table
from embedtune.finetune.vl_config import TINY_MODELS, VL_PRESETS, VLPACEConfig, vl_preset_config


def register_vl(methods: argparse._SubParsersAction) -> None:
    parser = methods.add_parser(
        "pace-vl",
        help="PACE on a Qwen-VL backbone (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) from MMEB-train-style data",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Stage I (cosine + LoRA on the language model) then Stage II (dot + full language model) with the Focal "
            "Embedding Loss; the vision tower and projector stay frozen. Presets: "
            + "; ".join(f"{name}: {text}" for name, text in VL_PRESETS.items())
            + f". Tiny random backbones for smoke runs: {', '.join(sorted(TINY_MODELS))}. The output's model/ folder "
            "loads with `embedtune evaluate-mmeb --model OUT/model` and `SentenceTransformer(OUT/model, trust_remote_code=True)`; "
            "vl_pace_config.json next to it records the run."
        ),
    )
    parser.add_argument("--preset", default="pace", choices=sorted(VL_PRESETS), help="recipe or baseline (Appendix A values)")
    parser.add_argument("--config", default=None, metavar="JSON", help="start from a saved vl_pace_config.json instead of --preset")
    parser.add_argument("--model", default=None, help="checkpoint folder or hub id of a supported family, or a tiny-* name (required unless --config)")
    parser.add_argument("--train", default=None, metavar="FILE", help="MMEB-train-style .jsonl or .parquet (required unless --config)")
    parser.add_argument("--output", default=None, metavar="DIR", help="output folder: stage1/ adapters, model/, result.json (required unless --config)")
    parser.add_argument("--image-root", default=None, help="folder image paths are relative to (default: the data file's)")
    parser.add_argument("--task-format", default=None, metavar="FORMAT",
                        help="Table 5 instruction for every query: vqa, classification, t2i, i2t, composed, or 'auto' (by dataset name)")
    parser.add_argument("--instruction", default=None, help="literal instruction for every query (instead of --task-format)")
    parser.add_argument("--stage1-steps", type=int, default=None, help="Stage I steps (preset: one epoch)")
    parser.add_argument("--stage2-steps", type=int, default=None, help="Stage II steps (preset: one epoch)")
    parser.add_argument("--stage2-init", default=None, help="Stage II init: fraction of Stage I steps, a step, or 'final' (paper: 0.25)")
    parser.add_argument("--stop-stage1-at-init", action="store_true", default=None, help="end Stage I at the Stage II init step")
    parser.add_argument("--stage1-lr", type=float, default=None, help="Stage I learning rate (paper: 2e-5)")
    parser.add_argument("--stage2-lr", type=float, default=None, help="Stage II learning rate (paper: 2e-6)")
    parser.add_argument("--stage1-temperature", type=float, default=None, help="Stage I τ (paper: 0.1)")
    parser.add_argument("--stage2-temperature", type=float, default=None, help="Stage II τ (paper: 100)")
    parser.add_argument("--warmup-ratio", type=float, default=None, help="linear warmup fraction of each stage (paper: 0.05)")
    parser.add_argument("--batch-size", type=int, default=None, help="queries per step (paper: 32 per GPU)")
    parser.add_argument("--n-negatives", type=int, default=None, help="hard negatives per query (paper: 5)")
    parser.add_argument("--gamma", type=float, default=None, help="focal γ (paper: 2)")
    parser.add_argument("--lora-rank", type=int, default=None, help="LoRA rank (paper: 32)")
    parser.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 × rank)")
    parser.add_argument("--max-seq-length", type=int, default=None, help="refuse longer inputs (paper: 8192)")
    parser.add_argument("--max-image-pixels", type=int, default=None, help="pixels per image at most (paper: 1605632)")
    parser.add_argument("--precision", default=None, choices=["auto", "bf16", "fp32"], help="auto: bf16 autocast on a supporting GPU")
    parser.add_argument("--seed", type=int, default=None, help="data order (and tiny backbone) seed")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    parser.add_argument("--eval-tasks", nargs="+", default=(), metavar="FILE", help="MMEB-eval-style files scored after training")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(handler=run_pace_vl)


# flag -> VLPACEConfig field (top level)
_TOP_LEVEL = {
    "model": "model", "train": "train_data", "output": "output_dir", "image_root": "image_root", "task_format": "task",
    "instruction": "instruction", "stage2_init": "stage2_init", "stop_stage1_at_init": "stop_stage1_at_init",
    "batch_size": "batch_size", "n_negatives": "n_negatives", "gamma": "gamma", "lora_rank": "lora_rank", "lora_alpha": "lora_alpha",
    "max_seq_length": "max_seq_length", "max_image_pixels": "max_image_pixels", "precision": "precision", "seed": "seed",
}
# flag -> (stage, VLStageConfig field)
_PER_STAGE = {
    "stage1_steps": ("stage1", "steps"), "stage2_steps": ("stage2", "steps"), "stage1_lr": ("stage1", "learning_rate"),
    "stage2_lr": ("stage2", "learning_rate"), "stage1_temperature": ("stage1", "temperature"),
    "stage2_temperature": ("stage2", "temperature"),
}


def config_from_args(args: argparse.Namespace):
    """The validated :class:`VLPACEConfig`: ``--config`` or ``--preset``, then the flags that were given."""
    values: dict[str, Any] = VLPACEConfig.load(args.config).to_dict() if args.config else vl_preset_config(args.preset).to_dict()
    for flag, name in _TOP_LEVEL.items():
        if getattr(args, flag) is not None:
            values[name] = getattr(args, flag)
    if args.instruction is not None and args.task_format is None:
        values["task"] = None  # an explicit instruction replaces a task taken from --config
    for flag, (stage, name) in _PER_STAGE.items():
        if getattr(args, flag) is None:
            continue
        if values[stage] is None:
            raise ValueError(f"--{flag.replace('_', '-')} was given but preset {values.get('preset')!r} has no {stage}; "
                             "drop the flag or use a two-stage preset (pace, no-focal).")
        values[stage][name] = getattr(args, flag)
    if args.warmup_ratio is not None:
        for stage in ("stage1", "stage2"):
            if values[stage] is not None:
                values[stage]["warmup_ratio"] = args.warmup_ratio
    for flag, name in (("model", "model"), ("train", "train_data"), ("output", "output_dir")):
        if not args.config and getattr(args, flag) is None:
            raise ValueError(f"--{flag} is required (or give --config with {name} set).")
    return VLPACEConfig.from_dict(values)


def run_pace_vl(args: argparse.Namespace) -> int:
    from embedtune.finetune.vl_recipe import run_vl_pace  # heavy optional dependency: sentence-transformers and the VL stack

    result = run_vl_pace(config_from_args(args), evaluate_tasks=args.eval_tasks, device=args.device)
    summary = {key: value for key, value in result.to_dict().items() if key not in ("logs", "config")}
    summary["final_loss"] = {stage: next((log["loss"] for log in reversed(result.logs) if log["stage"] == stage), None) for stage in (1, 2)}
    if args.json:
        print_json(summary)
    else:
        stages = [{"stage": stage, "steps_run": sum(log["stage"] == stage for log in result.logs), "final_loss": summary["final_loss"][stage]}
                  for stage in (1, 2) if any(log["stage"] == stage for log in result.logs)]
        print_table(stages, ["stage", "steps_run", "final_loss"])
        print(f"model: {result.model_dir} (rank with {result.similarity}; Stage II from Stage I step {result.stage2_init_step})")
        if result.metrics:
            print_table([{"dataset": name, "p@1": score} for name, score in result.metrics["per_dataset"].items()], ["dataset", "p@1"])
    return 0
