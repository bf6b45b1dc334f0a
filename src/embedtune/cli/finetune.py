"""``embedtune finetune pace``: the PACE recipe, its baselines and ablations, as flags.

``embedtune finetune pace-vl`` (vision-language backbones) lives in :mod:`embedtune.cli.finetune_vl`.
"""

from __future__ import annotations

import argparse
import json

from embedtune.cli.common import print_json, print_table
from embedtune.cli.finetune_vl import register_vl
from embedtune.finetune.config import PRESETS, preset_config


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "finetune",
        help="fine-tune the embedding model (PACE)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Fine-tune a sentence-transformers model (pace) or a Qwen vision-language embedder (pace-vl). "
                    "The output is an s-t model folder.",
    )
    methods = parser.add_subparsers(dest="method", metavar="METHOD", required=True)
    pace = methods.add_parser(
        "pace",
        help="PACE: Stage I cosine+LoRA, then Stage II dot+full from an intermediate checkpoint",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "Train with the Focal Embedding Loss on (query, positive, K hard negatives) tuples mined from BEIR train "
            "qrels with the frozen model. Presets: "
            + "; ".join(f"{name}: {text}" for name, text in _presets().items())
            + ". Evaluate a dot-product model with `embedtune evaluate --model OUT/model --similarity dot`. "
            "Multi-process: `accelerate launch --num_processes 2 -m embedtune finetune pace ...`."
        ),
    )
    pace.add_argument("--preset", default="pace", choices=sorted(_presets()), help="recipe, baseline or ablation")
    pace.add_argument("--model", default="minilm", help="'minilm', 'mpnet', or a local sentence-transformers folder")
    pace.add_argument("--data", default="scifact", help="BEIR folder, BEIR-layout .zip, or bundled name 'scifact'")
    pace.add_argument("--train-split", default="train", help="qrels split with the training (query, positive) pairs")
    pace.add_argument("--output", required=True, help="output folder (stages, checkpoints, model/, result.json)")
    pace.add_argument("--stage1-steps", type=int, default=None, help="Stage I schedule length (default: one epoch)")
    pace.add_argument("--stage2-steps", type=int, default=None, help="Stage II schedule length (default: one epoch)")
    pace.add_argument("--steps", type=int, default=None,
                      help="steps of a one-stage preset (default: PACE's updates, stage2-init step + stage2 steps)")
    pace.add_argument("--stage2-init", default="0.25", help="Stage II init checkpoint: fraction of Stage I steps, a step, or 'final'")
    pace.add_argument("--stop-stage1-at-init", action="store_true", help="end Stage I at the Stage II init checkpoint (same weights, less compute)")
    pace.add_argument("--save-steps", type=int, default=500, help="save a Stage I checkpoint every N steps (the init step is always saved)")
    pace.add_argument("--batch-size", type=int, default=32, help="queries per batch and process")
    pace.add_argument("--mini-batch-size", type=int, default=None, help="GradCache mini-batch size (exact gradients, constant memory)")
    pace.add_argument("--n-negatives", type=int, default=5, help="hard negatives per query")
    pace.add_argument("--hard-pool", type=int, default=50, help="negatives are drawn from the frozen model's top-N")
    pace.add_argument("--max-seq-length", type=int, default=None, help="cap on tokens per text")
    pace.add_argument("--weighting", default=None, choices=["focal", "random", "qp", "qn", "none"], help="override every stage's loss weighting")
    pace.add_argument("--gamma", type=float, default=None, help="override every stage's focal γ (paper: 2)")
    pace.add_argument("--stage2-temperature", default=None, help="Stage II τ: 'auto' (τ1 × median ‖q‖·‖c‖) or a number (paper: 100)")
    pace.add_argument("--weight-temperature", type=float, default=0.1, help="τ_w of the cosine focal confidence")
    pace.add_argument("--normalize", default="global", choices=["global", "local"], help="unit-mean focal weights over the global batch or per process")
    pace.add_argument("--lora-rank", type=int, default=32, help="LoRA rank")
    pace.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 × rank)")
    pace.add_argument("--seed", type=int, default=2027, help="training and mining seed")
    pace.add_argument("--deepspeed", default=None, help="DeepSpeed JSON config (GPU), e.g. configs/deepspeed_zero2.json")
    pace.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"], help="auto: bf16 on a supporting GPU, else fp32")
    pace.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    pace.add_argument("--evaluate-split", default=None, help="evaluate the final model on this qrels split (e.g. test)")
    pace.add_argument("--json", action="store_true", help="print the result as one JSON object")
    pace.set_defaults(handler=run_pace)

    register_vl(methods)


def _presets() -> dict[str, str]:
    return PRESETS


def config_from_args(args: argparse.Namespace):
    temperature = args.stage2_temperature
    if temperature is not None and temperature != "auto":
        temperature = float(temperature)
    return preset_config(
        args.preset,
        stage1_steps=args.stage1_steps,
        stage2_steps=args.stage2_steps,
        steps=args.steps,
        weighting=args.weighting,
        gamma=args.gamma,
        stage2_temperature=temperature,
        model=args.model,
        data=args.data,
        train_split=args.train_split,
        output_dir=args.output,
        stage2_init=args.stage2_init,
        stop_stage1_at_init=args.stop_stage1_at_init,
        save_steps=args.save_steps,
        batch_size=args.batch_size,
        mini_batch_size=args.mini_batch_size,
        n_negatives=args.n_negatives,
        hard_pool=args.hard_pool,
        max_seq_length=args.max_seq_length,
        weight_temperature=args.weight_temperature,
        normalize=args.normalize,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        seed=args.seed,
        deepspeed=args.deepspeed,
        precision=args.precision,
    )


def run_pace(args: argparse.Namespace) -> int:
    from embedtune.finetune.recipe import train_pace  # heavy optional dependency: sentence-transformers and transformers

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = train_pace(config_from_args(args), evaluate_split=args.evaluate_split)
    summary = {
        "preset": args.preset,
        "model_dir": result.model_dir,
        "similarity": result.similarity,
        "n_training_tuples": result.n_training_tuples,
        "seconds": result.seconds,
        "stages": [
            {k: getattr(stage, k) for k in ("name", "similarity", "parameters", "steps", "steps_run", "temperature", "weighting", "gamma", "seconds", "init_checkpoint")}
            for stage in result.stages
        ],
        "metrics": result.metrics,
    }
    if args.json:
        print_json(summary)
    else:
        print_table(summary["stages"], ["name", "similarity", "parameters", "steps_run", "temperature", "weighting", "seconds", "init_checkpoint"])
        print(f"model: {result.model_dir} (rank with {result.similarity})")
        if result.metrics:
            print(json.dumps({k: result.metrics[k] for k in ("ndcg@10", "recall@10") if k in result.metrics}))
    return 0
