"""Each step of the own-vectors path at growing N, against the same job done directly with numpy and FAISS.

    python benchmarks/scale.py --rows 10000 100000 1000000 3000000 --dims 384 768 \
        --work /tmp/embedtune-scale --out benchmarks/results/scale-steps

For every N and d it writes random unit vectors (float32) and times, in fresh processes, one thread:

* ``fit``: ``compress fit --method pca --dim 128`` against a direct PCA of the same seeded sample
  (the rule embedtune applies: ``min(N, max(65536, 100·d))`` rows; covariance + ``eigh``);
* ``apply``: ``compress apply`` against numpy streaming the memory-mapped file through the same
  projection in 65,536-row blocks;
* ``build``: ``index build`` (flat) against ``faiss.IndexFlatIP`` + ``write_index``;
* ``search``: ``search --query-vectors`` (1,000 queries, top 10) against ``IndexFlatIP.search``.

Each cell is the median of ``--repeats`` runs, embedtune and direct interleaved and taking turns to go
first, start-up included on both sides, each run after its inputs are read through (:func:`warm`) and its
outputs removed and the page cache flushed (:func:`fresh_start`); peak RSS is the child's own (``os.wait4``). It prints one Markdown table per d (step
× N: embedtune s, direct s, ratio, embedtune peak MB) and each step's growth exponent (the slope of
log time against log N over the measured N), and writes ``scale.json`` and ``REPORT.md`` to
``--out`` (a rerun of the same ``--work`` reuses the vector files). Resumable: finished cells are
kept in ``--out``/``scale.json`` and skipped. ``--compare-fit`` times nothing: it fits both sides once per
N and d and prints how much of the direct PCA's subspace embedtune's spans (equal quality: 1).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

STEPS = ("fit", "apply", "build", "search")
K = 128
QUERIES = 1000

DIRECT = {
    "fit": """
import sys, numpy as np
from safetensors.numpy import save_file
x = np.load(sys.argv[1], mmap_mode="r"); n, d = x.shape
m = min(n, max(65536, 100 * d))
rows = np.sort(np.random.default_rng(2027).choice(n, m, replace=False)) if m < n else np.arange(n)
s = np.asarray(x[rows], dtype=np.float64); mu = s.mean(0); s -= mu; c = s.T @ s / len(s)  # one operand: BLAS syrk, half a gemm
w, v = np.linalg.eigh(c); comp = v[:, ::-1][:, :int(sys.argv[3])].T.astype(np.float32)
save_file({"components": np.ascontiguousarray(comp), "mean": mu.astype(np.float32)}, sys.argv[2])
""",
    "apply": """
import sys, numpy as np
from safetensors.numpy import load_file
w = load_file(sys.argv[2]); W = w["components"].T.copy(); b = w["mean"] @ W
x = np.load(sys.argv[1], mmap_mode="r"); out = np.lib.format.open_memmap(sys.argv[3], "w+", np.float32, (x.shape[0], W.shape[1]))
for lo in range(0, x.shape[0], 65536):
    y = np.asarray(x[lo:lo + 65536], dtype=np.float32) @ W - b; y /= np.linalg.norm(y, axis=1, keepdims=True); out[lo:lo + len(y)] = y
out.flush()
""",
    "build": """
import sys, numpy as np, faiss
faiss.omp_set_num_threads(1)
x = np.load(sys.argv[1], mmap_mode="r"); index = faiss.IndexFlatIP(x.shape[1])
for lo in range(0, x.shape[0], 65536):
    index.add(np.ascontiguousarray(x[lo:lo + 65536], dtype=np.float32))
faiss.write_index(index, sys.argv[2])
""",
    "search": """
import sys, numpy as np, faiss
faiss.omp_set_num_threads(1)
index = faiss.read_index(sys.argv[1]); q = np.load(sys.argv[2]); D, I = index.search(q, 10)
np.save(sys.argv[3], I)
""",
}


WRITE_VECTORS = """
import os, sys, numpy as np
path, n, d, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed); partial = path + ".partial.npy"
out = np.lib.format.open_memmap(partial, "w+", np.float32, (n, d))
for lo in range(0, n, 262_144):
    block = rng.standard_normal((min(262_144, n - lo), d)).astype(np.float32)
    out[lo:lo + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
out.flush(); del out; os.replace(partial, path)
"""


def fresh_start(outputs: list[Path]) -> None:
    """Remove a step's outputs and flush every dirty page to disk, before a timed run (not timed).

    Without it the two sides meet different page caches: a direct script that rewrites its file truncates
    its previous, still-unwritten output, while `index build` writes the new folder before it removes the
    old one, so it meets twice the dirty data and the kernel throttles its writes to disk speed (a 1M
    flat build measured 13.1 s against 3.9 s that way). Each timed run now starts with its outputs gone
    and nothing dirty.
    """
    for path in outputs:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    os.sync()


def warm(paths: list[Path]) -> None:
    """Read ``paths`` (files, or every file in a folder) through once, so a timed run meets them in the page cache (not timed)."""
    for path in paths:
        for file in (sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]):
            with open(file, "rb") as handle:
                while handle.read(1 << 24):
                    pass


def timed(cmd: list[str], env: dict[str, str], outputs: list[Path] | None = None) -> tuple[float, float]:
    """Wall seconds and the child's own peak RSS in MB (``outputs`` removed first, see :func:`fresh_start`)."""
    fresh_start(outputs or [])
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        if status != 0:
            errors.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed: {errors.read().decode(errors='replace')[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def vectors(work: Path, n: int, d: int) -> tuple[Path, Path, Path, Path]:
    docs, ids, queries, query_ids = (work / f"docs-{n}x{d}.npy", work / f"ids-{n}.txt", work / f"queries-{d}.npy", work / "query-ids.txt")
    if not docs.is_file():
        # Written by a child process: this one stays small, so the children's peak RSS (which on Linux
        # includes the parent's memory at fork) measures the step, not the vector generation.
        subprocess.run([sys.executable, "-c", WRITE_VECTORS, str(docs), str(n), str(d), str(n * 1000 + d)], check=True)
    if not ids.is_file():  # in blocks: this process stays small (see above)
        with open(ids, "w", encoding="utf-8") as handle:
            for lo in range(0, n, 65536):
                handle.write("".join(f"d{i}\n" for i in range(lo, min(n, lo + 65536))))
    if not queries.is_file():
        q = np.random.default_rng(d).standard_normal((QUERIES, d)).astype(np.float32)
        np.save(queries, q / np.linalg.norm(q, axis=1, keepdims=True))
    if not query_ids.is_file():
        query_ids.write_text("".join(f"q{i}\n" for i in range(QUERIES)))
    return docs, ids, queries, query_ids


def cell(work: Path, n: int, d: int, repeats: int, env: dict[str, str], steps: tuple[str, ...] = STEPS) -> dict[str, dict[str, float]]:
    py = sys.executable
    docs, ids, queries, query_ids = vectors(work, n, d)
    tag = f"{n}x{d}"
    commands = {
        "fit": ([py, "-m", "embedtune", "--threads", "1", "--quiet", "compress", "fit", "--method", "pca", "--dim", str(K),
                 "--doc-embeddings", str(docs), "--doc-ids", str(ids), "--out", str(work / f"pca-{tag}"), "--overwrite"],
                [py, "-c", DIRECT["fit"], str(docs), str(work / f"direct-pca-{tag}.safetensors"), str(K)]),
        "apply": ([py, "-m", "embedtune", "--threads", "1", "--quiet", "compress", "apply", "--adapter", str(work / f"pca-{tag}"),
                   "--input", str(docs), "--out", str(work / f"applied-{tag}.npy"), "--overwrite"],
                  [py, "-c", DIRECT["apply"], str(docs), str(work / f"direct-pca-{tag}.safetensors"), str(work / f"direct-applied-{tag}.npy")]),
        "build": ([py, "-m", "embedtune", "--threads", "1", "--quiet", "index", "build", "--embeddings", str(docs), "--ids", str(ids),
                   "--out", str(work / f"index-{tag}"), "--overwrite"],
                  [py, "-c", DIRECT["build"], str(docs), str(work / f"direct-{tag}.faiss")]),
        "search": ([py, "-m", "embedtune", "--threads", "1", "--quiet", "search", "--index", str(work / f"index-{tag}"),
                    "--query-vectors", str(queries), "--query-ids", str(query_ids), "--top-k", "10",
                    "--out", str(work / f"run-{tag}"), "--overwrite"],
                   [py, "-c", DIRECT["search"], str(work / f"direct-{tag}.faiss"), str(queries), str(work / f"direct-hits-{tag}.npy")]),
    }
    outputs = {  # what each side writes: removed, and the page cache flushed, before each timed run
        "fit": ([work / f"pca-{tag}"], [work / f"direct-pca-{tag}.safetensors"]),
        "apply": ([work / f"applied-{tag}.npy"], [work / f"direct-applied-{tag}.npy"]),
        "build": ([work / f"index-{tag}"], [work / f"direct-{tag}.faiss"]),
        "search": ([work / f"run-{tag}"], [work / f"direct-hits-{tag}.npy"]),
    }
    inputs = {  # what each side reads: read through before each timed run
        "fit": ([docs, ids], [docs]),
        "apply": ([docs, work / f"pca-{tag}"], [docs, work / f"direct-pca-{tag}.safetensors"]),
        "build": ([docs, ids], [docs]),
        "search": ([work / f"index-{tag}", queries, query_ids], [work / f"direct-{tag}.faiss", queries]),
    }
    result: dict[str, dict[str, float]] = {}
    for step in (s for s in STEPS if s in steps):  # in order: apply reads fit's adapters, search reads build's indexes
        ours, theirs, peak = [], [], []
        for repeat in range(repeats):
            # Each run starts with its inputs read through (not timed) and the two sides take turns going first: a
            # first run whose input the kernel has dropped from its cache reads it from disk, and the side after it
            # does not (a 1M x 384 build measured 18.3 s first and 10.2 s second, the same command).
            for side in ((0, 1) if repeat % 2 == 0 else (1, 0)):
                warm(inputs[step][side])
                seconds, mb = timed(commands[step][side], env, outputs[step][side])
                if side == 0:
                    ours.append(seconds)
                    peak.append(mb)
                else:
                    theirs.append(seconds)
        result[step] = {"embedtune_s": statistics.median(ours), "direct_s": statistics.median(theirs),
                        "ratio": statistics.median(ours) / statistics.median(theirs), "embedtune_peak_mb": max(peak),
                        "embedtune_runs_s": [round(x, 3) for x in ours], "direct_runs_s": [round(x, 3) for x in theirs]}
        print(f"  {tag} {step}: embedtune {result[step]['embedtune_s']:.2f}s, direct {result[step]['direct_s']:.2f}s, "
              f"ratio {result[step]['ratio']:.2f}, peak {result[step]['embedtune_peak_mb']:.0f} MB", flush=True)
    for ours_out, direct_out in outputs.values():  # a 3M x 768 cell writes 30 GB: a full disk slows every later write
        fresh_start([*ours_out, *direct_out])
    return result


def compare_fits(work: Path, rows: list[int], dims: list[int]) -> list[dict[str, float]]:
    """Fit both sides once per N and d (untimed) and compare what they fitted: the share of the direct PCA's subspace
    that embedtune's spans (``||C_e C_d^T||_F^2 / k``, 1 when equal) and the largest difference of the means."""
    from safetensors.numpy import load_file

    found = []
    for d in dims:
        for n in rows:
            docs, ids, _, _ = vectors(work, n, d)
            ours, theirs = work / f"compare-pca-{n}x{d}", work / f"compare-direct-{n}x{d}.safetensors"
            subprocess.run([sys.executable, "-m", "embedtune", "--threads", "1", "--quiet", "compress", "fit", "--method", "pca",
                            "--dim", str(K), "--doc-embeddings", str(docs), "--doc-ids", str(ids), "--out", str(ours), "--overwrite"],
                           check=True, stdout=subprocess.DEVNULL)
            subprocess.run([sys.executable, "-c", DIRECT["fit"], str(docs), str(theirs), str(K)], check=True)
            a, b = load_file(str(ours / "model.safetensors")), load_file(str(theirs))
            span = float(np.linalg.norm(a["components"].astype(np.float64) @ b["components"].astype(np.float64).T) ** 2 / K)
            found.append({"n": n, "d": d, "subspace_share": span, "max_mean_difference": float(np.abs(a["mean"] - b["mean"]).max())})
            print(f"  {n}x{d}: embedtune's PCA spans {span:.6f} of the direct one's subspace; means differ by at most "
                  f"{found[-1]['max_mean_difference']:.2e}", flush=True)
            shutil.rmtree(ours)
            theirs.unlink()
    return found


def _machine() -> str:
    """The CPU and library versions (:func:`embedtune.bench.efficiency.machine_info`), and the load when the run started.

    Read in a child: machine_info imports torch and FAISS, and a child's peak RSS starts from this process's memory
    at fork, so importing them here set a floor of about 500 MB under every cell's figure.
    """
    done = subprocess.run([sys.executable, "-c", "import json; from embedtune.bench.efficiency import machine_info; "
                           "print(json.dumps(machine_info()))"], capture_output=True, text=True, check=True)
    info = json.loads(done.stdout.strip().splitlines()[-1])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{info['cpu']}, {info['cpus']} CPUs, faiss {info['faiss']}, numpy {info['numpy']}, torch {info['torch']}, "
            f"load average {load:.1f} at the start")


def exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(seconds) on log(N)."""
    if len(points) < 2:
        return None
    x = np.log([n for n, _ in points])
    y = np.log([s for _, s in points])
    return float(np.polyfit(x, y, 1)[0])


def _peak(mb: float, floor: float | None) -> str:
    """A child's peak RSS, or "≤ floor" where it is not above the benchmark's own memory at fork (what the child started from)."""
    return f"≤ {floor:.0f} MB (floor)" if floor is not None and mb <= floor + 1 else f"{mb:.0f} MB"


def report(data: dict) -> str:
    lines = ["# Each step at scale: embedtune against numpy and FAISS directly", "",
             "Commands:", "",
             *[f"- `{command}`" + (f" (started {date})" if date else "")
               for command, date in dict.fromkeys((command, date) for c in data["cells"]  # a cell merged from runs of other steps lists each
                                                  for command, date in c.get("runs", [(c.get("command", data["command"]), c.get("date"))]))], "",
             f"Machine: {data['machine']}. Date: {data['date']}. One thread; fresh processes, start-up included on both sides;"
             " median of the repeats; the two sides take turns to go first; each run starts with its inputs read through"
             " (in the page cache), its outputs removed and no dirty pages (`os.sync()`);"
             " peak RSS is embedtune's process."
             + (f" embedtune's modules: {data['bytecode']}." if data.get("bytecode") else ""), ""]
    if data.get("note"):
        lines += [f"Note: {data['note']}", ""]
    for d in sorted({c["d"] for c in data["cells"]}):
        cells = sorted((c for c in data["cells"] if c["d"] == d), key=lambda c: c["n"])
        lines += [f"## d = {d}", "", "| step | " + " | ".join(f"N = {c['n']:,}" for c in cells) + " | growth exponent (embedtune / direct) |",
                  "|---|" + "---|" * len(cells) + "---|"]
        for step in STEPS:
            row = [f"{c['steps'][step]['embedtune_s']:.2f} s / {c['steps'][step]['direct_s']:.2f} s = **{c['steps'][step]['ratio']:.2f}×**, "
                   + _peak(c["steps"][step]["embedtune_peak_mb"], c.get("benchmark_peak_mb")) if step in c["steps"] else "–"
                   for c in cells]
            ours = exponent([(c["n"], c["steps"][step]["embedtune_s"]) for c in cells if step in c["steps"]])
            theirs = exponent([(c["n"], c["steps"][step]["direct_s"]) for c in cells if step in c["steps"]])
            growth = "" if ours is None else f"{ours:.2f} / {theirs:.2f}"
            lines.append(f"| {step} | " + " | ".join(row) + f" | {growth} |")
        lines.append("")
    lines += ["Each cell: embedtune seconds / direct seconds = ratio, then embedtune's peak RSS. A child's peak RSS counts "
              "this benchmark's own memory when it forked: a figure marked (floor) is that, not the step's (the benchmark "
              "keeps itself small: it imports neither torch nor FAISS). fit: `compress fit --method pca "
              "--dim 128` against a direct PCA of the same sample rule; apply: `compress apply`; build: `index build` (flat); "
              "search: `search --query-vectors` with 1,000 queries, top 10.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--dims", type=int, nargs="+", default=[384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                        help="only these steps (apply needs a fit, search a build, from this or an earlier run in --work)")
    parser.add_argument("--work", default="/tmp/embedtune-scale")
    parser.add_argument("--out", default="benchmarks/results/scale-steps")
    parser.add_argument("--note", default=None, help="a line recorded with the figures (e.g. what else ran on the machine)")
    parser.add_argument("--report-only", action="store_true", help="rewrite REPORT.md from --out/scale.json, measuring nothing")
    parser.add_argument("--compare-fit", action="store_true",
                        help="time nothing: fit both sides once per N and d and print how far apart their PCAs are (equal quality)")
    args = parser.parse_args()
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    if args.compare_fit:
        compare_fits(work, args.rows, args.dims)
        return
    out.mkdir(parents=True, exist_ok=True)
    record = out / "scale.json"
    data = json.loads(record.read_text()) if record.is_file() else {"cells": []}
    if args.report_only:
        if args.note:
            data["note"] = args.note
            record.write_text(json.dumps(data, indent=1))
        (out / "REPORT.md").write_text(report(data))
        print(report(data))
        return
    if args.note:
        data["note"] = args.note
    data.update(command="python benchmarks/scale.py " + " ".join(sys.argv[1:]),
                machine=_machine(),
                date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # As installed: `pip install` byte-compiles a package, and numpy and FAISS come compiled. A source checkout run with
    # PYTHONDONTWRITEBYTECODE (as this machine sets) would compile embedtune's modules in every timed process instead.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    import embedtune

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(embedtune.__file__).parent)], env=env, check=True)
    data["bytecode"] = "compiled once before timing, as pip install does"
    for d in args.dims:
        for n in args.rows:
            if any(c["n"] == n and c["d"] == d for c in data["cells"]):
                continue
            print(f"N = {n:,}, d = {d}", flush=True)
            steps = cell(work, n, d, args.repeats, env, tuple(args.steps))
            # A child's peak RSS starts from this process's memory at fork: a child's figure at or below it is that floor.
            data["cells"].append({"n": n, "d": d, "command": data["command"], "date": data["date"], "steps": steps,
                                  "benchmark_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, record)
            (out / "REPORT.md").write_text(report(data))
    print(report(data))


if __name__ == "__main__":
    main()
