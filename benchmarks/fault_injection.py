"""Fault injection at scale: damage embedtune's files and kill its benchmark, and count what follows.

    python benchmarks/fault_injection.py --trials 500 --kills 40 --work /tmp/etfaults \
        --out benchmarks/results/fault_injection.json

The same trials as ``tests/fault_injection/`` (shared code: ``tests/fault_injection/faults.py``),
at larger counts:

* corrupt (1-4 random bytes overwritten at a random offset) and truncate (cut at a random length)
  a saved adapter (PCA, DIVE: ``model.safetensors`` or ``config.json``), an embedding-cache entry
  (``embeddings.npy``, ``ids.json``, ``meta.json``), a benchmark run record and a FAISS index
  (flat, SQ8, binary: every file of the folder), ``--trials`` seeds of each;
* corrupt, truncate, edit (a JSON field changed, its digests recomputed) and swap (the file of
  another run on other data, its digest entries recomputed) a FAISS index folder, a ``compress
  plan`` folder (judged by the hits of ``index build --plan``), a plan's cached FAISS files and an
  ``embed-corpus`` shard folder (issue 28);
* SIGKILL a tiny ``embedtune benchmark dive`` grid at random points ``--kills`` times, resuming it
  each time, and compare the final records with an uninterrupted run's.

Prints one Markdown row per artefact and kind: tried, clear error, identical result, wrong result
(the target is 0), unclear failure (another exception or a crash; the target is 0).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fault_injection"))

import faults  # noqa: E402  (tests/fault_injection/faults.py)

from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.io import atomic_write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=500, help="seeds per artefact and kind of damage")
    parser.add_argument("--kills", type=int, default=40, help="SIGKILLs of the benchmark (0: none)")
    parser.add_argument("--work", default="/tmp/etfaults", help="scratch folder (emptied first)")
    parser.add_argument("--out", default=None, help="write every trial and the table as JSON here")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.perf_counter()
    seeds = range(args.trials)
    trials: list[faults.Trial] = []
    for artefact in (faults.AdapterArtefact(work, "pca"), faults.AdapterArtefact(work, "dive"), faults.CacheArtefact(work),
                     faults.RecordArtefact(work)):
        for damage in faults.DAMAGE:
            trials += faults.run_trials(artefact, damage, seeds, work / "scratch")
    spec = faults.build_indexes(work)
    trials += faults.run_index_trials(spec, [(k, d, s) for k in faults.INDEX_KINDS for d in faults.ALL_DAMAGE for s in seeds], work)
    # Issue 28: plan folders, a plan's cached FAISS files and embed-corpus shards, edited and swapped files too.
    for artefact in (faults.PlanArtefact(work), faults.FaissCacheArtefact(work), faults.ShardArtefact(work)):
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
    if args.out:
        atomic_write_json(args.out, {"machine": machine_info(), "command": " ".join(sys.argv), "seconds": seconds, "rows": rows,
                                     "table": table, "kills": asdict(kill_report) if kill_report else None,
                                     "not_ok": [asdict(trial) for trial in bad]})
    sys.exit(1 if bad or (kill_report and kill_report.mismatches) else 0)


if __name__ == "__main__":
    main()
