"""Label-free planning: choose a compressed setting with no relevance labels.

``compress plan --label-free OBJECTIVE`` sweeps what needs no labels (the unsupervised
compressors of :data:`LABEL_FREE_METHODS`, uncentred PCA among them, at every precision, and the
FAISS peers on the uncompressed vectors) and scores each setting on one of two label-free
objectives (each a :class:`LabelFreeObjective`: what differs from a labelled plan in the one sweep
engine both run, :func:`embedtune.workflows.plan.run_sweep`):

- ``agreement``: recall@10 of the uncompressed float32 model's exact top-10, the measure FAISS
  users tune by. The queries are held-out corpus documents (a query document's own row is never
  among its results) or, when given, the user's unlabelled queries. It cannot prefer a setting
  that retrieves *better* than the uncompressed model: its ceiling is 1.0, reached by the
  uncompressed vectors.
- ``pseudo-queries``: nDCG@10 of pseudo-queries made from the held-out documents' own text (a
  title or a first sentence, :mod:`embedtune.data.pseudo_queries`), each document its own
  pseudo-query's positive. It can prefer a setting that ranks better than the uncompressed
  model (e.g. centred PCA, which agreement never rewards for that).

The held-out documents are a hashed, seeded sample of the corpus (:func:`held_out_documents`, the
new-documents protocol's hash): the compressors are fitted on the other documents only, so a
validation query was never a training point; the index still holds every document, as deployed.
The choice is then refitted on every document. Nothing here reads ``qrels``: the sweep and the
choice are the same on an experiment whose labels are removed (``--final`` alone scores the
choice on the labelled test queries, afterwards).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from embedtune import __version__
from embedtune.compress import Compressor, TrainingData, get_compressor_class, load_compressor
from embedtune.compress.base import PseudoQueries
from embedtune.data.new_documents import withheld_documents
from embedtune.data.pseudo_queries import PSEUDO_PREFIX, PSEUDO_QUERY_SOURCES
from embedtune.data.query_files import read_query_file
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.precomputed import load_embeddings
from embedtune.encoders.ray_encode import is_shard_folder
from embedtune.encoders.recipe import recipe_beside
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.errors import EmbedtuneError
from embedtune.evaluate.search import unit_rows
from embedtune.evaluate.streamed_top_k import exact_top_k
from embedtune.index.bill import DEFAULT_PRICE_PER_GB_MONTH
from embedtune.index.codecs import PRECISIONS
from embedtune.index.refine import DEFAULT_REFINE_CANDIDATES
from embedtune.index.fit_sample import fit_sample_record, fit_sample_rows, fit_sample_size
from embedtune.io import read_json_verified, release_mapped_pages, sha256_file, sha256_json, write_json_with_digest
from embedtune.workflows.experiment import Experiment, load_corpus_experiment
from embedtune.workflows.fit_and_score import build_config
from embedtune.workflows.full_corpus_check import full_corpus_agreement
from embedtune.workflows.plan import (
    PLAN_FILE,
    CODEC_BUDGETS,
    DEFAULT_CODECS,
    DEFAULT_PEERS,
    LEARNED_GATE_P,
    SEARCHED_CODECS,
    Candidate,
    PlanObjective,
    QuerySet,
    default_sweep_dir,
    faiss_cache_dir,
    method_settings,
    run_sweep,
    score_plan,
    vectors_sha256,
)
from embedtune.workflows.pseudo_queries import build_pseudo_queries, pseudo_query_documents, text_preset_pseudo_queries

logger = logging.getLogger(__name__)

__all__ = [
    "LABEL_FREE_OBJECTIVES",
    "LABEL_FREE_METHODS",
    "AGREEMENT_K",
    "held_out_documents",
    "exact_top_k",
    "agreement_queries",
    "pseudo_query_validation",
    "fit_label_free",
    "load_corpus_experiment",
    "check_label_free_method",
    "encode_unlabelled_queries",
    "label_free_validation",
    "LabelFreeValidation",
    "LabelFreeObjective",
    "run_label_free_plan",
    "plan_sample",
]

#: The label-free objectives: rank agreement with the uncompressed model, or pseudo-queries from the documents' own text.
LABEL_FREE_OBJECTIVES = ("agreement", "pseudo-queries")
#: The compressors a label-free sweep fits by default: they read corpus vectors only. Uncentred PCA must be
#: among them: on held-out data it was the setting validation preferred at 16 B. DIVE, the slow one (minutes a fit),
#: fits its ``unsupervised-guarded`` preset where the corpus's text gives pseudo-queries (neighbour-rank distillation
#: with them as anchors, kept only where the held-out documents' pseudo-queries show it beats its PCA start), else its
#: ``unsupervised`` one (the distillation alone: vectors given without their text).
LABEL_FREE_METHODS = ("truncate", "pca", "pca-uncentred", "dive")
#: Label-free methods that fit no projection on the corpus, so any dimension up to the input's works.
CORPUS_FREE_METHODS = ("truncate",)
#: Every precision the codecs have: the label-free sweep puts each on every compressor's output.
LABEL_FREE_PRECISIONS = PRECISIONS
#: The agreement objective's k: recall@10 of the exact float32 top-10.
AGREEMENT_K = 10
#: Held-out documents: this share of the corpus, at most :data:`MAX_HELD_OUT_DOCUMENTS` (enough for a stable mean,
#: few enough that scoring every setting stays cheap on a large corpus).
DEFAULT_HELD_OUT_FRACTION = 0.1
MAX_HELD_OUT_DOCUMENTS = 1000
#: Fewer validation queries than this and the plan refuses: one query's noise would choose.
MIN_VALIDATION_QUERIES = 10
_FIT_KEY = "key.json"


def held_out_documents(doc_ids: Sequence[str], fraction: float = DEFAULT_HELD_OUT_FRACTION, max_documents: int = MAX_HELD_OUT_DOCUMENTS,
                       seed: int = 2027) -> list[str]:
    """The documents withheld from fitting to validate on, in corpus order: a hashed share (``fraction``, at most ``max_documents``).

    The hash is the new-documents protocol's (:func:`embedtune.data.new_documents.withheld_documents`), so
    the sample depends on the ids and the seed only.
    """
    if max_documents < 1:
        raise ValueError(f"max_documents must be at least 1; got {max_documents}.")
    ids = list(doc_ids)
    if not ids:
        return []
    share = min(float(fraction), max_documents / len(ids))
    withheld = withheld_documents(ids, share, seed)
    return [doc_id for doc_id in ids if doc_id in withheld]


def agreement_queries(doc_ids: Sequence[str], doc_embeddings: np.ndarray, query_ids: Sequence[str], query_embeddings: np.ndarray,
                      documents: bool, k: int = AGREEMENT_K, part: str | None = None) -> QuerySet:
    """Queries judged by the uncompressed model: each query's exact float32 top-``k`` are its ``k`` relevant documents.

    Scored by :func:`~embedtune.workflows.plan.score_precisions`, a setting's ``recall@10`` is then its
    agreement: the share of the uncompressed top-10 it finds in its own top-10. ``documents``: the
    queries are corpus documents (``query_ids`` are their doc ids), so each one's own row is excluded
    from its targets and from its results.
    """
    doc_ids = list(doc_ids)
    query_ids = list(query_ids)
    exclude = None
    if documents:
        position = {doc_id: row for row, doc_id in enumerate(doc_ids)}
        missing = [qid for qid in query_ids if qid not in position]
        if missing:
            raise ValueError(f"{len(missing)} held-out document ids are not in the corpus, e.g. {missing[0]!r}.")
        exclude = np.array([position[qid] for qid in query_ids], dtype=np.int64)
    top = exact_top_k(query_embeddings, doc_embeddings, k, exclude)
    targets = {qid: {doc_ids[row]: 1 for row in rows} for qid, rows in zip(query_ids, top)}
    name = part or ("held-out documents" if documents else "unlabelled queries")
    return QuerySet(query_ids, np.ascontiguousarray(query_embeddings, dtype=np.float32), targets, name, ignore_identical_ids=documents)


def pseudo_query_validation(experiment: Experiment, doc_ids: Sequence[str], source: str = "title", encoder: SentenceEncoder | None = None,
                            cache: bool = True) -> QuerySet:
    """The pseudo-queries of ``doc_ids`` (a title or a first sentence each), encoded by the experiment's model, each judged by its own document.

    Encoded by :func:`embedtune.workflows.pseudo_queries.build_pseudo_queries` (cached); no
    negatives are mined. Documents whose text gives no pseudo-query (too short) are skipped.
    """
    pseudo = build_pseudo_queries(experiment, source, encoder=encoder, cache=cache, doc_ids=list(doc_ids), mine=False)
    judgments = {qid: {qid[len(PSEUDO_PREFIX):]: 1} for qid in pseudo.ids}
    return QuerySet(list(pseudo.ids), pseudo.embeddings, judgments, f"held-out pseudo-queries ({source})")


def encode_unlabelled_queries(experiment: Experiment, path: str | Path, encoder: SentenceEncoder | None = None,
                              cache: bool = True) -> tuple[list[str], np.ndarray]:
    """``(ids, vectors)`` of a query file (JSONL or TSV, :func:`~embedtune.data.query_files.read_query_file`), no labels,
    encoded as queries by the experiment's model (cached, keyed by the file's sha256).

    Raises:
        EmbedtuneError: the experiment's vectors were precomputed and no encoder is given.
    """
    if is_shard_folder(path):  # queries encoded already, by `embed-corpus --kind query`: read, never encode again
        return _query_vectors_folder(experiment, Path(path))
    queries = read_query_file(path)
    if encoder is None:  # the recipe of the documents: backend, length and query prompt as they were encoded
        encoder = experiment.encoder_recipe("unlabelled queries").encoder()
    ids, texts = [qid for qid, _ in queries], [text for _, text in queries]
    parts = {"model_sha256": encoder.fingerprint, "data_sha256": sha256_file(path), "recipe": {**encoder.recipe("query"), "unlabelled": True}}
    if cache:
        vectors, _ = EmbeddingCache().get_or_compute(parts, ids, lambda lo, hi: encoder.encode(texts[lo:hi], "query"))
    else:
        vectors = encoder.encode(texts, "query")
    return ids, np.ascontiguousarray(vectors, dtype=np.float32)


def _query_vectors_folder(experiment: Experiment, folder: Path) -> tuple[list[str], np.ndarray]:
    """The vectors of an ``embed-corpus --kind query`` folder, checked against the documents' recipe."""
    made_by = recipe_beside(folder)
    described = experiment.embeddings.model or {}
    if made_by is not None and (described.get("model") or described.get("name")):
        documents = experiment.encoder_recipe("unlabelled queries")
        # Prompts differ by design (a query prompt, a document prompt); the rest must agree.
        documents.check_same(replace(made_by, query_prompt=documents.query_prompt, document_prompt=documents.document_prompt),
                             here="the documents' vectors", there=str(folder))
    ids, vectors = load_embeddings(folder, unique=True)
    vectors = unit_rows(vectors) if experiment.similarity != "dot" else np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.shape[1] != experiment.embeddings.doc_embeddings.shape[1]:
        raise EmbedtuneError(f"{folder}: the query vectors are {vectors.shape[1]}-d but the documents' are "
                             f"{experiment.embeddings.doc_embeddings.shape[1]}-d; encode both with the same model.")
    return list(ids), vectors


# -- fitting without labels ------------------------------------------------------------------
def _fit_settings(candidate: Candidate, input_dim: int, preset: str | None = None) -> dict[str, Any]:
    """The config values a label-free fit uses: a supervised method's ``preset`` (by default its own ``unsupervised``
    one), its wide-output settings, the variant."""
    cls = get_compressor_class(candidate.method)
    settings: dict[str, Any] = {}
    preset = preset or (cls.unsupervised_preset if cls.supervised else None)
    if preset is not None:
        settings.update(cls.get_preset(preset).settings)
    settings.update(method_settings(candidate.method, candidate.dim, input_dim))
    settings.update(dict(candidate.settings))
    return settings


def _text_preset_fit(candidate: Candidate, doc_ids: Sequence[str], input_dim: int, seed: int, text: Experiment | None,
                     cache: EmbeddingCache | bool, source: str | None = None) -> tuple[Any, PseudoQueries | None, str | None]:
    """``(config, pseudo-queries, preset)``: a method's text preset and the pseudo-queries it reads where ``text`` (the
    corpus the vectors were encoded from, and their model) gives some, as ``compress fit`` does; else the plain config.
    ``source``: the pseudo-queries' source (the only one tried); None tries the preset's sources in turn."""
    cls = get_compressor_class(candidate.method)
    preset = cls.unsupervised_text_preset if cls.supervised else None
    if text is not None and preset is not None:
        config = build_config(candidate.method, candidate.dim, seed, _fit_settings(candidate, input_dim, preset))
        probe = cls(config)
        held_out, wanted = pseudo_query_documents(probe, list(doc_ids), getattr(config, "pseudo_query_weight", 0) > 0)
        made, _ = text_preset_pseudo_queries(text, held_out, wanted, source, cache)
        if made is not None:
            return config, made, preset
        logger.info("label-free fit of %s: no pseudo-query from the documents' text (none shorter than its document, or "
                    "vectors given without their text or model), so it fits the %r preset", candidate.name, cls.unsupervised_preset)
    return build_config(candidate.method, candidate.dim, seed, _fit_settings(candidate, input_dim)), None, None


def check_label_free_method(method: str) -> None:
    """Raise unless ``method`` can fit on corpus vectors alone (an unknown name raises too)."""
    cls = get_compressor_class(method)
    if not cls.supports_unsupervised:
        raise ValueError(f"{method} needs relevance labels (training triplets), so a label-free plan cannot fit it; "
                         f"choose among unsupervised compressors, e.g. {', '.join(LABEL_FREE_METHODS)}.")


def fit_label_free(candidate: Candidate, doc_ids: Sequence[str], doc_embeddings: np.ndarray, seed: int = 2027,
                   work: str | Path | None = None, part: str = "fit", vectors_digest: str | None = None,
                   text: Experiment | None = None, cache: EmbeddingCache | bool = True,
                   pseudo_query_source: str | None = None) -> tuple[Compressor, float]:
    """Fit ``candidate`` on corpus vectors alone (no queries, no labels); ``(compressor, fit seconds)``.

    A supervised method fits its ``unsupervised`` preset (DIVE: neighbour-rank distillation). Given
    ``text``, the experiment the vectors were encoded from (its corpus's text and model), it fits
    its text preset instead where it declares one, as ``compress fit`` does from a corpus (DIVE:
    ``unsupervised-guarded``, with pseudo-queries made from ``doc_ids``' text: anchors for the
    training sample, a guard on the held-out ones), and the plain preset where the text gives no
    pseudo-query. With ``work`` the fit is kept at ``WORK/label-free/<part>/<candidate>/s<seed>/``
    with ``key.json`` (the sha256 of the documents' ids and vectors, the settings, the seed, the
    pseudo-queries read), and reloaded only when that key matches and the compressor is intact.
    ``vectors_digest`` is :func:`vectors_sha256` of ``doc_embeddings`` when the caller already has
    it: a sweep fits many candidates on one corpus and need not hash it once per candidate.
    ``pseudo_query_source`` (``title``, ``first-sentence`` or ``first-words``) is the only source the
    text preset's pseudo-queries are made from; None tries its sources in turn.
    """
    check_label_free_method(candidate.method)
    docs = np.ascontiguousarray(doc_embeddings, dtype=np.float32)
    config, pseudo, preset = _text_preset_fit(candidate, doc_ids, docs.shape[1], seed, text, cache, pseudo_query_source)
    folder = key = None
    if work is not None:
        folder = Path(work) / "label-free" / part / candidate.name / f"s{seed}"
        # The whole resolved config, defaults included: a fit made under another default (e.g. a smaller training
        # sample) is not the fit this call would make.
        key = {"documents": sha256_json(list(doc_ids)), "vectors": _array_sha(docs, vectors_digest), "method": candidate.method, "dim": candidate.dim,
               "variant": candidate.variant, "config": json.loads(json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)),
               "seed": seed, "embedtune_version": __version__}
        if pseudo is not None:
            key["pseudo_queries"] = {"preset": preset, "source": pseudo.source, "ids": sha256_json(list(pseudo.ids)),
                                     "vectors": _array_sha(np.ascontiguousarray(pseudo.embeddings, dtype=np.float32))}
        cached = _cached_fit(folder, candidate.method, key)
        if cached is not None:
            return cached
    cls = get_compressor_class(candidate.method)
    compressor = cls(config)
    corpus = TrainingData.corpus_only(docs, list(doc_ids))
    if pseudo is not None:
        corpus = replace(corpus, pseudo_queries=pseudo)
    start = time.perf_counter()
    compressor.fit_unsupervised(corpus)
    fit_s = time.perf_counter() - start
    if folder is not None:
        compressor.save(folder / candidate.method)
        write_json_with_digest(folder / _FIT_KEY, {**key, "state_sha256": compressor.state_sha256(), "fit_s": fit_s})  # type: ignore[dict-item]
    logger.info("label-free fit of %s on %d documents in %.1fs%s", candidate.name, len(docs), fit_s,
                f" ({preset}, {len(pseudo.ids)} pseudo-queries from {pseudo.source})" if pseudo is not None else "")
    return compressor, fit_s


def _array_sha(x: np.ndarray, digest: str | None = None) -> str:
    return sha256_json([list(x.shape), digest if digest is not None else vectors_sha256(x)])


def _cached_fit(folder: Path, method: str, key: Mapping[str, Any]) -> tuple[Compressor, float] | None:
    if not (folder / _FIT_KEY).is_file():
        return None
    try:
        recorded, _ = read_json_verified(folder / _FIT_KEY, "", require_digest=True)
        if {k: v for k, v in recorded.items() if k not in ("state_sha256", "fit_s")} == dict(key):
            compressor = load_compressor(folder / method)
            if compressor.state_sha256() == recorded["state_sha256"]:
                return compressor, float(recorded["fit_s"])
        reason = "it was fitted on other documents or settings"
    except (OSError, ValueError, KeyError, TypeError) as error:
        reason = f"its files are damaged ({error})"
    logger.warning("%s: refitting: %s", folder, reason)
    shutil.rmtree(folder, ignore_errors=True)
    return None


# -- the label-free plan ---------------------------------------------------------------------
#: The row field each objective is read from (``score_precisions`` computes both on the given judgments).
OBJECTIVE_FIELDS = {"agreement": "recall@10", "pseudo-queries": "ndcg@10"}
OBJECTIVE_NAMES = {"agreement": "agreement@10 (recall@10 of the uncompressed float32 top-10)",
                   "pseudo-queries": "nDCG@10 of pseudo-queries from the held-out documents' text"}


@dataclass(frozen=True)
class LabelFreeValidation:
    """What a label-free sweep scores on and fits on: the validation queries, the documents fitted on, and what plan.json records."""

    objective: str
    queries: QuerySet
    fit_doc_ids: list[str]
    held_out: list[str]
    record: dict[str, Any]

    @property
    def field(self) -> str:
        return OBJECTIVE_FIELDS[self.objective]


def label_free_validation(
    experiment: Experiment,
    objective: str = "agreement",
    held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
    max_held_out: int = MAX_HELD_OUT_DOCUMENTS,
    seed: int = 2027,
    queries: tuple[Sequence[str], np.ndarray] | None = None,
    pseudo_query_source: str = "title",
    encoder: SentenceEncoder | None = None,
    cache: bool = True,
) -> LabelFreeValidation:
    """The validation of a label-free sweep on ``experiment``'s corpus; reads no qrels.

    ``agreement``: on the held-out documents, or on ``queries`` (``(ids, vectors)``, the user's
    unlabelled queries, encoded like real queries), when given; the compressors are then fitted on
    every document. ``pseudo-queries``: the held-out documents' pseudo-queries (``pseudo_query_source``:
    ``title`` or ``first-sentence``).

    Raises:
        ValueError: an unknown objective or source, ``queries`` with ``pseudo-queries``, or fewer than
            :data:`MIN_VALIDATION_QUERIES` validation queries.
    """
    if objective not in LABEL_FREE_OBJECTIVES:
        raise ValueError(f"label-free objective must be one of {list(LABEL_FREE_OBJECTIVES)}; got {objective!r}.")
    if pseudo_query_source not in PSEUDO_QUERY_SOURCES:
        raise ValueError(f"pseudo-query source must be one of {list(PSEUDO_QUERY_SOURCES)}; got {pseudo_query_source!r}.")
    if queries is not None and objective != "agreement":
        raise ValueError("unlabelled queries are scored by agreement with the uncompressed ranking (--label-free agreement); "
                         "pseudo-queries are made from the held-out documents' own text.")
    doc_ids = list(experiment.embeddings.doc_ids)
    docs = np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
    record: dict[str, Any] = {"objective": objective, "metric": OBJECTIVE_NAMES[objective], "labels_read": False}
    if queries is not None:
        query_ids, vectors = list(queries[0]), np.ascontiguousarray(queries[1], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != docs.shape[1]:
            raise ValueError(f"the unlabelled query vectors have shape {vectors.shape}; the documents are {docs.shape[1]}-d.")
        query_set = agreement_queries(doc_ids, docs, query_ids, vectors, documents=False)
        held_out: list[str] = []
        fit_ids = doc_ids
        record.update({"queries": query_set.part, "held_out_documents": 0, "fit_documents": len(fit_ids)})
    else:
        held_out = held_out_documents(doc_ids, held_out_fraction, max_held_out, seed)
        keep = set(held_out)
        fit_ids = [doc_id for doc_id in doc_ids if doc_id not in keep]
        if objective == "agreement":
            position = {doc_id: row for row, doc_id in enumerate(doc_ids)}
            query_set = agreement_queries(doc_ids, docs, held_out, docs[[position[d] for d in held_out]], documents=True)
        else:
            query_set = pseudo_query_validation(experiment, held_out, pseudo_query_source, encoder=encoder, cache=cache)
        record.update({"queries": query_set.part, "held_out_documents": len(held_out), "held_out_fraction": held_out_fraction,
                       "max_held_out": max_held_out, "held_out_seed": seed, "fit_documents": len(fit_ids),
                       "held_out_sha256": sha256_json(held_out)})
    record["n_queries"] = len(query_set.ids)
    if len(query_set.ids) < MIN_VALIDATION_QUERIES:
        raise ValueError(f"a label-free plan needs at least {MIN_VALIDATION_QUERIES} validation queries; {query_set.part} gives "
                         f"{len(query_set.ids)}. Raise the held-out fraction, or give unlabelled queries.")
    return LabelFreeValidation(objective, query_set, fit_ids, held_out, record)


class LabelFreeObjective(PlanObjective):
    """A label-free plan's objective for :func:`~embedtune.workflows.plan.run_sweep`: a :class:`LabelFreeValidation`'s queries and fits.

    Every row's ``objective`` is the validation's field (agreement: recall@10 of the uncompressed
    top-10; pseudo-queries: nDCG@10). The sweep's candidates are fitted by :func:`fit_label_free`
    on the documents the validation fits on (all but the held-out ones), the choice on every
    document; a projection needs at least as many fitting documents as dimensions.
    """

    name = "label-free plan"
    y = "objective"
    refit_on = "every document"
    #: Label-free DIVE (neighbour-rank distillation from its PCA start) scored at most 0.058 agreement@10 above the better of
    #: its PCA starts at float32 in full-sweep label-free plans (ArguAna, 32 dims; 0.031 on SciFact, 0.030 on NPL, 0.018 on
    #: 1M tiled vectors; ``benchmarks/sweep_bounds.py``): a candidate whose starts fall more than 0.15 short of the target is
    #: not fitted.
    learned_start_margin = 0.15

    def __init__(self, experiment: Experiment, validation: LabelFreeValidation, cache: EmbeddingCache | bool = True,
                 pseudo_query_source: str | None = None) -> None:
        self.experiment = experiment
        self.validation = validation
        self.cache = cache
        self.pseudo_query_source = pseudo_query_source  # the text preset's only source; None: its sources in turn
        self.queries = validation.queries
        self.metric = validation.field
        self.doc_ids = list(experiment.embeddings.doc_ids)
        self.docs = np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
        position = {doc_id: row for row, doc_id in enumerate(self.doc_ids)}
        self.fit_docs = self.docs[[position[d] for d in validation.fit_doc_ids]]
        self.fit_part = "all" if not validation.held_out else f"held-out-{validation.record['held_out_sha256'][:12]}"
        # Once: the sweep folder, the FAISS cache and every fit on all documents are keyed by it.
        self.docs_digest = vectors_sha256(self.docs)
        self.fit_docs_digest = self.docs_digest if len(self.fit_docs) == len(self.docs) else vectors_sha256(self.fit_docs)

    def fit(self, candidate: Candidate, seed: int, work: Path | None, final: bool) -> tuple[Compressor, float]:
        # The corpus's text goes with its vectors: DIVE fits its text preset (pseudo-queries as anchors and a guard) where
        # the text gives pseudo-queries, as ``compress fit`` does from a corpus.
        if final:
            return fit_label_free(candidate, self.doc_ids, self.docs, seed, work, "all", self.docs_digest, self.experiment, self.cache,
                                  self.pseudo_query_source)
        return fit_label_free(candidate, self.validation.fit_doc_ids, self.fit_docs, seed, work, self.fit_part, self.fit_docs_digest,
                              self.experiment, self.cache, self.pseudo_query_source)

    def fit_frozen(self) -> Compressor:
        frozen = get_compressor_class("frozen")
        return frozen(frozen.config_class(dim=self.docs.shape[1])).fit_unsupervised(TrainingData.corpus_only(self.docs, self.doc_ids))

    def default_work(self) -> Path:
        # Shared by label-free plans on the same corpus; each fit is keyed by its documents and candidate.
        return default_sweep_dir({"label_free_corpus": faiss_cache_dir(".", digest=self.docs_digest).name,
                                  "doc_ids": sha256_json(self.doc_ids)})

    def plot_title(self) -> str:
        return (f"{self.experiment.dataset.name}: {OBJECTIVE_NAMES[self.validation.objective]} on {len(self.queries.ids)} "
                f"{self.queries.part} vs bytes per vector (no labels)")

    def record(self) -> dict[str, Any]:
        return {"objective": self.validation.record,
                "validation": {"rule": f"label-free: {OBJECTIVE_NAMES[self.validation.objective]} on {len(self.queries.ids)} "
                                       f"{self.queries.part}", "n_queries": len(self.queries.ids)}}

    def candidates(self, cells: list[Candidate]) -> list[Candidate]:
        # A projection fitted on the corpus (PCA, and DIVE from its PCA start) has at most as many
        # directions as fitting documents; a small corpus leaves those dims out instead of failing.
        n_fit = len(self.validation.fit_doc_ids)
        too_few = [c for c in cells if c.method not in CORPUS_FREE_METHODS and c.dim > n_fit]
        if too_few:
            logger.info("label-free plan: %d fitting documents, so %s are left out (a projection fitted on them has at most %d directions)",
                        n_fit, ", ".join(c.name for c in too_few), n_fit)
        return [c for c in cells if c not in too_few]


def run_label_free_plan(
    experiment: Experiment,
    out: str | Path,
    objective: str = "agreement",
    budget_bytes: float | None = None,
    target_retention: float | None = None,
    methods: Sequence[str] = LABEL_FREE_METHODS,
    dims: Sequence[int] | None = None,
    precisions: Sequence[str] = LABEL_FREE_PRECISIONS,
    peers: Sequence[str] = DEFAULT_PEERS,
    seed: int = 2027,
    final: bool = False,
    work: str | Path | None = None,
    labels: Mapping[str, Any] | None = None,
    rounds: int = 3,
    held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
    max_held_out: int = MAX_HELD_OUT_DOCUMENTS,
    queries: tuple[Sequence[str], np.ndarray] | None = None,
    pseudo_query_source: str | None = None,
    encoder: SentenceEncoder | None = None,
    cache: bool = True,
    codecs: Sequence[str] = DEFAULT_CODECS,
    codec_budgets: Sequence[int] = CODEC_BUDGETS,
    allow_disk: bool = False,
    fit_sample: int | None = None,
    price_per_gb_month: float = DEFAULT_PRICE_PER_GB_MONTH,
    refine_candidates: int = DEFAULT_REFINE_CANDIDATES,
    check_full_corpus: bool = True,
    full_sweep: bool = False,
    searched_codecs: Sequence[str] = SEARCHED_CODECS,
    learned_gate_p: float = LEARNED_GATE_P,
    count_tables: bool = False,
    allow_index_over_float32: bool = False,
) -> dict[str, Any]:
    """``compress plan`` without labels: sweep, choose on a label-free objective, refit on every document, write the plan folder.

    :func:`~embedtune.workflows.plan.run_sweep` with a :class:`LabelFreeObjective`.

    Args mirror :func:`embedtune.workflows.plan.run_plan`; the differences:
        objective: ``agreement`` or ``pseudo-queries`` (see the module docstring).
        methods: unsupervised compressors only (a method that needs labels is an error).
        precisions: every precision by default (RaBitQ, TurboQuant and int4 on each compressor's output too).
        peers: as in ``run_plan``; ``csr`` fits CSR on the documents the other compressors fit on.
        target_retention: the share of the uncompressed float32 vectors' objective to keep (agreement: of 1.0).
        held_out_fraction, max_held_out: the documents withheld from fitting to validate on (hashed by ``seed``).
        queries: ``(ids, vectors)`` of the user's unlabelled queries (agreement only).
        pseudo_query_source, encoder, cache: how pseudo-queries are made and encoded (the experiment's model by default).
            ``pseudo_query_source`` (``title``, ``first-sentence`` or ``first-words``) makes both the
            ``pseudo-queries`` objective's queries and those of DIVE's text preset; None: ``title`` for the
            objective, and the preset tries ``title``, then ``first-words``.
        final: also score the choice on the experiment's labelled test queries, after it is made.
        codecs, codec_budgets, allow_disk, refine_candidates, full_sweep, searched_codecs, learned_gate_p, count_tables,
            allow_index_over_float32: as in
            ``run_plan`` (the codecs are fitted on every document the index holds; the tables' share is of every corpus row,
            not of the sample).
        fit_sample: the corpus rows the whole plan runs on (default: :func:`plan_sample`'s rule): the sweep fits,
            holds out, indexes and scores that seeded sample, and the choice is refitted on it; recorded in
            ``plan.json`` under ``fit_sample``. A corpus no larger than the sample is used whole.
        price_per_gb_month: the bill's price (see :func:`~embedtune.workflows.plan.run_sweep`).
        check_full_corpus: where the plan ran on a sample and scores agreement, also measure the choice over
            every document (:func:`~embedtune.workflows.full_corpus_check.full_corpus_agreement`), recorded in
            ``plan.json`` under ``full_corpus``, with a warning when it falls below ``target_retention``.

    Returns:
        The plan (also ``OUT/plan.json``, whose ``objective`` records what chose it).
    """
    for method in methods:
        check_label_free_method(method)
    sampled, record = plan_sample(experiment, fit_sample, seed)
    validation = label_free_validation(sampled, objective, held_out_fraction, max_held_out, seed, queries, pseudo_query_source or "title",
                                       encoder, cache)
    verify: Callable[[Path], tuple[bool, dict[str, Any]]] | None = None
    if sampled is not experiment and check_full_corpus and validation.objective == "agreement":
        truth: dict[str, Any] = {}  # the exact top-10 over every row: computed once for every setting measured

        def over_every_document(directory: Path) -> tuple[bool, dict[str, Any]]:
            checked = full_corpus_agreement(experiment, directory, validation.queries.vectors, validation.held_out, AGREEMENT_K, truth=truth)
            return target_retention is None or checked["agreement"] >= target_retention, checked

        verify = over_every_document
    plan = run_sweep(LabelFreeObjective(sampled, validation, cache, pseudo_query_source), out, budget_bytes, target_retention, methods, dims, precisions, peers, seed,
                     final and sampled is experiment, work, labels, rounds, codecs=codecs, codec_budgets=codec_budgets, allow_disk=allow_disk,
                     fit_sample=fit_sample, price_per_gb_month=price_per_gb_month, sample_record=record,
                     refine_candidates=refine_candidates, full_sweep=full_sweep, verify=verify, searched_codecs=searched_codecs,
                     learned_gate_p=learned_gate_p, count_tables=count_tables,
                     allow_index_over_float32=allow_index_over_float32)
    if "full_corpus" in plan:
        checked = plan["full_corpus"]
        if target_retention is not None and checked["agreement"] < target_retention:
            logger.warning("label-free plan: %s keeps agreement@10 %.4f on the %d-row sample but %.4f over all %d documents, below the "
                           "target %.3g (the best of %d settings measured over every document): a larger corpus is denser. Plan with a "
                           "larger --fit-sample, a lower --target-retention, or a larger --budget-bytes.",
                           checked["setting"], checked["on_sample"], len(sampled.embeddings.doc_ids), checked["agreement"],
                           checked["n_documents"], target_retention, len(plan.get("full_corpus_checks") or [checked]))
    if final and sampled is not experiment:  # the labelled test queries search the whole corpus, as deployed
        plan["test"] = score_plan(experiment, out, "test")
    if sampled is not experiment and ("full_corpus" in plan or final):
        write_json_with_digest(Path(out) / PLAN_FILE, plan)
    return plan


def plan_sample(experiment: Experiment, fit_sample: int | None = None, seed: int = 2027) -> tuple[Experiment, dict[str, Any]]:
    """The experiment a label-free plan runs on, and what ``plan.json`` records about it.

    A corpus of more rows than :func:`~embedtune.index.fit_sample.fit_sample_size` allows (``fit_sample``
    overrides the rule) becomes that seeded sample of its rows, in corpus order, so the plan's cost and
    memory stop growing with the corpus; a smaller one is returned as it is. Queries and labels are kept.
    """
    embeddings = experiment.embeddings
    n_docs, dim = len(embeddings.doc_ids), embeddings.dim
    size = fit_sample_size(n_docs, dim, fit_sample)
    record = {**fit_sample_record(n_docs, dim, size, seed, fit_sample),
              "fits": "every fit, held-out document and index of the sweep, and the refit of the choice"}
    if size >= n_docs:
        return experiment, record
    rows = fit_sample_rows(n_docs, size, seed)
    ids = [embeddings.doc_ids[row] for row in rows]
    record["ids_sha256"] = sha256_json(ids)
    logger.info("label-free plan: %d documents, so the plan runs on a seeded sample of %d (%s)", n_docs, size, record["rule"])
    docs = np.ascontiguousarray(embeddings.doc_embeddings[rows], dtype=np.float32)
    release_mapped_pages(embeddings.doc_embeddings)  # the sample is a copy; the corpus stays a map, not resident
    return dataclasses.replace(experiment, embeddings=dataclasses.replace(embeddings, doc_ids=ids, doc_embeddings=docs)), record
