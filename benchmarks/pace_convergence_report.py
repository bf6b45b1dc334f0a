"""Report of the PACE convergence study: table, validation curves PNG, diagnostics, paired tests.

Usage: python benchmarks/pace_convergence_report.py [--results benchmarks/results/pace-convergence]

Reads the per-configuration JSONs written by benchmarks/pace_convergence.py and writes REPORT.md and
curves.png into the same folder. Only configurations that have finished appear.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embedtune.data.beir import load_beir
from embedtune.evaluate.subsets import query_subsets, training_positives
from embedtune.io import atomic_write_bytes
from embedtune.workflows.significance import align_by_query, paired_test

SCIFACT = Path(__file__).resolve().parents[2] / "shared/data/beir/scifact"

ORDER = ["frozen", "infonce-lora", "st-hardness", "direct-dot-full", "pace", "no-focal", "no-dot", "s2-from-final"]
# Each model is tested against these; "name@" stands for the one full run of that preset's selected setting.
# pace: the ablations and the Stage II variant against the paper's recipe; frozen: against the starting model.
ANCHORS = ["infonce-lora", "st-hardness@", "direct-dot-full", "pace", "frozen"]


def preset_of(name: str) -> str:
    """``pace@s2lr2e-5+seed2028`` -> ``pace``."""
    return name.split("+")[0].split("@")[0]


def load(folder: Path) -> dict[str, dict]:
    runs = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if "test" in record:
            runs[record["name"]] = record
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(runs.items(), key=lambda item: (rank.get(preset_of(item[0]), 99), item[0])))


def load_screens(folder: Path) -> dict[str, dict]:
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((folder / "screen").glob("*.json"))]
    return {record["name"]: record for record in records}


def screens(runs: dict[str, dict], screened: dict[str, dict], updates: int) -> str:
    """Validation nDCG@10 over the first ``updates`` updates of each setting of a screened preset, and the pick.

    A full run of a screened preset counts as a candidate too, read over the same first updates, so
    every candidate is judged on the same validation evidence.
    """
    presets = sorted({preset_of(name) for name in screened})
    lines = ["| setting | source | validation nDCG@10 by update | best within the first %d updates |" % updates, "|---|---|---|---|"]
    picks = []
    for preset in presets:
        candidates = {name: ("screen", rec["curve"]) for name, rec in screened.items() if preset_of(name) == preset}
        candidates.update({name: ("full run", run["curve"]) for name, run in runs.items() if preset_of(name) == preset and "+" not in name})
        best_of = {}
        for name, (source, curve) in sorted(candidates.items()):
            early = [row for row in curve if row["update"] <= updates]
            best_of[name] = max(row["ndcg@10"] for row in early)
            by_update = ", ".join(f"{row['update']}: {row['ndcg@10']:.4f}" for row in sorted(early, key=lambda row: row["update"]))
            lines.append(f"| {name} | {source} | {by_update} | {best_of[name]:.4f} |")
        pick = max(best_of, key=best_of.get)
        picks.append(f"Selected on validation for `{preset}`: **{pick}** ({best_of[pick]:.4f})."
                     + ("" if pick in runs else " It has no full run yet."))
    return "\n".join(lines + [""] + picks)


def pace_selection(runs: dict[str, dict]) -> str:
    """PACE's settings (the paper's and the small-scale variants) compared on validation at the last update.

    The last update is the model that is tested and shipped, so that is what the choice reads.
    """
    candidates = {name: final_validation(run) for name, run in runs.items() if preset_of(name) == "pace" and "+" not in name}
    candidates = {name: row for name, row in candidates.items() if row}
    if len(candidates) < 2:
        return "Only one PACE setting has finished."
    lines = ["| PACE setting | validation nDCG@10 at the last update | best (update) |", "|---|---|---|"]
    for name, row in sorted(candidates.items(), key=lambda item: -item[1]["ndcg@10"]):
        best = max(runs[name]["curve"], key=lambda r: r["ndcg@10"])
        lines.append(f"| {name} | {row['ndcg@10']:.4f} | {best['ndcg@10']:.4f} ({best['update']}) |")
    pick = max(candidates, key=lambda name: candidates[name]["ndcg@10"])
    return "\n".join(lines + ["", f"Selected on validation for `pace`: **{pick}** ({candidates[pick]['ndcg@10']:.4f})."])


def seed_variance(runs: dict[str, dict]) -> str:
    """Seed-to-seed differences of the configurations run with a second training seed, on the sets both scored."""
    lines = ["| configuration | seeds | dataset | nDCG@10 per seed | Δ (second − first) | 95 % CI | p | val nDCG@10 at the last update per seed |",
             "|---|---|---|---|---|---|---|---|"]
    for name in runs:
        if "+" not in name:
            continue
        first = name.split("+")[0]
        if first not in runs:
            continue
        finals = ", ".join(f"{row['ndcg@10']:.4f}" if row else "–" for row in map(final_validation, (runs[first], runs[name])))
        for dataset in scored_sets(runs[first], runs[name]):
            a, b = align_by_query(runs[name]["test"][dataset]["per_query_ndcg@10"], runs[first]["test"][dataset]["per_query_ndcg@10"])
            test = paired_test(a, b)
            lines.append(f"| {first} | {training_seed(runs[first])}, {training_seed(runs[name])} | {dataset} | "
                         f"{runs[first]['test'][dataset]['ndcg@10']:.4f}, {runs[name]['test'][dataset]['ndcg@10']:.4f} | "
                         f"{test.mean_difference:+.4f} | [{test.ci_low:+.4f}, {test.ci_high:+.4f}] | {test.p_value:.4f} | {finals} |")
    return "\n".join(lines) if len(lines) > 2 else "No configuration has a second seed yet."


def training_seed(run: dict) -> int:
    """The seed training drew from (the record's top-level ``seed`` is the split's)."""
    return run.get("config", {}).get("seed", run["seed"])


def scored_sets(*records: dict) -> list[str]:
    """The test sets every one of ``records`` scored (a second-seed run may score SciFact only)."""
    return [d for d in ("scifact", "arguana") if all(d in r["test"] for r in records)]


def final_validation(run: dict) -> dict | None:
    """The validation row of the model that was tested: the last update on the final model's path."""
    curve = run.get("curve", [])
    return max(curve, key=lambda row: (row["update"], row["stage"] == "stage2")) if curve else None


def table(runs: dict[str, dict]) -> str:
    lines = ["| configuration | ranking | SciFact nDCG@10 | SciFact R@10 | ArguAna nDCG@10 | best val nDCG@10 (update) | val at the last update | Δθ S1 | Δθ S2 | Δθ total |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        scifact, arguana = run["test"]["scifact"], run["test"].get("arguana")
        curve = run.get("curve", [])
        best = max(curve, key=lambda row: row["ndcg@10"]) if curve else None
        last = final_validation(run)
        change = run.get("weight_change", {})
        fmt = lambda key: f"{change[key]:.2e}" if key in change else "–"  # noqa: E731
        lines.append(
            f"| {name}{' ¹' if run.get('stage1_shared_from') else ''} | {run['similarity']} | {scifact['ndcg@10']:.4f} | {scifact['recall@10']:.4f} | "
            + (f"{arguana['ndcg@10']:.4f} | " if arguana else "not scored | ")
            + (f"{best['ndcg@10']:.4f} ({best['update']})" if best else "–")
            + (f" | {last['ndcg@10']:.4f} ({last['update']})" if last else " | –")
            + f" | {fmt('stage1')} | {fmt('stage2')} | {fmt('total')} |"
        )
    return "\n".join(lines)


def diagnostics(runs: dict[str, dict]) -> str:
    lines = ["| configuration | Pearson r (norm vs cosine) | mean random-pair cosine |", "|---|---|---|"]
    for name, run in runs.items():
        diag = run.get("diagnostics", {})
        r = diag.get("coupling_r")
        lines.append(f"| {name} | {'undefined' if r is None else f'{r:+.3f}'} | {diag.get('random_pair_cosine', float('nan')):.4f} |")
    return "\n".join(lines)


def significance(runs: dict[str, dict]) -> str:
    lines = ["| comparison | dataset | Δ nDCG@10 | 95 % CI | p |", "|---|---|---|---|---|"]
    done: set[frozenset[str]] = set()  # a pair of anchors is tested once, not both ways round
    for anchor_prefix in ANCHORS:
        anchors = [n for n in runs if "+" not in n and (n == anchor_prefix or (anchor_prefix.endswith("@") and n.startswith(anchor_prefix)))]
        for anchor in anchors:
            for name in runs:
                # Second-seed runs are compared with their first seed in the seed-variance table instead.
                if name == anchor or name == "frozen" or "+" in name or frozenset((name, anchor)) in done:
                    continue
                done.add(frozenset((name, anchor)))
                for dataset in scored_sets(runs[name], runs[anchor]):
                    a, b = align_by_query(runs[name]["test"][dataset]["per_query_ndcg@10"], runs[anchor]["test"][dataset]["per_query_ndcg@10"])
                    test = paired_test(a, b)
                    lines.append(f"| {name} − {anchor} | {dataset} | {test.mean_difference:+.4f} | [{test.ci_low:+.4f}, {test.ci_high:+.4f}] | {test.p_value:.4f} |")
    return "\n".join(lines)


def subsets(runs: dict[str, dict], data: Path = SCIFACT) -> str:
    """SciFact test nDCG@10 on all, seen and unseen queries, with paired tests against frozen and direct-dot-full.

    Seen and unseen are relative to every judged query of ``qrels/train.tsv``: the study fitted on
    80 % of them and selected on the other 20 %, so all of them are labels it used.
    """
    seen = training_positives(load_beir(data, "train").qrels)
    test_qrels = load_beir(data, "test").qrels
    first = next(iter(runs.values()))["test"]["scifact"]["per_query_ndcg@10"]
    groups = query_subsets({q: test_qrels[q] for q in first}, seen)
    groups["all"] = sorted(first)
    anchors = [name for name in ("frozen", "direct-dot-full") if name in runs]
    header = "| configuration | all | seen | unseen | " + " | ".join(f"Δ unseen vs {a} (p)" for a in anchors) + " |"
    lines = [f"all {len(groups['all'])}, seen {len(groups['seen'])}, unseen {len(groups['unseen'])}, mixed {len(groups['mixed'])} "
             "test queries (seen: every positive was a positive of a train-qrels query; unseen: none was). nDCG@10; recall "
             "per query was not recorded by the study.", "", header, "|---|---|---|---|" + "---|" * len(anchors)]
    for name, run in runs.items():
        scores = run["test"]["scifact"]["per_query_ndcg@10"]
        means = [sum(scores[q] for q in groups[s]) / len(groups[s]) for s in ("all", "seen", "unseen")]
        tests = []
        for anchor in anchors:
            if anchor == name:
                tests.append("")
                continue
            other = runs[anchor]["test"]["scifact"]["per_query_ndcg@10"]
            a, b = align_by_query({q: scores[q] for q in groups["unseen"]}, {q: other[q] for q in groups["unseen"]})
            test = paired_test(a, b)
            tests.append(f"{test.mean_difference:+.4f} ({test.p_value:.2g})")
        lines.append(f"| {name} | " + " | ".join(f"{m:.4f}" for m in means) + " | " + " | ".join(tests) + " |")
    return "\n".join(lines)


def figure_title(runs: dict[str, dict]) -> str:
    """Names the model the runs started from, as they recorded it (a readout label, else the model)."""
    models = sorted({run.get("readout") or run.get("model") or "model not recorded" for run in runs.values()})
    lengths = sorted({run["max_seq_length"] for run in runs.values() if run.get("max_seq_length")})
    protocols = sorted({run.get("protocol") or "80/20 train-qrels split" for run in runs.values()})
    return (f"PACE convergence study: {', '.join(models)}"
            + (f", max length {', '.join(map(str, lengths))}" if lengths else "")
            + f"\nSciFact ({', '.join(protocols)}), validation on a held-out 20 % of train queries")


def plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib  # heavy optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, run in runs.items():
        if "+" in name:  # second seeds are validated more sparsely; the seed-variance table reports them
            continue
        curve = sorted(run.get("curve", []), key=lambda row: row["update"])
        if name == "frozen" and curve:
            ax.axhline(curve[0]["ndcg@10"], color="grey", linestyle=":", label="frozen")
            continue
        stage2 = [row for row in curve if row["stage"] == "stage2"]
        stage1 = [row for row in curve if row["stage"] == "stage1"]
        line, = ax.plot([r["update"] for r in stage1], [r["ndcg@10"] for r in stage1], marker="o", markersize=3, label=name)
        if stage2:
            # Stage II continues from the Stage I checkpoint at its first update.
            start = [r for r in stage1 if r["update"] <= stage2[0]["update"]]
            xs = ([start[-1]["update"]] if start else []) + [r["update"] for r in stage2]
            ys = ([start[-1]["ndcg@10"]] if start else []) + [r["ndcg@10"] for r in stage2]
            ax.plot(xs, ys, marker="s", markersize=3, linestyle="--", color=line.get_color(), label=f"{name} (Stage II)")
    ax.set_xlabel("optimizer updates on the final model's path")
    ax.set_ylabel("validation nDCG@10 (sub-corpus)")
    ax.set_title(figure_title(runs), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="benchmarks/results/pace-convergence")
    parser.add_argument("--screen-updates", type=int, default=100, help="updates of validation that a screen and a full run are compared on")
    args = parser.parse_args()
    folder = Path(args.results)
    runs = load(folder)
    screened = load_screens(folder)
    if not runs:
        raise SystemExit(f"{folder}: no finished configuration yet.")
    plot(runs, folder / "curves.png")
    text = "\n\n".join([
        "# PACE convergence study",
        f"Built from {len(runs)} finished configuration(s) in `{folder}` by `benchmarks/pace_convergence_report.py`.",
        "## Test scores (all 300 SciFact test queries; all ArguAna queries, zero-shot)", table(runs),
        "Δθ: relative L2 change of the transformer weights, ‖θ_after − θ_before‖ / ‖θ_before‖, per stage. "
        "¹ Stage I is `pace`'s own (the same config and seed), reused from its checkpoint at the transition.",
        "## Validation curves", "![curves](curves.png)",
        "## SciFact test by subset", subsets(runs),
        "## Geometry diagnostics (SciFact train pairs)", diagnostics(runs),
        "## Paired tests (per-query nDCG@10; permutation p, bootstrap 95 % CI)", significance(runs),
        "## PACE settings chosen on validation", pace_selection(runs),
        "## Seed variance (training seed only; same split, tuples and validation pool)", seed_variance(runs),
    ] + (["## Settings chosen on validation (screens)", screens(runs, screened, args.screen_updates)] if screened else [])) + "\n"
    atomic_write_bytes(folder / "REPORT.md", text.encode("utf-8"))
    print(text)


if __name__ == "__main__":
    main()
