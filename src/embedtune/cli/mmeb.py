"""``embedtune evaluate-mmeb``: Precision@1 of a Qwen-VL embedder on MMEB-eval-style files."""

from __future__ import annotations

import argparse
import logging

from embedtune.cli.common import command_config, command_line, format_table, print_json
from embedtune.encoders.sentence_transformer import fingerprint_model_dir
from embedtune.io import sha256_file
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir
from embedtune.workflows.mmeb import evaluate_mmeb_model
from embedtune.workflows.results import mmeb_summary, write_results

logger = logging.getLogger(__name__)


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate-mmeb",
        help="Precision@1 of a vision-language embedder on MMEB-style tasks, with the paper's grouping",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Each FILE is one dataset (JSONL or parquet, ground truth at candidate 0), named by its file stem. "
                    "A tie with the ground truth counts as a miss.",
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="folder saved by QwenVLEmbedder.save")
    parser.add_argument("--tasks", required=True, nargs="+", metavar="FILE", help="MMEB-eval-style files")
    parser.add_argument("--similarity", default="auto", choices=["auto", "cosine", "dot"],
                        help="ranking similarity; auto uses the one saved with the model (dot after Stage II)")
    parser.add_argument("--task-format", default=None, metavar="FORMAT",
                        help="Table 5 instruction for every file's queries: vqa, classification, t2i, i2t, composed, "
                             "or 'auto' (by dataset name); a row's own 'instruction'/'task' field wins (default: none)")
    parser.add_argument("--instruction", default="", help="literal instruction for every file's queries (instead of --task-format)")
    parser.add_argument("--image-root", default=None, help="folder image paths are relative to (default: each file's folder)")
    parser.add_argument("--batch-size", type=int, default=8, help="inputs per forward pass")
    parser.add_argument("--device", default=None, help="torch device (default: CPU)")
    parser.add_argument("--out", default=None, metavar="DIR", help="write results.json and results.md there")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(handler=run_evaluate_mmeb)


def run_evaluate_mmeb(args: argparse.Namespace) -> int:
    if args.out:
        prepare_output_dir(args.out, args.overwrite, command="evaluate-mmeb", inputs=[args.model, *args.tasks])
    result = evaluate_mmeb_model(args.model, args.tasks, similarity=args.similarity, image_root=args.image_root,
                                 batch_size=args.batch_size, device=args.device, task=args.task_format, instruction=args.instruction)
    groups = ["classification", "vqa", "retrieval", "grounding", "ind", "ood", "overall"]
    table = (format_table([{"dataset": name, "p@1": score} for name, score in result["per_dataset"].items()], ["dataset", "p@1"])
             + "\n" + format_table([{key: result[key] for key in groups}], groups))
    if args.out:
        metrics, rows = mmeb_summary(result)
        model = {"name": str(args.model), "path": str(args.model), "fingerprint": fingerprint_model_dir(args.model), "similarity": result["similarity"]}
        path = write_results(args.out, task="evaluate-mmeb", command=command_line(args), config=command_config(args),
                             data={"tasks": {str(task): sha256_file(task) for task in args.tasks}}, model=model, metrics=metrics,
                             rows=rows, table=table)
        logger.info("results: %s", path)
        finish_output_dir(args.out, "evaluate-mmeb")
    if args.json:
        print_json(result)
    else:
        print(table)
    return 0
