"""Search speed of embedtune's registered codecs against FAISS's own scans at equal bytes per vector, at 1M vectors.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/codec_speed.py

Corpus: 1,000,000 MiniLM-like vectors, the 5,183 real SciFact MiniLM document vectors
(``src/embedtune/datasets/scifact-minilm-vectors.npz``, array ``document``, 384-d, unit norm) tiled
(row ``i`` is document ``i mod 5183``), plus Gaussian noise of sigma 0.02 per dimension (seeded,
``numpy.random.default_rng(SEED)``, drawn in blocks of 65,536 rows), renormalised to unit norm.
Queries: the first 1,000 of the 1,109 real SciFact MiniLM query vectors (array ``query``).

Codecs, at 32 and 64 bytes per vector:

* embedtune's registered codecs, through ``Precision(name).codec.train(xb)`` then ``.add(xb)``,
  wrapped as ``QuantizedIndex(precision, d, index, n)``: exactly the body of
  ``QuantizedIndex.build`` for a registered codec, split so fit and add are timed apart; searched
  through ``QuantizedIndex.search`` (what a user calls; it adds ``break_ties`` on the ``(1000, 10)``
  result): ``klt-pq:B``, ``klt-wpq:B``, ``klt-pq4:B``, ``klt-pq4-sphere:B`` and ``klt-apq-sphere:B`` (their codes' own
  search, then the top 100 ranked by direction), ``klt-rq:B`` (32 B only; its fit + add is given 20 minutes)
  and the numpy reference ``klt-sq:B`` (each search of the batch is given 10 minutes at 1M rows;
  past that it is measured on the first 100,000 rows instead);
* FAISS's own exhaustive scans at the same bytes, built with
  ``faiss.index_factory(384, spec, faiss.METRIC_INNER_PRODUCT)``, trained on the same 65,536-row
  sample the embedtune codecs fit on (``embedtune.index.codecs.transform.training_sample(xb)``,
  seed 0), then given every row, and searched with ``index.search``: ``PQ{B}`` (8-bit PQ),
  ``PQ{2B}x4fs`` (4-bit fast scan) and ``OPQ{B},PQ{B}`` (its build is given 15 minutes);
* ``Flat`` (float32, exact): the exact top-10 every recall@10 is measured against, and the speed
  of exact search for scale.

Each (codec, budget) runs in its own process (so its peak RSS is its own), one thread
(``faiss.omp_set_num_threads(1)``; set ``OMP_NUM_THREADS=1`` as well): build, free the float
corpus, one warm-up search of the 1,000 queries at k = 10 (its result gives recall@10), then
three timed searches of the batch; queries/s is 1,000 over the median. The ratio is embedtune's
queries/s over FAISS's scan of the same code type at the same bytes (klt-pq and klt-wpq vs ``PQ{B}``,
klt-pq4 and klt-pq4-sphere vs ``PQ{2B}x4fs``, klt-rq and klt-apq-sphere vs ``PQ{B}``); above 1 embedtune is faster.

Resumable: one JSON per (codec, budget) in ``--out``; a JSON already there is not run again
(delete it to rerun). ``REPORT.md`` is rewritten from the JSONs at the end of every run
(``--report`` only rewrites it).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "src" / "embedtune" / "datasets" / "scifact-minilm-vectors.npz"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "codec-speed"
SEED = 0
SIGMA = 0.02
ROWS = 1_000_000
QUERIES = 1_000
K = 10
RUNS = 3
GEN_BLOCK = 65_536
FALLBACK_ROWS = 100_000
#: Seconds a job's build (fit + add) may take before it is stopped and recorded as skipped.
BUILD_LIMIT = {"klt-rq": 20 * 60, "OPQ": 15 * 60}
#: Seconds one search of the batch may take (the reference numpy codec only).
SEARCH_LIMIT = {"klt-sq": 10 * 60}
#: Safety net for every other job (seconds of build, and of one search).
DEFAULT_LIMIT = 45 * 60


# ----------------------------------------------------------------------------------------------- data


def make_corpus(rows: int) -> np.ndarray:
    """``(rows, 384)`` float32 unit rows: document ``i mod 5183`` plus N(0, SIGMA^2) noise, renormalised."""
    doc = np.load(VECTORS)["document"].astype(np.float32)
    rng = np.random.default_rng(SEED)
    x = np.empty((rows, doc.shape[1]), dtype=np.float32)
    for start in range(0, rows, GEN_BLOCK):
        stop = min(rows, start + GEN_BLOCK)
        block = doc[np.arange(start, stop) % len(doc)]
        block += np.float32(SIGMA) * rng.standard_normal(block.shape, dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        x[start:stop] = block
    return x


def load_queries() -> np.ndarray:
    return np.ascontiguousarray(np.load(VECTORS)["query"][:QUERIES], dtype=np.float32)


# ----------------------------------------------------------------------------------------------- jobs


def jobs(budgets: list[int]) -> list[tuple[str, int]]:
    """(codec, budget) in the order they run: exact search first (its top-10 is every recall's truth), slow ones last."""
    out: list[tuple[str, int]] = [("Flat", 1536)]
    for b in budgets:
        out += [(f"PQ{b}", b), (f"klt-pq:{b}", b), (f"klt-wpq:{b}", b), (f"PQ{2 * b}x4fs", b), (f"klt-pq4:{b}", b),
                (f"klt-pq4-sphere:{b}", b), (f"klt-apq-sphere:{b}", b)]
    out += [("klt-rq:32", 32)] if 32 in budgets else []
    out += [(f"klt-sq:{b}", b) for b in budgets]
    out += [(f"OPQ{b},PQ{b}", b) for b in budgets]  # optional extra peers: last, so a time budget cuts them first
    return out


def family(codec: str) -> str:
    if ":" in codec:
        return codec.split(":")[0]
    return "OPQ" if codec.startswith("OPQ") else ("PQfs" if codec.endswith("fs") else ("PQ" if codec.startswith("PQ") else codec))


def peer_of(codec: str, budget: int) -> str | None:
    """FAISS's scan of the same code type at the same bytes (the ratio's denominator)."""
    return {"klt-pq": f"PQ{budget}", "klt-wpq": f"PQ{budget}", "klt-pq4": f"PQ{2 * budget}x4fs", "klt-rq": f"PQ{budget}",
            "klt-pq4-sphere": f"PQ{2 * budget}x4fs", "klt-apq-sphere": f"PQ{budget}"}.get(family(codec))


def key(codec: str, rows: int, threads: int = 1) -> str:
    name = codec.replace(":", "-").replace(",", "_")
    name = name if rows == ROWS else f"{name}@{rows // 1000}k"
    return name if threads == 1 else f"{name}-t{threads}"


# ----------------------------------------------------------------------------------------------- worker


def _rss_now_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


_PHASES: dict[str, float] = {}


def _progress(path: str | None, phase: str) -> None:
    """Record that ``phase`` starts now (the runner reads every phase's start, so none is missed between its polls)."""
    _PHASES[phase] = time.time()
    if path:
        tmp = path + ".tmp"
        Path(tmp).write_text(json.dumps({"phase": phase, "phases": _PHASES}))
        os.replace(tmp, path)


def _exact_topk(xb: np.ndarray, xq: np.ndarray) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(xb.shape[1])
    index.add(xb)
    return index.search(xq, K)[1]


def worker(codec: str, budget: int, rows: int, out: Path, progress: str | None, threads: int) -> dict:
    import faiss

    from embedtune.index.codecs import Precision, QuantizedIndex
    from embedtune.index.codecs.transform import training_sample

    faiss.omp_set_num_threads(threads)
    rss_base = _rss_now_mib()
    _progress(progress, "corpus")
    xq = load_queries()
    xb = make_corpus(rows)
    n, d = xb.shape
    truth_path = out / f"ground_truth_{rows}.npy"
    result: dict = {"codec": codec, "budget": budget, "rows": n, "queries": len(xq), "k": K, "threads": faiss.omp_get_max_threads()}

    _progress(progress, "build")
    if codec == "Flat":
        t0 = time.perf_counter()
        index = faiss.IndexFlatIP(d)
        index.add(xb)
        fit_s, add_s = 0.0, time.perf_counter() - t0
        search = index.search
        code_size = 4 * d
        result["backend"] = "IndexFlatIP"
    elif family(codec).startswith("klt"):
        if not truth_path.exists():
            np.save(truth_path, _exact_topk(xb, xq))
        precision = Precision(codec)
        t0 = time.perf_counter()
        trained = precision.codec.train(xb)  # QuantizedIndex.build(xb, codec), split to time fit and add apart
        fit_s = time.perf_counter() - t0
        _progress(progress, "add")
        t0 = time.perf_counter()
        trained.add(xb)
        add_s = time.perf_counter() - t0
        qi = QuantizedIndex(precision, d, trained, n)
        search = qi.search
        code_size = int(trained.sa_code_size())
        result["backend"] = type(trained).__name__ + (f"({type(faiss.downcast_index(trained.index)).__name__})"
                                                      if isinstance(trained, faiss.IndexPreTransform) else "")
        if isinstance(trained, faiss.IndexPreTransform):
            result["kept_axes"] = int(trained.index.d)
        elif hasattr(trained, "encoder"):  # klt-wpq: its weighted encoder maps onto the kept axes
            result["backend"] = f"ScoreWeightedIndex({type(trained.search_index).__name__})"
            result["kept_axes"] = int(faiss.downcast_index(trained.encoder.index).d)
        else:
            result["kept_axes"] = int(trained.axes.shape[1])
    else:
        if not truth_path.exists():
            np.save(truth_path, _exact_topk(xb, xq))
        index = faiss.index_factory(d, codec, faiss.METRIC_INNER_PRODUCT)
        sample = training_sample(xb, seed=SEED)  # the rows embedtune's codecs fit on
        t0 = time.perf_counter()
        index.train(sample)
        fit_s = time.perf_counter() - t0
        del sample
        _progress(progress, "add")
        t0 = time.perf_counter()
        index.add(xb)
        add_s = time.perf_counter() - t0
        search = index.search
        code_size = int(index.sa_code_size())
        result["backend"] = type(index).__name__
    result.update(fit_s=fit_s, add_s=add_s, build_s=fit_s + add_s, code_bytes=code_size)

    truth = None if codec == "Flat" else np.load(truth_path)  # Flat: its own warm-up result is the truth
    del xb  # every index holds its own copy (Flat) or codes
    gc.collect()
    result["rss_held_mib"] = _rss_now_mib()
    result["rss_base_mib"] = rss_base

    times = []
    for run in range(RUNS + 1):
        _progress(progress, f"search{run}")
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        D, I = search(xq, K)
        elapsed = time.perf_counter() - t0
        if run == 0:
            result["warmup_s"] = elapsed
            if truth is None:
                truth = np.asarray(I)
                np.save(truth_path, truth)
            hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(np.asarray(I), truth)]
            result["recall_at_10"] = float(np.mean(hits)) / K
        else:
            times.append(elapsed)
            result.setdefault("load1_at_runs", []).append(round(load, 2))
    result["search_s"] = times
    result["median_s"] = float(np.median(times))
    result["qps"] = len(xq) / result["median_s"]
    result["ns_per_query_vector"] = 1e9 * result["median_s"] / (len(xq) * n)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["status"] = "ok"
    return result


# ----------------------------------------------------------------------------------------------- runner


def run_job(codec: str, budget: int, rows: int, out: Path, log_dir: Path, threads: int) -> dict:
    """Run one job in a child process, stopping it past its build or search limit; returns what it wrote or a skip record."""
    fam = family(codec)
    build_limit = BUILD_LIMIT.get(fam, DEFAULT_LIMIT)
    search_limit = SEARCH_LIMIT.get(fam, DEFAULT_LIMIT)
    with tempfile.TemporaryDirectory() as tmp:
        progress = str(Path(tmp) / "progress.json")
        result_path = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--worker", codec, str(budget), "--rows", str(rows), "--out", str(out),
               "--progress", progress, "--result", str(result_path), "--threads", str(threads)]
        env = dict(os.environ, **{var: str(threads) for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
        log = open(log_dir / f"{key(codec, rows, threads)}.log", "w")
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        phase_started: dict[str, float] = {}
        reason = None
        while proc.poll() is None:
            time.sleep(2)
            try:
                state = json.loads(Path(progress).read_text())
            except (OSError, ValueError):
                continue
            phase, phase_started = state["phase"], state["phases"]
            now = time.time()
            if phase in ("build", "add") and now - phase_started["build"] > build_limit:
                reason = f"build (fit + add) passed {build_limit / 60:.0f} min (stopped in phase {phase!r})"
            elif phase.startswith("search") and now - phase_started[phase] > search_limit:
                reason = f"one search of the {QUERIES}-query batch passed {search_limit / 60:.0f} min at {rows:,} rows"
            if reason:
                proc.kill()
                proc.wait()
                break
        log.close()
        wall = time.time() - started
        if reason is None and proc.returncode == 0 and result_path.exists():
            result = json.loads(result_path.read_text())
        else:
            result = {"codec": codec, "budget": budget, "rows": rows, "threads": threads, "status": "skipped",
                      "reason": reason or f"worker exited with {proc.returncode} (see logs/{key(codec, rows, threads)}.log)",
                      "phase_seconds": {p: round(t - started, 1) for p, t in phase_started.items()}}
    result["wall_s"] = wall
    result["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    return result


COMMAND_FILE = "command.txt"


def main_runner(args: argparse.Namespace) -> None:
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = " ".join(f"{var}={os.environ[var]}" for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if var in os.environ)
    command = f"{env} nice -n {os.nice(0)} .venv/bin/python benchmarks/codec_speed.py {' '.join(sys.argv[1:])}".strip()
    before = (out / COMMAND_FILE).read_text().splitlines() if (out / COMMAND_FILE).exists() else []
    (out / COMMAND_FILE).write_text("\n".join(before + ([command] if command not in before else [])) + "\n")  # every run, in order
    todo = jobs(args.budgets)
    if args.only:
        todo = [job for job in todo if job[0] in args.only or job[0] == "Flat"]
    began = time.time()
    for codec, budget in todo:
        rows = args.rows
        path = out / f"{key(codec, rows, args.threads)}.json"
        if not path.exists() and args.stop_after and time.time() - began > 60 * args.stop_after:
            print(f"[cut ] {codec} @ {budget} B: this run's {args.stop_after:.0f} min are spent", flush=True)
            path.write_text(json.dumps({"codec": codec, "budget": budget, "rows": rows, "threads": args.threads, "status": "skipped",
                                        "reason": f"not started: the run's time budget (--stop-after {args.stop_after:g} min) was spent",
                                        "date": datetime.datetime.now().isoformat(timespec="seconds")}, indent=2) + "\n")
            continue
        if path.exists():
            print(f"[skip] {path.name} present", flush=True)
            existing = json.loads(path.read_text())
            if not (existing.get("status") == "skipped" and family(codec) == "klt-sq" and "search" in existing.get("reason", "")):
                continue
        else:
            print(f"[run ] {codec} @ {budget} B, {rows:,} rows  ({datetime.datetime.now():%H:%M:%S})", flush=True)
            result = run_job(codec, budget, rows, out, out / "logs", args.threads)
            path.write_text(json.dumps(result, indent=2) + "\n")
            print(f"       {summary_line(result)}", flush=True)
        # The reference numpy codec, too slow at full size: measured on the first FALLBACK_ROWS rows instead.
        if family(codec) == "klt-sq" and json.loads(path.read_text())["status"] == "skipped" and rows > FALLBACK_ROWS:
            small = out / f"{key(codec, FALLBACK_ROWS, args.threads)}.json"
            if not small.exists():
                print(f"[run ] {codec} @ {budget} B, {FALLBACK_ROWS:,} rows (fallback)", flush=True)
                result = run_job(codec, budget, FALLBACK_ROWS, out, out / "logs", args.threads)
                small.write_text(json.dumps(result, indent=2) + "\n")
                print(f"       {summary_line(result)}", flush=True)
    write_report(out, args)


def summary_line(r: dict) -> str:
    if r["status"] != "ok":
        return f"SKIPPED: {r['reason']}"
    return (f"{r['qps']:.1f} q/s (median {r['median_s']:.2f} s), recall@10 {r['recall_at_10']:.3f}, build {r['build_s']:.1f} s, "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB")


# ----------------------------------------------------------------------------------------------- report


def _machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    return {"model": fields.get("Model name", "?").strip(), "cpus": fields.get("CPU(s)", "?").strip(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def write_report(out: Path, args: argparse.Namespace) -> str:
    import faiss

    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name not in (PAIRED_FILE, PAIRED_ADDITIVE_FILE, PAIRED_SCALAR_FILE)]
    commands = (out / COMMAND_FILE).read_text().split("\n") if (out / COMMAND_FILE).exists() else ["?"]
    command = "`; then `".join(c for c in commands if c.strip())
    by_name = {(r["codec"], r["rows"], r.get("threads", 1)): r for r in results}
    machine = _machine()
    lines = [
        "# Search speed: embedtune's registered codecs vs FAISS's scans at equal bytes",
        "",
        f"Command: `{command}`" + ("; then `... benchmarks/codec_speed.py --paired`" if (out / PAIRED_FILE).exists() else "") + "  ",
        # The JSONs of the runs before --paired-scalar record no machine; where those ran is stated once, here.
        f"Machine that wrote this report: {machine['model']}, {machine['cpus']} CPUs, {machine['mem_gib']} GiB RAM; Python {platform.python_version()}, "
        f"FAISS {faiss.__version__}, numpy {np.__version__}. The runs to 2026-12-05T08:13 (the main table, `--paired`, "
        "`--paired-additive`) were on a 2-core AMD EPYC VM; `--paired-scalar` names its own machine  ",
        f"Date: {datetime.date.today().isoformat()} (runs: "
        f"{min((r['date'] for r in results), default='-')} to {max((r['date'] for r in results), default='-')})",
        "",
        f"Corpus: {args.rows:,} MiniLM-like vectors (the 5,183 SciFact MiniLM document vectors tiled, + N(0, {SIGMA}²) noise per "
        f"dimension, seed {SEED}, renormalised); {QUERIES:,} real SciFact MiniLM queries; k = {K}; exhaustive search; one "
        f"thread; queries/s = {QUERIES} / median of {RUNS} timed batch searches after one warm-up. Recall@10 against exact "
        "float32 top-10 on the same rows. Ratio = embedtune q/s ÷ FAISS q/s for the same code type at the same bytes "
        "(>1: embedtune faster; target ≥ 0.67, i.e. within 1.5×). Build = fit (65,536-row sample) + add (all rows). "
        "Peak RSS includes the float32 corpus (1.43 GiB at 1M rows) held during build; held RSS is the process after "
        "the float corpus is freed (index + Python/FAISS, whose baseline is in the JSON as `rss_base_mib`).",
        "",
        "| budget | codec | rows | threads | backend | kept axes | code B | q/s | ns / (query·vector) | ratio vs FAISS | recall@10 | "
        "fit s | add s | build s | peak RSS MiB | held RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    order = {c: i for i, (c, _) in enumerate(jobs(sorted({r["budget"] for r in results if r["codec"] != "Flat"}) or [32, 64]))}
    for r in sorted(results, key=lambda r: (r["budget"] if r["codec"] != "Flat" else 10**6, order.get(r["codec"], 99), -r["rows"], r.get("threads", 1))):
        if r["status"] != "ok":
            lines.append(f"| {r['budget']} | {r['codec']} | {r['rows']:,} | {r.get('threads', 1)} | – | – | – | skipped | – | – | – | – | – | – | – | – |")
            notes.append(f"- `{r['codec']}` at {r['rows']:,} rows skipped: {r['reason']}.")
            continue
        peer = peer_of(r["codec"], r["budget"])
        peer_r = by_name.get((peer, r["rows"], r.get("threads", 1))) if peer else None
        ratio = (f"{r['qps'] / peer_r['qps']:.2f} vs {peer}" if peer_r and peer_r["status"] == "ok" else
                 (f"n/a ({peer} missing)" if peer else "–"))
        lines.append(
            f"| {r['budget']} | {r['codec']} | {r['rows']:,} | {r['threads']} | {r.get('backend', '')} | {r.get('kept_axes', '–')} | {r['code_bytes']} | "
            f"{r['qps']:.1f} | {r['ns_per_query_vector']:.2f} | {ratio} | {r['recall_at_10']:.3f} | {r['fit_s']:.1f} | {r['add_s']:.1f} | "
            f"{r['build_s']:.1f} | {r['peak_rss_mib']:.0f} | {r['rss_held_mib']:.0f} |")
    if notes:
        lines += ["", "Skipped:", "", *notes]
    loads = [x for r in results for x in r.get("load1_at_runs", [])]
    if loads:
        lines += ["", f"1-minute load average at the timed runs: {min(loads):.2f} to {max(loads):.2f} (2 CPUs; other "
                  "processes on the machine share them, so absolute q/s is noisy; the ratios compare runs made minutes apart)."]
    truth_file = out / f"ground_truth_{ROWS}.npy"
    share = (float(np.mean([np.bincount(row).max() for row in np.load(truth_file) % 5183])) if truth_file.exists() else None)
    lines += ["", f"Recall@10 is low for every 32-64 B code here by construction: each real document appears about "
              f"{ROWS // 5183} times, each copy with independent noise (cosine about 0.87 between two copies), so the exact "
              "top-10 of a query are mostly copies of its nearest one or two documents, told apart only by noise that "
              "a 32-64 B code does not keep" + (f" (on average {share:.1f} of the exact 10 are copies of one document)" if share else "")
              + ". Compare recall across codecs at the same bytes, not with recall on a real corpus."]
    lines += paired_lines(out)
    lines += paired_additive_lines(out)
    lines += paired_scalar_lines(out)
    text = "\n".join(lines) + "\n"
    (out / "REPORT.md").write_text(text)
    return text


# ----------------------------------------------------------------------------------------------- paired check

PAIRED_FILE = "paired.json"


def _median_time(search, xq: np.ndarray, runs: int) -> float:
    search(xq, K)  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        search(xq, K)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _paired_record(path: Path) -> tuple[dict, dict[str, float]] | None:
    """A paired run's record and each timed search's median seconds, or None when the run has not been made."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record, {name: float(np.median(v)) for name, v in record["seconds"].items()}


def _time_alternately(pairs: dict, xq: np.ndarray, rounds: int, result: dict, runs: int = 1) -> None:
    """Time every search of ``pairs`` once a round, ``rounds`` times, into ``result["seconds"]`` (each round's 1-min load
    into ``result["load1"]``), so every search sees the same moments of a shared machine."""
    for _ in range(rounds):
        result["load1"].append(round(os.getloadavg()[0], 2))
        for name, search in pairs.items():
            result["seconds"].setdefault(name, []).append(_median_time(search, xq, runs))
        print(json.dumps(result["seconds"]), flush=True)


def paired(out: Path, rounds: int = 2) -> dict:
    """Each embedtune codec and its FAISS peer built in one process and timed alternately (``rounds`` times, each a
    warm-up and the median of ``RUNS`` searches, one for the slow 8-bit scans), so both see the same machine load.

    * ``klt-pq4:B`` vs ``PQ{2B}x4fs`` (B = 32, 64), both built as in the main run; also each at FAISS's fast-scan
      kernel ``implem = 15`` instead of the default, to show the kernel choice matters more than the codec;
    * ``klt-pq:32`` vs ``PQ32``, both fitted on the first 16,384 rows only (a 1M-row index either way; the scan's cost
      does not depend on how the tables were fitted);
    * ``klt-rq:32``'s scan vs FAISS's own ``IndexResidualQuantizer`` LUT scan of the same shape (200 axes, 32 stages
      of 8 bits, ``ST_LUT_nonorm``) and vs ``PQ32``: codebooks trained on 4,096 rows (beam 1) and 1M random codes set
      with ``add_sa_codes``, since a LUT scan's cost does not depend on the codes' values (building klt-rq at 1M takes
      ~16 minutes; its own scan was timed in the main run).
    """
    import faiss

    from embedtune.index.codecs import Precision, QuantizedIndex
    from embedtune.index.codecs.transform import training_sample

    faiss.omp_set_num_threads(1)
    xq, xb = load_queries(), make_corpus(ROWS)
    sample = training_sample(xb, seed=SEED)
    result: dict = {"rows": len(xb), "queries": len(xq), "k": K, "rounds": rounds, "seconds": {}, "load1": []}

    def timed(pairs: dict, runs: int) -> None:
        _time_alternately(pairs, xq, rounds, result, runs)

    for b in (32, 64):
        peer = faiss.index_factory(384, f"PQ{2 * b}x4fs", faiss.METRIC_INNER_PRODUCT)
        peer.train(sample)
        peer.add(xb)
        precision = Precision(f"klt-pq4:{b}")
        trained = precision.codec.train(xb)
        trained.add(xb)
        qi = QuantizedIndex(precision, 384, trained, len(xb))
        timed({f"klt-pq4:{b}": qi.search, f"PQ{2 * b}x4fs": peer.search}, RUNS)
        inner = faiss.downcast_index(trained.index)
        inner.implem = peer.implem = 15
        timed({f"klt-pq4:{b} implem=15": qi.search, f"PQ{2 * b}x4fs implem=15": peer.search}, RUNS)
        del peer, trained, qi, inner
        gc.collect()

    precision = Precision("klt-pq:32")
    trained = precision.codec.train(xb[:16_384])
    trained.add(xb)
    qi = QuantizedIndex(precision, 384, trained, len(xb))
    pq = faiss.index_factory(384, "PQ32", faiss.METRIC_INNER_PRODUCT)
    pq.train(np.ascontiguousarray(xb[:16_384]))
    pq.add(xb)
    del xb
    gc.collect()
    codes = np.random.default_rng(SEED).integers(0, 256, size=(ROWS, 32), dtype=np.uint8)
    rq = faiss.IndexResidualQuantizer(200, 32, 8, faiss.METRIC_INNER_PRODUCT, faiss.AdditiveQuantizer.ST_LUT_nonorm)
    rq.rq.max_beam_size = 1
    rq.train(np.ascontiguousarray(sample[:4096, :200]))
    rq.add_sa_codes(codes)
    q200 = np.ascontiguousarray(xq[:, :200])
    timed({"klt-pq:32 (fit on 16k rows)": qi.search, "PQ32 (fit on 16k rows)": pq.search,
           "FAISS IndexResidualQuantizer 200-d, 32x8 (random codes)": lambda _q, k: rq.search(q200, k)}, 1)
    result["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    (out / PAIRED_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


PAIRED_ADDITIVE_FILE = "paired-additive.json"


def paired_additive(out: Path, rounds: int = 3) -> dict:
    """The additive codecs' scans (``klt-rq:32``: 200 axes; ``klt-wpq:32``: 384), timed alternately in one process:
    FAISS's own ``IndexResidualQuantizer`` LUT scan, embedtune's search of the same index
    (:func:`embedtune.index.codecs.additive_scan.additive_search`: the product quantiser's scan on the same codes)
    and ``PQ32``. Codebooks trained on 4,096 rows (beam 1), 1M random codes set with ``add_sa_codes`` (a LUT scan's
    cost does not depend on the codes' values); the top-10 of both scans of one index are compared too.
    """
    import faiss

    from embedtune.index.codecs.additive_scan import additive_search
    from embedtune.index.codecs.transform import training_sample

    faiss.omp_set_num_threads(1)
    xq, xb = load_queries(), make_corpus(ROWS)
    sample = np.ascontiguousarray(training_sample(xb, seed=SEED)[:16_384])
    pq = faiss.index_factory(384, "PQ32", faiss.METRIC_INNER_PRODUCT)
    pq.train(sample)
    pq.add(xb)
    del xb
    gc.collect()
    codes = np.random.default_rng(SEED).integers(0, 256, size=(ROWS, 32), dtype=np.uint8)
    result: dict = {"rows": ROWS, "queries": len(xq), "k": K, "rounds": rounds, "seconds": {}, "load1": [], "same_top10": {}}
    pairs: dict = {"PQ32": pq.search}
    for dim in (200, 384):
        rq = faiss.IndexResidualQuantizer(dim, 32, 8, faiss.METRIC_INNER_PRODUCT, faiss.AdditiveQuantizer.ST_LUT_nonorm)
        rq.rq.max_beam_size = 1
        rq.train(np.ascontiguousarray(sample[:4096, :dim]))
        rq.add_sa_codes(codes)
        q = np.ascontiguousarray(xq[:, :dim])
        pairs[f"FAISS RQ scan {dim}-d 32x8"] = lambda _q, k, rq=rq, q=q: rq.search(q, k)
        pairs[f"embedtune scan {dim}-d 32x8"] = lambda _q, k, rq=rq, q=q: additive_search(rq, q, k)
        _, I_faiss = rq.search(q, K)
        _, I_ours = additive_search(rq, q, K)
        result["same_top10"][f"{dim}-d"] = float((I_faiss == I_ours).mean())
    _time_alternately(pairs, xq, rounds, result)
    result["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    (out / PAIRED_ADDITIVE_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def paired_additive_lines(out: Path) -> list[str]:
    recorded = _paired_record(out / PAIRED_ADDITIVE_FILE)
    if recorded is None:
        return []
    r, sec = recorded
    lines = ["", f"Additive codecs' scan (`--paired-additive`, {r['date']}): one process, timed alternately, {r['rounds']} rounds "
             f"(1-min load {min(r['load1']):.2f} to {max(r['load1']):.2f}); 1M random 32-byte codes. Seconds per batch of 1,000 "
             "queries; ratio = PQ32 s / scan s (1: PQ's speed; the target is ≥ 0.67).", "",
             "| scan | s | ratio vs PQ32 | top-10 equal to FAISS's scan |", "|---|---|---|---|"]
    for name in sec:
        dim = name.split(" ")[-2] if "scan" in name else None
        same = f"{100 * r['same_top10'][dim]:.2f} %" if name.startswith("embedtune") else "–"
        lines.append(f"| {name} | {sec[name]:.2f} | {sec['PQ32'] / sec[name]:.2f} | {same} |")
    return lines


PAIRED_SCALAR_FILE = "paired-scalar.json"


def paired_scalar(out: Path, rounds: int = 1) -> dict:
    """The scalar quantisers' batch search (``SQ8``: the ``int8`` precision; ``SQfp16``: ``float16``), timed alternately in
    one process: FAISS's own per-code scan and embedtune's (:func:`embedtune.index.codecs.faiss_scan.faiss_index_search`:
    the codes decoded a block at a time and scored by BLAS), over the same index of ``ROWS`` vectors, 1,000 queries, top 10;
    the share of equal top-10 entries too. The float32 flat search (``exact_search``) is timed beside them for scale.
    """
    import faiss

    from embedtune.evaluate.search import exact_search
    from embedtune.index.codecs.faiss_scan import faiss_index_search

    faiss.omp_set_num_threads(1)
    xq, xb = load_queries(), make_corpus(ROWS)
    result: dict = {"rows": ROWS, "queries": len(xq), "k": K, "rounds": rounds, "seconds": {}, "load1": [], "same_top10": {}}
    pairs: dict = {"float32 exact_search": lambda q, k: exact_search(q, xb, k)}
    for name, qtype in (("SQ8", faiss.ScalarQuantizer.QT_8bit), ("SQfp16", faiss.ScalarQuantizer.QT_fp16)):
        index = faiss.IndexScalarQuantizer(xb.shape[1], qtype, faiss.METRIC_INNER_PRODUCT)
        index.train(xb[:65_536])
        index.add(xb)
        pairs[f"FAISS {name} scan"] = index.search
        pairs[f"embedtune {name} search"] = lambda q, k, index=index: faiss_index_search(index, q, k)
        result["same_top10"][name] = float((index.search(xq, K)[1] == faiss_index_search(index, xq, K)[1]).mean())
    _time_alternately(pairs, xq, rounds, result)
    result["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    result["machine"] = _machine()
    (out / PAIRED_SCALAR_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def paired_scalar_lines(out: Path) -> list[str]:
    recorded = _paired_record(out / PAIRED_SCALAR_FILE)
    if recorded is None:
        return []
    r, sec = recorded
    machine = r.get("machine") or {}
    lines = ["", f"Scalar quantisers' batch search (`--paired-scalar`, {r['date']}, {machine.get('model', '?')}, {machine.get('cpus', '?')} "
             f"CPUs): one process, timed alternately, {r['rounds']} "
             f"rounds (1-min load {min(r['load1']):.2f} to {max(r['load1']):.2f}); {r['rows']:,} vectors. Seconds per batch of "
             f"{r['queries']:,} queries, top {r['k']}; ratio = FAISS's scan s / embedtune's s (>1: embedtune's is faster).", "",
             "| search | s | ratio | top-10 equal to FAISS's scan |", "|---|---|---|---|"]
    for name in sec:
        kind = name.split(" ")[1]
        ours = name.startswith("embedtune")
        ratio = f"{sec[f'FAISS {kind} scan'] / sec[name]:.2f}" if ours else "–"
        same = f"{100 * r['same_top10'][kind]:.2f} %" if ours else "–"
        lines.append(f"| {name} | {sec[name]:.2f} | {ratio} | {same} |")
    return lines


def paired_lines(out: Path) -> list[str]:
    recorded = _paired_record(out / PAIRED_FILE)
    if recorded is None:
        return []
    r, sec = recorded
    rows = [("klt-pq4:32", "PQ64x4fs"), ("klt-pq4:32 implem=15", "PQ64x4fs implem=15"), ("klt-pq4:64", "PQ128x4fs"),
            ("klt-pq4:64 implem=15", "PQ128x4fs implem=15"), ("klt-pq:32 (fit on 16k rows)", "PQ32 (fit on 16k rows)"),
            ("FAISS IndexResidualQuantizer 200-d, 32x8 (random codes)", "PQ32 (fit on 16k rows)")]
    lines = ["", f"Paired check (`--paired`, {r['date']}): each pair built in one process and timed alternately, "
             f"{r['rounds']} rounds, so both see the same load (1-min load {min(r['load1']):.2f} to {max(r['load1']):.2f}). "
             "Seconds per batch of 1,000 queries (median over rounds of each round's median), ratio = peer s / codec s "
             "(>1: the first is faster).", "",
             "| codec | s | peer | s | ratio |", "|---|---|---|---|---|"]
    for a, b in rows:
        if a in sec and b in sec:
            lines.append(f"| {a} | {sec[a]:.2f} | {b} | {sec[b]:.2f} | {sec[b] / sec[a]:.2f} |")
    if "klt-rq:32" not in sec:
        main = out / f"{key('klt-rq:32', ROWS)}.json"
        if main.exists() and json.loads(main.read_text()).get("status") == "ok":
            m = json.loads(main.read_text())["median_s"]
            lines.append(f"| klt-rq:32 (main run) | {m:.2f} | FAISS IndexResidualQuantizer 200-d, 32x8 (random codes) | "
                         f"{sec['FAISS IndexResidualQuantizer 200-d, 32x8 (random codes)']:.2f} | "
                         f"{sec['FAISS IndexResidualQuantizer 200-d, 32x8 (random codes)'] / m:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--budgets", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--paired-scalar", action="store_true",
                        help="time FAISS's SQ8/SQfp16 scans against embedtune's batch search alternately (paired_scalar())")
    parser.add_argument("--paired-additive", action="store_true",
                        help="only time the additive codecs' scans against FAISS's RQ scan and PQ32, alternately")
    parser.add_argument("--threads", type=int, default=1, help="FAISS / BLAS threads of each job (default 1)")
    parser.add_argument("--stop-after", type=float, default=0,
                        help="minutes: jobs not started by then are recorded as skipped (0: no limit)")
    parser.add_argument("--only", nargs="+", help="run only these codecs (plus Flat, the ground truth)")
    parser.add_argument("--paired", action="store_true", help="time each codec and its FAISS peer alternately in one "
                        "process (see paired()); writes paired.json and adds it to REPORT.md")
    parser.add_argument("--report", action="store_true", help="only rewrite REPORT.md from the JSONs")
    parser.add_argument("--worker", nargs=2, metavar=("CODEC", "BUDGET"), help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args.worker[0], int(args.worker[1]), args.rows, Path(args.out), args.progress, args.threads)
        Path(args.result).write_text(json.dumps(result, indent=2))
        return
    if args.report:
        print(write_report(Path(args.out), args))
        return
    if args.paired_scalar:
        paired_scalar(Path(args.out))
        print(write_report(Path(args.out), args))
        return
    if args.paired_additive:
        paired_additive(Path(args.out))
        print(write_report(Path(args.out), args))
        return
    if args.paired:
        paired(Path(args.out))
        print(write_report(Path(args.out), args))
        return
    main_runner(args)
    print(write_report(Path(args.out), args))


if __name__ == "__main__":
    main()
