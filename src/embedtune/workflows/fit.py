"""Fit one compressor on all the data given, for deployment: what ``embedtune compress fit`` runs.

No evaluation split: every labelled query trains (``val_fraction`` or ``val_split`` hold some out,
for best-epoch selection only). The inputs, in any combination that makes sense:

- a BEIR folder (``data``) with a ``model``, its ``qrels/<split>.tsv`` the labels;
- document vectors + ids and query vectors + ids, with ``labels`` (a pairs file or a qrels TSV,
  :mod:`embedtune.data.pairs`): no corpus or query text;
- a corpus alone: document vectors + ids, or a BEIR folder and a ``model`` with
  ``unsupervised=True`` (or no qrels at all).

With labels and a supervised method it takes the supervised path (triplets mined with the
method's default preset: the safety net of :data:`embedtune.compress.presets.SAFETY_NET_MINING`);
otherwise the unsupervised path (``fit`` on the corpus, or ``fit_unsupervised`` for a supervised
method that has an unsupervised setting). A supervised-only method given no labels is an error
that lists the unsupervised methods.

>>> from embedtune.workflows.fit import fit_on_all
>>> result = fit_on_all("dive", 128, doc_embeddings="docs.npy", doc_ids="docs.txt",      # doctest: +SKIP
...                     query_embeddings="queries.npy", query_ids="queries.txt", labels="pairs.jsonl", out="my-dive")
>>> result.path, result.info["selected_epoch"]                                          # doctest: +SKIP

``OUT/`` then holds the compressor itself (``load_compressor(OUT)``) and ``fit.json``, which says
what was used: the path, the method and its config, the inputs with their sha256 fingerprints
(``model: precomputed`` for given vectors), the labels, the triplets and the selected epoch.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedtune import __version__
from embedtune.compress import Compressor, Preset, TrainingData, describe_method, get_compressor_class, unsupervised_methods
from embedtune.compress.base import PseudoQueries
from embedtune.compress.holdout import holdout_ids
from embedtune.compress.presets import MiningOptions
from embedtune.compress.streaming import embedding_file_shape
from embedtune.data.beir import load_beir, qrels_splits
from embedtune.data.pairs import read_labels
from embedtune.data.splits import QuerySplit, rank_by_hash
from embedtune.encoders.precomputed import PRECOMPUTED_MODEL, load_embedding_rows, require_ids
from embedtune.errors import EmbedtuneError
from embedtune.evaluate.search import unit_rows
from embedtune.io import atomic_write_json
from embedtune.workflows.experiment import Experiment, load_corpus_experiment, load_experiment, training_data
from embedtune.workflows.fit_and_score import build_config
from embedtune.workflows.pseudo_queries import (pseudo_query_documents, recipe_pseudo_queries, selection_pseudo_queries,
                                                text_preset_pseudo_queries)
from embedtune.workflows.train_compressor import require_mined_triplets, resolve_preset, training_notes
from embedtune.workflows.triplets import shared_triplets

logger = logging.getLogger(__name__)

__all__ = ["FitResult", "fit_on_all", "supported_paths", "FIT_INFO_NAME", "SUPERVISED", "UNSUPERVISED"]

FIT_INFO_NAME = "fit.json"
SUPERVISED, UNSUPERVISED = "supervised", "unsupervised"


@dataclass
class FitResult:
    """What :func:`fit_on_all` did.

    Attributes:
        compressor: the fitted compressor (also saved in ``out``).
        path: ``"supervised"`` or ``"unsupervised"``.
        info: what ``OUT/fit.json`` holds.
        out: the output folder, or None.
        notes: plain lines for the user (which path and why, what selection kept).
    """

    compressor: Compressor
    path: str
    info: dict[str, Any]
    out: Path | None = None
    notes: list[str] = field(default_factory=list)


def supported_paths(method: str) -> list[str]:
    """The paths ``method`` can take: supervised (it learns from labels) and/or unsupervised."""
    cls = describe_method(method)  # the traits, without importing the method's module (torch) for --help
    paths = [SUPERVISED] if cls.supervised else []
    if not cls.supervised or cls.supports_unsupervised:
        paths.append(UNSUPERVISED)
    return paths


def _no_labels_error(method: str) -> ValueError:
    return ValueError(
        f"{method} is supervised-only and no labels were given. Give relevance labels (--pairs FILE or --qrels FILE with "
        f"query vectors, or a BEIR folder with qrels/<split>.tsv), or pick a method that fits without labels: "
        f"{', '.join(m for m in unsupervised_methods() if m != 'frozen')}."
    )


def _val_ids(val_split: str | Path, data: str | Path | None, labels: str | Path | None) -> tuple[list[str], dict[str, dict[str, int]], str]:
    """Validation query ids and qrels from a labels file, or from a qrels split of the BEIR folder."""
    if Path(val_split).is_file() or labels is not None or data is None:
        qrels = read_labels(val_split)
        source = str(val_split)
    else:
        dataset = load_beir(data, str(val_split))
        qrels, source = dataset.qrels, f"{dataset.source}/qrels/{val_split}.tsv"
    ids = [qid for qid, docs in qrels.items() if any(rel > 0 for rel in docs.values())]
    return ids, qrels, source


def _ranked_holdout(ids: Sequence[str], fraction: float, seed: int, qrels: dict[str, dict[str, int]] | None = None) -> list[str]:
    """About ``round(fraction · n)`` ids (at least 1, at most n − 1) held out for selection.

    With ``qrels``, whole groups of queries that share positives (:func:`~embedtune.compress.holdout.holdout_ids`),
    so the held-out positives are never fitted and selection cannot reward memorising them;
    without, the first by ``sha256(f"{seed}:{id}")``.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1); got {fraction!r}.")
    if len(ids) < 2:
        raise ValueError(f"val_fraction holds out labelled queries for epoch selection, but there are only {len(ids)}.")
    n = min(len(ids) - 1, max(1, round(len(ids) * fraction)))
    if qrels is None:
        return rank_by_hash(ids, seed)[:n]
    return holdout_ids(list(ids), qrels, n, seed, what="compress fit --val-fraction")


def _labelled_experiment(
    data: str | Path | None, model: str, split: str, labels: str | Path | None, vectors: dict[str, Any],
    encoder_options: Mapping[str, Any] | None, cache: bool, seed: int,
) -> Experiment:
    """Every labelled query in ``train`` (split fractions 1/0/0); val is set by the caller."""
    return load_experiment(data=None if labels is not None else data, model=model, qrels_split=split, split_seed=seed,
                           fractions=(1.0, 0.0, 0.0), encoder_options=dict(encoder_options or {}), cache=cache, labels=labels,
                           **vectors)


def _has_labels(data: str | Path | None, split: str, labels: str | Path | None, unsupervised: bool) -> bool:
    if unsupervised:
        return False
    if labels is not None:
        return True
    if data is None:
        return False
    available = qrels_splits(data)
    if split in available:
        return True
    if available:
        raise FileNotFoundError(
            f"{data}: no qrels/{split}.tsv to fit on; available splits: {available}. Pass --split with one of them, "
            "or --unsupervised to fit on the corpus alone."
        )
    return False


def _corpus(data: str | Path | None, model: str, vectors: dict[str, Any], encoder_options: Mapping[str, Any] | None,
            cache: bool) -> tuple[list[str], np.ndarray, dict[str, Any], Experiment]:
    """Document ids, unit-row vectors, their provenance and the corpus experiment (its texts) for the unsupervised path."""
    given = vectors.get("doc_embeddings") is not None
    corpus = load_corpus_experiment(None if given else data, model, encoder_options, cache,
                                    vectors.get("doc_embeddings"), vectors.get("doc_ids"))
    provenance = dict(corpus.provenance)
    if not given:
        provenance["data"] = dict(corpus.dataset.fingerprints)
    return list(corpus.embeddings.doc_ids), corpus.embeddings.doc_embeddings, provenance, corpus


#: The unsupervised DIVE settings that read the documents' pseudo-queries, and how to fit without them.
_PSEUDO_QUERY_SETTINGS = "selection_signal='pseudo-queries', training_guard='pseudo-queries' and pseudo_query_weight > 0"
_WITHOUT_PSEUDO_QUERIES = "--set selection_signal=rank-kl, training_guard=none and pseudo_query_weight=0"


def training_guard_note(method: str, fit_details: Any) -> str | None:
    """The line to say where DIVE's training guard set aside the epoch selection kept (None elsewhere): the fit is then its
    PCA start, but not because no trained epoch beat it, which is what a fit at epoch 0 says otherwise."""
    guard = fit_details.get("training_guard") if isinstance(fit_details, Mapping) else None
    if not isinstance(guard, Mapping) or guard.get("kept") != "start" or "p_one_sided" not in guard:
        return None
    return (f"{method}: the training guard kept the {guard['start']} PCA start: the held-out documents' pseudo-queries scored "
            f"epoch {guard['selected_epoch']} {guard['mean_difference']:+.4f} nDCG@10 above it, one-sided p "
            f"{guard['p_one_sided']:.3f} over {guard['n_pseudo_queries']}, not below {guard['p_threshold']}.")


def _selects_on_pseudo_queries(config: Any) -> bool:
    """Whether the fit reads the held-out documents' pseudo-queries (to select on them, or to guard its training)."""
    return getattr(config, "selection_signal", None) == "pseudo-queries" or getattr(config, "training_guard", "none") == "pseudo-queries"


def _sampled_corpus(compressor: Compressor, data: str | Path | None, vectors: dict[str, Any],
                    encoder_options: Mapping[str, Any] | None) -> tuple[list[str], np.ndarray, dict[str, Any], int] | None:
    """The rows a sample-fitting method reads from given ``.npy`` vectors, read alone; None when the whole corpus is read.

    A method that names its rows (:meth:`~embedtune.compress.base.Compressor.fit_rows`: PCA's
    sample) is handed only those rows, so its fit costs the same at 3M rows as at 100k and equals
    the fit on the whole file. Returns ``(ids, unit-row vectors, provenance, corpus rows)``.
    """
    path, ids_file = vectors.get("doc_embeddings"), vectors.get("doc_ids")
    if path is None or ids_file is None or data is not None or Path(path).suffix != ".npy" or not Path(path).is_file():
        return None
    if _selects_on_pseudo_queries(compressor.config):
        return None  # selection reads the held-out documents' texts: the whole-corpus path
    try:
        n_rows, dim = embedding_file_shape(path)
    except (ValueError, OSError):
        return None  # the whole-corpus reader names what is wrong with the file
    rows = compressor.fit_rows(n_rows, dim)
    if rows is None:
        return None
    ids, docs, record = load_embedding_rows(path, ids_file, rows)
    if (encoder_options or {}).get("normalize", True):
        docs = unit_rows(docs)
    provenance = {"model": PRECOMPUTED_MODEL, "vectors": record.pop("ids"), "vector_rows": record}
    return ids, docs, provenance, int(n_rows)


def fit_on_all(
    method: str = "dive",
    dim: int = 128,
    *,
    data: str | Path | None = None,
    model: str = "minilm",
    split: str = "train",
    labels: str | Path | None = None,
    doc_embeddings: str | Path | None = None,
    doc_ids: str | Path | None = None,
    query_embeddings: str | Path | None = None,
    query_ids: str | Path | None = None,
    unsupervised: bool = False,
    val_split: str | Path | None = None,
    val_fraction: float | None = None,
    preset: str | Preset | None = None,
    settings: Mapping[str, Any] | None = None,
    mining: MiningOptions | Mapping[str, Any] | None = None,
    seed: int = 2027,
    encoder_options: Mapping[str, Any] | None = None,
    cache: bool = True,
    out: str | Path | None = None,
    pseudo_queries: str | None = None,
) -> FitResult:
    """Fit ``method`` at ``dim`` on every query and document given; save it to ``out``.

    Args:
        method: the registry name of the compressor.
        dim: the output dimension k.
        data: a BEIR folder (or ``.zip``, or ``"scifact"``); its ``qrels/<split>.tsv`` are the labels.
        model: the encoder of ``data`` (ignored for given vectors).
        split: the qrels split of ``data`` to fit on.
        labels: a pairs file or qrels TSV for given query/doc vectors (replaces ``data``).
        doc_embeddings, doc_ids, query_embeddings, query_ids: precomputed vectors and their ids.
        unsupervised: fit on the corpus alone even when labels exist.
        val_split: queries held out for best-epoch selection only: a labels file, or a qrels
            split name of ``data``.
        val_fraction: or this fraction of the labelled queries (ranked by sha256 of seed and id).
        preset: the method's preset (default: its own; supervised methods: the safety net).
        settings: config fields over the preset's.
        mining: triplet mining changes over the preset's.
        seed: training, mining and hold-out seed.
        encoder_options: :class:`SentenceEncoder` options; ``normalize=False`` keeps raw vectors.
        cache: use the embedding cache when encoding.
        out: the folder to write the compressor and ``fit.json`` to.
        pseudo_queries: ``title``, ``first-sentence`` or ``none``: the training-only pseudo-queries
            (default: the preset's; skipped with a note on given vectors, which carry no text). On
            the unsupervised path with DIVE's ``selection_signal='pseudo-queries'``: the source of
            the held-out documents' pseudo-queries it selects on (default ``title``).

    Returns:
        A :class:`FitResult`.
    """
    cls = get_compressor_class(method)
    if val_split is not None and val_fraction is not None:
        raise ValueError("give --val-split or --val-fraction, not both.")
    vectors = {"doc_embeddings": doc_embeddings, "doc_ids": doc_ids, "query_embeddings": query_embeddings, "query_ids": query_ids}
    if labels is not None and query_embeddings is None:
        raise ValueError(f"{labels}: labels need query vectors: pass --query-embeddings and --query-ids (and the doc vectors).")
    labelled = _has_labels(data, split, labels, unsupervised)
    chosen = resolve_preset(method, preset)
    overrides = {**chosen.settings, **(settings or {})}
    notes: list[str] = []
    start = time.perf_counter()
    info: dict[str, Any] = {"embedtune_version": __version__, "method": method, "dim": dim, "seed": seed}

    if labelled and cls.supervised:
        path = SUPERVISED
        experiment = _labelled_experiment(data, model, split, labels, vectors, encoder_options, cache, seed)
        all_ids = experiment.part_ids("train")
        val_ids: list[str] = []
        if val_split is not None:
            val_ids, val_qrels, val_source = _val_ids(val_split, data, labels)
            require_ids(experiment.embeddings.query_ids, val_ids, query_ids or query_embeddings or f"{data} queries", val_source, "query")
            # A positive without a vector can never be retrieved: selection would score against it.
            positives = [doc for qid in val_ids for doc, rel in val_qrels[qid].items() if rel > 0]
            require_ids(experiment.embeddings.doc_ids, positives, doc_ids or doc_embeddings or f"{data} corpus", val_source, "document")
            experiment.dataset.qrels.update({qid: val_qrels[qid] for qid in val_ids})
            info["val"] = {"source": val_source, "queries": len(val_ids)}
        elif val_fraction is not None:
            val_ids = _ranked_holdout(all_ids, val_fraction, seed, experiment.qrels_for(all_ids))
            info["val"] = {"fraction": val_fraction, "queries": len(val_ids), "rule": "whole groups of queries that share positives"}
        held = set(val_ids)
        train_ids = [qid for qid in all_ids if qid not in held]
        experiment.split = QuerySplit(train=train_ids, val=list(val_ids), test=[], seed=seed, fractions=(1.0, 0.0, 0.0),
                                      dataset=experiment.dataset.name, qrels_split=experiment.dataset.split,
                                      fingerprints=dict(experiment.dataset.fingerprints))
        triplet_mining = chosen.mining if mining is None else (mining if isinstance(mining, MiningOptions) else chosen.mining.replace(**dict(mining)))
        triplets = shared_triplets(experiment, "train", triplet_mining, seed)
        require_mined_triplets(experiment, "train", triplets, triplet_mining)
        if val_ids:
            if "epoch_selection" in {f for f in cls.config_class.__dataclass_fields__}:
                overrides["epoch_selection"] = "val"  # the held-out queries select the epoch; they are never trained on
            else:
                notes.append(f"{method} does not select an epoch, so the held-out queries are not used.")
        compressor = cls(build_config(method, dim, seed, overrides))
        train = training_data(experiment, "train", triplets)
        train.pseudo_queries, pseudo_note = recipe_pseudo_queries(experiment, method, pseudo_queries, chosen.pseudo_queries,
                                                                  triplet_mining, seed)
        if pseudo_note:
            notes.append(pseudo_note)
        if train.pseudo_queries is not None:
            info["pseudo_queries"] = {"source": train.pseudo_queries.source, "n_queries": len(train.pseudo_queries.ids),
                                      "n_triplets": int(len(train.pseudo_queries.triplets))}
        val = training_data(experiment, "val") if val_ids else None
        log_path = Path(out) / "training_log.jsonl" if out is not None else None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.unlink(missing_ok=True)
        compressor.fit(train, val, log_path=log_path)
        info["labels"] = {"source": str(labels) if labels is not None else f"{experiment.dataset.source}/qrels/{split}.tsv",
                          "queries": len(all_ids), "train_queries": len(train_ids)}
        info["triplets"] = {"negatives": triplet_mining.negatives, "n_negatives": triplet_mining.n_negatives,
                            **triplet_mining.non_default(), "n_triplets": int(len(triplets))}
        info["provenance"] = experiment.provenance
        n_docs = len(experiment.embeddings.doc_ids)
    else:
        path = UNSUPERVISED
        if cls.supervised and not cls.supports_unsupervised:
            raise _no_labels_error(method)
        if labelled:
            notes.append(f"{method} reads no labels: it is fitted on the corpus alone.")
        if val_split is not None or val_fraction is not None:
            notes.append("no labelled queries are used on the unsupervised path, so --val-split/--val-fraction are ignored.")
        unsupervised_preset = getattr(cls, "unsupervised_preset", None)
        text_default = False  # the method's text preset was chosen here: it gives way to the plain one where the text gives none
        if preset is None and cls.supervised and unsupervised_preset is not None:
            # A supervised method's own unsupervised recipe, not its (labelled) default preset.
            name, text_preset = unsupervised_preset, cls.unsupervised_text_preset
            if text_preset is not None:
                if vectors.get("doc_embeddings") is None and data is not None and pseudo_queries != "none":
                    name, text_default = text_preset, True
                else:
                    why = "--pseudo-queries none asks for none" if pseudo_queries == "none" else "these vectors were given without it"
                    notes.append(f"{method}: fitted with its {unsupervised_preset!r} preset; {text_preset!r}, the default where the "
                                 f"documents' text is at hand, makes pseudo-queries from it, and {why}.")
            chosen = cls.get_preset(name)
            overrides = {**chosen.settings, **(settings or {})}
        compressor = cls(build_config(method, dim, seed, overrides))
        sampled = _sampled_corpus(compressor, data, vectors, encoder_options)
        if sampled is not None:
            ids, docs, provenance, n_docs = sampled
            corpus_experiment = None
            notes.append(f"{method} fits on a sample of {len(ids):,} of the {n_docs:,} rows; only those rows were read.")
        else:
            ids, docs, provenance, corpus_experiment = _corpus(data, model, vectors, encoder_options, cache)
            n_docs = len(ids)
        corpus = TrainingData.corpus_only(docs, ids)
        selects_on_them = _selects_on_pseudo_queries(compressor.config)
        trains_on_them = getattr(compressor.config, "pseudo_query_weight", 0) > 0
        if selects_on_them or trains_on_them:
            if pseudo_queries == "none":
                raise ValueError(f"{_PSEUDO_QUERY_SETTINGS} read the documents' pseudo-queries; drop --pseudo-queries none (or give "
                                 f"title or first-sentence), or use {_WITHOUT_PSEUDO_QUERIES}.")
            source = pseudo_queries or "title"
            if corpus_experiment is None:  # the sampled route read vectors only: there is no text to make them from
                raise EmbedtuneError(f"pseudo-queries ({_PSEUDO_QUERY_SETTINGS}) are made from the documents' text and encoded by "
                                     "their model; a fit on a sample of given vectors has neither. Fit from the corpus (--data CORPUS "
                                     f"--model MODEL), or use {_WITHOUT_PSEUDO_QUERIES}.")
            # Selection reads the held-out documents' pseudo-queries, the anchors the training sample's (the fit keeps them
            # apart): only those are made, so a large corpus costs no more than its sample.
            held_out, wanted = pseudo_query_documents(compressor, ids, trains_on_them)
            made: PseudoQueries | None = None
            if text_default:
                made, source = text_preset_pseudo_queries(corpus_experiment, held_out, wanted, pseudo_queries, cache)
                if made is None:
                    chosen = cls.get_preset(unsupervised_preset)
                    overrides = {**chosen.settings, **(settings or {})}
                    compressor = cls(build_config(method, dim, seed, overrides))
                    notes.append(f"{method}: fitted with its {unsupervised_preset!r} preset: no held-out document's text gives a "
                                 f"pseudo-query shorter than the document (tried {source}), and {cls.unsupervised_text_preset!r}, "
                                 "the default where the text is at hand, reads them.")
                    trains_on_them = getattr(compressor.config, "pseudo_query_weight", 0) > 0
                    if trains_on_them or _selects_on_pseudo_queries(compressor.config):  # the user's settings read them: say why
                        held_out, wanted = pseudo_query_documents(compressor, ids, trains_on_them)
                        source = pseudo_queries or "title"
                        made = selection_pseudo_queries(corpus_experiment, wanted, source, cache=cache)
            else:
                made = selection_pseudo_queries(corpus_experiment, wanted, source, cache=cache)
            if made is not None:
                corpus = dataclasses.replace(corpus, pseudo_queries=made)
                info["selection_pseudo_queries" if not trains_on_them else "pseudo_queries"] = {
                    "source": source, "n_queries": len(made.ids), "held_out_documents": len(held_out)}
        elif pseudo_queries not in (None, "none"):
            notes.append("--pseudo-queries on the unsupervised path names the source of the pseudo-queries selected on "
                         "(--set selection_signal=pseudo-queries); with this selection they are not used.")
        log_path = Path(out) / "training_log.jsonl" if out is not None else None
        if cls.supervised:
            compressor.fit_unsupervised(corpus, log_path=log_path)
        else:
            compressor.fit(corpus, log_path=log_path)
        info["provenance"] = provenance
    info["path"] = path
    info["preset"] = chosen.name
    info["config"] = compressor.config.to_dict()
    info["fit_details"] = compressor.fit_details()  # e.g. the rows a PCA was fitted on
    info["documents"] = n_docs
    info["input_dim"] = compressor.input_dim_
    info["fit_seconds"] = round(time.perf_counter() - start, 3)
    epoch = getattr(compressor, "selected_epoch_", None)
    info["selected_epoch"] = epoch
    notes.insert(0, f"{method}: {path} path ({'relevance labels given' if labelled else 'no labels'}; "
                    f"{method} supports {' and '.join(supported_paths(method))}).")
    guard_note = training_guard_note(method, info["fit_details"])
    notes += [guard_note] if guard_note else training_notes(method, [epoch] if epoch is not None else None)
    if chosen.name == "static-corpus" and describe_method(method).module.startswith("embedtune.compress.dive"):
        from embedtune.compress.dive import STATIC_CORPUS_WARNING  # DIVE's module (torch): only where its preset was chosen

        logger.warning(STATIC_CORPUS_WARNING)
        notes.append(STATIC_CORPUS_WARNING)
    info["notes"] = notes
    out_path = None
    if out is not None:
        out_path = Path(out)
        compressor.save(out_path)
        atomic_write_json(out_path / FIT_INFO_NAME, info)
    return FitResult(compressor, path, info, out_path, notes)
