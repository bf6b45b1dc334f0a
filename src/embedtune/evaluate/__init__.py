"""Exact search, pytrec_eval metrics and embedding-level evaluation."""

from embedtune.evaluate.metrics import DEFAULT_METRICS, RetrievalMetrics, evaluate_run
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.evaluate.search import exact_search, search_ids

__all__ = ["DEFAULT_METRICS", "RetrievalMetrics", "evaluate_embeddings", "evaluate_run", "exact_search", "search_ids"]
