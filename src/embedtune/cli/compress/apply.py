"""``embedtune compress apply``: compress a (large) .npy or parquet of embeddings in chunks, memory bounded."""

from __future__ import annotations

import argparse
import time

from embedtune.cli.common import DeprecatedAlias, add_ray_flags, print_json, ray_pool
from embedtune.cli.compress.flags import ADAPTER_HELP
from embedtune.compress import load_compressor
from embedtune.compress.streaming import apply_compressor_streaming, embedding_file_shape, ids_path_for
from embedtune.outputs import prepare_output_file

__all__ = ["register", "run_apply"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``apply`` to the ``compress`` subcommands."""
    apply = sub.add_parser("apply", help="compress a (large) .npy or parquet of embeddings in chunks",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                           description="Memory-mapped, chunked: memory stays bounded whatever the input size. With --ray-actors N "
                                       "(a .npy --input and --out), N actors of a Ray cluster each transform a range of rows and write "
                                       "them in place; the output equals the local one bit for bit. On a cluster give paths every node "
                                       "can read and write (shared storage) and --ray-address auto (on a node) or ray://HOST:10001.")
    apply.add_argument("--adapter", required=True, help=ADAPTER_HELP)
    apply.add_argument("--input", required=True, help="(n, d) float32/float16 .npy, or .parquet with an id column")
    out = apply.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="(n, k) float32 .npy (parquet input: ids go to <stem>.ids.txt) or .parquet")
    out.add_argument("--output", dest="out", action=DeprecatedAlias, replacement="--out", help=argparse.SUPPRESS)
    apply.add_argument("--id-column", default="id", help="parquet id column")
    apply.add_argument("--vector-column", default="embedding", help="parquet vector column")
    apply.add_argument("--chunk-size", type=int, default=65536, help="rows per chunk (with --ray-actors: rows per Ray task, rounded up to a multiple of 4096)")
    apply.add_argument("--overwrite", action="store_true", help="replace an existing --out file (never the --input)")
    add_ray_flags(apply, actor="compressor", threads="transform threads (4096-row tiles side by side)")
    apply.set_defaults(handler=run_apply)


def run_apply(args: argparse.Namespace) -> int:
    pool = ray_pool(args)
    prepare_output_file(args.out, args.overwrite, inputs=[args.input])
    if args.input.endswith(".parquet") and args.out.endswith(".npy"):  # the ids go beside the vectors
        prepare_output_file(ids_path_for(args.out), args.overwrite, inputs=[args.input], flag="--out's ids file")
    compressor = load_compressor(args.adapter)
    start = time.perf_counter()
    if pool is None:
        path = apply_compressor_streaming(compressor, args.input, args.out, args.chunk_size,
                                          id_column=args.id_column, vector_column=args.vector_column)
    else:
        from embedtune.compress.ray_apply import apply_compressor_ray, check_ray_apply_paths

        check_ray_apply_paths(args.input, args.out, compressor)  # before Ray starts
        path = apply_compressor_ray(args.adapter, args.input, args.out, pool, rows_per_range=args.chunk_size)
    rows = embedding_file_shape(path, args.vector_column)[0]
    seconds = time.perf_counter() - start
    print_json({"output": str(path), "rows": int(rows), "dim": compressor.output_dim, "seconds": seconds, "vectors_per_second": rows / max(seconds, 1e-9),
                "backend": "local" if pool is None else f"ray ({pool.actors} actors)"})
    return 0
