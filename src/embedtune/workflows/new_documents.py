"""Run the new-documents protocol on an :class:`Experiment` (see :mod:`embedtune.data.new_documents`).

:func:`withhold_new_documents` returns the experiment that fitting sees (the corpus without the
withheld documents; the train and validation judgments without them, and a query left with no
positive dropped) beside the full one, and :func:`score_new_documents` scores a fitted
compressor on the test queries whose positives all lie among the withheld documents, searching
the whole corpus, as a user's index does once the new documents are added.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from embedtune.compress.base import Compressor
from embedtune.data.new_documents import DEFAULT_NEW_DOCUMENTS_FRACTION, new_document_queries, withheld_documents, without_documents
from embedtune.encoders.dataset import DatasetEmbeddings
from embedtune.errors import NoQueriesError
from embedtune.evaluate.metrics import RetrievalMetrics
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.workflows.experiment import Experiment

__all__ = ["NewDocuments", "withhold_new_documents", "score_new_documents"]


@dataclass
class NewDocuments:
    """The two views of one experiment under the new-documents protocol.

    Attributes:
        full: the experiment as given (the whole corpus is searched at scoring time).
        fit: what fitting and selection see: the corpus and judgments without ``withheld``.
        withheld: the documents that "arrive after the fit".
        query_ids: the scored queries: test queries (``part``) whose positives all lie in ``withheld``.
        fraction, seed: how ``withheld`` was drawn.
    """

    full: Experiment
    fit: Experiment
    withheld: set[str]
    query_ids: list[str]
    fraction: float
    seed: int

    def describe(self) -> dict[str, object]:
        return {"fraction": self.fraction, "seed": self.seed, "n_withheld_documents": len(self.withheld),
                "n_documents": len(self.full.embeddings.doc_ids), "n_queries": len(self.query_ids),
                "rule": "sha256(f'{seed}:new-documents:{doc_id}'), the smallest round(fraction·n) withheld; scored: test "
                        "queries whose positives are all withheld, searching the whole corpus"}


def withhold_new_documents(experiment: Experiment, fraction: float = DEFAULT_NEW_DOCUMENTS_FRACTION, seed: int | None = None,
                           part: str = "test") -> NewDocuments:
    """Withhold a hashed ``fraction`` of the corpus from fitting; see the module docstring.

    Raises:
        NoQueriesError: no ``part`` query has all its positives among the withheld documents.
    """
    if experiment.split is None:
        raise ValueError("the new-documents protocol needs a query-disjoint split (load the experiment with a split seed).")
    seed = experiment.split.seed if seed is None else seed
    doc_ids = experiment.embeddings.doc_ids
    withheld = withheld_documents(doc_ids, fraction, seed)
    scored = new_document_queries(experiment.dataset.qrels, experiment.part_ids(part), withheld)
    if not scored:
        raise NoQueriesError(
            f"{experiment.dataset.name}: no {part} query has all its positives among the {len(withheld)} withheld documents "
            f"(fraction {fraction:g}, seed {seed}). Fix: raise the fraction, or use a dataset with more judged test queries.")
    keep = np.array([doc not in withheld for doc in doc_ids])
    embeddings = experiment.embeddings
    fit_embeddings = DatasetEmbeddings(
        [doc for doc, kept in zip(doc_ids, keep) if kept], np.ascontiguousarray(embeddings.doc_embeddings[keep]),
        embeddings.query_ids, embeddings.query_embeddings, dict(embeddings.timings), dict(embeddings.cache_hits), dict(embeddings.model))
    qrels = without_documents(experiment.dataset.qrels, withheld)
    split = experiment.split
    fit_split = dataclasses.replace(
        split, train=[q for q in split.train if q in qrels], val=[q for q in split.val if q in qrels],
        test=[q for q in split.test if q in qrels],
        fingerprints={**split.fingerprints, "new-documents": f"fraction={fraction:g} seed={seed} n={len(withheld)}"})
    dataset = dataclasses.replace(
        experiment.dataset, corpus={doc: text for doc, text in experiment.dataset.corpus.items() if doc not in withheld}, qrels=qrels,
        fingerprints={**experiment.dataset.fingerprints, "new-documents": f"fraction={fraction:g} seed={seed} n={len(withheld)}"})
    fit = Experiment(dataset, fit_embeddings, fit_split, experiment.similarity, dict(experiment.provenance))
    return NewDocuments(experiment, fit, withheld, scored, float(fraction), int(seed))


def score_new_documents(view: NewDocuments, compressor: Compressor) -> RetrievalMetrics:
    """nDCG@10 and the rest of ``compressor`` on the new-document queries, over the whole corpus."""
    full = view.full
    queries = compressor.transform(full.embeddings.queries(view.query_ids))
    docs = compressor.transform(np.ascontiguousarray(full.embeddings.doc_embeddings, dtype=np.float32))
    return evaluate_embeddings(view.query_ids, queries, full.embeddings.doc_ids, docs, full.qrels_for(view.query_ids),
                               similarity=full.similarity)  # type: ignore[arg-type]
