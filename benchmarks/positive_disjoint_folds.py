"""Learning at equal bytes on positive-disjoint folds: every judged query is an unseen test query once.

A single query-disjoint split leaves few unseen test queries (a test query is unseen when none of
its positives is a training query's positive): 104 of SciFact's 300, 2 of NPL's 18, none of
CACM's 11. Here the judged queries are cut into ``--folds`` folds that share no positive document
(:func:`embedtune.workflows.experiment.fold_experiments`; SciFact pools its train and test qrels),
DIVE is fitted with the labels of the other folds, and each fold's queries are scored by its own
fit, so every judged query is an unseen test query of exactly one fit.

Every setting stores the same bytes per vector in RAM, ``klt-apq:B`` fitted on the corpus alone, on

* the plain float32 vectors (``frozen``): no learning;
* PCA to k dims, both variants (``pca``, ``pca-uncentred``); the stronger one per collection,
  chosen after the fact, is the comparison, which favours PCA;
* DIVE to k dims without labels (``dive@unsupervised``), one fit per seed for every fold (it sees
  no label);
* DIVE to k dims with the labels (``dive``: the default ``robust`` preset with its
  positive-disjoint epoch selection inside the training folds), one fit per fold and seed;
  ``dive@pseudo-title`` (``--learned``): the same plus one pseudo-query per document, its title
  (the corpus's own text, no label);
* ``dive@guarded`` (``--learned``): DIVE fitted on each fold's training queries without its
  validation queries, followed by ``klt-tcq-sphere``, kept per budget only where those validation
  queries (whole groups sharing no positive with the training ones) score it above the plain
  vectors + ``klt-tcq-sphere`` by the paired test ``compress plan`` gates a learned map with;
  elsewhere the plain codec: what a plan with labels would serve.

Scored: nDCG@10 per query; DIVE's per-query scores averaged over the seeds; paired sign-flip
permutation test over queries (:func:`embedtune.workflows.significance.paired_test`). The
"best label-free" comparison is, per collection and budget, the highest of the plain codec, both
PCA variants and label-free DIVE, chosen after the fact.

One JSON per cell under ``--out`` (``<dataset>/k<dim>/<label>[+fold<i>]+seed<s>.json``) holds the
per-query scores at every budget; finished cells are skipped, so a run resumes. ``--report``
writes ``REPORT.md``.

Usage::

    python benchmarks/positive_disjoint_folds.py --datasets med cacm npl scifact arguana --dims 128
    python benchmarks/positive_disjoint_folds.py --report
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from learned_equal_bytes import BUDGETS, CODEC, DATA, SEEDS, SPLIT_SEED, budget_scores  # noqa: E402  (sets the offline environment)

from embedtune import __version__  # noqa: E402
from embedtune.bench.efficiency import machine_info  # noqa: E402
from embedtune.compress import get_compressor_class  # noqa: E402
from embedtune.compress.base import TrainingData  # noqa: E402
from embedtune.compress.dive import DIVECompressor, DIVEConfig  # noqa: E402
from embedtune.evaluate.subsets import query_subsets, training_positives  # noqa: E402
from embedtune.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from embedtune.workflows import load_experiment  # noqa: E402
from embedtune.workflows.experiment import fold_experiments, training_data  # noqa: E402
from embedtune.workflows.fit_and_score import build_config, fit_and_evaluate  # noqa: E402
from embedtune.workflows.plan import LEARNED_GATE_P  # noqa: E402
from embedtune.workflows.pseudo_queries import build_pseudo_queries  # noqa: E402
from embedtune.workflows.significance import paired_test  # noqa: E402
from embedtune.workflows.train_compressor import resolve_preset  # noqa: E402
from embedtune.workflows.triplets import shared_triplets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "positive-disjoint-folds"
FOLDS = 5
LABEL_FREE = ("frozen", "pca", "pca-uncentred")
#: The trellis code on the plain vectors, and its codes ranked on the unit sphere: no FAISS index type holds them and
#: embedtune's numpy scan serves them, so both are label-free settings (the sphere one, where run, the best codec on the plain
#: vectors in the near-limit benchmark).
TRELLIS = "frozen@klt-tcq"
TRELLIS_CODEC = "klt-tcq"
TRELLIS_SPHERE = "frozen@klt-tcq-sphere"
TRELLIS_CODECS = {TRELLIS: TRELLIS_CODEC, TRELLIS_SPHERE: "klt-tcq-sphere"}
#: DIVE with the labels followed by the trellis code on the sphere (``--learned dive@klt-tcq-sphere``): the same fits as
#: ``dive`` (the same seeds and folds), another codec; compared with both PCA variants followed by the same codec.
SPHERE_LABELS = {"dive@klt-tcq-sphere": "klt-tcq-sphere", "pca@klt-tcq-sphere": "klt-tcq-sphere",
                 "pca-uncentred@klt-tcq-sphere": "klt-tcq-sphere", "dive@guarded": "klt-tcq-sphere"}
LABEL_CODECS = {**TRELLIS_CODECS, **SPHERE_LABELS}
#: ``dive@guarded``: DIVE fitted on each fold's training queries without its validation queries, then kept, at each
#: budget, only where it beats the plain vectors followed by the same codec on those validation queries by the test
#: `compress plan` gates a learned map with (:func:`embedtune.workflows.plan.gate_learned`: a higher mean and a two-sided
#: paired p below LEARNED_GATE_P); elsewhere the plain codec. What a user with labels gets from a plan that keeps
#: learning only where held-out queries whose positives it never saw show it pays.
GUARDED = "dive@guarded"
LEARNED = ("dive", "dive@pseudo-title", "dive@klt-tcq-sphere", GUARDED)


def experiment_for(dataset: str):
    protocol = "beir-train" if dataset == "scifact" else "paper"
    return protocol, load_experiment(DATA[dataset], "minilm", protocol=protocol, split_seed=SPLIT_SEED)


def judged(experiment, ids: list[str]) -> list[str]:
    return [q for q in ids if any(r > 0 for r in experiment.dataset.qrels.get(q, {}).values())]


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None
    command = " ".join(["python", *sys.argv])
    for dataset in args.datasets:
        protocol, experiment = experiment_for(dataset)
        folds = fold_experiments(experiment, args.folds, SPLIT_SEED)
        every = judged(experiment, experiment.part_ids("all"))
        for dim in args.dims:
            todo: list[tuple[str, int, int | None]] = [(label, 0, None) for label in (*LABEL_FREE, *TRELLIS_CODECS)]
            if {"dive@klt-tcq-sphere", GUARDED} & set(args.learned):  # their PCA comparisons, followed by the same codec
                todo += [("pca@klt-tcq-sphere", 0, None), ("pca-uncentred@klt-tcq-sphere", 0, None)]
            todo += [("dive@unsupervised", seed, None) for seed in args.seeds]
            todo += [(label, seed, fold) for label in args.learned for seed in args.seeds for fold in range(args.folds)]
            mined: dict[int, np.ndarray] = {}
            guard_mined: dict[int, np.ndarray] = {}
            pseudo = None
            for label, seed, fold in todo:
                name = label + (f"+fold{fold}" if fold is not None else "") + f"+seed{seed}"
                path = out / dataset / f"k{dim}" / f"{name}.json"
                if path.is_file():
                    continue
                start = time.perf_counter()
                details: dict[str, Any] = {}
                test_ids = every
                if label in ("frozen", *TRELLIS_CODECS):
                    transform = lambda x: x  # noqa: E731
                elif label.split("@")[0] in ("pca", "pca-uncentred"):
                    cls = get_compressor_class(label.split("@")[0])
                    transform = cls(cls.config_class(dim=dim, seed=SPLIT_SEED)).fit_unsupervised(experiment.embeddings.doc_embeddings).transform
                elif label == "dive@unsupervised":
                    compressor = DIVECompressor(DIVEConfig.preset("unsupervised", dim=dim, seed=seed, progress=False, device="cpu"))
                    compressor.fit_unsupervised(TrainingData.corpus_only(experiment.embeddings.doc_embeddings, experiment.embeddings.doc_ids))
                    transform = compressor.transform
                    details = {"start": compressor.fit_details().get("start"), "selected_epoch": compressor.selected_epoch_}
                elif label == GUARDED:
                    part = folds[fold]
                    test_ids = judged(part, part.part_ids("test"))
                    plain = json.loads((out / dataset / f"k{dim}" / f"{TRELLIS_SPHERE}+seed0.json").read_text(encoding="utf-8"))
                    record_extra, transform = guarded_fit(experiment, part, dim, seed, test_ids, tuple(args.budgets),
                                                          plain["per_query_by_budget"], guard_mined, fold)
                    details = {"fold": fold, "n_folds": args.folds, **record_extra}
                else:
                    part = folds[fold]
                    test_ids = judged(part, part.part_ids("test"))
                    preset = resolve_preset("dive", None)
                    if fold not in mined:
                        mined[fold] = shared_triplets(part, "train+val", preset.mining, SPLIT_SEED)
                    overrides = {**preset.settings, "progress": False}
                    if label == "dive@pseudo-title":
                        if pseudo is None:  # the corpus's titles: the same for every fold
                            pseudo = build_pseudo_queries(experiment, "title", preset.mining, SPLIT_SEED)
                        overrides["pseudo_query_weight"] = 1.0
                    result = fit_and_evaluate(part, "dive", dim, seed, final=True, triplets=mined[fold], overrides=overrides,
                                              pseudo_queries=pseudo if label == "dive@pseudo-title" else None)
                    transform = result.compressor.transform
                    seen = training_positives(part.dataset.qrels, part.part_ids("train+val"))
                    subsets = query_subsets(part.qrels_for(test_ids), seen)
                    if len(subsets["unseen"]) != len(test_ids):  # the folds' one promise
                        raise AssertionError(f"{dataset} fold {fold}: {len(test_ids) - len(subsets['unseen'])} test queries share a positive with training")
                    details = {"fold": fold, "n_folds": args.folds, "train_queries": len(part.split.train), "val_queries": len(part.split.val),
                               "selected_epoch": getattr(result.compressor, "selected_epoch_", None)}
                fit_s = time.perf_counter() - start
                scored = details.pop("per_query_by_budget", None)  # the guarded setting scores its own choice
                record = {"dataset": dataset, "protocol": protocol, "split_seed": SPLIT_SEED, "dim": dim, "label": label, "seed": seed,
                          "codec": LABEL_CODECS.get(label, CODEC), "fit_s": round(fit_s, 1), **details,
                          "per_query_by_budget": scored if scored is not None else budget_scores(
                              experiment, transform, test_ids, tuple(args.budgets), LABEL_CODECS.get(label, CODEC)),
                          "command": command, "git_commit": commit, "embedtune_version": __version__, "machine": machine_info(),
                          "seconds": round(time.perf_counter() - start, 1), "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
                atomic_write_json(path, record)
                means = {b: np.mean(list(s.values())) for b, s in record["per_query_by_budget"].items()}
                print(f"{dataset} k={dim} {name}: {len(test_ids)} queries, " + ", ".join(f"{b} B {m:.4f}" for b, m in means.items())
                      + f" ({record['seconds']:.0f}s)", flush=True)


def guarded_fit(experiment, part, dim: int, seed: int, test_ids: list[str], budgets: tuple[int, ...],
                plain: dict[str, dict[str, float]], mined: dict[int, np.ndarray], fold: int) -> tuple[dict[str, Any], Any]:
    """DIVE on the fold's training queries alone, kept per budget where its validation queries show it beats the plain codec.

    The validation queries are whole groups of training-fold queries that share no positive with
    the queries DIVE trains on (``positive_disjoint_folds``), so the guard reads queries whose
    positives the fit never saw, as the test fold's are. DIVE's own epoch selection stays inside
    its training queries. ``plain``: the plain vectors followed by ``klt-tcq-sphere``, per budget
    and query (every judged query). Returns the record's details, with ``per_query_by_budget``
    (the guarded choice on the test queries), and DIVE's transform.
    """
    codec = SPHERE_LABELS[GUARDED]
    preset = resolve_preset("dive", None)
    if fold not in mined:
        mined[fold] = shared_triplets(part, "train", preset.mining, SPLIT_SEED)
    compressor = DIVECompressor(build_config("dive", dim, seed, {**preset.settings, "progress": False}))
    compressor.fit(training_data(part, "train", mined[fold]))  # no validation set: it selects inside its training queries
    guard_ids = judged(part, part.part_ids("val"))
    learned = budget_scores(experiment, compressor.transform, guard_ids + test_ids, budgets, codec)
    chosen: dict[str, dict[str, float]] = {}
    unguarded: dict[str, dict[str, float]] = {}
    guard: dict[str, dict[str, Any]] = {}
    for budget in map(str, budgets):
        ours = np.array([learned[budget][q] for q in guard_ids])
        theirs = np.array([plain[budget][q] for q in guard_ids])
        test = paired_test(ours, theirs)
        keep = test.mean_difference > 0 and test.p_value < LEARNED_GATE_P
        guard[budget] = {"kept": "dive" if keep else "plain codec", "n_queries": len(guard_ids),
                         "mean_difference": round(test.mean_difference, 6), "p": round(test.p_value, 6)}
        unguarded[budget] = {q: learned[budget][q] for q in test_ids}
        chosen[budget] = unguarded[budget] if keep else {q: plain[budget][q] for q in test_ids}
    return ({"train_queries": len(part.split.train), "val_queries": len(part.split.val), "selected_epoch": compressor.selected_epoch_,
             "guard": guard, "unguarded_per_query_by_budget": unguarded, "per_query_by_budget": chosen}, compressor.transform)


def merged(records: list[dict[str, Any]], budget: str) -> dict[str, float]:
    """Per query, the mean over seeds; the folds of one seed are joined first (each query is in one fold)."""
    by_seed: dict[int, dict[str, float]] = {}
    for record in records:
        by_seed.setdefault(record["seed"], {}).update(record["per_query_by_budget"][budget])
    queries = set.intersection(*(set(s) for s in by_seed.values()))
    return {q: float(np.mean([s[q] for s in by_seed.values()])) for q in sorted(queries)}


class Verdict(NamedTuple):
    """One learned setting at one (collection, k, budget): its paired differences (mean, p) with each comparison."""

    dataset: str
    k: str
    budget: str
    label: str
    best_free: str
    d_pca: float
    p_pca: float
    d_free: float
    p_free: float
    d_plain: float
    p_plain: float
    detectable: float
    d_trellis: float  # NaN where the block has no trellis row
    p_trellis: float


def detectable(differences: np.ndarray) -> float:
    """The smallest mean of ``differences`` (per query) a two-sided paired test at 0.05 detects with 80 % power."""
    return float(2.80 * differences.std(ddof=1) / np.sqrt(len(differences))) if len(differences) > 1 else float("nan")


def report(out: Path) -> str:
    lines = ["# Learning at equal bytes on positive-disjoint folds", "",
             (__doc__ or "").split("\n\n", 1)[1].split("\n\nOne JSON")[0].strip(), ""]
    verdicts: list[Verdict] = []
    commands, dates, machines = set(), [], set()
    for dataset in DATA:
        for block in sorted((out / dataset).glob("k*"), key=lambda p: int(p.name[1:])):
            records: dict[str, list[dict[str, Any]]] = {}
            for path in sorted(block.glob("*.json")):
                record = json.loads(path.read_text(encoding="utf-8"))
                records.setdefault(record["label"], []).append(record)
                commands.add(record["command"])
                dates.append(record["date"])
                machines.add(str(record["machine"].get("cpu")))
            learned = [label for label in LEARNED if label in records]
            if not set(LABEL_FREE) <= records.keys() or not learned:
                continue
            n_folds = records[learned[0]][0]["n_folds"]
            seeds = {label: sorted({r["seed"] for r in records[label]}) for label in learned}
            complete = all(sum(r["seed"] == s for r in records[label]) == n_folds for label in learned for s in seeds[label])
            budgets = list(records["frozen"][0]["per_query_by_budget"])
            n_queries = len(records["frozen"][0]["per_query_by_budget"][budgets[0]])
            train_sizes = sorted({(r["fold"], r["train_queries"] + r["val_queries"]) for r in records[learned[0]]})
            lines += [f"## {dataset}, k = {block.name[1:]}: {n_queries} judged queries, all unseen, {n_folds} folds"
                      + ("" if complete else " (**incomplete**: some folds missing; the rows use the queries every setting scored, and the "
                                          "verdict leaves them out)"), "",
                      "Queries that train each fold (train + validation): " + ", ".join(f"fold {f}: {n}" for f, n in train_sizes)
                      + ". Seeds: " + "; ".join(f"{label} {', '.join(map(str, seeds[label]))}" for label in learned)
                      + "; label-free DIVE " + ", ".join(str(r["seed"]) for r in records.get("dive@unsupervised", [])) + ".", "",
                      "| B | setting | nDCG@10 | Δ − stronger PCA (p) | Δ − best label-free (p) | Δ − plain codec (p) "
                      "| Δ − trellis code (p) |",
                      "|---|---|---|---|---|---|---|"]
            for budget in budgets:
                scores = {label: merged(rs, budget) for label, rs in records.items()}
                ids = sorted(set.intersection(*(set(s) for s in scores.values())))
                mean = {label: float(np.mean([s[q] for q in ids])) for label, s in scores.items()}
                stronger = max(("pca", "pca-uncentred"), key=mean.__getitem__)
                label_free = [label for label in ("frozen", "pca", "pca-uncentred", "dive@unsupervised", *TRELLIS_CODECS,
                                                  "pca@klt-tcq-sphere", "pca-uncentred@klt-tcq-sphere") if label in mean]
                best_free = max(label_free, key=mean.__getitem__)

                def versus(label: str, other: str) -> tuple[float, float]:
                    test = paired_test(np.array([scores[label][q] for q in ids]), np.array([scores[other][q] for q in ids]))
                    # Scores are stored to 6 decimals and averaged over seeds: a smaller difference is the same setting (+0.0000).
                    return (0.0 if abs(test.mean_difference) < 1e-9 else test.mean_difference), test.p_value

                trellis = TRELLIS in mean
                for label in [*label_free, *learned]:
                    if label in TRELLIS_CODECS:
                        name = f"`{TRELLIS_CODECS[label]}:{budget}` (served by embedtune's numpy scan)"
                    elif label == GUARDED:
                        name = (f"dive-{block.name[1:]} + `{SPHERE_LABELS[label]}:{budget}` where validation queries show it beats the "
                                f"plain codec, else the plain codec")
                    elif label in SPHERE_LABELS:
                        name = f"{label.split('@')[0]}-{block.name[1:]} + `{SPHERE_LABELS[label]}:{budget}`"
                    else:
                        name = f"`{CODEC}:{budget}`" if label == "frozen" else f"{label}-{block.name[1:]} + `{CODEC}:{budget}`"
                    tags = [t for t, hit in (("stronger PCA", label == stronger), ("best label-free", label == best_free)) if hit]
                    cells = " | | | |"
                    if label in learned:
                        # DIVE followed by another codec is compared with PCA and the plain vectors followed by that codec.
                        codec = SPHERE_LABELS.get(label)
                        own_pca = [f"{v}@{codec}" for v in ("pca", "pca-uncentred") if f"{v}@{codec}" in mean] if codec else []
                        own_stronger = max(own_pca, key=mean.__getitem__) if own_pca else stronger
                        own_plain = TRELLIS_SPHERE if codec and TRELLIS_SPHERE in mean else "frozen"
                        (d_pca, p_pca), (d_free, p_free), (d_plain, p_plain) = (versus(label, own_stronger), versus(label, best_free),
                                                                                versus(label, own_plain))
                        d_tcq, p_tcq = versus(label, TRELLIS) if trellis else (float("nan"), float("nan"))
                        cells = (f" {d_pca:+.4f} ({p_pca:.3f}) | {d_free:+.4f} ({p_free:.3f}) | {d_plain:+.4f} ({p_plain:.3f}) | "
                                 + (f"{d_tcq:+.4f} ({p_tcq:.3f}) |" if trellis else "– |"))
                        if complete:  # a block missing folds scores only some queries: shown, not counted
                            verdicts.append(Verdict(dataset, block.name, budget, label, best_free, d_pca, p_pca, d_free, p_free, d_plain,
                                                    p_plain, detectable(np.array([scores[label][q] - scores[best_free][q] for q in ids])),
                                                    d_tcq, p_tcq))
                    lines.append(f"| {budget} | {name}{' (' + ', '.join(tags) + ')' if tags else ''} | {mean[label]:.4f} |{cells}")
            lines.append("")
    wins = [v for v in verdicts if v.d_pca > 0 and v.p_pca < 0.05 and v.d_free > 0 and v.p_free < 0.05]
    losses = [v for v in verdicts if (v.d_pca < 0 and v.p_pca < 0.05) or (v.d_free < 0 and v.p_free < 0.05)]
    win_sets = sorted({v[0] for v in wins})
    lines += ["## Verdict", "",
              "| collection | k | B | learned | DIVE − stronger PCA (p) | DIVE − best label-free (which) (p) | DIVE − plain codec (p) "
              "| detectable Δ | DIVE − trellis code (p) |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {d} | {k[1:]} | {b} | {lab} | {dp:+.4f} ({pp:.3f}) | {df:+.4f} ({'plain codec' if bf == 'frozen' else bf}) ({pf:.3f}) "
              f"| {dc:+.4f} ({pc:.3f}) | {mde:.4f} | " + ("–" if np.isnan(dt_) else f"{dt_:+.4f} ({pt:.3f})") + " |"
              for d, k, b, lab, bf, dp, pp, df, pf, dc, pc, mde, dt_, pt in verdicts]
    lines += ["", "\"detectable Δ\" is the smallest mean difference over the best label-free setting that a paired test at "
              "p < 0.05 finds four times in five, given how much the per-query differences of this cell vary: "
              "(z₀.₉₇₅ + z₀.₈) · sd / √n = 2.80 · sd / √n (the normal approximation)."]
    measured = [v for v in verdicts if not np.isnan(v.d_trellis)]
    above_trellis = [v for v in measured if v.d_trellis > 0 and v.p_trellis < 0.05]
    below_trellis = [v for v in measured if v.d_trellis < 0 and v.p_trellis < 0.05]
    lines += ["", f"The trellis code (`{TRELLIS_CODEC}`, on the plain vectors: the codec nearest the rate-distortion bound, served by "
              f"embedtune's numpy scan) and its codes on the sphere (`klt-tcq-sphere`, where run) are label-free settings above. Against "
              f"the plain trellis code, DIVE with labels is significantly above in "
              f"{len(above_trellis)} of {len(measured)} cells ({', '.join(sorted({v[0] for v in above_trellis})) or 'none'}) and "
              f"significantly below in {len(below_trellis)}"
              + (" (" + "; ".join(f"{d} {k} {b} B" for d, k, b, *_ in below_trellis) + ")" if below_trellis else "") + "."]
    lines += ["", f"Of {len(verdicts)} cells (collection × k × B × learned setting), {len(wins)} are significantly above (p < 0.05) both "
              f"the stronger PCA and the best label-free setting at the same bytes, in {len(win_sets)} collection(s)"
              + (f" ({', '.join(win_sets)})" if win_sets else "") + f"; {len(losses)} are significantly below one of them"
              + (": " + "; ".join(f"{d} {k} {b} B {lab}" for d, k, b, lab, *_ in losses) if losses else "") + ".", "",
              *[f"- `{label}`: {sum(v.label == label for v in wins)} of {sum(v.label == label for v in verdicts)} cells significantly above "
                f"both, in {len({v.dataset for v in wins if v.label == label})} collection(s); significantly below one of them in "
                f"{sum(v.label == label for v in losses)}." for label in LEARNED if any(v.label == label for v in verdicts)], "",
              f"Machine: {', '.join(sorted(machines))} (2 cores, one thread per process); cells written {min(dates, default='?')} to "
              f"{max(dates, default='?')}. Commands:", "", "```bash", *sorted(commands), "python benchmarks/positive_disjoint_folds.py --report", "```", ""]
    text = "\n".join(lines)
    atomic_write_bytes(out / "REPORT.md", text.encode("utf-8"))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATA), choices=list(DATA))
    parser.add_argument("--dims", nargs="+", type=int, default=[128])
    parser.add_argument("--budgets", nargs="+", type=int, default=list(BUDGETS))
    parser.add_argument("--folds", type=int, default=FOLDS)
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--learned", nargs="+", default=["dive"], choices=list(LEARNED))
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
