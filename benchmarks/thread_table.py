"""Times compress fit, compress apply, embed-corpus and evaluate at the default and at 1 and 2 threads,
on the machine as it is and with one more busy process, side by side in one run.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/thread_table.py --out benchmarks/results/threads

Each cell is one ``embedtune`` process timed with ``/usr/bin/time`` (wall seconds and peak RSS);
"default" passes no ``--threads`` (the command then takes :func:`embedtune.runtime.default_threads`,
the free cores), "1" and "2" pass ``--threads``; "2" is also what torch, FAISS and BLAS took on
their own before (every core of this 2-core machine). The busy process is one single-threaded
Python loop started before the cell and stopped after it. The cells of a workload run one after
the other, so they share the machine's load of the moment (recorded per cell: the 1-minute load
average at its start).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EMBEDTUNE = str(Path(sys.executable).with_name("embedtune"))
SHARED = ROOT.parent / "shared" / "data" / "beir"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def prepare(work: Path, evaluate_data: str | None = None) -> dict[str, list[str]]:
    """Inputs of the four workloads, and their commands (without --threads)."""
    from embedtune.data.beir import load_beir

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    adapter = work / "adapter"
    subprocess.run([EMBEDTUNE, "-q", "--threads", "1", "compress", "fit", "--method", "dive", "--dim", "128", "--data", "scifact",
                    "--model", "minilm", "--set", "epochs=2", "--out", str(adapter), "--overwrite"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    rng = np.random.default_rng(0)
    big = rng.standard_normal((200_000, 384), dtype=np.float32)
    big /= np.linalg.norm(big, axis=1, keepdims=True)
    np.save(work / "vectors.npy", big)
    corpus = load_beir("scifact").corpus
    with open(work / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for doc_id in list(corpus)[:200]:
            handle.write(json.dumps({"_id": doc_id, **corpus[doc_id]}) + "\n")
    arguana = SHARED / "arguana"
    evaluated = evaluate_data or (str(arguana) if arguana.is_dir() else "scifact")
    evaluated_name = Path(evaluated).name if evaluate_data else ("ArguAna" if arguana.is_dir() else "scifact")
    return {
        "compress fit (DIVE 128, SciFact, 10 epochs)": ["compress", "fit", "--method", "dive", "--dim", "128", "--data", "scifact",
                                                         "--model", "minilm", "--set", "epochs=10", "--out", str(work / "fit"),
                                                         "--overwrite"],
        "compress apply (200k x 384 -> 128)": ["compress", "apply", "--adapter", str(adapter), "--input", str(work / "vectors.npy"),
                                                "--out", str(work / "applied.npy"), "--overwrite"],
        "embed-corpus (200 SciFact docs, MiniLM)": ["embed-corpus", "--data", str(work / "corpus.jsonl"), "--model", "minilm",
                                                     "--out", "{fresh}"],
        f"evaluate (MiniLM, {evaluated_name}, cached)": ["evaluate", "--model", "minilm", "--data", evaluated],
    }


def run_cell(command: list[str], threads: str, busy: bool, work: Path) -> dict:
    from embedtune.runtime import default_threads

    argv = [EMBEDTUNE, "-q", *([] if threads == "default" else ["--threads", threads]), *command]
    argv = [str(Path(tempfile.mkdtemp(dir=work)) / "out") if part == "{fresh}" else part for part in argv]
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        if spinner is not None:
            time.sleep(1.0)
        load = os.getloadavg()[0]
        resolved = default_threads() if threads == "default" else int(threads)
        timing = work / "time.txt"
        completed = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(timing), *argv], capture_output=True, text=True,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
        wall, rss_kb = timing.read_text().split()[-2:]
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return {"threads": threads, "resolved_threads": resolved, "busy": busy, "seconds": float(wall), "peak_rss_mb": int(rss_kb) / 1024,
            "load_1min": round(load, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "threads"))
    parser.add_argument("--only", nargs="*", default=None, help="substrings of the workloads to run")
    parser.add_argument("--evaluate-data", default=None, help="the dataset of the evaluate row (default: ArguAna when ../shared has it)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="embedtune-threads-") as scratch:
        work = Path(scratch)
        workloads = prepare(work, args.evaluate_data)
        cells = []
        for name, command in workloads.items():
            if args.only and not any(part in name for part in args.only):
                continue
            for busy in (False, True):
                for threads in ("default", "1", "2"):
                    cell = {"workload": name, **run_cell(command, threads, busy, work)}
                    cells.append(cell)
                    print(json.dumps(cell), flush=True)
    record = {"started": started.isoformat(timespec="seconds"), "machine": f"{os.cpu_count()} cores, {_cpu()}",
              "command": "benchmarks/thread_table.py " + " ".join(argv if argv is not None else sys.argv[1:]), "cells": cells}
    (out / "thread_table.json").write_text(json.dumps(record, indent=2) + "\n")
    print(markdown(record))
    return 0


def markdown(record: dict) -> str:
    rows = ["| workload | load | default | 1 thread | 2 threads (the old default) |", "|---|---|---|---|---|"]
    by_key = {(c["workload"], c["busy"], c["threads"]): c for c in record["cells"]}
    for name in dict.fromkeys(c["workload"] for c in record["cells"]):
        for busy in (False, True):
            cells = [by_key.get((name, busy, t)) for t in ("default", "1", "2")]
            if not any(cells):
                continue
            shown = [f"{c['seconds']:.1f} s" + (f" ({c['resolved_threads']} thr)" if c["threads"] == "default" else "") if c else "" for c in cells]
            load = "+1 busy process" if busy else "as it was"
            loads = "/".join(f"{c['load_1min']:.1f}" for c in cells if c)
            rows.append(f"| {name} | {load} (load {loads}) | " + " | ".join(shown) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
