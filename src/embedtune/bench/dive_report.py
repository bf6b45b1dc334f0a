"""Build the DIVE protocol report (Markdown + PNGs) from a results folder alone.

``embedtune report dive --results DIR`` reads ``DIR/runs/**.json`` and writes ``DIR/REPORT.md``
with every table of the protocol, the figures beside it, and ``DIR/summary.json``.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.bench.aggregate import equal_weight_average, mean_std
from embedtune.bench.beyond_report import beyond_sections
from embedtune.bench.datasets import community_parent
from embedtune.bench.grid import RunStore
from embedtune.bench.report_parts import compare_runs, group_runs, md_table, paired_runs_test, plot_curves
from embedtune.compress import available_methods
from embedtune.data.beir import load_beir
from embedtune.evaluate.subsets import query_subsets, training_positives
from embedtune.io import atomic_write_bytes, atomic_write_json
from embedtune.workflows.significance import paired_test

logger = logging.getLogger(__name__)

__all__ = ["build_report", "group_runs"]

METRICS = ("ndcg@10", "recall@10")


def _fmt(mean: float, std: float, n_seeds: int | None = None) -> str:
    """``mean ± sample std``; one seed has no sample std, so it is the mean alone."""
    if n_seeds == 1:
        return f"{mean:.4f}"
    return f"{mean:.4f} ± {std:.4f}"


# Shown in the H column rather than next to the method name.
_HEAD_SETTINGS = ("heads", "max_heads")


def settings_label(method: str, overrides: dict[str, Any]) -> str:
    """``method``, plus any non-default settings of its runs, e.g. ``smec (epoch_budget=total)``."""
    shown = {k: v for k, v in sorted(overrides.items()) if k not in _HEAD_SETTINGS}
    if not shown:
        return method
    return f"{method} ({', '.join(f'{k}={v}' for k, v in shown.items())})"


def _seed_values(runs: list[dict], metric: str) -> dict[int, float]:
    return {r["spec"]["seed"]: r["metrics"][metric] for r in runs}


def _collapse_communities(groups: dict[tuple, list[dict]]) -> dict[tuple, dict[str, Any]]:
    """Mean ± std per group; communities of one parent are first averaged with equal weight per seed."""
    parents: dict[tuple, dict[str, list[dict]]] = defaultdict(dict)
    for (backbone, dataset, dim, method, variant), runs in groups.items():
        parents[(backbone, community_parent(dataset), dim, method, variant)][dataset] = runs
    table = {}
    for key, communities in parents.items():
        row: dict[str, Any] = {"communities": len(communities) if len(communities) > 1 or "/" in next(iter(communities)) else 0}
        any_runs = next(iter(communities.values()))
        for metric in METRICS:
            per_community = {name: _seed_values(runs, metric) for name, runs in communities.items()}
            seeds = sorted(set.intersection(*(set(v) for v in per_community.values())))
            values = [equal_weight_average({name: vals[s] for name, vals in per_community.items()}) for s in seeds]
            row[metric], row[f"{metric}_std"] = mean_std(values)
            row["seeds"] = seeds
        row["fit_seconds"] = statistics.fmean(r["fit_seconds"] for runs in communities.values() for r in runs)
        row["heads"] = any_runs[0].get("heads")
        row["overrides"] = dict(any_runs[0]["spec"].get("overrides") or {})
        row["out_dim"] = any_runs[0].get("out_dim")
        table[key] = row
    return table


def _plot_bars(path: Path, title: str, data: dict[str, dict[str, tuple[float, float]]], ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(data)
    methods = [m for m in available_methods() if any(m in data[d] for d in datasets)]
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(datasets) + 2), 4))
    for i, method in enumerate(methods):
        xs = [j + i * width for j in range(len(datasets))]
        means = [data[d].get(method, (np.nan, 0))[0] for d in datasets]
        stds = [data[d].get(method, (np.nan, 0))[1] for d in datasets]
        ax.bar(xs, means, width, yerr=stds, label=method, capsize=2)
    ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(datasets))], datasets)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_report(results_dir: str | Path, n_resamples: int = 10_000) -> Path:
    """Write ``REPORT.md``, the PNGs and ``summary.json`` into ``results_dir``; return the report path."""
    root = Path(results_dir)
    records = [r for r in RunStore(root).all_records() if "metrics" in r]
    if not records:
        raise FileNotFoundError(f"{root}/runs: no finished runs to report; run `embedtune benchmark dive` first.")
    out: list[str] = [f"# DIVE protocol report\n\nBuilt from {len(records)} runs in `{root}`.\n"]
    summary: dict[str, Any] = {}

    # -- 1. Main comparison (held-out test) ------------------------------------------------
    main_groups = group_runs(records, "main")
    main = _collapse_communities(main_groups)
    out.append("## 1. Main comparison (Figures 1, 2, 6): held-out test queries, mean ± sample std over seeds\n")
    for backbone in sorted({k[0] for k in main}):
        for dim in sorted({k[2] for k in main if k[0] == backbone}):
            rows, bars_ndcg, bars_recall = [], defaultdict(dict), defaultdict(dict)
            for dataset in sorted({k[1] for k in main if k[0] == backbone and k[2] == dim}):
                for method in available_methods():
                    row = main.get((backbone, dataset, dim, method, ""))
                    if row is None:
                        continue
                    rows.append([dataset, settings_label(method, row["overrides"]), row["out_dim"], 4 * int(row["out_dim"]), row["heads"] or "", _fmt(row["ndcg@10"], row["ndcg@10_std"], len(row["seeds"])),
                                 _fmt(row["recall@10"], row["recall@10_std"], len(row["seeds"])), len(row["seeds"]), f"{row['fit_seconds']:.1f}"])
                    bars_ndcg[dataset][method] = (row["ndcg@10"], row["ndcg@10_std"])
                    bars_recall[dataset][method] = (row["recall@10"], row["recall@10_std"])
                    summary.setdefault("main", {}).setdefault(f"{backbone}/{dataset}/k{dim}", {})[method] = row
            out.append(f"### {backbone}, k = {dim}\n")
            out.append(md_table(["dataset", "method", "dim", "B/vector (float32)", "H", "nDCG@10", "Recall@10", "seeds", "fit s"], rows) + "\n")
            for metric, bars in (("ndcg", bars_ndcg), ("recall", bars_recall)):
                png = f"main_{metric}_{backbone}_k{dim}.png"
                _plot_bars(root / png, f"{backbone}, k={dim}: held-out {metric}@10", bars, f"{metric}@10")
                out.append(f"![{metric}]({png})\n")

    out += subset_section(root, main_groups, n_resamples, summary)

    # -- 2. Ablation (validation) ----------------------------------------------------------
    out.append("## 2. Ablation (Table 3): validation queries, DIVE variants\n")
    ablation_groups = group_runs(records, "ablation")
    rows = []
    for k, r in sorted(_collapse_communities(ablation_groups).items()):
        reference = (*k[:4], "dive")
        # Paired on the validation queries, per-query means over seeds; a folder of communities has no single query set.
        compared = k[4] != "dive" and k in ablation_groups and reference in ablation_groups
        delta, ci, p_value = compare_runs(ablation_groups[k], ablation_groups[reference], n_resamples) if compared else ("–", "–", "–")
        rows.append([k[0], k[1], k[2], k[4], _fmt(r["ndcg@10"], r["ndcg@10_std"], len(r["seeds"])),
                     _fmt(r["recall@10"], r["recall@10_std"], len(r["seeds"])), len(r["seeds"]), delta, ci, p_value])
    out.append("Δ, its bootstrap 95 % CI and the paired permutation p are against DIVE (the paper's recipe) in the same cell.\n")
    out.append(md_table(["backbone", "dataset", "k", "variant", "val nDCG@10", "val Recall@10", "seeds", "Δ vs DIVE", "95 % CI", "p"], rows) + "\n"
               if rows else "_no ablation runs_\n")

    # -- 3. Unsupervised comparison --------------------------------------------------------
    out.append("## 3. Unsupervised compressors (Table 4): held-out test\n")
    rows = [[k[0], k[1], k[2], k[3], _fmt(r["ndcg@10"], r["ndcg@10_std"], len(r["seeds"])), _fmt(r["recall@10"], r["recall@10_std"], len(r["seeds"]))]
            for k, r in sorted(main.items()) if k[3] in ("pca", "autoencoder", "dive")]
    out.append(md_table(["backbone", "dataset", "k", "method", "nDCG@10", "Recall@10"], rows) + "\n" if rows else "_none_\n")

    # -- 4. Learning-rate audit ------------------------------------------------------------
    out.append("## 4. Learning-rate audit (Figure 3): three candidates per supervised baseline, selected on validation\n")
    lr_val = _collapse_communities(group_runs(records, "lr_audit"))
    rows = [[k[0], k[1], k[2], k[3], k[4], _fmt(r["ndcg@10"], r["ndcg@10_std"], len(r["seeds"]))] for k, r in sorted(lr_val.items())]
    out.append(md_table(["backbone", "dataset", "k", "method", "lr", "val nDCG@10"], rows) + "\n" if rows else "_no audit runs_\n")
    rows = []
    for key, row in sorted(_collapse_communities(group_runs(records, "lr_selected")).items()):
        dive = main.get((*key[:3], "dive", ""))
        rows.append([*key[:4], key[4], _fmt(row["ndcg@10"], row["ndcg@10_std"], len(row["seeds"])), _fmt(dive["ndcg@10"], dive["ndcg@10_std"], len(dive["seeds"])) if dive else "–"])
        summary.setdefault("lr_audit", {})[f"{key[0]}/{key[1]}/k{key[2]}/{key[3]}"] = {"selected_lr": float(key[4]), **row}
    out.append("Selected learning rate, retrained on train+val, held-out test:\n\n" + (md_table(["backbone", "dataset", "k", "method", "selected lr", "test nDCG@10", "DIVE test nDCG@10"], rows) + "\n" if rows else "_phase 2 not run yet_\n"))

    # -- 5. Head count ---------------------------------------------------------------------
    out.append("## 5. Head-count sensitivity (Figure 4): validation\n")
    heads = _collapse_communities(group_runs(records, "heads"))
    rows = [[k[0], k[1], k[2], k[4], _fmt(r["ndcg@10"], r["ndcg@10_std"], len(r["seeds"])), len(r["seeds"])]
            for k, r in sorted(heads.items(), key=lambda kv: (kv[0][:3], int(kv[0][4])))]
    out.append(md_table(["backbone", "dataset", "k", "H", "val nDCG@10", "seeds"], rows) + "\n" if rows else "_none_\n")
    skipped = sorted({f"{r['spec']['backbone']} {r['spec']['dataset']} k={r['spec']['dim']} H={r['spec']['overrides'].get('heads')}"
                      for r in records if r.get("skipped")})
    if skipped:
        out.append("Infeasible (k·H > d), skipped: " + "; ".join(skipped) + "\n")

    # -- 6. Training dynamics --------------------------------------------------------------
    out.append("## 6. Training dynamics (Figure 5): ρ(t) and loss decomposition, DIVE final runs (first seed)\n")
    for backbone in sorted({k[0] for k in main_groups}):
        for dim in sorted({k[2] for k in main_groups if k[0] == backbone}):
            rho, losses, losses_dataset = {}, {}, ""
            for key, runs in sorted(main_groups.items()):
                if key[0] != backbone or key[2] != dim or key[3] != "dive":
                    continue
                history = sorted(runs, key=lambda r: r["spec"]["seed"])[0]["history"]
                if history:
                    rho[key[1]] = [h["active_ratio"] for h in history]
                    if not losses:
                        losses = {term: [h[f"weighted_{term}"] for h in history] for term in ("triplet", "view", "geometry")}
                        losses_dataset = key[1]
            if rho:
                png = f"dynamics_rho_{backbone}_k{dim}.png"
                plot_curves(root / png, f"active ratio ρ(t), {backbone}, k={dim}", rho, "ρ")
                out.append(f"![rho]({png})\n")
                png = f"dynamics_losses_{backbone}_k{dim}.png"
                plot_curves(root / png, f"weighted loss terms ({losses_dataset}), {backbone}, k={dim}", losses, "loss")
                out.append(f"![losses]({png})\n")
                marks = [1, 10, 20, 30, 40, 50]
                rows = [[d, *[f"{v[m - 1]:.3f}" if m <= len(v) else "" for m in marks]] for d, v in rho.items()]
                out.append(md_table(["dataset", *[f"ρ@{m}" for m in marks]], rows) + "\n")
                summary.setdefault("dynamics", {})[f"{backbone}/k{dim}"] = rho

    # -- 7. Significance (DIVE vs each method, per-query nDCG@10 averaged over seeds) -------
    sig_rows = []
    for key, runs in sorted(main_groups.items()):
        backbone, dataset, dim, method, _ = key
        dive = main_groups.get((backbone, dataset, dim, "dive", ""))
        if method == "dive" or not dive:
            continue
        test = paired_runs_test(dive, runs, n_resamples)
        sig_rows.append([backbone, dataset, dim, method, f"{test.mean_difference:+.4f}", f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}]", f"{test.p_value:.4f}", test.n_queries])
        summary.setdefault("significance", {})[f"{backbone}/{dataset}/k{dim}/dive-vs-{method}"] = test.to_dict()
    out.append("## 7. Significance: DIVE vs each method (paired permutation p, bootstrap 95 % CI of Δ nDCG@10, per-query means over seeds)\n")
    out.append(md_table(["backbone", "dataset", "k", "vs method", "Δ nDCG@10", "95 % CI", "p", "queries"], sig_rows) + "\n" if sig_rows else "_none_\n")

    out += beyond_sections(records, root, n_resamples, summary)

    report = root / "REPORT.md"
    atomic_write_bytes(report, "\n".join(out).encode("utf-8"))
    atomic_write_json(root / "summary.json", _jsonable(summary))
    return report


def _split_groups(root: Path, dataset: str, dataset_path: str, test_ids: list[str]) -> dict[str, list[str]] | None:
    """Seen / unseen / mixed test queries of one dataset, from its saved split (train+val define "seen"), or None."""
    manifest = root / "splits" / f"{dataset}.json"
    if not manifest.is_file() or not Path(dataset_path).exists():
        return None
    split = json.loads(manifest.read_text(encoding="utf-8"))
    qrels: dict[str, dict[str, int]] = {}
    for part in split["qrels_split"].split("+"):
        qrels.update(load_beir(dataset_path, part).qrels)
    fitted = split["query_ids"]["train"] + split["query_ids"]["val"]
    return query_subsets({q: qrels[q] for q in test_ids if q in qrels}, training_positives(qrels, fitted))


def subset_section(root: Path, main_groups: dict[tuple, list[dict]], n_resamples: int, summary: dict[str, Any]) -> list[str]:
    """§1b: the main comparison on seen and unseen test queries, with DIVE − method on unseen."""
    out = ["## 1b. Main comparison by subset: seen and unseen test queries\n",
           "Seen: every positive was a positive of a train or validation query; unseen: none was (mixed count in all only). "
           "nDCG@10, per-query means over seeds; Δ unseen: DIVE − method on the unseen queries, paired permutation p.\n"]
    cells = sorted({k[:3] for k in main_groups})
    for backbone, dataset, dim in cells:
        runs = {k[3]: v for k, v in main_groups.items() if k[:3] == (backbone, dataset, dim) and k[4] == ""}
        if "dive" not in runs:
            continue
        first = runs["dive"][0]
        groups = _split_groups(root, dataset, first["spec"].get("dataset_path", ""), sorted(first["per_query"]))
        if groups is None:
            out.append(f"_{backbone} / {dataset}: no saved split or dataset here to define seen queries._\n")
            continue
        means = {m: {q: statistics.fmean(r["per_query"][q]["ndcg@10"] for r in rs) for q in rs[0]["per_query"]} for m, rs in runs.items()}
        rows = []
        for method in [m for m in available_methods() if m in means]:
            scores = means[method]
            values = [np.mean([scores[q] for q in ids]) if ids else float("nan") for ids in (list(scores), groups["seen"], groups["unseen"])]
            delta = ""
            if method != "dive" and groups["unseen"]:
                test = paired_test(np.array([means["dive"][q] for q in groups["unseen"]]), np.array([scores[q] for q in groups["unseen"]]), n_resamples)
                delta = f"{test.mean_difference:+.4f} ({test.p_value:.2g})"
            rows.append([method, *[f"{v:.4f}" for v in values], delta])
            summary.setdefault("subsets", {}).setdefault(f"{backbone}/{dataset}/k{dim}", {})[method] = dict(zip(("all", "seen", "unseen"), values))
        out.append(f"### {backbone} / {dataset}, k = {dim} (seen {len(groups['seen'])}, unseen {len(groups['unseen'])})\n")
        out.append(md_table(["method", "all", "seen", "unseen", "Δ unseen (p)"], rows) + "\n")
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value
