"""Retrieval metrics through pytrec_eval, as BEIR and both papers compute them.

Per-query values are kept because paired significance tests need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RetrievalMetrics", "evaluate_run", "DEFAULT_METRICS", "mteb_retrieval_metrics"]

# Our name -> pytrec_eval measure. MRR@10 is pytrec_eval's "recip_rank" over a run cut at 10.
DEFAULT_METRICS = ("ndcg@10", "recall@10", "recall@100", "p@1", "mrr@10")
_TREC_MEASURES = {
    "ndcg": ("ndcg_cut", "ndcg_cut_{k}"),
    "map": ("map_cut", "map_cut_{k}"),
    "recall": ("recall", "recall_{k}"),
    "p": ("P", "P_{k}"),
}
# The cutoffs MTEB reports for a retrieval task (nDCG, MAP, recall, precision and MRR at each).
MTEB_CUTOFFS = (1, 3, 5, 10, 20, 100, 1000)


def mteb_retrieval_metrics(top_k: int = 1000) -> tuple[str, ...]:
    """The metrics MTEB writes for a retrieval task, at the cutoffs a top-``top_k`` run can score, plus the defaults."""
    names = [f"{base}@{k}" for base in ("ndcg", "map", "recall", "p", "mrr") for k in MTEB_CUTOFFS if k <= top_k]
    return tuple(dict.fromkeys([*DEFAULT_METRICS, *names]))


@dataclass
class RetrievalMetrics:
    """Mean metrics over the evaluated queries, plus every per-query value."""

    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]] = field(repr=False)

    @property
    def n_queries(self) -> int:
        return len(self.per_query)

    def __getitem__(self, name: str) -> float:
        return self.aggregate[name]

    def vector(self, name: str, query_ids: list[str] | None = None) -> np.ndarray:
        """Per-query values of one metric in a fixed query order (for paired tests)."""
        ids = sorted(self.per_query) if query_ids is None else query_ids
        return np.array([self.per_query[qid][name] for qid in ids], dtype=np.float64)

    def to_dict(self) -> dict[str, float | int]:
        return {**self.aggregate, "n_queries": self.n_queries}


def _parse(name: str) -> tuple[str, int]:
    base, _, cutoff = name.lower().partition("@")
    if not cutoff.isdigit() or base not in {"ndcg", "map", "recall", "p", "mrr"}:
        raise ValueError(f"unknown metric {name!r}; use ndcg@k, map@k, recall@k, p@k or mrr@k.")
    return base, int(cutoff)


def evaluate_run(
    qrels: dict[str, dict[str, int]],
    run: dict[str, dict[str, float]],
    metrics: tuple[str, ...] = DEFAULT_METRICS,
) -> RetrievalMetrics:
    """Score ``run`` against ``qrels``; queries without judgments are skipped, as in BEIR.

    A judged query with no retrieved documents scores zero (it is still counted).
    """
    import pytrec_eval

    judged = {qid: {did: int(rel) for did, rel in docs.items()} for qid, docs in qrels.items() if docs}
    run = {qid: run.get(qid, {}) for qid in judged}
    parsed = {name: _parse(name) for name in metrics}
    measures = {_TREC_MEASURES[b][0] + "." + ",".join(str(k) for (bb, k) in parsed.values() if bb == b) for b, _ in parsed.values() if b != "mrr"}
    per_query = {qid: {} for qid in judged}
    if measures:
        # pytrec_eval drops queries whose run is empty; give them a sentinel doc scoring nothing.
        padded = {qid: (docs if docs else {"__embedtune_empty__": 0.0}) for qid, docs in run.items()}
        results = pytrec_eval.RelevanceEvaluator(judged, measures).evaluate(padded)
        for name, (base, cutoff) in parsed.items():
            if base == "mrr":
                continue
            key = _TREC_MEASURES[base][1].format(k=cutoff)
            for qid in judged:
                per_query[qid][name] = float(results[qid][key])
    for name, (base, cutoff) in parsed.items():
        if base != "mrr":
            continue
        for qid, judgments in judged.items():
            ranked = sorted(run[qid].items(), key=lambda item: (-item[1], item[0]))[:cutoff]
            per_query[qid][name] = next(
                (1.0 / rank for rank, (did, _) in enumerate(ranked, 1) if judgments.get(did, 0) > 0), 0.0
            )
    aggregate = {name: float(np.mean([per_query[qid][name] for qid in judged])) if judged else 0.0 for name in metrics}
    return RetrievalMetrics(aggregate=aggregate, per_query=per_query)
