"""Build the training-only pseudo-queries of an experiment's corpus.

Each document of the fitting corpus gets one pseudo-query (its title or its first sentence, see
:mod:`embedtune.data.pseudo_queries`), encoded as a query by the experiment's model and cached
like any other encoding, with hard negatives mined by the frozen model exactly as real triplets
are. Documents withheld by the new-documents protocol are not in the fitting corpus, so they get
none.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from embedtune.compress.base import PseudoQueries
from embedtune.compress.registry import get_compressor_class
from embedtune.compress.presets import MiningOptions
from embedtune.data.pseudo_queries import PSEUDO_PREFIX, PSEUDO_QUERY_SOURCES, pseudo_query_texts
from embedtune.data.triplets import mine_triplets
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.precomputed import PRECOMPUTED_MODEL
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.errors import EmbedtuneError
from embedtune.io import sha256_json
from embedtune.workflows.experiment import Experiment

logger = logging.getLogger(__name__)

__all__ = ["TEXT_PRESET_SOURCES", "build_pseudo_queries", "pseudo_query_documents", "recipe_pseudo_queries", "selection_pseudo_queries",
           "text_preset_pseudo_queries"]

#: The pseudo-query sources a method's text preset (DIVE's ``unsupervised-guarded``) tries, in turn, until the held-out
#: documents give some: titles (or first sentences), then a text's first words (a corpus without titles or sentence
#: ends, as NPL's).
TEXT_PRESET_SOURCES = ("title", "first-words")


def build_pseudo_queries(
    experiment: Experiment,
    source: str = "title",
    mining: MiningOptions | None = None,
    seed: int = 2027,
    encoder: SentenceEncoder | None = None,
    cache: EmbeddingCache | bool = True,
    doc_ids: Sequence[str] | None = None,
    mine: bool = True,
    skip_whole_documents: bool = False,
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
        skip_whole_documents: give no pseudo-query to a document whose pseudo-query text would be
            its whole text (:func:`~embedtune.data.pseudo_queries.pseudo_query_texts`).

    Raises:
        EmbedtuneError: the experiment's vectors were precomputed, so no encoder is known, and none was given.
    """
    mining = mining if mining is not None else MiningOptions()
    if encoder is None:  # the experiment's own recipe: the same backend, length and query prompt as its queries had
        encoder = experiment.encoder_recipe("pseudo-queries").encoder()
    corpus_ids = experiment.embeddings.doc_ids
    ids, positives, texts = pseudo_query_texts(experiment.dataset.corpus, corpus_ids if doc_ids is None else list(doc_ids), source,
                                           skip_whole_documents)
    corpus_sha = experiment.dataset.fingerprints.get("corpus.jsonl", "")
    # The ids are part of the key: a withheld or sampled corpus has other pseudo-queries than the whole one.
    parts = {"model_sha256": encoder.fingerprint, "data_sha256": corpus_sha, "recipe": {**encoder.recipe("query"), "pseudo_queries": source},
             "ids_sha256": sha256_json(ids)}
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


def recipe_pseudo_queries(
    experiment: Experiment,
    method: str,
    requested: str | None,
    preset_source: str | None,
    mining: MiningOptions | None,
    seed: int,
) -> tuple[PseudoQueries | None, str | None]:
    """The pseudo-queries a fit uses, and a note when the recipe's could not be built.

    ``requested`` (the user's ``--pseudo-queries``; ``"none"`` turns them off) wins over the
    preset's ``preset_source``. An explicit request on a method without ``pseudo_query_weight``, or
    on precomputed vectors, raises; a preset's own request there is skipped with a note instead, so
    a default recipe still runs on the user's own vectors.
    """
    explicit = requested is not None
    source = None if requested == "none" else (requested if explicit else preset_source)
    if source is None:
        return None, None
    fields = {f.name for f in dataclasses.fields(get_compressor_class(method).config_class)}
    if "pseudo_query_weight" not in fields:
        if explicit:
            raise ValueError(f"pseudo-queries train DIVE only; {method!r} has no pseudo_query_weight. "
                             "Drop --pseudo-queries or use --method dive.")
        return None, None
    if experiment.provenance.get("model") in (None, PRECOMPUTED_MODEL) or not any(
            (fields_.get("title") or fields_.get("text")) for fields_ in experiment.dataset.corpus.values()):
        if explicit:
            raise EmbedtuneError("pseudo-queries are made from the documents' text and encoded by their model; these vectors "
                                 "were given without either. Drop --pseudo-queries (or pass --pseudo-queries none).")
        return None, ("the recipe's pseudo-queries need the documents' text and the model that encoded them; with given "
                      "vectors it trains on the labelled queries alone.")
    return build_pseudo_queries(experiment, source, mining, seed), None


def selection_pseudo_queries(experiment: Experiment, documents: Sequence[str] | None, source: str = "title",
                             cache: EmbeddingCache | bool = True) -> PseudoQueries:
    """The pseudo-queries an unsupervised fit reads: one per document, encoded as queries, not mined.

    Documents whose pseudo-query would be their whole text get none (it would retrieve itself
    through any map). ``documents``: the documents to make them for, e.g. the ones the fit holds out and
    selects on (:meth:`~embedtune.compress.dive.DIVECompressor.selection_documents`), with the anchors'
    training sample besides them (:meth:`~embedtune.compress.dive.DIVECompressor.training_documents`:
    DIVE's ``pseudo_query_weight`` trains on the training documents' and selects on the held-out ones');
    None: every document.

    Raises:
        EmbedtuneError: the vectors were given without the documents' text or the model that encoded them,
            or none of ``documents`` gives a pseudo-query shorter than itself.
    """
    texts = experiment.dataset.corpus.values()
    if experiment.provenance.get("model") in (None, PRECOMPUTED_MODEL) or not any((f.get("title") or f.get("text")) for f in texts):
        raise EmbedtuneError("selection_signal='pseudo-queries', training_guard='pseudo-queries' and pseudo_query_weight > 0 read "
                             "pseudo-queries made from the documents' text and encoded by their model; these vectors were given "
                             "without either. Fit from the corpus instead (--data CORPUS --model MODEL), or fit on agreement with the "
                             "frozen space alone: --set selection_signal=rank-kl (and training_guard=none, pseudo_query_weight=0).")
    pseudo = build_pseudo_queries(experiment, source, cache=cache, doc_ids=None if documents is None else list(documents), mine=False,
                                  skip_whole_documents=True)
    if not pseudo.ids:
        others = " or ".join(f"--pseudo-queries {name}" for name in PSEUDO_QUERY_SOURCES if name != source)
        which = "documents" if documents is None else f"{len(documents)} documents it reads"
        raise EmbedtuneError(f"pseudo-queries: none of the {which} has a {source} "
                             "pseudo-query shorter than the document itself (a corpus without titles or sentence ends has none), "
                             f"so there is nothing to select on. Try {others} (first-words: texts without punctuation), "
                             "or --set selection_signal=rank-kl.")
    return pseudo


def pseudo_query_documents(compressor: object, ids: Sequence[str], for_training: bool) -> tuple[list[str], list[str]]:
    """``(held-out documents, the documents to make pseudo-queries for)`` of an unsupervised fit on ``ids``, in corpus order.

    The held-out ones are those the fit selects and guards on
    (:meth:`~embedtune.compress.dive.DIVECompressor.selection_documents`); with the anchors (``for_training``) the training
    sample's are added (:meth:`~embedtune.compress.dive.DIVECompressor.training_documents`). Only these are made, so a large
    corpus costs no more than its sample.
    """
    held = compressor.selection_documents(len(ids))  # type: ignore[attr-defined]
    rows = np.union1d(held, compressor.training_documents(len(ids))) if for_training else held  # type: ignore[attr-defined]
    return [ids[row] for row in held], [ids[row] for row in rows]


def text_preset_pseudo_queries(experiment: Experiment, held_out: Sequence[str], wanted: Sequence[str], source: str | None = None,
                               cache: EmbeddingCache | bool = True) -> tuple[PseudoQueries | None, str]:
    """``(pseudo-queries of wanted, source)`` for a method's text preset, or ``(None, the sources tried)`` where no source
    gives a held-out document one; the fit then takes the method's plain unsupervised preset.

    ``source``: the user's (the only one tried); None tries :data:`TEXT_PRESET_SOURCES` in turn. Vectors given without
    their text or model give none either.
    """
    tried = [source] if source else list(TEXT_PRESET_SOURCES)
    held = set(held_out)
    for name in tried:
        try:
            made = selection_pseudo_queries(experiment, wanted, name, cache=cache)
        except EmbedtuneError:
            continue
        if any(query_id[len(PSEUDO_PREFIX):] in held for query_id in made.ids):
            return made, name
    return None, " and ".join(tried)
