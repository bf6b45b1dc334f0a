"""Build the training-only pseudo-queries of an experiment's corpus (issue 27 §5).

Each document of the fitting corpus gets one pseudo-query (its title or its first sentence, see
:mod:`embedtune.data.pseudo_queries`), encoded as a query by the experiment's model and cached
like any other encoding, with hard negatives mined by the frozen model exactly as real triplets
are. Documents withheld by the new-documents protocol are not in the fitting corpus, so they get
none.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from embedtune.compress.base import PseudoQueries
from embedtune.compress.presets import MiningOptions
from embedtune.data.pseudo_queries import pseudo_query_texts
from embedtune.data.triplets import mine_triplets
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.precomputed import PRECOMPUTED_MODEL
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.errors import EmbedtuneError
from embedtune.io import sha256_json
from embedtune.workflows.experiment import Experiment

logger = logging.getLogger(__name__)

__all__ = ["build_pseudo_queries"]


def build_pseudo_queries(
    experiment: Experiment,
    source: str = "title",
    mining: MiningOptions | None = None,
    seed: int = 2027,
    encoder: SentenceEncoder | None = None,
    cache: EmbeddingCache | bool = True,
    doc_ids: Sequence[str] | None = None,
    mine: bool = True,
) -> PseudoQueries:
    """One pseudo-query per document of ``experiment``'s corpus, encoded, with mined triplets.

    Args:
        experiment: the fitting experiment (after any new-documents withholding).
        source: ``title`` or ``first-sentence``.
        mining: how negatives are mined (default: the paper's top-50 hard negatives).
        seed: the mining seed.
        encoder: the query encoder; default: the experiment's model with its similarity's normalisation.
        cache: an :class:`EmbeddingCache`, True for the default one, False for none.
        doc_ids: only these documents get a pseudo-query (default: every document), e.g. the
            documents a label-free plan holds out to validate on (:mod:`embedtune.workflows.label_free`).
        mine: mine hard negatives (training); False gives no triplets (validation reads only the
            pseudo-queries and their own documents).

    Raises:
        EmbedtuneError: the experiment's vectors were precomputed, so no encoder is known, and none was given.
    """
    mining = mining if mining is not None else MiningOptions()
    model = experiment.provenance.get("model")
    if encoder is None:
        if model in (None, PRECOMPUTED_MODEL):
            raise EmbedtuneError("pseudo-queries are encoded by the model that made the vectors, but these vectors were precomputed; "
                                 "pass --model (or an encoder) or leave pseudo-queries off.")
        encoder = SentenceEncoder(str(model), normalize=experiment.similarity != "dot", show_progress=False)
    corpus_ids = experiment.embeddings.doc_ids
    ids, positives, texts = pseudo_query_texts(experiment.dataset.corpus, corpus_ids if doc_ids is None else list(doc_ids), source)
    corpus_sha = experiment.dataset.fingerprints.get("corpus.jsonl", "")
    parts = {"model_sha256": encoder.fingerprint, "data_sha256": corpus_sha, "recipe": {**encoder.recipe("query"), "pseudo_queries": source}}
    if doc_ids is not None:  # a subset is an entry of its own: it must not replace the whole corpus's
        parts["documents_sha256"] = sha256_json(list(doc_ids))
    if cache is True:
        cache = EmbeddingCache()
    if cache:
        vectors, _ = cache.get_or_compute(parts, ids, lambda lo, hi: encoder.encode(texts[lo:hi], "query"))
    else:
        vectors = encoder.encode(texts, "query")
    if not mine:
        logger.info("pseudo-queries (%s): %d of %d documents, not mined", source, len(ids), len(corpus_ids))
        return PseudoQueries(ids, vectors, np.zeros((0, 3), dtype=np.int64), source)
    qrels = {query_id: {doc_id: 1} for query_id, doc_id in zip(ids, positives)}
    triplets = mine_triplets(ids, vectors, corpus_ids, np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32), qrels,
                             n_negatives=mining.n_negatives, negatives=mining.negatives,  # type: ignore[arg-type]
                             seed=seed, **mining.filter_options())
    logger.info("pseudo-queries (%s): %d of %d documents, %d triplets", source, len(ids), len(corpus_ids), len(triplets))
    return PseudoQueries(ids, vectors, triplets, source)
