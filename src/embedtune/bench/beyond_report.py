"""Report sections for the studies beyond the paper: DIVE variants, preset candidates, the best preset.

They read the same run records as :mod:`embedtune.bench.dive_report` and are appended to its
``REPORT.md`` when such runs exist:

- ``variant:<name>``: a DIVE option (e.g. ``init="pca"``) retrained on train+val and scored on
  held-out test, against faithful DIVE and PCA;
- ``candidate:<name>``: preset candidates on validation, against the paper preset, with the
  active-ratio trajectory of each;
- ``preset_best:<name>``: the validation-selected preset on held-out test, against faithful DIVE
  and every method of the main comparison.

Every comparison is a paired test on per-query nDCG@10 (each query's mean over seeds).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from embedtune.bench.dive_protocol import select_preset
from embedtune.bench.report_parts import compare_runs, group_runs, md_table, plot_curves

__all__ = ["beyond_sections"]

PAPER_CANDIDATE = "paper"


def _mean_std(runs: list[dict]) -> str:
    values = [r["metrics"]["ndcg@10"] for r in runs]
    if len(values) == 1:  # one seed has no sample std
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def _final_rho(runs: list[dict]) -> str:
    finals = [r["history"][-1]["active_ratio"] for r in runs if r.get("history")]
    return f"{statistics.fmean(finals):.3f}" if finals else "–"


def beyond_sections(records: list[dict], root: Path, n_resamples: int, summary: dict[str, Any]) -> list[str]:
    """Markdown sections (and PNGs in ``root``) for variants, preset candidates and the best preset."""
    out: list[str] = []
    main = group_runs(records, "main")

    variants = group_runs(records, "variant")
    if variants:
        out.append("## 8. DIVE variants beyond the paper: held-out test, mean ± sample std over seeds\n")
        out.append("Δ is variant − reference on per-query nDCG@10 (means over seeds); p from a paired permutation test.\n")
        rows = []
        for (backbone, dataset, dim, _, name), runs in sorted(variants.items()):
            row = [backbone, dataset, dim, name, _mean_std(runs), len(runs)]
            for reference in ("dive", "pca"):
                ref = main.get((backbone, dataset, dim, reference, ""))
                row += list(compare_runs(runs, ref, n_resamples)) if ref else ["–", "–", "–"]
                if ref:
                    summary.setdefault("variants", {})[f"{backbone}/{dataset}/k{dim}/{name}-vs-{reference}"] = row[-3:]
            rows.append(row)
        out.append(md_table(
            ["backbone", "dataset", "k", "variant", "nDCG@10", "seeds", "Δ vs DIVE", "95 % CI", "p", "Δ vs PCA", "95 % CI", "p"], rows) + "\n")

    candidates = group_runs(records, "candidate")
    if candidates:
        out.append("## 9. Preset candidates (init × objective × margin): validation queries only\n")
        out.append(f"Δ and p against the `{PAPER_CANDIDATE}` candidate (the paper's recipe); ρ is the final-epoch active ratio.\n")
        rows = []
        rho_curves: dict[tuple, dict[str, list[float]]] = defaultdict(dict)
        for (backbone, dataset, dim, _, name), runs in sorted(candidates.items()):
            paper = candidates.get((backbone, dataset, dim, "dive", PAPER_CANDIDATE))
            comparison = compare_runs(runs, paper, n_resamples) if paper and name != PAPER_CANDIDATE else ("–", "–", "–")
            rows.append([backbone, dataset, dim, name, _mean_std(runs), len(runs), *comparison, _final_rho(runs)])
            first = sorted(runs, key=lambda r: r["spec"]["seed"])[0]
            selection = [h for h in first.get("history", []) if h.get("phase") in (None, "select")]
            if selection:
                rho_curves[(backbone, dataset, dim)][name] = [h["active_ratio"] for h in selection]
        out.append(md_table(["backbone", "dataset", "k", "candidate", "val nDCG@10", "seeds", "Δ vs paper", "95 % CI", "p", "final ρ"], rows) + "\n")
        for (backbone, dataset, dim), curves in sorted(rho_curves.items()):
            png = f"candidates_rho_{backbone}_{dataset.replace('/', '__')}_k{dim}.png"
            plot_curves(root / png, f"active ratio ρ(t), {dataset}, {backbone}, k={dim} (first seed)", curves, "ρ")
            out.append(f"![rho]({png})\n")
        chosen = select_preset({str(i): r for i, r in enumerate(records)})
        if chosen is not None:
            best, scores = chosen
            ranking = sorted(scores.items(), key=lambda kv: -kv[1])
            out.append("Selection score (mean validation nDCG@10 over the cells every candidate finished): "
                       + ", ".join(f"`{n}` {s:.4f}" for n, s in ranking) + f". Selected: **`{best}`**.\n")
            summary["preset_selection"] = {"selected": best, "scores": scores}

    best_runs = group_runs(records, "preset_best")
    if best_runs:
        out.append("## 10. The validation-selected preset on held-out test\n")
        rows = []
        for (backbone, dataset, dim, _, name), runs in sorted(best_runs.items()):
            for (b, d, k, method, label), reference in sorted(main.items()):
                if (b, d, k) != (backbone, dataset, dim) or label:
                    continue
                rows.append([backbone, dataset, dim, name, _mean_std(runs), method, _mean_std(reference), *compare_runs(runs, reference, n_resamples)])
                summary.setdefault("preset_best", {})[f"{backbone}/{dataset}/k{dim}/{name}-vs-{method}"] = rows[-1][4:]
        out.append(md_table(["backbone", "dataset", "k", "preset", "nDCG@10", "vs method", "method nDCG@10", "Δ", "95 % CI", "p"], rows) + "\n")
    return out
