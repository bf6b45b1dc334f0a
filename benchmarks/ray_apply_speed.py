"""Ray apply against the local apply, side by side in one run: wall time, peak memory, equal bits.

Random ``(rows, dim)`` float32 vectors in a ``.npy``, a PCA adapter ``dim -> out_dim`` fitted on
20,000 of them, then:

* ``local``: :func:`embedtune.compress.streaming.apply_compressor_streaming` (``compress apply``);
* ``ray range, N actors``: :func:`embedtune.compress.ray_apply.apply_compressor_ray`
  (``compress apply --ray-actors N``): 4096-aligned row ranges, memory-mapped in, written in place;
* ``ray data, numpy 4096``: the Ray Data dataset route as it was (``read_numpy`` ->
  ``map_batches`` with numpy batches of 4096 rows -> ``write_numpy``);
* ``ray data, arrow 65536``: the same route with :func:`compress_dataset`'s Arrow batches of 65,536 rows.

Ray is started once, before the routes (its start-up is timed on its own line): on a cluster it
is already running. Peak memory is the largest sum of the resident sets of this process and all
its child processes (Ray's GCS, raylet and workers), sampled every 0.1 s, less that sum just before the route.

Command::

    python benchmarks/ray_apply_speed.py --rows 1000000 --dim 384 --out-dim 128 \\
        --report benchmarks/results/ray-apply/REPORT.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from embedtune.bench.efficiency import machine_info


def _tree_rss() -> int:
    import psutil

    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def measured(fn):
    """``(seconds, peak extra bytes over the process tree's resident set before the call)``."""
    base = _tree_rss()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak[0] = max(peak[0], _tree_rss())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    try:
        fn()
    finally:
        seconds = time.perf_counter() - start
        done.set()
        thread.join()
    return seconds, max(peak[0], _tree_rss()) - base


def machine() -> str:
    info = machine_info()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{info['cpus']} cores, {info['cpu']}, {platform.system()} {platform.release()}, load average {load:.1f} at start"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="vectors in the input .npy")
    parser.add_argument("--dim", type=int, default=384, help="input dimension")
    parser.add_argument("--out-dim", type=int, default=128, help="PCA output dimension")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor counts of the Ray range apply")
    parser.add_argument("--no-dataset-routes", action="store_true", help="skip the two Ray Data dataset routes")
    parser.add_argument("--workdir", default=None, help="folder for the input and outputs (default: a temporary one, deleted)")
    parser.add_argument("--report", default=None, help="write the table as Markdown here (with the command, machine and date)")
    args = parser.parse_args(argv)

    import ray

    from embedtune.compress import TrainingData, make_compressor
    from embedtune.compress.ray_apply import RayPool, apply_compressor_ray, compress_dataset
    from embedtune.compress.streaming import apply_compressor_streaming
    from embedtune.runtime import set_progress

    set_progress(False)
    started = dt.datetime.now(dt.timezone.utc)
    host = machine()
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ray-apply-speed."))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rng = np.random.default_rng(0)
        source = work / "vectors.npy"
        vectors = np.lib.format.open_memmap(source, mode="w+", dtype=np.float32, shape=(args.rows, args.dim))
        for start in range(0, args.rows, 100_000):
            stop = min(start + 100_000, args.rows)
            vectors[start:stop] = rng.standard_normal((stop - start, args.dim), dtype=np.float32)
        vectors.flush()
        sample = np.array(vectors[:20_000])
        del vectors
        ids = [str(i) for i in range(len(sample))]
        compressor = make_compressor("pca", dim=args.out_dim).fit(TrainingData(ids[:1], sample[:1], ids, sample, {}))
        adapter = work / "adapter"
        compressor.save(adapter)

        rows: list[dict] = []
        local_out = work / "local.npy"
        seconds, memory = measured(lambda: apply_compressor_streaming(compressor, source, local_out))
        rows.append({"route": "local (compress apply)", "seconds": seconds, "memory": memory})
        reference = np.load(local_out, mmap_mode="r")

        init_seconds, _ = measured(lambda: ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                                                    logging_level=logging.ERROR))
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        try:
            cores = os.cpu_count() or 1
            for actors in args.actors:
                out = work / f"ray-{actors}.npy"
                # The actors share the machine's cores: each reserves and uses its share.
                pool = RayPool(actors=actors, cpus_per_actor=max(cores // actors, 1), threads_per_actor=max(cores // actors, 1))
                seconds, memory = measured(lambda: apply_compressor_ray(adapter, source, out, pool, show_progress=False))
                rows.append({"route": f"ray range, {actors} actor{'s' if actors > 1 else ''} (compress apply --ray-actors {actors})",
                             "seconds": seconds, "memory": memory, "output": out})
            if not args.no_dataset_routes:
                for name, kwargs in (("ray data, numpy batches of 4096 (the old defaults)", {"batch_size": 4096, "batch_format": "numpy", "zero_copy_batch": False}),
                                     ("ray data, arrow batches of 65536 (compress_dataset)", {})):
                    folder = work / f"dataset-{len(rows)}"

                    def run(folder: Path = folder, kwargs: dict = kwargs) -> None:
                        ds = ray.data.read_numpy(str(source))
                        compress_dataset(ds, adapter, vector_column="data", num_cpus=1, **kwargs).write_numpy(str(folder), column="data")

                    seconds, memory = measured(run)
                    parts = sorted(folder.glob("*.npy"))
                    rows.append({"route": name, "seconds": seconds, "memory": memory,
                                 "output_rows": sum(np.load(p, mmap_mode="r").shape[0] for p in parts)})
        finally:
            ray.shutdown()

        local_seconds = rows[0]["seconds"]
        lines = ["| route | seconds | vs local | peak extra memory (GB) | output vs local |", "|---|---|---|---|---|"]
        for row in rows:
            if "output" in row:
                got = np.load(row["output"], mmap_mode="r")
                same = "equal bits" if np.array_equal(got, reference) else f"max abs diff {float(np.max(np.abs(got - reference))):.2e}"
            elif "output_rows" in row:
                same = f"{row['output_rows']} rows (order not kept)"
            else:
                same = "-"
            lines.append(f"| {row['route']} | {row['seconds']:.1f} | {row['seconds'] / local_seconds:.2f}x | {row['memory'] / 1e9:.2f} | {same} |")
        table = "\n".join(lines)
        command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
        header = (f"{args.rows:,} x {args.dim} float32 -> PCA {args.out_dim}; ray.init took {init_seconds:.1f} s "
                  f"(before the routes, not in their times). Each range-apply actor reserves and computes with {cores} / actors "
                  "cores; the local apply uses every core.")
        print(header)
        print(table)
        if args.report:
            report = Path(args.report)
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(
                "# Ray apply against the local apply\n\n"
                f"Command: `{command}`\n\n"
                f"Machine: {host}.\n\nDate: {started.strftime('%Y-%m-%d %H:%M UTC')}.\n\n"
                f"{header}\n\n{table}\n\n"
                "Times are wall seconds of the call; peak extra memory is the largest resident set of this process and its "
                "children (Ray's processes included) above what they held before the call. The Ray range apply is what "
                "`compress apply --ray-actors` and `index build --ray-actors` run; see `benchmarks/ray_apply_speed.py`.\n\n"
                "## Why the dataset route is slow and heavy\n\n"
                "* Every vector goes through Ray's object store: `read_numpy` reads a single `.npy` as one block (the whole "
                "file), the actor copies its batches out of it, and its output goes back into the store and on to the writer. "
                "The memory is those blocks, and one read task reads the whole file before any actor starts.\n"
                "* Numpy batches of 4096 rows: one call, one tensor-to-numpy and one numpy-to-Arrow conversion per 4096 rows, "
                "and the input column kept in every output batch; a parquet list column arrives as an object array of one "
                "array per row. `compress_dataset` now takes Arrow batches of 65,536 rows without copies.\n"
                "* Each actor imported the whole `embedtune.compress` package, torch included, before its first batch; the "
                "compressors' lazy imports leave an actor numpy and the adapter's own modules.\n\n"
                "The range apply keeps the vectors out of the object store: each actor memory-maps its 4096-aligned rows of "
                "the input, transforms them and writes them with `pwrite` into their place of the output file, which the "
                "driver created at full size. What is left of its time over the local apply is starting the actors.\n",
                encoding="utf-8")
            print(f"wrote {report}")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
