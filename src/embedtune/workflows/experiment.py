"""Public one-call workflows that the CLI and the benchmarks share: load, embed, evaluate.

Each function takes plain values (a dataset name or path, a model alias or path) so that the
CLI stays a thin layer over this module.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress.base import TrainingData
from embedtune.data.beir import BeirDataset, load_beir, load_beir_corpus, untitled_corpus
from embedtune.data.pairs import labelled_dataset, read_labels
from embedtune.data.splits import QuerySplit, positive_disjoint_folds, query_disjoint_split, train_qrels_split
from embedtune.encoders.cache import EmbeddingCache
from embedtune.encoders.dataset import DatasetEmbeddings, embed_dataset
from embedtune.encoders.recipe import EncoderRecipe, recipe_beside
from embedtune.encoders.precomputed import PRECOMPUTED_MODEL, check_precomputed_pair, judged_documents, load_embeddings, require_ids, vector_fingerprints
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.encoders.similarity import SimilarityChoice, resolve_similarity
from embedtune.errors import EmbedtuneError
from embedtune.evaluate.metrics import RetrievalMetrics
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.evaluate.search import unit_rows
from embedtune.io import release_mapped_pages

logger = logging.getLogger(__name__)

__all__ = ["Experiment", "load_experiment", "load_corpus_experiment", "fold_experiments", "evaluate_frozen", "training_data", "encoder_settings", "PROTOCOLS"]

# "paper": 60/20/20 query-disjoint split of one qrels split's judged queries (DIVE §4.1).
# "beir-train": train/val from qrels/train.tsv, test = every judged query of qrels/test.tsv.
PROTOCOLS = ("paper", "beir-train")


@dataclass
class Experiment:
    """A dataset, its embeddings and (optionally) its query-disjoint split."""

    dataset: BeirDataset
    embeddings: DatasetEmbeddings
    split: QuerySplit | None = None
    # "cosine": both sides L2-normalised before search (whatever the vectors' source); "dot": raw inner product.
    similarity: str = "cosine"
    #: Where the vectors came from, for reports: ``{"model": name or "precomputed", "vectors": {file: sha256}}``.
    provenance: dict[str, Any] = field(default_factory=dict)

    def encoder_recipe(self, what: str = "these queries") -> EncoderRecipe:
        """The recipe that made the experiment's vectors, to encode more text the same way.

        Raises:
            EmbedtuneError: the vectors were precomputed, so no recipe is known; ``what`` names what needed one.
        """
        described = self.embeddings.model or {}
        if described.get("model") or described.get("name"):  # recorded with the vectors (embed, embed-corpus)
            return EncoderRecipe.from_dict({"normalize": self.similarity != "dot", **described}, "the experiment's vectors")
        if not described or self.provenance.get("model") in (None, PRECOMPUTED_MODEL):
            raise EmbedtuneError(f"{what} are encoded by the model that made the vectors, but these vectors were precomputed; "
                                 "pass --model with the model's own data (the vectors are then encoded and cached), "
                                 "or leave them out.")
        # A description without a name (or normalisation) takes them from the experiment itself.
        return EncoderRecipe.from_dict({"model": self.provenance["model"], "normalize": self.similarity != "dot", **described},
                                       "the experiment's vectors")

    def qrels_for(self, query_ids: list[str]) -> dict[str, dict[str, int]]:
        return {qid: self.dataset.qrels[qid] for qid in query_ids if qid in self.dataset.qrels}

    def part_ids(self, part: str) -> list[str]:
        """Query ids of ``all`` judged queries or a split part (train, val, test, train+val)."""
        if part == "all":
            return self.dataset.judged_query_ids()
        if self.split is None:
            raise ValueError("this experiment has no query-disjoint split; load it with split_seed=...")
        return self.split.part(part)

    def evaluate(
        self,
        part: str = "all",
        query_embeddings: np.ndarray | None = None,
        doc_embeddings: np.ndarray | None = None,
        ignore_identical_ids: bool = True,
        top_k: int = 100,
        metrics: tuple[str, ...] | None = None,
    ) -> RetrievalMetrics:
        """Score (possibly transformed) embeddings on the queries of ``part``.

        ``query_embeddings`` must then be row-aligned with ``part_ids(part)``. ``metrics``: the
        names to compute (default :data:`~embedtune.evaluate.metrics.DEFAULT_METRICS`).
        """
        ids = self.part_ids(part)
        if query_embeddings is None:
            query_embeddings = self.embeddings.queries(ids)
        if doc_embeddings is None:
            doc_embeddings = np.ascontiguousarray(self.embeddings.doc_embeddings, dtype=np.float32)
        return evaluate_embeddings(ids, query_embeddings, self.embeddings.doc_ids, doc_embeddings, self.qrels_for(ids), top_k,
                                   ignore_identical_ids, similarity=self.similarity,  # type: ignore[arg-type]
                                   **({"metrics": metrics} if metrics else {}))


def fold_experiments(experiment: Experiment, n_folds: int = 5, seed: int = 2027, val_fraction: float = 0.2) -> list[Experiment]:
    """``experiment`` once per positive-disjoint fold of all its judged queries (:func:`~embedtune.data.splits.positive_disjoint_folds`).

    Every judged query is a test query of exactly one fold, and no positive of a fold's test
    queries is a positive of its train or validation queries, so each test query is "unseen".
    Under ``beir-train`` the train and test qrels are pooled (their queries are disjoint) and the
    folds record both files' sha256. The vectors are shared, not copied.
    """
    splits = positive_disjoint_folds(experiment.dataset, n_folds, seed, val_fraction)
    if experiment.split is not None:  # the pooled qrels' own files (beir-train: train.tsv too)
        splits = [replace(s, qrels_split=experiment.split.qrels_split, fingerprints={**experiment.split.fingerprints, **s.fingerprints})
                  for s in splits]
    return [replace(experiment, split=s) for s in splits]


def encoder_settings(
    similarity: str | None,
    model: str | Path | None,
    precomputed: bool = False,
    *,
    batch_size: int = 64,
    max_seq_length: int | None = None,
    query_prompt: str = "",
    document_prompt: str = "",
) -> tuple[SimilarityChoice, dict[str, Any]]:
    """The similarity to rank with, and the encoder options that go with it: one rule for every command.

    The similarity is ``similarity`` when given, else the model's own (``similarity_fn_name`` of
    a sentence-transformers folder: a PACE Stage II model ranks by dot), else cosine; with
    ``precomputed`` vectors the model's setting does not apply (see
    :func:`~embedtune.encoders.similarity.resolve_similarity`). The options (``batch_size``,
    ``max_seq_length``, ``query_prompt``, ``document_prompt``, ``normalize``) are what
    :func:`load_experiment` and :func:`~embedtune.workflows.fit.fit_on_all` take as
    ``encoder_options``: ``normalize`` is False for dot, so a dot model's vectors keep their norms.
    ``evaluate``, ``compress train``, ``compress fit`` and ``compress plan`` all resolve it here.

    Raises:
        EmbedtuneError: ``similarity`` is not supported, or the model's own is one embedtune cannot rank with.
    """
    choice = resolve_similarity(similarity, model, precomputed=precomputed)
    options = {"batch_size": batch_size, "max_seq_length": max_seq_length, "query_prompt": query_prompt,
               "document_prompt": document_prompt, "normalize": choice.name != "dot"}
    return choice, options


def load_experiment(
    data: str | Path = "scifact",
    model: str = "minilm",
    qrels_split: str = "test",
    split_seed: int | None = 2027,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    encoder_options: dict | None = None,
    cache: bool | EmbeddingCache = True,
    doc_embeddings: str | Path | None = None,
    doc_ids: str | Path | None = None,
    query_embeddings: str | Path | None = None,
    query_ids: str | Path | None = None,
    protocol: str = "paper",
    val_fraction: float = 0.2,
    labels: str | Path | None = None,
) -> Experiment:
    """Load ``data``, embed it with ``model`` (or read precomputed vectors), and split it.

    With ``labels`` (a pairs file or a qrels TSV, see :mod:`embedtune.data.pairs`) in place of a
    BEIR folder (``data`` is then not read), precomputed doc and query vectors are a dataset of
    their own: no text is needed. Ids must be unique, and every labelled query and document must have a
    vector (the error names the file and the first id that does not). The experiment's
    ``provenance`` then records ``model: precomputed`` and the vector files' sha256.

    ``protocol="paper"`` splits the judged queries of ``qrels_split`` by ``fractions``;
    ``protocol="beir-train"`` trains on ``qrels/train.tsv`` (``val_fraction`` of it held out for
    validation) and tests on every judged query of ``qrels_split``. The experiment's qrels then
    hold both files' judgments (their queries are disjoint).

    ``encoder_options["normalize"]`` (default True) sets the experiment's similarity: cosine
    (precomputed vectors are L2-normalised as well) or, with False, the raw dot product.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {list(PROTOCOLS)}; got {protocol!r}.")
    similarity = "cosine" if (encoder_options or {}).get("normalize", True) else "dot"
    precomputed = doc_embeddings is not None or query_embeddings is not None
    if precomputed and (doc_embeddings is None or query_embeddings is None):
        raise ValueError("pass both --doc-embeddings and --query-embeddings (with their ids) to skip encoding.")
    if labels is not None or data is None:  # labels replace the BEIR folder: ``data`` is not read
        if labels is None or not precomputed:
            raise ValueError("without a BEIR folder, give precomputed doc and query vectors (with their ids) and a labels file "
                             "(--pairs: JSONL {\"query_id\", \"doc_id\"} or query_id<TAB>doc_id, or --qrels: a BEIR qrels TSV).")
        if protocol == "beir-train":
            raise ValueError("the beir-train protocol reads qrels/train.tsv and qrels/test.tsv of a BEIR folder; "
                             "with a labels file use the paper protocol (a query-disjoint split of the labelled queries).")
        return _labelled_experiment(labels, doc_embeddings, doc_ids, query_embeddings, query_ids, split_seed, fractions, similarity)  # type: ignore[arg-type]
    dataset = load_beir(data, qrels_split)
    beir_split: QuerySplit | None = None
    if protocol == "beir-train":
        if split_seed is None:
            raise ValueError("the beir-train protocol needs a split_seed (it picks the validation queries).")
        train_dataset = load_beir(data, "train")
        beir_split = train_qrels_split(train_dataset, dataset, val_fraction, split_seed)
        dataset.qrels = {**train_dataset.qrels, **dataset.qrels}
    if doc_embeddings is not None or query_embeddings is not None:
        if doc_embeddings is None or query_embeddings is None:
            raise ValueError("pass both --doc-embeddings and --query-embeddings (with their ids) to skip encoding.")
        start = time.perf_counter()
        d_ids, d_vecs = load_embeddings(doc_embeddings, doc_ids, unique=True)
        q_ids, q_vecs = load_embeddings(query_embeddings, query_ids, unique=True)
        check_precomputed_pair(doc_embeddings, d_ids, d_vecs, query_embeddings, q_vecs, dataset)
        if similarity == "cosine":  # cosine normalises whatever the vectors' source, as the encoder does
            d_vecs, q_vecs = unit_rows(d_vecs), unit_rows(q_vecs)
        embeddings = DatasetEmbeddings(d_ids, d_vecs, q_ids, q_vecs, {"load": time.perf_counter() - start}, {})
        qrels_file = f"{dataset.source}/qrels/{dataset.split}.tsv"
        require_ids(q_ids, dataset.judged_query_ids(), query_ids or query_embeddings, qrels_file, "query")
        # A judged document without a vector would be scored as never retrieved: a lower number, no warning.
        require_ids(d_ids, judged_documents(dataset), doc_ids or doc_embeddings, qrels_file, "document")
        provenance: dict[str, Any] = {"model": PRECOMPUTED_MODEL,
                                      "vectors": vector_fingerprints(doc_embeddings, doc_ids, query_embeddings, query_ids)}
    else:
        encoder = SentenceEncoder(model, **(encoder_options or {}))
        embeddings = embed_dataset(encoder, dataset, cache=cache)
        provenance = {"model": str(model), "model_sha256": encoder.fingerprint}
    if beir_split is not None:
        split = beir_split
    else:
        split = query_disjoint_split(dataset, fractions, split_seed) if split_seed is not None else None
    return Experiment(dataset, embeddings, split, similarity, provenance)


def _labelled_experiment(
    labels: str | Path,
    doc_embeddings: str | Path,
    doc_ids: str | Path | None,
    query_embeddings: str | Path,
    query_ids: str | Path | None,
    split_seed: int | None,
    fractions: tuple[float, float, float],
    similarity: str,
) -> Experiment:
    """An experiment from precomputed vectors and a labels file, with no corpus or query text."""
    start = time.perf_counter()
    d_ids, d_vecs = load_embeddings(doc_embeddings, doc_ids, unique=True)
    q_ids, q_vecs = load_embeddings(query_embeddings, query_ids, unique=True)
    fingerprints = vector_fingerprints(doc_embeddings, doc_ids, query_embeddings, query_ids)
    dataset = labelled_dataset(d_ids, q_ids, read_labels(labels), labels, str(doc_ids or doc_embeddings),
                               str(query_ids or query_embeddings), fingerprints=fingerprints)
    check_precomputed_pair(doc_embeddings, d_ids, d_vecs, query_embeddings, q_vecs, dataset)
    if similarity == "cosine":
        d_vecs, q_vecs = unit_rows(d_vecs), unit_rows(q_vecs)
    embeddings = DatasetEmbeddings(d_ids, d_vecs, q_ids, q_vecs, {"load": time.perf_counter() - start}, {})
    split = query_disjoint_split(dataset, fractions, split_seed) if split_seed is not None else None
    return Experiment(dataset, embeddings, split, similarity, {"model": PRECOMPUTED_MODEL, "vectors": fingerprints})


def training_data(experiment: Experiment, part: str, triplets: np.ndarray | None = None) -> TrainingData:
    """The :class:`TrainingData` of one split part (whole corpus, that part's queries)."""
    ids = experiment.part_ids(part)
    return TrainingData(
        query_ids=ids,
        query_embeddings=experiment.embeddings.queries(ids),
        doc_ids=experiment.embeddings.doc_ids,
        doc_embeddings=np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32),
        qrels=experiment.qrels_for(ids),
        triplets=triplets,
    )


def evaluate_frozen(experiment: Experiment, part: str = "all", ignore_identical_ids: bool = True, top_k: int = 100) -> RetrievalMetrics:
    return experiment.evaluate(part, ignore_identical_ids=ignore_identical_ids, top_k=top_k)


def load_corpus_experiment(
    data: str | Path | None = None,
    model: str = "minilm",
    encoder_options: Mapping[str, Any] | None = None,
    cache: bool = True,
    doc_embeddings: str | Path | None = None,
    doc_ids: str | Path | None = None,
) -> Experiment:
    """An experiment of the corpus alone, all a label-free plan reads: no queries, no qrels, no split.

    ``data``: a BEIR folder or a ``corpus.jsonl`` (:func:`~embedtune.data.beir.load_beir_corpus`:
    ``qrels/`` and ``queries.jsonl`` need not exist), encoded with ``model`` (cached), or, with
    ``doc_embeddings`` (and ``doc_ids``), precomputed vectors; their texts are then read from
    ``data`` when it is given (pseudo-queries need them). ``encoder_options["normalize"]`` (default
    True) is cosine similarity, False the raw dot product.
    """
    normalize = (encoder_options or {}).get("normalize", True)
    if doc_embeddings is not None:
        ids, docs = load_embeddings(doc_embeddings, doc_ids, unique=True)
        docs = unit_rows(docs) if normalize else np.ascontiguousarray(docs, dtype=np.float32)
        release_mapped_pages(docs)  # unit rows are returned as the map itself, read through once: not held resident
        dataset = (load_beir_corpus(data) if data is not None else
                   BeirDataset(Path(doc_embeddings).stem, untitled_corpus(ids), {}, {}, "corpus", {}, str(doc_embeddings)))
        provenance: dict[str, Any] = {"model": PRECOMPUTED_MODEL, "vectors": vector_fingerprints(doc_embeddings, doc_ids)}
        made_by = recipe_beside(doc_embeddings)  # an embed-corpus folder (or embed's) records the recipe that made it
    else:
        if data is None:
            raise ValueError("give the corpus: a BEIR folder or corpus.jsonl (--data) and a --model, or --doc-embeddings with --doc-ids.")
        dataset = load_beir_corpus(data)
        dataset.fingerprints.setdefault("queries.jsonl", hashlib.sha256(b"").hexdigest())  # no queries are encoded
        encoder = SentenceEncoder(model, **dict(encoder_options or {}))
        encoded = embed_dataset(encoder, dataset, cache=cache)
        ids, docs = list(encoded.doc_ids), np.ascontiguousarray(encoded.doc_embeddings, dtype=np.float32)
        provenance = {"model": str(model), "model_sha256": encoder.fingerprint}
    # The recipe travels with the vectors, so pseudo- and unlabelled queries are encoded the same way.
    described = encoded.model if doc_embeddings is None else (made_by.to_dict() if made_by is not None else {})
    embeddings = DatasetEmbeddings(list(ids), docs, [], np.zeros((0, docs.shape[1]), dtype=np.float32), {}, {}, described)
    return Experiment(dataset, embeddings, None, "cosine" if normalize else "dot", provenance)
