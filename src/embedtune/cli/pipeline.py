"""``embedtune pipeline``: PACE fine-tuning, then compression of the fine-tuned embeddings, then evaluation."""

from __future__ import annotations

import argparse
import logging

from embedtune.cli.common import add_data_flags, add_list_flag, command_config, command_line, format_table, print_json
from embedtune.compress import describe_method
from embedtune.data.beir import load_beir
from embedtune.encoders import resolve_model_path
from embedtune.encoders.sentence_transformer import fingerprint_model_dir
from embedtune.finetune.config import DEFAULT_PRESETS, ONE_STAGE_DEFAULT_EPOCHS, parse_stage2_init, preset_config
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.results import describe_data, pipeline_summary, write_results

logger = logging.getLogger(__name__)


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
    parser.add_argument("--preset", default=DEFAULT_PRESETS["text"],
                        help=f"fine-tuning preset (default: {DEFAULT_PRESETS['text']}, as `embedtune finetune pace`; see its --help)")
    parser.add_argument("--train-split", default="train", help="qrels split PACE and the compressors train on")
    parser.add_argument("--test-split", default="test", help="qrels split of the held-out evaluation")
    parser.add_argument("--stage1-steps", type=int, default=None,
                        help="Stage I schedule length in optimizer steps (default: the preset's, one pass over the training tuples; "
                             "a one-stage preset's whole schedule: " + ", ".join(f"{name} {epochs:g} epochs" for name, epochs in
                                                                                 ONE_STAGE_DEFAULT_EPOCHS.items()) + ")")
    parser.add_argument("--stage2-steps", type=int, default=None,
                        help="Stage II schedule length in optimizer steps (default: the preset's, one pass over the training tuples)")
    parser.add_argument("--stage2-init", type=parse_stage2_init, default=0.25, help="Stage II init checkpoint: fraction of Stage I, a step, or 'final'")
    parser.add_argument("--stop-stage1-at-init", action="store_true", help="end Stage I at the Stage II init checkpoint")
    parser.add_argument("--batch-size", type=int, default=32, help="PACE queries per batch")
    parser.add_argument("--max-seq-length", type=int, default=None, help="token cap for training and encoding")
    add_list_flag(parser, "--methods", default=["dive"], help="compressors, e.g. --methods dive pca")
    parser.add_argument("--dive-preset", default=describe_method("dive").default_preset, choices=sorted(describe_method("dive").presets),
                        help="DIVE preset for the compression step (settings and triplet mining)")
    parser.add_argument("--dim", type=int, default=128, help="compressed dimension k")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2027], help="compressor seeds")
    parser.add_argument("--norm-preserving", action="store_true",
                        help="also run DIVE with output_norm='input' (head 1 scaled by the input norm, for dot-product models)")
    parser.add_argument("--no-base", action="store_true", help="skip the base-model rows")
    parser.add_argument("--seed", type=int, default=2027, help="PACE seed and split seed")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(handler=run_pipeline_command)


def run_pipeline_command(args: argparse.Namespace) -> int:
    # heavy optional dependency: sentence-transformers and transformers (PACE training, through finetune.recipe)
    from embedtune.workflows.pipeline import PipelineConfig, run_pipeline

    init = args.stage2_init
    pace_config = preset_config(
        args.preset, stage1_steps=args.stage1_steps, stage2_steps=args.stage2_steps, model=args.model, data=args.data,
        train_split=args.train_split, output_dir=args.out, stage2_init=init, stop_stage1_at_init=args.stop_stage1_at_init,
        batch_size=args.batch_size, max_seq_length=args.max_seq_length, seed=args.seed,
    )
    variants = {"norm-preserving": {"method": "dive", "output_norm": "input"}} if args.norm_preserving else {}
    config = PipelineConfig(methods=args.methods, dim=args.dim, seeds=args.seeds, dive_preset=args.dive_preset, variants=variants,
                            test_split=args.test_split, split_seed=args.seed, compare_base=not args.no_base)
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
    metrics, per_query, rows = pipeline_summary(result, (args.methods or ["dive"])[0])
    base = resolve_model_path(args.model)
    model = {"name": "finetuned", "path": result["model_dir"], "fingerprint": fingerprint_model_dir(result["model_dir"]),
             "similarity": result["similarity"], "base": {"name": args.model, "path": str(base), "fingerprint": fingerprint_model_dir(base)}}
    data = describe_data(load_beir(args.data, args.test_split), queries=f"every judged query of qrels/{args.test_split}.tsv",
                         train_split=args.train_split)
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
