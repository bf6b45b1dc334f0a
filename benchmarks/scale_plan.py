"""The label-free planner at scale: wall time, peak RSS, and how well a plan fitted on a sample predicts the full corpus.

For each corpus size N (default 10k and 100k; add 1000000 for a million), this script

1. makes N x 384 "own" vectors by tiling the bundled real all-MiniLM-L6-v2 document vectors
   (``benchmarks/data/vectors/{arguana,npl,cacm,med}-minilm-vectors.npz``, 24,448 rows) with a little
   seeded Gaussian noise (sigma 0.01 per coordinate, then unit rows), saved as ``.npy`` + ids under ``--work``;
2. runs ``embedtune --threads T compress plan --label-free agreement --doc-embeddings ... --target-retention R``
   in a child process and records its wall time and peak RSS (``resource.getrusage`` of that child);
3. in a second child, measures the chosen setting on the *full* corpus: the same held-out documents as
   queries, the exact float32 top-10 over all N documents (streamed, :func:`embedtune.workflows.label_free.exact_top_k`),
   and the plan folder's compressor and precision (its trained tables) over all N documents; the
   retention on the full corpus is that agreement@10 over the float32 reference's (1.0 by definition).

Each size's result is ``OUT/n<N>.json``; a size whose JSON exists is not run again (resumable; ``--force`` reruns).
``OUT/REPORT.md`` is regenerated from every JSON present, with the command, the machine and the date.

    python benchmarks/scale_plan.py --sizes 10000 100000 --work /tmp/scale-plan --out benchmarks/results/scale
    nohup python benchmarks/scale_plan.py --sizes 1000000 ... &   # a million: in the background, resumable
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("arguana", "npl", "cacm", "med")
NOISE = 0.01
SOURCE_ROWS = 24_448  # the document vectors of SOURCES together


def make_vectors(n: int, work: Path) -> tuple[Path, Path]:
    """``(vectors.npy, ids.txt)`` of ``n`` tiled, noised, unit MiniLM vectors (made once, written in blocks)."""
    path, ids = work / f"v{n}.npy", work / f"v{n}.ids.txt"
    if path.is_file() and ids.is_file():
        return path, ids
    base = np.concatenate([np.load(REPO / "benchmarks/data/vectors" / f"{name}-minilm-vectors.npz")["document"] for name in SOURCES])
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, base.shape[1]))
    for lo in range(0, n, 65536):
        rows = base[np.arange(lo, min(n, lo + 65536)) % len(base)]
        rows = rows + rng.standard_normal(rows.shape, dtype=np.float32) * np.float32(NOISE)
        out[lo : lo + len(rows)] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    out.flush()
    del out
    os.replace(tmp, path)
    ids.write_text("".join(f"d{i}\n" for i in range(n)))
    return path, ids


def plan_command(args: argparse.Namespace, n: int, vectors: Path, ids: Path) -> list[str]:
    suffix = f"-{args.tag}" if args.tag else ""  # a tagged sweep fits in its own folders: nothing reused from another sweep
    command = [sys.executable, "-m", "embedtune", "--threads", str(args.threads), "-q", "compress", "plan", "--label-free", "agreement",
               "--doc-embeddings", str(vectors), "--doc-ids", str(ids),
               *(["--target-retention", str(args.target_retention)] if args.target_retention else []), "--out", str(args.work / f"plan{n}{suffix}"), "--work", str(args.work / f"sweep{n}{suffix}"), "--overwrite", "--json"]
    if args.fit_sample:
        command += ["--fit-sample", str(args.fit_sample)]
    if args.methods:
        command += ["--methods", *args.methods]
    return command + list(args.plan_args)


def run_child(command: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess, float]:
    """``(wall seconds, peak RSS in MiB, result, CPU seconds)`` of one child process (RSS and CPU: this child's own, from its
    rusage; CPU time is what a busy shared machine inflates least)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # files, not pipes: a full pipe would block the child
        start = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    process.returncode = code = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, subprocess.CompletedProcess(command, code, stdout, stderr), usage.ru_utime + usage.ru_stime


def full_corpus_check(plan_dir: Path, vectors: Path, ids_path: Path) -> dict:
    """The chosen setting's agreement@10 on the full corpus, for the held-out documents the plan validated on."""
    from embedtune.evaluate.search import unit_rows
    from embedtune.index.codecs import QuantizedIndex
    from embedtune.index.codecs.quantized_index import read_codec_index
    from embedtune.index.fit_sample import fit_sample_rows
    from embedtune.index.plan_format import load_plan
    from embedtune.workflows.label_free import exact_top_k, held_out_documents

    plan, compressor, precision, calibration = load_plan(plan_dir)
    docs = unit_rows(np.load(vectors, mmap_mode="r"))
    ids = ids_path.read_text().split()
    sample, objective = plan["fit_sample"], plan["objective"]
    rows = fit_sample_rows(len(ids), sample["rows"], sample["seed"])
    held = held_out_documents([ids[r] for r in rows], objective["held_out_fraction"], objective["max_held_out"], objective["held_out_seed"])
    position = {doc_id: row for row, doc_id in enumerate(ids)}
    held_rows = np.array([position[d] for d in held], dtype=np.int64)
    queries = np.ascontiguousarray(docs[held_rows], dtype=np.float32)
    start = time.perf_counter()
    truth = exact_top_k(queries, docs, 10, exclude=held_rows)
    truth_s = time.perf_counter() - start
    start = time.perf_counter()
    xb = np.concatenate([compressor.transform(np.ascontiguousarray(docs[lo : lo + 65536], dtype=np.float32))
                         for lo in range(0, len(docs), 65536)])
    if precision.uses_factory:  # the plan's trained tables (PQ, codecs, int4, RaBitQ...), filled with every document
        backend = read_codec_index(plan_dir, precision, xb.shape[1])
        backend.add(xb)
        index = QuantizedIndex(precision, xb.shape[1], backend, len(xb), float_vectors=xb if precision.rescores_float else None)
    else:
        index = QuantizedIndex.build(xb, precision, calibration=calibration)
    _, found = index.search(compressor.transform(queries), 11)
    agreement = []
    for own, result, target in zip(held_rows, found, truth):
        top = [r for r in result if r != own][:10]
        agreement.append(len(set(top) & set(target.tolist())) / 10)
    # Row r is a noisy copy of source row r % SOURCE_ROWS: the share of the exact top-10 that are copies of the query's own source.
    copies = float(np.mean((truth % SOURCE_ROWS) == (held_rows[:, None] % SOURCE_ROWS)))
    return {"n_queries": len(held_rows), "agreement@10_full": float(np.mean(agreement)), "truth_copies_share": copies, "truth_s": truth_s,
            "index_and_search_s": time.perf_counter() - start}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?")
    return f"{cpu}, {os.cpu_count()} CPUs visible, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _own_check(result: dict) -> str:
    """The plan's own full-corpus agreement@10 and its seconds, or a dash for a plan without one."""
    own = result.get("plan_full_corpus")
    if not own:
        return "\u2013"
    return f"{own['agreement']:.4f} ({own['truth_s'] + own['build_s'] + own['search_s']:.0f} s)"


def _commit() -> str:
    """The repository's commit, with ``+changes`` when the working tree differs from it (the code the child ran)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return (head or "unknown") + ("+changes" if dirty else "")


def _sweep(command: str) -> str:
    """The sweep a recorded command ran: its --methods and plan flags after ``--json``, or the plan's defaults."""
    words = shlex.split(command)
    extra = [w for w in words[words.index("--json") + 1:]] if "--json" in words else []
    extra = [w for i, w in enumerate(extra) if not (w == "--fit-sample" or (i and extra[i - 1] == "--fit-sample"))]
    return f"`{' '.join(extra)}`" if extra else "default (every method, peer and codec)"


def write_report(out: Path) -> None:
    results = sorted((json.loads(p.read_text()) for p in out.glob("n*.json")), key=lambda r: (r["n"], r["fit_sample"]["rows"], r["date"]))
    lines = ["# The label-free planner at scale", "",
             "Generated by `benchmarks/scale_plan.py` from the `n<N>.json` files beside this report (each records its own command, "
             "machine and date). Own vectors: the bundled all-MiniLM-L6-v2 document vectors (ArguAna, NPL, CACM, MED; 24,448 rows) "
             f"tiled to N rows with seeded Gaussian noise (sigma {NOISE}), unit rows, 384-d. The plan fits, holds out, indexes and "
             "scores a seeded sample of min(N, max(65,536, 64 d)) rows (or --fit-sample rows where the command says so); the full-corpus check re-scores the chosen setting over all "
             "N documents with the same held-out queries. Each run's sweep (methods, peers) is in its command below; wall "
             "times are one thread on whatever share of the machine the run got (see the machine line: a shared machine inflates them).", "",
             "| N | run (UTC), code | sweep | wall (plan) | peak RSS (plan) | fit sample | chosen | bytes/vector | agreement@10 on the sample | "
             "on the full corpus | the plan's own full-corpus check | 8-bit peers not trained | $/month at 1B |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        chosen = r["chosen"]
        run = r["date"][:16].replace("T", " ") + (f", `{r['commit']}`" if r.get("commit") else "")
        lines.append(f"| {r['n']:,} | {run} | {_sweep(r['command'])} | {r['plan_wall_s']:.0f} s | {r['plan_peak_rss_mib']:,.0f} MiB | {r['fit_sample']['rows']:,} | "
                     f"`{chosen['setting']}` | {chosen['ram_bytes']} | {r['retention_sample']:.4f} | "
                     f"{r['full']['agreement@10_full']:.4f} | {_own_check(r)} | {r['skipped_peers']} | {chosen['usd_month@1B']:,.0f} |")
    lines += ["", "Retention is agreement@10 over the float32 reference's, which is 1.0 on either corpus (the reference is the exact "
              "float32 top-10 itself). A larger corpus is denser, so the same codes find fewer of the exact top-10: the gap between "
              "the two columns is what a plan fitted on a sample over-promises. A plan that ran on a sample now measures that "
              "itself (`plan.json`: `full_corpus`, `embedtune.workflows.full_corpus_check`); its figure, where the run had it, "
              "is beside this script's independent check (\u2013: a plan written before it, or on the whole corpus).", "",
              "Caveat of the tiled corpus: row r is a noisy copy of source row r mod 24,448, so at N rows each source vector has "
              "about N / 24,448 copies. The share of a held-out document's exact top-10 that are copies of its own source vector "
              "(whose scores differ by the noise alone) is:",
              ", ".join(f"N = {r['n']:,}: {r['full']['truth_copies_share']:.2f}" for r in results if "truth_copies_share" in r["full"])
              + " (not measured for the runs without the figure). Where it is near 1, agreement@10 on the full corpus asks a codec to "
              "rank noise, a harder test than a real corpus of that size sets.", ""]
    for r in results:
        lines += [f"## N = {r['n']:,}, fit sample {r['fit_sample']['rows']:,}", "", f"- date: {r['date']}", f"- machine: {r['machine']}",
                  *([f"- the plan's CPU time: {r['plan_cpu_s']:.0f} s (wall {r['plan_wall_s']:.0f} s)"] if "plan_cpu_s" in r else []),
                  *([f"- code: commit {r['commit']}"] if r.get("commit") else []), f"- command: `{r['command']}`",
                  *(["- the plan's full-corpus checks, in order: " + "; ".join(f"`{c['setting']}` {c['agreement']:.4f} ({c['on_sample']:.4f} on "
                                                                               f"the sample)" for c in r["plan_full_corpus_checks"])]
                    if len(r.get("plan_full_corpus_checks") or []) > 1 else []),
                  f"- full-corpus check: {r['full']['n_queries']} held-out queries, exact top-10 over {r['n']:,} documents in "
                  f"{r['full']['truth_s']:.1f} s, chosen index built and searched in {r['full']['index_and_search_s']:.1f} s "
                  f"(its own peak RSS {r['check_peak_rss_mib']:,.0f} MiB)",
                  "- targets (1M x 384, 2 cores): <= 600 s wall and <= 4 GB peak RSS" if r["n"] >= 1_000_000 else "", ""]
    (out / "REPORT.md").write_text("\n".join(line for line in lines if line is not None) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--work", type=Path, default=Path("/tmp/embedtune-scale-plan"), help="vectors, plans and sweeps (not committed)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/scale")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target-retention", type=float, default=0.95,
                        help="the plan's --target-retention (0: none, so that a --budget-bytes plan chooses the best setting in it)")
    parser.add_argument("--methods", nargs="*", default=["truncate", "pca", "pca-uncentred"],
                        help="label-free methods (default: all but DIVE, whose unsupervised fit takes minutes per dimension)")
    parser.add_argument("--fit-sample", type=int, default=None, help="pass --fit-sample to the plan (results: n<N>-s<ROWS>.json)")
    parser.add_argument("--tag", default=None, help="a name for this sweep in the result file (n<N>[-s<ROWS>]-<TAG>.json), so runs of "
                        "other sweeps on the same size are kept side by side")
    parser.add_argument("--force", action="store_true", help="rerun sizes whose JSON exists")
    parser.add_argument("--check", nargs=3, metavar=("PLAN", "VECTORS", "IDS"), help=argparse.SUPPRESS)
    parser.add_argument("plan_args", nargs="*", help="more `compress plan` flags, after --")
    args = parser.parse_args()
    if args.check:
        print(json.dumps(full_corpus_check(*map(Path, args.check))))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "HF_HUB_OFFLINE": "1", "EMBEDTUNE_CACHE": str(args.work / "cache")}
    for n in args.sizes:
        tag = f"{n}" + (f"-s{args.fit_sample}" if args.fit_sample else "") + (f"-{args.tag}" if args.tag else "")
        result_path = args.out / f"n{tag}.json"
        if result_path.is_file() and not args.force:
            print(f"N={n}: {result_path} exists, kept (--force reruns)")
            continue
        vectors, ids = make_vectors(n, args.work)
        command = plan_command(args, n, vectors, ids)
        print(f"N={n}: {shlex.join(command)}", flush=True)
        commit = _commit()  # the code the child runs, read before it starts
        wall, rss, done, cpu = run_child(command, env)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        plan = json.loads(done.stdout)
        check_wall, check_rss, checked, _ = run_child([sys.executable, __file__, "--check", str(args.work / (f"plan{n}" + (f"-{args.tag}" if args.tag else ""))), str(vectors), str(ids)], env)
        if checked.returncode:
            print(checked.stderr[-3000:], file=sys.stderr)
            return checked.returncode
        shown = [part if not part.startswith(str(args.work)) else part.replace(str(args.work), "$WORK") for part in command[1:]]
        result = {"n": n, "dim": 384, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                  "commit": commit, "command": "python " + shlex.join(shown), "plan_wall_s": wall, "plan_cpu_s": cpu, "plan_peak_rss_mib": rss, "fit_sample": plan["fit_sample"],
                  "chosen": plan["chosen"], "retention_sample": plan["retention"], "objective": plan["objective"],
                  "skipped_peers": len(plan.get("skipped_peers") or []), "skipped_peer_settings": plan.get("skipped_peers") or [],
                  "bill": plan["bill"], "frontier": plan["frontier"], "full": json.loads(checked.stdout), "check_wall_s": check_wall,
                  "plan_full_corpus": plan.get("full_corpus"), "plan_full_corpus_checks": plan.get("full_corpus_checks"),
                  "check_peak_rss_mib": check_rss}
        result_path.write_text(json.dumps(result, indent=1) + "\n")
        write_report(args.out)
        print(f"N={n}: plan {wall:.0f} s, peak RSS {rss:,.0f} MiB; chosen {plan['chosen']['setting']}: agreement@10 "
              f"{plan['retention']:.4f} on the sample, {result['full']['agreement@10_full']:.4f} on the full corpus", flush=True)
    write_report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
