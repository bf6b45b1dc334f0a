"""Learning at equal bytes: does a transform fitted with labels beat the best codec on the plain vectors, on unseen queries?

Every setting stores the same bytes per vector in RAM: ``klt-apq:B`` (the score-aware transform
codec, fitted on the corpus alone) on

* the plain float32 vectors (``frozen``): no learning at all;
* PCA to k dims, both variants (``pca``, ``pca-uncentred``): the stronger one on each subset is the
  comparison, chosen after the fact, which favours PCA;
* DIVE to k dims with the labels (``dive``: the default ``robust`` preset, positive-disjoint
  selection; ``dive@pseudo-title``: the same plus one training-only pseudo-query per document, its
  title), ``--seeds`` seeds;
* DIVE to k dims without labels (``dive@unsupervised``: ``compress fit --unsupervised``).

Scored: nDCG@10 on the test queries, split into **seen** (every positive was a positive of a
training query), **unseen** (none was) and all. A learned transform counts only where it beats
both the plain codec and the stronger PCA at the same bytes on the unseen queries (paired
permutation test over queries, DIVE's per-query scores averaged over the seeds).

SciFact uses its own training queries (``beir-train``: 809 train, 300 test); the other collections
the DIVE paper's query-disjoint 60/20/20 split, where a query's positives are seldom another's, so
nearly every test query is unseen.

One JSON per (collection, k, method, seed) under ``--out`` holds the per-query scores at every
budget; finished cells are skipped. ``--report`` writes ``REPORT.md``.

Usage::

    python benchmarks/learned_equal_bytes.py                                  # scifact arguana, k = 128, B = 16 32 48, 3 seeds
    python benchmarks/learned_equal_bytes.py --datasets arguana --dims 64 --seeds 2027
    python benchmarks/learned_equal_bytes.py --report
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("EMBEDTUNE_VECTORS_PATH", str(Path(__file__).resolve().parent / "data" / "vectors"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from embedtune import __version__  # noqa: E402
from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.compress import get_compressor_class  # noqa: E402
from embedtune.compress.base import TrainingData  # noqa: E402
from embedtune.compress.dive import DIVECompressor, DIVEConfig  # noqa: E402
from embedtune.evaluate.metrics import evaluate_run  # noqa: E402
from embedtune.evaluate.search import run_from_topk  # noqa: E402
from embedtune.evaluate.subsets import query_subsets, training_positives  # noqa: E402
from embedtune.index.codecs import Precision, QuantizedIndex  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from embedtune.workflows import load_experiment  # noqa: E402
from embedtune.workflows.fit_and_score import fit_and_evaluate  # noqa: E402
from embedtune.workflows.pseudo_queries import build_pseudo_queries  # noqa: E402
from embedtune.workflows.significance import align_by_query, paired_test  # noqa: E402
from embedtune.workflows.train_compressor import resolve_preset  # noqa: E402
from embedtune.workflows.triplets import shared_triplets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "learned-equal-bytes"
DATA = {name: ROOT.parent / "shared" / "data" / "beir" / name for name in ("scifact", "arguana", "npl", "cacm", "med")}
SEEDS = (2027, 2028, 2029)
SPLIT_SEED = 2027
CODEC = "klt-apq"
BUDGETS = (16, 32, 48)
LEARNED = ("dive", "dive@pseudo-title", "dive@unsupervised")
FETCH = 101  # one extra: a document whose id is the query's is dropped, as BEIR does


def cell_path(out: Path, dataset: str, dim: int, label: str, seed: int) -> Path:
    return out / dataset / f"k{dim}" / f"{label}+seed{seed}.json"


def budget_scores(experiment, transform, test_ids: list[str], budgets: tuple[int, ...], codec: str = CODEC) -> dict[str, dict[str, float]]:
    """Per budget, per test query nDCG@10 of ``<codec>:B`` (``klt-apq``) on ``transform``'s output (fitted on the corpus)."""
    emb = experiment.embeddings
    docs = np.ascontiguousarray(transform(emb.doc_embeddings), dtype=np.float32)
    rows = [emb.query_ids.index(q) for q in test_ids]
    queries = np.ascontiguousarray(transform(emb.query_embeddings[rows]), dtype=np.float32)
    qrels = experiment.qrels_for(test_ids)
    out: dict[str, dict[str, float]] = {}
    for budget in budgets:
        index = QuantizedIndex.build(docs, Precision(f"{codec}:{budget}"), train=docs)
        D, I = index.search(queries, FETCH)
        metrics = evaluate_run(qrels, run_from_topk(test_ids, D, I, emb.doc_ids, 100, True), ("ndcg@10",))
        out[str(budget)] = {q: round(float(v["ndcg@10"]), 6) for q, v in metrics.per_query.items()}
    return out


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
    command = " ".join(["python", *sys.argv])
    for dataset in args.datasets:
        protocol = "beir-train" if dataset == "scifact" else "paper"
        experiment = load_experiment(DATA[dataset], "minilm", protocol=protocol, split_seed=SPLIT_SEED)
        test_ids = [q for q in experiment.part_ids("test") if any(r > 0 for r in experiment.dataset.qrels.get(q, {}).values())]
        mined: dict[Any, np.ndarray] = {}
        pseudo = None
        for dim in args.dims:
            todo = [("frozen", 0), ("pca", 0), ("pca-uncentred", 0)] + [(label, seed) for label in args.learned for seed in args.seeds]
            for label, seed in todo:
                path = cell_path(out, dataset, dim, label, seed)
                if path.is_file():
                    continue
                start = time.perf_counter()
                details: dict[str, Any] = {}
                if label == "frozen":
                    transform = lambda x: x  # noqa: E731
                elif label in ("pca", "pca-uncentred"):
                    cls = get_compressor_class(label)
                    compressor = cls(cls.config_class(dim=dim, seed=SPLIT_SEED)).fit_unsupervised(experiment.embeddings.doc_embeddings)
                    transform = compressor.transform
                elif label == "dive@unsupervised":
                    compressor = DIVECompressor(DIVEConfig.preset("unsupervised", dim=dim, seed=seed, progress=False, device="cpu"))
                    compressor.fit_unsupervised(TrainingData.corpus_only(experiment.embeddings.doc_embeddings, experiment.embeddings.doc_ids))
                    transform = compressor.transform
                    details = {"start": compressor.fit_details().get("start"), "selected_epoch": compressor.selected_epoch_}
                else:
                    preset = resolve_preset("dive", None)
                    if preset.mining not in mined:
                        mined[preset.mining] = shared_triplets(experiment, "train+val", preset.mining, SPLIT_SEED)
                    overrides = {**preset.settings, "progress": False}
                    extra = None
                    if label == "dive@pseudo-title":
                        if pseudo is None:
                            pseudo = build_pseudo_queries(experiment, "title", preset.mining, SPLIT_SEED)
                        overrides["pseudo_query_weight"] = 1.0
                        extra = pseudo
                    result = fit_and_evaluate(experiment, "dive", dim, seed, final=True, triplets=mined[preset.mining],
                                              overrides=overrides, pseudo_queries=extra)
                    transform = result.compressor.transform
                    details = {"selected_epoch": getattr(result.compressor, "selected_epoch_", None)}
                fit_s = time.perf_counter() - start
                record = {"dataset": dataset, "protocol": protocol, "split_seed": SPLIT_SEED, "dim": dim, "label": label, "seed": seed,
                          "codec": CODEC, "fit_s": round(fit_s, 1), **details,
                          "per_query_by_budget": budget_scores(experiment, transform, test_ids, tuple(args.budgets)),
                          "command": command, "git_commit": commit, "embedtune_version": __version__, "machine": machine_info(),
                          "seconds": round(time.perf_counter() - start, 1), "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
                atomic_write_json(path, record)
                means = {b: np.mean(list(s.values())) for b, s in record["per_query_by_budget"].items()}
                print(f"{dataset} k={dim} {label} seed {seed}: " + ", ".join(f"{b} B {m:.4f}" for b, m in means.items())
                      + f" ({record['seconds']:.0f}s)", flush=True)


def _mean(records: list[dict[str, Any]], budget: str) -> dict[str, float]:
    first = records[0]["per_query_by_budget"][budget]
    return {q: float(np.mean([r["per_query_by_budget"][budget][q] for r in records])) for q in first}


def report(out: Path) -> str:
    lines = ["# Learning at equal bytes: seen and unseen queries", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\nOne JSON")[0].strip(), ""]
    verdicts, commands, dates, machines = [], set(), [], set()
    for dataset in DATA:
        for block in sorted((out / dataset).glob("k*"), key=lambda p: int(p.name[1:])):
            records: dict[str, list[dict[str, Any]]] = {}
            for path in sorted(block.glob("*.json")):
                record = json.loads(path.read_text(encoding="utf-8"))
                records.setdefault(record["label"], []).append(record)
                commands.add(record["command"])
                dates.append(record["date"])
                machines.add(str(record["machine"].get("cpu")))
            if not {"frozen", "pca", "pca-uncentred"} <= records.keys():
                continue
            first = records["frozen"][0]
            protocol = first["protocol"]
            experiment = load_experiment(DATA[dataset], "minilm", protocol=protocol, split_seed=first["split_seed"])
            seen = training_positives(experiment.dataset.qrels, experiment.part_ids("train+val"))
            budgets = list(first["per_query_by_budget"])
            test_ids = sorted(first["per_query_by_budget"][budgets[0]])
            experiment_qrels = experiment.qrels_for(test_ids)
            groups = query_subsets(experiment_qrels, seen)
            groups["all"] = test_ids
            lines += [f"## {dataset}, k = {block.name[1:]}, {protocol} split: {len(groups['all'])} test queries "
                      f"(seen {len(groups['seen'])}, unseen {len(groups['unseen'])}, mixed {len(groups['mixed'])})", "",
                      "nDCG@10 per subset (all / seen / unseen); Δ: the learned row minus the plain codec and minus the stronger PCA "
                      "on that subset, paired p.", "",
                      "| B | setting | seeds | all | seen | unseen | Δ unseen vs plain codec (p) | Δ unseen vs stronger PCA (p) | Δ all vs plain codec (p) |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for budget in budgets:
                scores = {label: _mean(rs, budget) for label, rs in records.items()}

                def subset_mean(label: str, subset: str) -> float:
                    return float(np.mean([scores[label][q] for q in groups[subset]])) if groups[subset] else float("nan")

                def versus(label: str, other: str, subset: str) -> tuple[float, float]:
                    ids = groups[subset]
                    if not ids:
                        return float("nan"), float("nan")
                    test = paired_test(np.array([scores[label][q] for q in ids]), np.array([scores[other][q] for q in ids]))
                    return test.mean_difference, test.p_value

                stronger_unseen = max(("pca", "pca-uncentred"), key=lambda m: subset_mean(m, "unseen") if groups["unseen"] else subset_mean(m, "all"))
                for label in ["frozen", "pca", "pca-uncentred", *[l for l in LEARNED if l in records]]:
                    name = f"`{CODEC}:{budget}`" if label == "frozen" else f"{label}-{block.name[1:]} + `{CODEC}:{budget}`"
                    cells = " | ".join(f"{subset_mean(label, s):.4f}" if groups[s] else "–" for s in ("all", "seen", "unseen"))
                    extra = " | | |"
                    if label in LEARNED:
                        d1, p1 = versus(label, "frozen", "unseen")
                        d2, p2 = versus(label, stronger_unseen, "unseen")
                        d3, p3 = versus(label, "frozen", "all")
                        if groups["unseen"]:
                            extra = f" {d1:+.4f} ({p1:.3f}) | {d2:+.4f} ({p2:.3f}) ({stronger_unseen}) | {d3:+.4f} ({p3:.3f}) |"
                            verdicts.append((dataset, block.name, budget, label, d1, p1, d2, p2))
                        else:  # no unseen query: nothing to say about generalisation here
                            extra = f" – | – | {d3:+.4f} ({p3:.3f}) |"
                    lines.append(f"| {budget} | {name} | {len(records[label])} | {cells} |{extra}")
            lines.append("")
    wins = [v for v in verdicts if v[4] > 0 and v[5] < 0.05 and v[6] > 0 and v[7] < 0.05]
    losses = [v for v in verdicts if (v[4] < 0 and v[5] < 0.05) or (v[6] < 0 and v[7] < 0.05)]
    lines += ["## Verdict", "",
              "NPL, CACM and MED have 93, 52 and 30 judged queries, so the paper's split leaves 18, 11 and 6 test queries, "
              "and NPL's and CACM's share most of their relevant documents with training queries (2 and 0 unseen): they "
              "cannot show a difference, and their unsupervised cells (every query) are in "
              "[`label-free-dive/REPORT.md`](../label-free-dive/REPORT.md) and the near-limit report.", "",
              f"Of {len(verdicts)} learned cells (collection × k × B × method), {len(wins)} are significantly above both the plain "
              f"codec and the stronger PCA at the same bytes on unseen queries"
              + (": " + "; ".join(f"{d} {k} {b} B {l}" for d, k, b, l, *_ in wins) if wins else "")
              + f"; {len(losses)} are significantly below one of them"
              + (": " + "; ".join(f"{d} {k} {b} B {l}" for d, k, b, l, *_ in losses) if losses else "") + ".", "",
              f"Machine: {', '.join(sorted(machines))} (2 cores, one thread per process); cells written {min(dates, default='?')} to "
              f"{max(dates, default='?')}. Commands:", "", "```bash", *sorted(commands), "python benchmarks/learned_equal_bytes.py --report", "```", ""]
    text = "\n".join(lines)
    atomic_write_bytes(out / "REPORT.md", text.encode("utf-8"))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["scifact", "arguana"], choices=list(DATA))
    parser.add_argument("--dims", nargs="+", type=int, default=[128])
    parser.add_argument("--budgets", nargs="+", type=int, default=list(BUDGETS))
    parser.add_argument("--learned", nargs="+", default=list(LEARNED), choices=list(LEARNED))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.report:
        print(report(Path(args.out)))
        return
    torch.set_num_threads(args.threads)
    run(args)
    print(report(Path(args.out)))


if __name__ == "__main__":
    main()
