"""``embedtune embed`` and ``embedtune split``."""

from __future__ import annotations

import argparse

import numpy as np

from embedtune.cli.common import add_data_flags, add_model_flags, add_split_flags, experiment_from_args, print_json
from embedtune.data import load_beir, query_disjoint_split
from embedtune.io import atomic_save_npy, atomic_write_json
from embedtune.outputs import OVERWRITE_HELP, finish_output_dir, prepare_output_dir, prepare_output_file


def register(commands: argparse._SubParsersAction) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    embed = commands.add_parser("embed", help="encode a dataset's corpus and queries to .npy files", formatter_class=fmt,
                                description="Encode every document and query (cached) and write float32 .npy files plus ids.")
    add_data_flags(embed)
    add_model_flags(embed)
    embed.add_argument("--out", required=True, help="output folder for {doc,query}_embeddings.npy and {doc,query}_ids.json")
    embed.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    embed.set_defaults(handler=run_embed)

    split = commands.add_parser("split", help="write the query-disjoint train/val/test manifest", formatter_class=fmt,
                                description="Rank judged query ids by sha256(f'{seed}:{id}') and cut them into train/val/test.")
    add_data_flags(split)
    add_split_flags(split)
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
    finish_output_dir(out, "embed")
    print_json({"out": str(out), "docs": len(emb.doc_ids), "queries": len(emb.query_ids), "dim": emb.dim, "seconds": emb.timings})
    return 0


def run_split(args: argparse.Namespace) -> int:
    prepare_output_file(args.out, args.overwrite, inputs=[args.data])
    dataset = load_beir(args.data, args.split)
    split = query_disjoint_split(dataset, tuple(args.fractions), args.split_seed)
    split.save(args.out)
    manifest = split.manifest()
    print_json({"out": args.out, "counts": manifest["counts"], "seed": manifest["seed"]})
    return 0
