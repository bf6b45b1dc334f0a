"""Synthetic retrieval sets with known complete relevance, for tests of training robustness.

:func:`make_false_negative_dataset` models a held-out dataset with **many judged documents per
query and incomplete judgements**, the setting in which hard negatives mined from the frozen
top ranks are mostly false negatives:

- every query has its own topic direction and ``positives_per_query`` truly relevant documents
  close to it; only a ``judged_fraction`` of them (at least one) appears in ``qrels``;
- every relevant document has ``near_duplicates_per_positive`` near-duplicates in the corpus,
  all truly relevant and none judged, so they score almost exactly like their source;
- the rest of the corpus is topical distractors (truly non-relevant, but closer to a query than
  random: the hard negatives one wants) and uniformly random background documents.

A naive miner that draws negatives from the frozen top ranks therefore picks many unjudged
relevant documents. ``true_qrels`` holds the complete truth, so a test can score a compressed
model against every relevant document, not only the judged ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

__all__ = ["FalseNegativeDataset", "make_false_negative_dataset"]


@dataclass
class FalseNegativeDataset:
    """A synthetic retrieval set; unpacks as ``(query_ids, query_emb, doc_ids, doc_emb, qrels)``.

    ``mine_triplets(*dataset)`` and ``query_ids, queries, doc_ids, docs, qrels = dataset`` both
    work; the ground truth is in the extra attributes.

    Attributes:
        query_ids: list of query ids, ``"q0000"``, ...
        query_emb: ndarray of shape (n_queries, dim), float32, L2-normalised.
        doc_ids: list of doc ids, ``"d000000"``, ... in row order (rows are shuffled, so an id
            says nothing about the document's role).
        doc_emb: ndarray of shape (n_docs, dim), float32, L2-normalised.
        qrels: the incomplete judgements, ``{query_id: {doc_id: 1}}``: judged relevant only.
        true_qrels: the complete truth, ``{query_id: {doc_id: 1}}``: every relevant document,
            judged or not (originals and their near-duplicates).
        unjudged_relevant: ``{query_id: set of doc ids}``: ``true_qrels`` minus ``qrels``, the
            false negatives a miner must avoid.
        near_duplicate_of: ``{doc_id: source doc_id}`` for every near-duplicate.
        distractors: ``{query_id: set of doc ids}``: topical but non-relevant documents.
    """

    query_ids: list[str]
    query_emb: np.ndarray
    doc_ids: list[str]
    doc_emb: np.ndarray
    qrels: dict[str, dict[str, int]]
    true_qrels: dict[str, dict[str, int]] = field(repr=False)
    unjudged_relevant: dict[str, set[str]] = field(repr=False)
    near_duplicate_of: dict[str, str] = field(repr=False)
    distractors: dict[str, set[str]] = field(repr=False)

    def __iter__(self) -> Iterator:
        return iter((self.query_ids, self.query_emb, self.doc_ids, self.doc_emb, self.qrels))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def make_false_negative_dataset(
    n_queries: int = 40,
    n_docs: int = 4000,
    dim: int = 64,
    positives_per_query: int = 20,
    near_duplicates_per_positive: int = 2,
    judged_fraction: float = 0.5,
    seed: int = 0,
    *,
    query_noise: float = 0.3,
    relevant_noise: float = 0.6,
    duplicate_noise: float = 0.05,
    distractor_noise: float = 1.2,
    distractors_per_query: int | None = None,
    n_topics: int | None = None,
    topic_spread: float = 0.5,
    query_shift: float = 0.0,
) -> FalseNegativeDataset:
    """A retrieval set with many relevant documents per query, incompletely judged.

    Geometry (all vectors L2-normalised; ``g`` a fresh standard normal vector scaled by
    ``1/sqrt(dim)``, so of norm about 1; ``t_q`` the unit topic of query ``q``):

    - query: ``t_q + query_noise·g``;
    - relevant document: ``t_q + relevant_noise·g`` (cosine to the topic about 0.86);
    - near-duplicate of a relevant document ``r``: ``r + duplicate_noise·g``;
    - topical distractor: ``t_q + distractor_noise·g`` (about 0.64: below the relevant ones);
    - background: ``g``.

    Optional structure (off by default; the defaults reproduce the original datasets exactly):

    - ``n_topics``: the query topics are no longer independent. There are ``n_topics`` unit
      centres ``c_j`` and query ``q`` gets ``t_q = unit(c_{q mod n_topics} + topic_spread·g)``,
      so queries of one topic are close to each other and a query's relevant documents are
      close to its siblings' (retrieval becomes a fine-grained, genuinely hard task);
    - ``query_shift``: every query gets a shared offset ``query_shift·o`` (``o`` one random unit
      vector) before its final normalisation, a stand-in for the query/document modality gap of
      asymmetric encoders (short queries versus long passages). Relevance is unchanged;
      queries and documents simply occupy different regions.

    Args:
        n_queries: number of queries (one topic each).
        n_docs: corpus size; must hold every relevant document and its near-duplicates.
        dim: embedding dimension.
        positives_per_query: truly relevant original documents per query.
        near_duplicates_per_positive: unjudged near-duplicates of each relevant document.
        judged_fraction: in (0, 1]: the share of each query's original relevant documents that
            is judged (rounded, at least one). Near-duplicates are never judged.
        seed: seed of the numpy generator; the same arguments give the same dataset.
        query_noise, relevant_noise, duplicate_noise, distractor_noise: see the geometry above.
        distractors_per_query: topical distractors per query; default: half of the corpus left
            after the relevant documents, spread over the queries. The rest is background.
        n_topics: None (the default: every query has its own independent topic) or the number of
            shared topic centres; query ``q`` belongs to centre ``q mod n_topics``.
        topic_spread: with ``n_topics``, how far a query's topic lies from its centre (see the
            geometry above; 0 makes the queries of a centre share one topic).
        query_shift: norm of the shared query offset (0: none).

    Returns:
        A :class:`FalseNegativeDataset` (unpacks as the five-tuple
        ``(query_ids, query_emb, doc_ids, doc_emb, qrels)``).
    """
    for name, value in (("n_queries", n_queries), ("dim", dim), ("positives_per_query", positives_per_query)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1; got {value!r}.")
    if isinstance(near_duplicates_per_positive, bool) or not isinstance(near_duplicates_per_positive, int) or near_duplicates_per_positive < 0:
        raise ValueError(f"near_duplicates_per_positive must be an integer >= 0; got {near_duplicates_per_positive!r}.")
    if n_topics is not None and (isinstance(n_topics, bool) or not isinstance(n_topics, int) or n_topics < 1):
        raise ValueError(f"n_topics must be None or an integer >= 1; got {n_topics!r}.")
    for name, value in (("topic_spread", topic_spread), ("query_shift", query_shift)):
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0; got {value!r}.")
    if not 0.0 < float(judged_fraction) <= 1.0:
        raise ValueError(f"judged_fraction must be in (0, 1]; got {judged_fraction!r}.")
    relevant_total = n_queries * positives_per_query * (1 + near_duplicates_per_positive)
    if n_docs < relevant_total:
        raise ValueError(
            f"n_docs={n_docs} cannot hold the {relevant_total} relevant documents "
            f"(n_queries·positives_per_query·(1 + near_duplicates_per_positive)); raise n_docs."
        )
    spare = n_docs - relevant_total
    if distractors_per_query is None:
        distractors_per_query = spare // 2 // n_queries
    if distractors_per_query < 0 or n_queries * distractors_per_query > spare:
        raise ValueError(f"distractors_per_query={distractors_per_query} does not fit in the {spare} documents left after the relevant ones.")

    rng = np.random.default_rng(seed)

    def noise(*shape: int) -> np.ndarray:
        return rng.standard_normal((*shape, dim)) / np.sqrt(dim)

    if n_topics is None:
        topics = _unit(rng.standard_normal((n_queries, dim)))
    else:
        centres = _unit(rng.standard_normal((n_topics, dim)))
        topics = _unit(centres[np.arange(n_queries) % n_topics] + topic_spread * noise(n_queries))
    queries = _unit(topics + query_noise * noise(n_queries))
    originals = _unit(topics[:, None, :] + relevant_noise * noise(n_queries, positives_per_query))
    duplicates = _unit(originals[:, :, None, :] + duplicate_noise * noise(n_queries, positives_per_query, near_duplicates_per_positive))
    distractor_vectors = _unit(topics[:, None, :] + distractor_noise * noise(n_queries, distractors_per_query))
    n_background = spare - n_queries * distractors_per_query
    background = _unit(rng.standard_normal((n_background, dim)))
    if query_shift > 0:
        # Its own stream, so the corpus and the judgements equal those of query_shift=0.
        queries = _unit(queries + query_shift * _unit(np.random.default_rng([seed, 1]).standard_normal(dim)))

    # Roles in generation order: ("relevant", q, p, -1), ("duplicate", q, p, j), ("distractor", q, -1, -1), ("background", ...).
    vectors = [originals.reshape(-1, dim), duplicates.reshape(-1, dim), distractor_vectors.reshape(-1, dim), background]
    roles: list[tuple[str, int, int]] = []
    roles += [("relevant", q, p) for q in range(n_queries) for p in range(positives_per_query)]
    roles += [("duplicate", q, p) for q in range(n_queries) for p in range(positives_per_query) for _ in range(near_duplicates_per_positive)]
    roles += [("distractor", q, -1) for q in range(n_queries) for _ in range(distractors_per_query)]
    roles += [("background", -1, -1)] * n_background
    stacked = np.concatenate(vectors).astype(np.float32)

    # Shuffle the corpus so that row order (and so id order) carries no role information.
    permutation = rng.permutation(n_docs)
    doc_emb = np.ascontiguousarray(stacked[permutation])
    doc_ids = [f"d{row:06d}" for row in range(n_docs)]
    id_of = np.empty(n_docs, dtype=np.int64)
    id_of[permutation] = np.arange(n_docs)  # generation index -> row

    query_ids = [f"q{q:04d}" for q in range(n_queries)]
    n_judged = max(1, int(round(judged_fraction * positives_per_query)))
    judged = [set(rng.choice(positives_per_query, size=n_judged, replace=False).tolist()) for _ in range(n_queries)]

    original_id = {}
    qrels: dict[str, dict[str, int]] = {query_id: {} for query_id in query_ids}
    true_qrels: dict[str, dict[str, int]] = {query_id: {} for query_id in query_ids}
    near_duplicate_of: dict[str, str] = {}
    distractors: dict[str, set[str]] = {query_id: set() for query_id in query_ids}
    for index, (role, q, p) in enumerate(roles):
        doc_id = doc_ids[id_of[index]]
        if role == "relevant":
            original_id[(q, p)] = doc_id
            true_qrels[query_ids[q]][doc_id] = 1
            if p in judged[q]:
                qrels[query_ids[q]][doc_id] = 1
        elif role == "duplicate":
            true_qrels[query_ids[q]][doc_id] = 1
            near_duplicate_of[doc_id] = original_id[(q, p)]
        elif role == "distractor":
            distractors[query_ids[q]].add(doc_id)
    unjudged_relevant = {query_id: set(true_qrels[query_id]) - set(qrels[query_id]) for query_id in query_ids}
    return FalseNegativeDataset(
        query_ids=query_ids,
        query_emb=queries.astype(np.float32),
        doc_ids=doc_ids,
        doc_emb=doc_emb,
        qrels=qrels,
        true_qrels=true_qrels,
        unjudged_relevant=unjudged_relevant,
        near_duplicate_of=near_duplicate_of,
        distractors=distractors,
    )
