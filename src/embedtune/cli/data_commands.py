"""``embedtune embed``, ``embedtune embed-corpus`` and ``embedtune split``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from embedtune.cli.common import add_backend_flag, add_data_flags, add_model_flags, add_ray_flags, add_split_flags, backend_options, experiment_from_args, print_json
from embedtune.data import load_beir, query_disjoint_split
from embedtune.data.splits import positive_disjoint_folds
from embedtune.encoders.ray_encode import RUN_RECORD
from embedtune.encoders.recipe import EncoderRecipe, write_recipe
from embedtune.io import atomic_save_npy, atomic_write_json
from embedtune.workflows.encode_corpus import encode_corpus
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir, prepare_output_file


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    embed = commands.add_parser("embed", help="experiments: encode a labelled BEIR dataset's corpus and queries (cached) to two .npy files; for your own corpus or query log use embed-corpus", formatter_class=fmt,
                                description="Encode every document and query (cached) and write float32 .npy files plus ids.")
    add_data_flags(embed)
    add_model_flags(embed)
    embed.add_argument("--out", required=True, help="output folder for {doc,query}_embeddings.npy and {doc,query}_ids.json")
    embed.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    embed.set_defaults(handler=run_embed)

    corpus = commands.add_parser(
        "embed-corpus", help="your corpus (or, with --kind query, a query log): resumable, checked .npy shards, here or on Ray; read wherever vectors are", formatter_class=fmt,
        description="Encode every document of --data into shard-0000i.npy + shard-0000i.ids.txt under --out. A rerun skips "
                    "complete shards. With --ray-actors N, N encoders run on Ray Data (one per GPU with --gpus-per-actor 1); "
                    "on a cluster, start it on a node with --ray-address auto and give an --out every node can write.")
    corpus.add_argument("--data", required=True, help="a BEIR folder or a corpus.jsonl ({\"_id\", \"title\", \"text\"} per line); "
                        "with --kind query, a query file (JSONL {\"_id\", \"text\"} or TSV id<TAB>text)")
    corpus.add_argument("--kind", default="document", choices=["document", "query"],
                        help="encode documents, or the queries of a query log (unlabelled queries for a label-free plan)")
    corpus.add_argument("--prompt", default="", help="text prepended to every text: the model's document prompt, or its query "
                        "prompt with --kind query (e.g. 'query: ' for E5); recorded, so search uses the same")
    corpus.add_argument("--model", default="minilm", help="'minilm', 'mpnet', or a local sentence-transformers folder")
    corpus.add_argument("--out", required=True,
                        help="shard folder: created, or re-entered when an earlier embed-corpus wrote it (a rerun resumes); "
                             "any other non-empty folder is refused")
    corpus.add_argument("--overwrite", action="store_true",
                        help=OVERWRITE_HELP + " (re-running into the same --out resumes instead; --overwrite encodes every shard again)")
    corpus.add_argument("--shard-size", type=int, default=50_000, help="documents per shard (one encode call, one file)")
    corpus.add_argument("--batch-size", type=int, default=64, help="encoding batch size")
    corpus.add_argument("--max-seq-length", type=int, default=None, help="token cap (default: the model's own)")
    add_backend_flag(corpus)
    add_ray_flags(corpus, actor="encoder", threads="torch threads", gpus=True)
    corpus.set_defaults(handler=run_embed_corpus)

    split = commands.add_parser("split", help="write the query-disjoint train/val/test manifest", formatter_class=fmt,
                                description="Rank judged query ids by sha256(f'{seed}:{id}') and cut them into train/val/test; "
                                            "with --folds N, cut them into N positive-disjoint folds instead.")
    add_data_flags(split)
    add_split_flags(split)
    split.add_argument("--folds", type=int, default=None, metavar="N",
                       help="N positive-disjoint folds (N >= 2): each judged query is a test query of one fold, and no test query's "
                            "relevant document is a relevant document of that fold's train or val queries; --fractions' VAL share of "
                            "TRAIN+VAL sets the validation part. The manifest lists the folds")
    split.add_argument("--out", required=True, help="manifest JSON path")
    split.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    split.set_defaults(handler=run_split)


def run_embed(args: argparse.Namespace) -> int:
    out = prepare_output_dir(args.out, args.overwrite, command="embed", inputs=[
        args.data, args.model, args.doc_embeddings, args.doc_ids, args.query_embeddings, args.query_ids])
    experiment = experiment_from_args(args, with_split=False)
    emb = experiment.embeddings
    atomic_save_npy(out / "doc_embeddings.npy", np.asarray(emb.doc_embeddings, dtype=np.float32))
    atomic_save_npy(out / "query_embeddings.npy", np.asarray(emb.query_embeddings, dtype=np.float32))
    atomic_write_json(out / "doc_ids.json", emb.doc_ids)
    atomic_write_json(out / "query_ids.json", emb.query_ids)
    if emb.model:  # encoded here: the recipe travels with the vectors, so `index build` and `search` can check it
        write_recipe(out, EncoderRecipe.from_dict(emb.model))
    finish_output_dir(out, "embed")
    print_json({"out": str(out), "docs": len(emb.doc_ids), "queries": len(emb.query_ids), "dim": emb.dim, "seconds": emb.timings})
    return 0


def _shard_folder_before_markers(out: str) -> tuple[str, ...]:
    """``("run.json",)`` when ``out`` is a shard folder an embed-corpus wrote before output markers existed (resumed as its own)."""
    record = Path(out) / RUN_RECORD
    try:
        previous = json.loads(record.read_text(encoding="utf-8")) if record.is_file() and not record.is_symlink() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return ()
    return (RUN_RECORD,) if isinstance(previous, dict) and {"shard_size", "ids_sha256", "model"} <= set(previous) else ()


def run_embed_corpus(args: argparse.Namespace) -> int:
    if args.shard_size < 1:
        raise ValueError(f"--shard-size must be at least 1; got {args.shard_size}.")
    # The same --out rules as every writer: a folder this command wrote is resumed, any other non-empty one refused.
    prepare_output_dir(args.out, args.overwrite, command="embed-corpus", inputs=[args.data, args.model], resume=True,
                       legacy_names=_shard_folder_before_markers(args.out))
    options = {"batch_size": args.batch_size, **backend_options(args)}
    if args.max_seq_length is not None:
        options["max_seq_length"] = args.max_seq_length
    manifest = encode_corpus(args.data, args.model, args.out, shard_size=args.shard_size, ray_actors=args.ray_actors,
                             ray_address=args.ray_address, cpus_per_actor=args.cpus_per_actor, gpus_per_actor=args.gpus_per_actor,
                             threads_per_actor=args.threads_per_actor, kind=args.kind, prompt=args.prompt, **options)
    finish_output_dir(args.out, "embed-corpus")
    print_json({"out": args.out, **{k: v for k, v in manifest.items() if k != "shards"}, "shards": len(manifest["shards"])})
    return 0


def run_split(args: argparse.Namespace) -> int:
    prepare_output_file(args.out, args.overwrite, inputs=[args.data])
    dataset = load_beir(args.data, args.split)
    if args.folds is not None:
        train, val, _ = args.fractions
        folds = positive_disjoint_folds(dataset, args.folds, args.split_seed, val_fraction=val / (train + val) if train + val else 0.0)
        manifests = [fold.manifest() for fold in folds]
        atomic_write_json(args.out, {"protocol": "positive-disjoint folds", "n_folds": args.folds, "folds": manifests})
        print_json({"out": args.out, "counts": [manifest["counts"] for manifest in manifests], "seed": args.split_seed})
        return 0
    split = query_disjoint_split(dataset, tuple(args.fractions), args.split_seed)
    split.save(args.out)
    manifest = split.manifest()
    print_json({"out": args.out, "counts": manifest["counts"], "seed": manifest["seed"]})
    return 0
