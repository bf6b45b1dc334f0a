"""Fault injection at scale: damage embedtune's files and kill its benchmark, and count what follows.

    python benchmarks/fault_injection.py --trials 500 --kills 40 --work /tmp/etfaults \
        --out benchmarks/results/fault_injection.json
    python benchmarks/fault_injection.py --artefacts resumed --trials 100 --kills 0 --work /tmp/etfaults \
        --report benchmarks/results/fault-injection

The same trials as ``tests/fault_injection/`` (shared code: ``tests/fault_injection/faults.py``),
at larger counts:

* corrupt (1-4 random bytes overwritten at a random offset) and truncate (cut at a random length)
  a saved adapter (PCA, DIVE: ``model.safetensors`` or ``config.json``), an embedding-cache entry
  (``embeddings.npy``, ``ids.json``, ``meta.json``), a benchmark run record and a FAISS index
  (flat, SQ8, binary: every file of the folder), ``--trials`` seeds of each;
* corrupt, truncate, edit (a JSON field changed, its digests recomputed) and swap (the file of
  another run on other data, its digest entries recomputed) a FAISS index folder, a ``compress
  plan`` folder (judged by the hits of ``index build --plan``), a plan's cached FAISS files and an
  ``embed-corpus`` shard folder;
* the same four kinds on an exported model folder (``compress export --plan``: its
  ``embedtune_precision/`` files and compressor copy, judged by the deployed int8 codes), the
  embedding cache's partial shards of an interrupted encode, and an interrupted ``embed-corpus``
  folder that is resumed (a swap there: a whole shard of a run over another corpus), judged by
  the resumed result (``--artefacts resumed`` runs only these, ``all`` everything);
* SIGKILL a tiny ``embedtune benchmark dive`` grid at random points ``--kills`` times, resuming it
  each time, and compare the final records with an uninterrupted run's.

Prints one Markdown row per artefact and kind: tried, clear error, identical result, wrong result
(the target is 0), unclear failure (another exception or a crash; the target is 0). ``--report DIR``
writes the table as ``DIR/REPORT.md`` and every trial as ``DIR/fault_injection.json``, both with
the command, the machine and the date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fault_injection"))

import faults  # noqa: E402  (tests/fault_injection/faults.py)

from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=500, help="seeds per artefact and kind of damage")
    parser.add_argument("--kills", type=int, default=40, help="SIGKILLs of the benchmark (0: none)")
    parser.add_argument("--work", default="/tmp/etfaults", help="scratch folder (emptied first)")
    parser.add_argument("--out", default=None, help="write every trial and the table as JSON here")
    parser.add_argument("--artefacts", choices=["all", "resumed"], default="all",
                        help="all: every artefact; resumed: exported model folders, the cache's partial shards and resumed "
                             "embed-corpus folders only")
    parser.add_argument("--report", default=None, metavar="DIR",
                        help="write DIR/REPORT.md (the table, command, machine, date) and DIR/fault_injection.json (every trial)")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.perf_counter()
    seeds = range(args.trials)
    trials: list[faults.Trial] = []
    if args.artefacts == "all":
        for artefact in (faults.AdapterArtefact(work, "pca"), faults.AdapterArtefact(work, "dive"), faults.CacheArtefact(work),
                         faults.RecordArtefact(work)):
            for damage in faults.DAMAGE:
                trials += faults.run_trials(artefact, damage, seeds, work / "scratch")
        spec = faults.build_indexes(work)
        trials += faults.run_index_trials(spec, [(k, d, s) for k in faults.INDEX_KINDS for d in faults.ALL_DAMAGE for s in seeds], work)
        # Plan folders, a plan's cached FAISS files and embed-corpus shards, edited and swapped files too.
        for artefact in (faults.PlanArtefact(work), faults.FaissCacheArtefact(work), faults.ShardArtefact(work)):
            for damage in faults.ALL_DAMAGE:
                trials += faults.run_trials(artefact, damage, seeds, work / "scratch")
    # Exported model folders, the embedding cache's partial shards, and embed-corpus folders resumed.
    for artefact in (faults.ExportedModelArtefact(work), faults.CachePartialArtefact(work), faults.ShardResumeArtefact(work)):
        for damage in faults.ALL_DAMAGE:
            trials += faults.run_trials(artefact, damage, seeds, work / "scratch")
    kill_report = None
    if args.kills:
        model = faults.make_tiny_model(work / "model")
        kill_report = faults.kill_benchmark(work / "kills", model, n_kills=args.kills, seed=0)
    rows = faults.summarise(trials + (kill_report.trials if kill_report else []))
    seconds = time.perf_counter() - started
    table = faults.markdown_table(rows)
    print(table)
    if kill_report is not None:
        print(f"\nkills: {kill_report.kills} over {kill_report.episodes} resumed episodes of a {kill_report.runs}-run grid "
              f"(uninterrupted: {kill_report.reference_seconds:.2f}s); runs already finished when each kill landed: "
              f"{sorted(kill_report.finished_at_kill)}; records differing from the uninterrupted run: {len(kill_report.mismatches)}")
    bad = [trial for trial in trials if trial.outcome not in ("clear error", "identical")]
    for trial in bad[:20]:
        print(f"NOT OK: {trial}")
    print(f"{len(trials)} file trials, {kill_report.kills if kill_report else 0} kills in {seconds:.0f}s")
    threads = " ".join(f"{name}={os.environ[name]}" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if name in os.environ)
    command = " ".join(filter(None, [threads, "python", *sys.argv]))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:  # the code the trials ran on
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    record = {"machine": machine_info(), "command": command, "date": date, "commit": commit, "seconds": seconds, "rows": rows, "table": table,
              "kills": asdict(kill_report) if kill_report else None, "not_ok": [asdict(trial) for trial in bad]}
    if args.out:
        atomic_write_json(args.out, record)
    if args.report:
        report = Path(args.report)
        atomic_write_json(report / "fault_injection.json", {**record, "trials": [asdict(trial) for trial in trials]})
        atomic_write_bytes(report / "REPORT.md", report_markdown(record, len(trials)).encode("utf-8"))
    sys.exit(1 if bad or (kill_report and kill_report.mismatches) else 0)


def report_markdown(record: dict, n_trials: int) -> str:
    """The table with how it was made: command, machine, date and seconds."""
    machine = record["machine"]
    shown = ", ".join(f"{key}: {value}" for key, value in machine.items() if not isinstance(value, (dict, list)))
    lines = ["# Fault injection", "",
             "Each trial damages one file of an artefact (corrupt: 1-4 random bytes overwritten; truncate: cut at a random length; "
             "edit: one JSON field changed to another plausible value, every digest covering it recomputed; swap: the file of another "
             "run, its digest entries recomputed) and loads it as embedtune would. *wrong result* (a different number, no error) and "
             "*unclear failure* (another exception or a crash) must be 0. Shared code: `tests/fault_injection/faults.py`; the raw "
             "trials are in `fault_injection.json` beside this file.", "",
             f"- command: `{record['command']}`", f"- date: {record['date']}", f"- commit: {record.get('commit')}",
             f"- machine: {shown}",
             f"- {n_trials} file trials in {record['seconds']:.0f} s", "", record["table"], ""]
    if record["not_ok"]:
        lines += ["Not OK:", "", *(f"- {trial}" for trial in record["not_ok"][:20]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
