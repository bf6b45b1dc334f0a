"""``embedtune pipeline``: PACE fine-tuning, then compression of the fine-tuned embeddings, then evaluation."""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable
from typing import Any

from embedtune.cli.common import add_data_flags, command_config, command_line, format_table, print_json
from embedtune.cli.config_flags import add_config_flags, config_overrides
from embedtune.data.beir import load_beir
from embedtune.encoders import resolve_model_path
from embedtune.encoders.sentence_transformer import fingerprint_model_dir
from embedtune.finetune.config import DEFAULT_PRESETS, ONE_STAGE_DEFAULT_EPOCHS, PACEConfig, parse_stage2_init, preset_config
from embedtune.finetune.schema import StageConfig
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.pipeline_config import PipelineConfig
from embedtune.workflows.results import describe_data, pipeline_summary, write_results

logger = logging.getLogger(__name__)

__all__ = ["register", "run_pipeline_command", "configs_from_args", "PIPELINE_FLAG_FIELDS", "PIPELINE_FLAG_ALIASES",
           "PIPELINE_PACE_FLAG_FIELDS"]

#: PipelineConfig fields taken as flags, one each. The others: split_seed is --seed's, variants --norm-preserving's;
#: mining (the --dive-preset's) and compressor_overrides have none (--n-negatives would read as PACE's, as in `finetune pace`).
PIPELINE_FLAG_FIELDS = ("methods", "dim", "seeds", "dive_preset", "test_split", "val_fraction", "compare_base")
#: Flag names kept working where they differ from the generated one (--compare-base's alias --base gives --no-base).
PIPELINE_FLAG_ALIASES = {"compare_base": ("--base",)}
#: PACEConfig fields taken as flags, named as `finetune pace` names them (--model, --data and --out stay hand-written: paths).
PIPELINE_PACE_FLAG_FIELDS = ("train_split", "stage2_init", "stop_stage1_at_init", "batch_size", "max_seq_length", "seed")
_STAGES = ("stage1", "stage2")
_DEFAULT_PRESET = DEFAULT_PRESETS["text"]
# A fine-tuning field's help ends with its dataclass default, "(default: VALUE...)"; a flag states the preset's instead.
_STATED_DEFAULT = re.compile(r"\s*\(default: [^()]*\)$")


def _preset_default(values: dict[str, Any], extra: dict[str, str] | None = None) -> Callable[[str, str], str]:
    """``(field, help) -> help``: the field's help, what the default --preset sets it to, and any ``extra`` words."""
    def note(name: str, help_text: str) -> str:
        return (f"{_STATED_DEFAULT.sub('', help_text)}{(extra or {}).get(name, '')} "
                f"(default: {values[name]!r}, --preset {_DEFAULT_PRESET}'s)")
    return note


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "pipeline",
        help="fine-tune (PACE), then compress the fine-tuned embeddings, then evaluate",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "PACE fine-tunes --model on qrels/<train-split>.tsv; each compressor is then fitted on the fine-tuned "
            "embeddings of the same train queries and evaluated once on every judged query of qrels/<test-split>.tsv, "
            "beside the uncompressed models and the base model under the same compressors. Re-running with the same "
            "--out reuses a finished fine-tuning."
        ),
    )
    parser.add_argument("--model", default="minilm", help="'minilm', 'mpnet', or a local sentence-transformers folder")
    add_data_flags(parser, split=False, help="BEIR folder (with qrels/train.tsv), .zip, or bundled name 'scifact'")
    parser.add_argument("--out", required=True, help="run folder (finetune/, triplets/, compressors/<model>/<method>/s<seed>/ with every "
                        "fitted compressor, results.json with the full summary in its 'details' (it replaces pipeline_result.json), results.md)")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP + " (re-running into the same --out resumes instead)")
    parser.add_argument("--preset", default=_DEFAULT_PRESET,
                        help=f"fine-tuning preset (default: {_DEFAULT_PRESET}, as `embedtune finetune pace`; see its --help)")
    preset = preset_config(_DEFAULT_PRESET).to_dict()
    pace = parser.add_argument_group(
        "fine-tuning (PACEConfig and StageConfig fields)", "A flag given overrides the --preset's value; one left out keeps it.")
    add_config_flags(pace, PACEConfig, PIPELINE_PACE_FLAG_FIELDS, value_parsers={"stage2_init": parse_stage2_init},
                     help_text=_preset_default(preset, {"seed": "; also the seed of the compressors' validation split and triplets"}))
    one_stage = ("; a one-stage preset's whole schedule: "
                 + ", ".join(f"{name} {epochs:g} epochs" for name, epochs in ONE_STAGE_DEFAULT_EPOCHS.items()))
    for stage in _STAGES:
        epochs = preset[stage]["epochs"]
        passes = f"; None with --preset {_DEFAULT_PRESET}: {'one pass' if epochs == 1 else f'{epochs:g} passes'} over the training tuples"
        add_config_flags(pace, StageConfig, ("steps",), prefix=f"{stage}-",
                         help_text=_preset_default(preset[stage], {"steps": passes + (one_stage if stage == "stage1" else "")}))
    compress = parser.add_argument_group("compression (PipelineConfig fields)", "A flag left out keeps the field's default.")
    add_config_flags(compress, PipelineConfig, PIPELINE_FLAG_FIELDS, aliases=PIPELINE_FLAG_ALIASES)
    compress.add_argument("--norm-preserving", action="store_true",
                          help="also run DIVE with output_norm='input' (head 1 scaled by the input norm, for dot-product models)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(handler=run_pipeline_command)


def configs_from_args(args: argparse.Namespace) -> tuple[PACEConfig, PipelineConfig]:
    """The fine-tuning recipe and the compression settings: the presets', then every flag that was given.

    Every value given is checked by its config's declared constraints here, before any model is read."""
    steps = {stage: config_overrides(args, StageConfig, ("steps",), prefix=f"{stage}-").get("steps") for stage in _STAGES}
    pace_config = preset_config(args.preset, stage1_steps=steps["stage1"], stage2_steps=steps["stage2"], model=args.model,
                                data=args.data, output_dir=args.out, **config_overrides(args, PACEConfig, PIPELINE_PACE_FLAG_FIELDS))
    given = config_overrides(args, PipelineConfig, PIPELINE_FLAG_FIELDS)
    if args.norm_preserving:
        given["variants"] = {"norm-preserving": {"method": "dive", "output_norm": "input"}}
    return pace_config, PipelineConfig(split_seed=pace_config.seed, **given)


def run_pipeline_command(args: argparse.Namespace) -> int:
    # heavy optional dependency: sentence-transformers and transformers (PACE training, through finetune.recipe)
    from embedtune.workflows.pipeline import run_pipeline

    pace_config, config = configs_from_args(args)
    prepare_output_dir(args.out, args.overwrite, command="pipeline", inputs=[args.data, args.model], resume=True,
                       legacy_names=["finetune", "pipeline_result.json"])
    result = run_pipeline(pace_config, config, args.out)
    table = format_table(result["rows"], ["model", "similarity", "method", "variant", "dim", "seed", "ndcg@10", "ndcg@10_seen",
                                          "ndcg@10_unseen", "recall@10", "n_queries"])
    counts = result.get("subsets", {}).get("counts", {})
    if counts:
        table += (f"\nnDCG@10_seen / _unseen: the {counts.get('seen', 0)} test queries whose positives were all train-qrels "
                  f"positives / the {counts.get('unseen', 0)} with none among them ({counts.get('mixed', 0)} mixed count in nDCG@10 only).")
    if result["comparisons"]:
        table += ("\npaired tests on per-query nDCG@10 (means over seeds; permutation p, bootstrap 95 % CI):\n"
                  + format_table(result["comparisons"], ["a", "b", "mean_a", "mean_b", "difference", "ci_low", "ci_high", "p_value", "n_queries"]))
    metrics, per_query, rows = pipeline_summary(result, (config.methods or ["dive"])[0])
    base = resolve_model_path(args.model)
    model = {"name": "finetuned", "path": result["model_dir"], "fingerprint": fingerprint_model_dir(result["model_dir"]),
             "similarity": result["similarity"], "base": {"name": args.model, "path": str(base), "fingerprint": fingerprint_model_dir(base)}}
    data = describe_data(load_beir(args.data, config.test_split), queries=f"every judged query of qrels/{config.test_split}.tsv",
                         train_split=pace_config.train_split)
    path = write_results(args.out, task="pipeline", command=command_line(args), config={**command_config(args), **result["pipeline_config"]},
                         data=data, model=model, metrics=metrics, per_query=per_query, rows=rows, table=table,
                         details=result, extra={"comparisons": result["comparisons"]})
    logger.info("results: %s", path)
    finish_output_dir(args.out, "pipeline")
    if args.json:
        print_json(result)
    else:
        print(table)
        print(f"fine-tuned model: {result['model_dir']} (ranks by {result['similarity']}); results: {path}")
        saved = [row["compressor"] for row in result["rows"] if row.get("compressor") and row["model"] == "finetuned"]
        if saved:
            print(f"fitted compressors (apply them to the fine-tuned model's vectors): {', '.join(saved)}")
    return 0
