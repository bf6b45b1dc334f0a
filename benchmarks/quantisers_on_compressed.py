"""RaBitQ, TurboQuant and int4 on compressed outputs: do they beat sign bits on DIVE?

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/quantisers_on_compressed.py --dims 128 64 --seeds 2027
    .venv/bin/python benchmarks/quantisers_on_compressed.py --report

SciFact ``beir-train`` (fit on ``qrels/train.tsv`` with the default preset, as ``compress train
--protocol beir-train`` does; all 300 test queries scored). Each compressor (the default DIVE,
uncentred and centred PCA, and the frozen vectors) is scored at every precision in
:data:`PRECISIONS` on the test queries, and each score is split into ``seen`` and ``unseen``
test queries (whose positives were all / none training positives). One JSON per
(method, dim, seed) under ``--results``; a finished one is skipped, so a stopped run resumes.

``--report`` prints, per byte size, every setting with its nDCG@10 on all / seen / unseen, and
for DIVE's RaBitQ/TurboQuant/int4 rows the paired test against DIVE's sign bits at the same
dimension and against the best non-DIVE setting that uses at most the same bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from embedtune import __version__  # noqa: E402
from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.compress import get_compressor_class  # noqa: E402
from embedtune.evaluate.subsets import query_subsets, training_positives  # noqa: E402
from embedtune.io import atomic_write_json  # noqa: E402
from embedtune.runtime import set_threads  # noqa: E402
from embedtune.workflows import load_experiment  # noqa: E402
from embedtune.workflows.fit_and_score import fit_and_evaluate  # noqa: E402
from embedtune.workflows.plan import precision_rows  # noqa: E402
from embedtune.workflows.significance import paired_test  # noqa: E402
from embedtune.workflows.train_compressor import resolve_preset  # noqa: E402
from embedtune.workflows.triplets import shared_triplets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("float32", "int8", "int4", "binary", "binary-rescore", "rabitq1", "rabitq1-rescore", "rabitq4", "turboquant1", "turboquant4")
QUANTISERS = ("int4", "rabitq1", "rabitq1-rescore", "rabitq4", "turboquant1", "turboquant4")
SPLIT_SEED = 2027


def cell_path(results: Path, method: str, dim: int, seed: int) -> Path:
    return results / f"{method}-{dim}-s{seed}.json"


def run(args: argparse.Namespace) -> None:
    experiment = load_experiment(args.data, args.model, protocol="beir-train", split_seed=SPLIT_SEED)
    seen_docs = training_positives(experiment.qrels_for(experiment.split.train + experiment.split.val))
    subsets = query_subsets(experiment.qrels_for(experiment.split.test), seen_docs)
    cells = [("frozen", experiment.embeddings.dim, args.seeds[0])]
    cells += [(m, k, args.seeds[0]) for k in args.dims for m in ("pca-uncentred", "pca")]
    cells += [("dive", k, s) for k in args.dims for s in args.seeds]
    triplets = None
    for method, dim, seed in cells:
        path = cell_path(args.results, method, dim, seed)
        if path.is_file():
            continue
        start = time.perf_counter()
        compressor, fit_seconds = None, 0.0
        if method != "frozen":
            preset = resolve_preset(method, None)
            mined = None
            if get_compressor_class(method).supervised:
                if triplets is None:
                    triplets = shared_triplets(experiment, "train+val", preset.mining, SPLIT_SEED)
                mined = triplets
            overrides = dict(preset.settings)
            if "progress" in get_compressor_class(method).config_class.__dataclass_fields__:
                overrides["progress"] = False
            result = fit_and_evaluate(experiment, method, dim, seed, final=True, triplets=mined, overrides=overrides)
            compressor, fit_seconds = result.compressor, result.fit_seconds
        rows = precision_rows(experiment, "test", compressor, PRECISIONS, rounds=1, time_reference=False)
        record = {
            "method": method, "dim": dim, "seed": seed, "fit_seconds": fit_seconds, "subsets": {k: len(v) for k, v in subsets.items()},
            "rows": [{k: row[k] for k in ("precision", "ram_bytes", "disk_bytes", "ndcg@10", "recall@10", "per_query")} for row in rows],
            "seconds": time.perf_counter() - start, "machine": machine_info(), "embedtune": __version__, "date": dt.date.today().isoformat(),
            "command": " ".join(sys.argv),
        }
        atomic_write_json(path, record)
        best = max(rows, key=lambda r: r["ndcg@10"])
        print(f"{method}-{dim} s{seed}: {len(rows)} precisions in {record['seconds']:.0f}s (fit {fit_seconds:.0f}s; best {best['precision']} "
              f"{best['ndcg@10']:.4f})", flush=True)
    (args.results / "subsets.json").write_text(json.dumps(subsets, indent=1) + "\n")


def _mean(per_query: dict[str, float], ids: list[str]) -> float:
    return float(np.mean([per_query[q] for q in ids])) if ids else float("nan")


def report(args: argparse.Namespace) -> None:
    subsets = json.loads((args.results / "subsets.json").read_text())
    settings: dict[str, dict] = {}
    for path in sorted(args.results.glob("*-s*.json")):
        record = json.loads(path.read_text())
        for row in record["rows"]:
            name = f"{record['method']}-{record['dim']}/{row['precision']}"
            entry = settings.setdefault(name, {"method": record["method"], "dim": record["dim"], "precision": row["precision"],
                                               "ram_bytes": row["ram_bytes"], "runs": []})
            entry["runs"].append(row["per_query"])
    for entry in settings.values():  # trained settings: the mean over seeds per query
        qids = sorted(entry["runs"][0])
        entry["per_query"] = {q: float(np.mean([run[q] for run in entry["runs"]])) for q in qids}
    all_ids = sorted(next(iter(settings.values()))["per_query"])
    parts = {"all": all_ids, "seen": subsets["seen"], "unseen": subsets["unseen"]}
    print(f"SciFact beir-train, {args.model}: nDCG@10 on all {len(all_ids)} / seen {len(parts['seen'])} / unseen {len(parts['unseen'])} "
          "test queries (trained settings: mean over seeds)\n")
    print("| setting | B in RAM | seeds | all | seen | unseen |")
    print("|---|---|---|---|---|---|")
    for name, entry in sorted(settings.items(), key=lambda kv: (kv[1]["ram_bytes"], -_mean(kv[1]["per_query"], all_ids))):
        values = " | ".join(f"{_mean(entry['per_query'], ids):.4f}" for ids in parts.values())
        print(f"| {name} | {entry['ram_bytes']} | {len(entry['runs'])} | {values} |")
    print("\nDIVE with each quantiser against DIVE's sign bits at the same dimension, and against the best non-DIVE setting "
          "at the same or fewer bytes (chosen on all test queries: an upper bound for the peer):\n")
    print("| DIVE setting | B | vs | Δ all (p) | Δ seen (p) | Δ unseen (p) |")
    print("|---|---|---|---|---|---|")
    for name, entry in sorted(settings.items(), key=lambda kv: kv[1]["ram_bytes"]):
        if entry["method"] != "dive" or entry["precision"] not in QUANTISERS:
            continue
        sign = settings.get(f"dive-{entry['dim']}/{'binary-rescore' if entry['precision'].endswith('rescore') else 'binary'}")
        peers = [e for e in settings.values() if e["method"] != "dive" and e["ram_bytes"] <= entry["ram_bytes"]
                 and e["precision"].endswith("rescore") == entry["precision"].endswith("rescore")]
        peer = max(peers, key=lambda e: _mean(e["per_query"], all_ids)) if peers else None
        for label, other in (("sign bits", sign), ("best peer", peer)):
            if other is None:
                continue
            cells = []
            for ids in parts.values():
                test = paired_test(np.array([entry["per_query"][q] for q in ids]), np.array([other["per_query"][q] for q in ids]))
                cells.append(f"{test.mean_difference:+.4f} ({test.p_value:.2g})")
            other_name = f"{other['method']}-{other['dim']}/{other['precision']} ({other['ram_bytes']} B)"
            print(f"| {name} | {entry['ram_bytes']} | {label}: {other_name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared/data/beir/scifact"))
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--dims", nargs="+", type=int, default=[128, 64])
    parser.add_argument("--seeds", nargs="+", type=int, default=[2027])
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    args.results = args.results or ROOT / "benchmarks/results/quantisers-on-compressed" / f"scifact-{args.model}"
    args.results.mkdir(parents=True, exist_ok=True)
    set_threads(args.threads)
    report(args) if args.report else run(args)


if __name__ == "__main__":
    main()
