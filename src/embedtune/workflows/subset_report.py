"""All, seen and unseen: the per-subset block every supervised report carries.

See :mod:`embedtune.evaluate.subsets` for the definitions. This module turns per-query scores
(averaged over seeds) into the ``subsets`` block of ``report.json`` / ``results.json``: counts,
the mean nDCG@10 and Recall@10 of each method on each subset, and the paired test of the main
method against every other one on each subset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embedtune.data.beir import load_beir
from embedtune.evaluate.subsets import SUBSETS, query_subsets, subset_means, subset_table_rows, training_positives
from embedtune.workflows.results import format_table
from embedtune.workflows.significance import align_by_query, paired_test

__all__ = ["SUBSET_DEFINITION", "subset_block", "subset_lines", "per_query_means"]

SUBSET_DEFINITION = ("seen: every positive of the query was a positive of a fitting or selection query; unseen: none was; "
                     "mixed queries count in 'all' only")


def per_query_means(per_query_runs: Sequence[Mapping[str, Mapping[str, float]]],
                    metrics: tuple[str, ...] = ("ndcg@10", "recall@10")) -> dict[str, dict[str, float]]:
    """Per-query metrics averaged over runs (seeds); the queries of the first run."""
    queries = sorted(per_query_runs[0])
    return {q: {m: float(np.mean([run[q][m] for run in per_query_runs])) for m in metrics if m in per_query_runs[0][q]}
            for q in queries}


def subset_block(
    per_query: Mapping[str, Mapping[str, Mapping[str, float]]],
    eval_qrels: Mapping[str, Mapping[str, int]],
    training_qrels: Mapping[str, Mapping[str, int]],
    main: str,
    training_label: str = "train",
) -> dict[str, Any]:
    """The ``subsets`` block: counts, per-method means per subset, paired tests of ``main`` per subset.

    Args:
        per_query: method -> query id -> metric -> value (seed means).
        eval_qrels: the judgments of the scored queries.
        training_qrels: the judgments the methods fitted and selected on (they define "seen").
        main: the method every other one is compared with.
        training_label: which labels ``training_qrels`` are, for the report.
    """
    seen_docs = training_positives(training_qrels)
    groups = query_subsets(eval_qrels, seen_docs)
    methods = {name: subset_means(scores, groups) for name, scores in per_query.items()}
    comparisons: dict[str, dict[str, Any]] = {}
    for name, scores in per_query.items():
        if name == main:
            continue
        comparisons[name] = {}
        for subset in SUBSETS:
            ids = sorted(per_query[main]) if subset == "all" else groups[subset]
            a = {q: per_query[main][q]["ndcg@10"] for q in ids if q in per_query[main]}
            b = {q: scores[q]["ndcg@10"] for q in ids if q in scores}
            x, y = align_by_query(a, b)
            comparisons[name][subset] = paired_test(x, y).to_dict() if len(x) else None
    first = next(iter(methods.values()))
    return {
        "definition": SUBSET_DEFINITION,
        "training_labels": training_label,
        "n_training_positives": len(seen_docs),
        "counts": {name: first[name]["n_queries"] for name in SUBSETS} | {"mixed": len(groups["mixed"])},
        "query_ids": {"seen": groups["seen"], "unseen": groups["unseen"]},
        "methods": methods,
        "comparisons": {name: {"against": name, **tests} for name, tests in comparisons.items()},
        "main": main,
    }


def subset_lines(block: Mapping[str, Any]) -> list[str]:
    """The printed table: nDCG@10 on all, seen and unseen queries, with the main method's Δ (p) on each."""
    counts, main = block["counts"], block["main"]
    rows = []
    for name, means in block["methods"].items():
        row: dict[str, Any] = {"method": name}
        for subset in SUBSETS:
            value = means[subset]["ndcg@10"]
            row[subset] = "n/a" if value is None else f"{value:.4f}"
            test = block["comparisons"].get(name, {}).get(subset)
            if test:
                row[f"Δ {subset}"] = f"{test['mean_difference']:+.4f} ({test['p_value']:.2g})"
        rows.append(row)
    columns = ["method"] + [c for subset in SUBSETS for c in (subset, f"Δ {subset}")]
    header = (f"nDCG@10 by subset ({block['definition']}; all {counts['all']}, seen {counts['seen']}, "
              f"unseen {counts['unseen']}, mixed {counts['mixed']} queries). Δ: {main} minus the row, paired p.")
    lines = [header, format_table(rows, columns)]
    if counts["unseen"] == 0:
        lines.append("No scored query is unseen: every test positive was a training positive, so no figure here shows "
                     "how documents training never saw are ranked.")
    return lines


def new_documents_lines(block: Mapping[str, Any]) -> list[str]:
    """The printed table of the new-documents protocol: nDCG@10 per method, the main method's Δ (p)."""
    main = block["main"]
    rows = []
    for name, means in block["methods"].items():
        test = block["comparisons"].get(name)
        rows.append({"method": name, "nDCG@10": f"{means['ndcg@10']:.4f}", "Recall@10": f"{means['recall@10']:.4f}",
                     f"Δ {main} (p)": f"{test['mean_difference']:+.4f} ({test['p_value']:.2g})" if test else None})
    header = (f"New documents: {block['n_withheld_documents']} of {block['n_documents']} documents ({block['fraction']:.0%}, "
              f"seed {block['seed']}) withheld from fitting and selection; {block['n_queries']} test queries whose positives "
              "are all withheld, searching the whole corpus:")
    return [header, format_table(rows, ["method", "nDCG@10", "Recall@10", f"Δ {main} (p)"])]


def finetune_subsets(per_query: Mapping[str, Mapping[str, float]], data: Any, train_split: str, eval_split: str,
                     label: str = "fine-tuned") -> dict[str, Any] | None:
    """The subset block of a fine-tuned model scored on ``eval_split``: seen relative to ``train_split``'s judgments.

    None when the data has no ``train_split`` qrels to be seen in (nothing was trained on its labels).
    """
    try:
        train_qrels = load_beir(data, train_split).qrels
    except (FileNotFoundError, ValueError):
        return None
    eval_qrels = load_beir(data, eval_split).qrels
    return subset_block({label: per_query}, {q: eval_qrels[q] for q in per_query if q in eval_qrels}, train_qrels, label, train_split)


def subset_table_rows_line(block: Mapping[str, Any], method: str | None = None) -> str:
    """One line for a single model: ``nDCG@10 by subset: all 0.7068 (300) · seen 0.7286 (193) · unseen 0.6699 (104)``."""
    from_method = block["methods"][method or block["main"]]
    return (f"nDCG@10 by subset ({block['definition']}): {subset_table_rows(from_method)}")
