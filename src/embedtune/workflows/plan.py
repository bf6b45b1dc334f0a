"""Quality per byte: sweep (compressor × dimension × precision), find the Pareto frontier, and plan a deployment.

The library engine behind ``embedtune compress plan`` and ``benchmarks/frontier.py``:

- :func:`fit_or_load` fits one compressor through :func:`embedtune.workflows.fit_compressor`
  (the method's default preset: DIVE's ``robust``) or reloads it from a previous run's folder;
- :func:`precision_rows` scores one compressed space at every precision: nDCG@10, Recall@10,
  per-query nDCG@10 (for paired tests), bytes in RAM and on disk, fixed bytes, and the batched
  search latency, all precisions timed side by side in the same rounds;
- :mod:`embedtune.workflows.pareto` reads the rows (the frontier, the best within a budget, the
  choice), and :mod:`embedtune.workflows.frontier_plot` draws them;
- :func:`run_plan` evaluates the sweep on validation queries only, picks the cheapest setting
  meeting a retention target (or the best within a byte budget), refits it on train+val and
  writes a deployable folder (the format: :mod:`embedtune.index.plan_format`; the codecs it
  scores with are the deployed ones, :mod:`embedtune.index.codecs`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedtune import __version__
from embedtune.compress import Compressor, get_compressor_class, load_compressor
from embedtune.compress.csr import sparse_code_bytes
from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.subsets import query_subsets, subset_means, training_positives
from embedtune.evaluate.search import run_from_topk
from embedtune.encoders.paths import cache_root
from embedtune.errors import EmbedtuneError
from embedtune.index.codecs import Precision, QuantizedIndex
from embedtune.index.deployment import deployment_recipe
from embedtune.index.plan_format import PLAN_FILE, load_plan, write_plan
from embedtune.io import (
    atomic_write,
    read_json_verified,
    sha256_file,
    sha256_json,
    verify_sha256,
    write_json_with_digest,
)
from embedtune.locks import exclusive_lock
from embedtune.result_files import find_results, results_details
from embedtune.runtime import progress_bar
from embedtune.workflows.experiment import Experiment, training_data
from embedtune.workflows.frontier_plot import plot_frontier
from embedtune.workflows.pareto import choose, pareto_frontier
from embedtune.workflows.train_compressor import fit_compressor, resolve_preset

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PRECISIONS",
    "DEFAULT_PEERS",
    "QUANTISER_PEERS",
    "Candidate",
    "VARIANTS",
    "candidate_for",
    "sweep_dims",
    "method_settings",
    "fit_or_load",
    "fit_key",
    "experiment_fingerprint",
    "precision_rows",
    "QuerySet",
    "score_precisions",
    "peer_factories",
    "csr_peer_rows",
    "faiss_cache_dir",
    "load_faiss_cache",
    "save_faiss_cache",
    "run_plan",
]

DEFAULT_PRECISIONS = ("float32", "float16", "int8", "binary", "binary-asym", "binary-rescore")
DEFAULT_PEERS = ("pq", "opq", "pq-fs", "rabitq", "turboquant", "int4")
#: Peer kinds that are built-in precisions of the frozen vectors (FAISS RaBitQ, TurboQuant, SQ4), not factory strings.
QUANTISER_PEERS: dict[str, tuple[str, ...]] = {
    "rabitq": ("rabitq1", "rabitq1-rescore", "rabitq4"),
    "turboquant": ("turboquant1", "turboquant4"),
    "int4": ("int4",),
}
# The largest code each peer family is trained at: beyond 64 B int8 is lossless already; OPQ trains its
# rotation with 8-bit PQ many times over (minutes per code on a small CPU), so only up to 32 B.
PEER_MAX_BYTES = {"pq": 64, "pq-fs": 64, "ivf-pq-fs": 64, "opq": 32}
#: The learned peer kind: CSR (sentence-transformers' sparse autoencoder), fitted on the corpus alone, at the budgets
#: between these bytes that its k (index, fp16 value) pairs fill. Not a default peer: each budget is one fit.
CSR_PEER_BYTES = (16, 128)
CSR_LATENT_MULTIPLE = 4  # m = 4d latents, the width the CSR paper and s-t's examples use
_FIT_KEY = "key.json"


@dataclass(frozen=True)
class Candidate:
    """One compressor of the sweep: a method at a dimension, with an optional named variant.

    ``variant`` names extra config ``settings`` (e.g. ``qat-binary`` for
    ``{"quantization_aware": "binary"}``); ``default`` means the method's own preset.
    """

    method: str
    dim: int
    variant: str = "default"
    settings: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.method}{'' if self.variant == 'default' else '+' + self.variant}-{self.dim}"


#: Named config variants a sweep can add beside a method's default (methods whose config has the field).
VARIANTS: dict[str, dict[str, Any]] = {"qat-binary": {"quantization_aware": "binary"}, "qat-int8": {"quantization_aware": "int8"}}


def _check_variant(variant: str) -> None:
    if variant != "default" and variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}.")


def candidate_for(method: str, dim: int, variant: str = "default") -> Candidate:
    """The :class:`Candidate` of ``method`` at ``dim`` with the settings of the named ``variant``."""
    _check_variant(variant)
    return Candidate(method, dim, variant, tuple(sorted(VARIANTS.get(variant, {}).items())))


def variant_applies(method: str, variant: str) -> bool:
    """Whether ``method``'s config has every field the ``variant`` sets."""
    fields = {f.name for f in dataclasses.fields(get_compressor_class(method).config_class)}
    return set(VARIANTS[variant]) <= fields


def sweep_dims(input_dim: int, fractions: Sequence[int] = (1, 2, 3, 6, 12)) -> list[int]:
    """``d, d/2, d/3, d/6, d/12`` (rounded down, distinct, at least 8)."""
    return sorted({max(8, input_dim // f) for f in fractions}, reverse=True)


def method_settings(method: str, dim: int, input_dim: int) -> dict[str, Any]:
    """Settings a method needs at a dimension beyond its preset: its ``wide_output_settings`` when ``k > d/2``
    (DIVE: room for one head only, so no view loss, which needs two)."""
    wide = get_compressor_class(method).wide_output_settings
    return dict(wide) if wide and 2 * dim > input_dim else {}


#: Fewer training points than this per centroid and a plan leaves out the 8-bit PQ/OPQ peers (FAISS itself warns below 39).
MIN_POINTS_PER_CENTROID = 4


def peer_factories(input_dim: int, budgets: Sequence[int], kinds: Sequence[str] = DEFAULT_PEERS, n_train: int | None = None) -> list[str]:
    """FAISS ``index_factory`` strings at code sizes equal to ``budgets`` (bytes) that divide ``input_dim``.

    ``pq``: ``PQm`` (m bytes, 8 bits per sub-quantizer); ``opq``: ``OPQm,PQm``; ``pq-fs``:
    ``PQ{2m}x4fs`` (fast-scan, 4 bits); ``ivf-pq-fs``: ``IVFn,PQ{2m}x4fs`` with ``n`` fitted to
    ``n_train`` (39 training points per list at least; its 8-byte ids count as RAM). With
    ``n_train``, the 8-bit codes (``pq``, ``opq``: 256 centroids per sub-quantizer) are left out
    below :data:`MIN_POINTS_PER_CENTROID` training points per centroid: such a codebook is mostly
    cells of one point, and OPQ spent over 9 CPU-minutes per plan fitting them on 400 documents
    (4-bit fast-scan codes, 16 centroids, stay).
    """
    factories = []
    for budget in budgets:
        for kind in kinds:
            if kind in QUANTISER_PEERS or kind == "csr":  # precisions or codes of their own bytes, not factory strings
                continue
            if kind in ("pq", "opq") and n_train is not None and n_train < MIN_POINTS_PER_CENTROID * 256:
                continue
            if kind in ("pq", "opq") and input_dim % budget == 0:
                factories.append(f"PQ{budget}" if kind == "pq" else f"OPQ{budget},PQ{budget}")
            elif kind == "pq-fs" and input_dim % (2 * budget) == 0:
                factories.append(f"PQ{2 * budget}x4fs")
            elif kind == "ivf-pq-fs" and budget > 8 and input_dim % (2 * (budget - 8)) == 0:
                nlist = max(1, min(1024, (n_train or 39 * 64) // 39))
                factories.append(f"IVF{nlist},PQ{2 * (budget - 8)}x4fs")
            elif kind not in ("pq", "opq", "pq-fs", "ivf-pq-fs"):
                raise ValueError(f"unknown peer kind {kind!r}; valid: pq, opq, pq-fs, ivf-pq-fs, {', '.join(QUANTISER_PEERS)}, csr.")
    return factories


def csr_peer_rows(fitted: Experiment, experiment: Experiment, budgets: Sequence[int], seed: int = 2027, work: str | Path | None = None,
                  data: Mapping[str, Any] | None = None, rounds: int = 3) -> list[dict[str, Any]]:
    """CSR, fitted on ``fitted``'s corpus without labels, at each budget of :data:`CSR_PEER_BYTES` its codes fill, scored on ``experiment``'s val.

    A row's bytes are the sparse code's, ``k × (index bytes + 2)`` (:func:`embedtune.compress.csr.sparse_code_bytes`),
    and its search is exact over the densified k-sparse codes, the documents' values at fp16 (``SQfp16``): the
    ranking a sparse store of those pairs gives. The rows are peers on the frontier, never the plan's choice
    (``choosable`` False): the deployed index has no sparse store yet, so a chosen CSR would not hold its bytes.
    """
    latent_dim = CSR_LATENT_MULTIPLE * experiment.embeddings.dim
    pair_bytes = sparse_code_bytes(1, latent_dim)
    rows: list[dict[str, Any]] = []
    for budget in sorted(set(budgets)):
        active = budget // pair_bytes
        if not CSR_PEER_BYTES[0] <= budget <= CSR_PEER_BYTES[1] or budget % pair_bytes or 4 * active > latent_dim:
            continue
        candidate = Candidate("csr", latent_dim, f"k{active}", (("active", active),))
        compressor, fit_s = fit_or_load(fitted, candidate, seed, final=False, work=work, data=data)
        for row in precision_rows(experiment, "val", compressor, ["float16"], rounds=rounds,
                                  labels={"method": "csr", "variant": candidate.variant, "family": "CSR (learned peer)",
                                          "candidate": candidate.name, "fit_s": fit_s}):
            code_bytes = sparse_code_bytes(active, latent_dim)
            row.update(precision="sparse-fp16", setting=f"{candidate.name}/sparse-fp16", ram_bytes=code_bytes, disk_bytes=code_bytes,
                       choosable=False)
            rows.append(row)
    return rows


# -- fitting ---------------------------------------------------------------------------------
def experiment_fingerprint(experiment: Experiment) -> dict[str, Any]:
    """sha256 of everything in ``experiment`` that shapes a fit: the vectors, their ids, the labels, the split, the similarity."""
    def array_sha(x: np.ndarray) -> str:
        x = np.ascontiguousarray(x, dtype=np.float32)
        digest = hashlib.sha256(f"{x.shape}".encode())
        for start in range(0, len(x), 65536):
            digest.update(x[start : start + 65536].tobytes())
        return digest.hexdigest()

    split = experiment.split
    return {
        "doc_embeddings": array_sha(experiment.embeddings.doc_embeddings),
        "query_embeddings": array_sha(experiment.embeddings.query_embeddings),
        "doc_ids": sha256_json(list(experiment.embeddings.doc_ids)),
        "query_ids": sha256_json(list(experiment.embeddings.query_ids)),
        "qrels": sha256_json(experiment.dataset.qrels),
        "split": sha256_json({"train": list(split.train), "val": list(split.val), "test": list(split.test)} if split is not None else None),
        "similarity": experiment.similarity,
    }


def fit_key(experiment: Experiment, candidate: Candidate, seed: int, final: bool, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything a cached fit of ``candidate`` depends on: the data's fingerprints, the split part, the method, its settings, the seed."""
    settings = {**method_settings(candidate.method, candidate.dim, experiment.embeddings.dim), **dict(candidate.settings)}
    # The fit runs the method's default preset under these settings: a changed recipe refits.
    recipe = resolve_preset(candidate.method, None)
    preset = {"name": recipe.name, "settings": dict(recipe.settings), "mining": dataclasses.asdict(recipe.mining),
              "pseudo_queries": recipe.pseudo_queries}
    return {
        "data": dict(data if data is not None else experiment_fingerprint(experiment)),
        "part": "train+val" if final else "train",
        "method": candidate.method,
        "dim": candidate.dim,
        "variant": candidate.variant,
        "preset": json.loads(json.dumps(preset, sort_keys=True, default=str)),
        "settings": json.loads(json.dumps(settings, sort_keys=True, default=str)),
        "seed": seed,
        "embedtune_version": __version__,
    }


def _differing(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    fields = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            fields += _differing(a, b, f"{prefix}{key}.")
        elif a != b:
            fields.append(f"{prefix}{key}")
    return fields


def fit_or_load(
    experiment: Experiment,
    candidate: Candidate,
    seed: int,
    final: bool,
    work: str | Path | None = None,
    data: Mapping[str, Any] | None = None,
) -> tuple[Compressor, float]:
    """The fitted compressor of ``candidate`` (and its fit seconds), fitted through :func:`fit_compressor`.

    ``final``: train+val (scored on test later); otherwise train only (scored on val). With
    ``work``, the fit lives at ``WORK/<train part>/<candidate>/s<seed>/`` with ``key.json``, what
    it was fitted on (:func:`fit_key`: the fingerprints of the vectors, ids, labels and split, the
    settings and the seed), and is reloaded from there only when that key is this run's and the
    compressor is intact; otherwise it is refitted, with a note naming the fields that differ.
    ``data``: :func:`experiment_fingerprint` of ``experiment``, when the caller has it already.
    """
    folder = None
    key = None
    if work is not None:
        folder = Path(work) / ("train+val" if final else "train") / candidate.name / f"s{seed}"
        key = fit_key(experiment, candidate, seed, final, data)
        cached = _cached_fit(folder, candidate, key)
        if cached is not None:
            return cached
    input_dim = experiment.embeddings.dim
    settings = {**method_settings(candidate.method, candidate.dim, input_dim), **dict(candidate.settings)}
    result = fit_compressor(experiment, candidate.method, candidate.dim, seeds=[seed], final=final, settings=settings or None,
                            out=folder, labels={"candidate": candidate.name})
    run = result.runs[candidate.method][0]
    if folder is not None and run.compressor is not None:
        write_json_with_digest(folder / _FIT_KEY, {**key, "state_sha256": run.compressor.state_sha256()})  # type: ignore[dict-item]
    return run.compressor, run.fit_seconds  # type: ignore[return-value]


def _cached_fit(folder: Path, candidate: Candidate, key: dict[str, Any]) -> tuple[Compressor, float] | None:
    """The fit in ``folder`` when it was made from ``key`` and loads intact; else None (and the folder is cleared for a refit)."""
    if find_results(folder) is None:  # results.json, or an older sweep's report.json
        return None
    reason = None
    try:
        recorded, _ = read_json_verified(folder / _FIT_KEY, "", require_digest=True) if (folder / _FIT_KEY).is_file() else (None, False)
        if recorded is None:
            reason = f"it has no {_FIT_KEY} (written by an older embedtune), so what it was fitted on is unknown"
        else:
            differing = _differing({k: v for k, v in recorded.items() if k != "state_sha256"}, key)
            if differing:
                reason = f"it was fitted on other inputs or settings (differing: {', '.join(differing)})"
            else:
                compressor = load_compressor(folder / candidate.method)
                if compressor.state_sha256() != recorded.get("state_sha256"):
                    reason = "its compressor is not the one recorded in key.json"
                else:
                    report = results_details(folder) or {}
                    return compressor, float(report["results"][candidate.method]["summary"]["fit_s"])
    except (OSError, ValueError, KeyError, TypeError) as error:  # damaged files: refit
        reason = f"its files are damaged ({error})"
    logger.warning("%s: refitting %s: %s", folder, candidate.name, reason)
    shutil.rmtree(folder, ignore_errors=True)
    return None


# -- scoring at every precision --------------------------------------------------------------
def precision_rows(
    experiment: Experiment,
    part: str,
    compressor: Compressor | None,
    precisions: Sequence[str | Precision] = DEFAULT_PRECISIONS,
    top_k: int = 100,
    rounds: int = 5,
    time_reference: bool = True,
    labels: Mapping[str, Any] | None = None,
    prebuilt: dict[str, tuple[QuantizedIndex, float]] | None = None,
    progress: Callable[[int], object] | None = None,
) -> list[dict[str, Any]]:
    """Score ``compressor``'s space (None: the frozen vectors) at each precision on the queries of ``part``.

    Every row holds ``ndcg@10``, ``recall@10``, ``per_query`` (nDCG@10 by query id), ``ram_bytes``
    and ``disk_bytes`` per vector, ``fixed_bytes`` (tables that do not grow with the corpus),
    ``build_s`` and ``latency_ms``: the median over ``rounds`` of one batched search of all the
    queries, every precision (and, with ``time_reference``, exact float32 search of the
    uncompressed vectors) timed once per round in rotating order, so they share the machine's
    noise; ``latency_vs_reference`` is the ratio to that reference's median in the same rounds.

    ``prebuilt`` (precision name -> (index, build seconds)) reuses indexes built on the same vectors
    before (e.g. FAISS PQ on the frozen corpus for validation and then test queries), and
    receives the ones built here. ``progress`` is called with 1 after each index is built or reused
    (e.g. the ``update`` of a bar over a larger job).
    """
    ids = experiment.part_ids(part)
    qrels = experiment.qrels_for(ids)
    ids = [qid for qid in ids if qrels.get(qid)]
    queries = QuerySet(ids, experiment.embeddings.queries(ids), qrels, part)
    return score_precisions(queries, experiment.embeddings.doc_ids, experiment.embeddings.doc_embeddings, compressor, precisions,
                            top_k=top_k, rounds=rounds, time_reference=time_reference, labels=labels, prebuilt=prebuilt, progress=progress)


@dataclass(frozen=True)
class QuerySet:
    """Queries to score a sweep on: ids, their uncompressed vectors (row-aligned), and the judgments they are scored against.

    ``judgments`` are labelled qrels, or label-free targets (the uncompressed model's top-10 of
    each query, or a pseudo-query's own document; see :mod:`embedtune.workflows.label_free`).
    ``part`` is what the rows record as ``queries``. With ``ignore_identical_ids`` a retrieved
    document whose id is the query's is dropped, as BEIR does (a corpus document used as a query
    never finds itself).
    """

    ids: list[str]
    vectors: np.ndarray
    judgments: Mapping[str, Mapping[str, int]]
    part: str
    ignore_identical_ids: bool = True

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.vectors):
            raise ValueError(f"{len(self.ids)} query ids but {len(self.vectors)} query vectors.")


def score_precisions(
    queries: QuerySet,
    doc_ids: Sequence[str],
    doc_embeddings: np.ndarray,
    compressor: Compressor | None,
    precisions: Sequence[str | Precision] = DEFAULT_PRECISIONS,
    top_k: int = 100,
    rounds: int = 5,
    time_reference: bool = True,
    labels: Mapping[str, Any] | None = None,
    prebuilt: dict[str, tuple[QuantizedIndex, float]] | None = None,
    progress: Callable[[int], object] | None = None,
    per_query_metric: str = "ndcg@10",
) -> list[dict[str, Any]]:
    """:func:`precision_rows` on any :class:`QuerySet` against the documents ``doc_ids`` (vectors ``doc_embeddings``).

    ``per_query`` holds ``per_query_metric`` (``ndcg@10`` or ``recall@10``) by query id.
    """
    if per_query_metric not in ("ndcg@10", "recall@10"):
        raise ValueError(f"per_query_metric must be ndcg@10 or recall@10; got {per_query_metric!r}.")
    ids, qrels = list(queries.ids), queries.judgments
    doc_ids = list(doc_ids)
    frozen_q = np.ascontiguousarray(queries.vectors, dtype=np.float32)
    frozen_b = np.ascontiguousarray(doc_embeddings, dtype=np.float32)
    xq, xb = (compressor.transform(frozen_q), compressor.transform(frozen_b)) if compressor is not None else (frozen_q, frozen_b)
    dim = xb.shape[1]
    fetch = top_k + 1  # one extra: identical query/doc ids are dropped, as BEIR does
    indexes: list[tuple[str, QuantizedIndex | None, np.ndarray]] = []
    builds: dict[str, float] = {}
    for spec in precisions:
        precision = Precision(spec) if isinstance(spec, str) else spec
        if prebuilt is not None and precision.name in prebuilt:
            index, builds[precision.name] = prebuilt[precision.name]
        else:
            start = time.perf_counter()
            index = QuantizedIndex.build(xb, precision)
            builds[precision.name] = time.perf_counter() - start
            if prebuilt is not None:
                prebuilt[precision.name] = (index, builds[precision.name])
        indexes.append((precision.name, index, xq))
        if progress is not None:
            progress(1)
    timed = list(indexes)
    if time_reference:
        timed.append(("__reference__", QuantizedIndex.build(frozen_b, "float32"), frozen_q))
    times: dict[str, list[float]] = {name: [] for name, _, _ in timed}
    results: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, index, rows_q in timed:  # warm-up (and the results, from the same call as the timing)
        results[name] = index.search(rows_q, fetch)  # type: ignore[union-attr]
    for round_index in range(rounds):
        shift = round_index % len(timed)
        for name, index, rows_q in timed[shift:] + timed[:shift]:
            start = time.perf_counter()
            index.search(rows_q, fetch)  # type: ignore[union-attr]
            times[name].append(time.perf_counter() - start)
    reference_ms = statistics.median(times["__reference__"]) * 1e3 if time_reference and rounds else None
    rows = []
    for name, index, _ in indexes:
        D, I = results[name]
        metrics = evaluate_run(qrels, run_from_topk(ids, D, I, doc_ids, top_k, queries.ignore_identical_ids), ("ndcg@10", "recall@10", "recall@100"))
        latency = statistics.median(times[name]) * 1e3 if rounds else None
        rows.append({
            **(labels or {}),
            "dim": dim,
            "precision": name,
            "ram_bytes": index.ram_bytes(),  # type: ignore[union-attr]
            "disk_bytes": index.disk_bytes(),  # type: ignore[union-attr]
            "fixed_bytes": index.fixed_bytes(),  # type: ignore[union-attr]
            "ndcg@10": metrics["ndcg@10"],
            "recall@10": metrics["recall@10"],
            "recall@100": metrics["recall@100"],
            "n_queries": metrics.n_queries,
            "queries": queries.part,
            "build_s": builds[name],
            "latency_ms": latency,
            "latency_queries": len(ids),
            "latency_vs_reference": (latency / reference_ms) if latency is not None and reference_ms else None,
            "per_query": {qid: round(values[per_query_metric], 6) for qid, values in metrics.per_query.items()},
        })
    return rows


#: The sweeps' shared home under the user cache (``$EMBEDTUNE_CACHE`` overrides it): one folder per data.
SWEEP_CACHE = "plan-sweeps"
#: The lock file in a sweep folder: one plan at a time sweeps there; a second waits, then reuses its fits.
SWEEP_LOCK = ".lock"


def default_sweep_dir(fingerprint: Mapping[str, Any]) -> Path:
    """Where a plan keeps its sweep when no ``work`` is given: ``<cache>/plan-sweeps/<sha256 of the fingerprint>``.

    Keyed by everything that shaped the fits (:func:`experiment_fingerprint`, or the corpus
    vectors' digest for a label-free plan), so two plans on the same data share their fits (the
    README's second and third plans take seconds, not the sweep again) and plans on other data
    never meet. Each fit inside is still reloaded only when its own ``key.json`` matches.
    """
    return cache_root() / SWEEP_CACHE / sha256_json(dict(fingerprint))[:16]


def vectors_sha256(vectors: np.ndarray) -> str:
    """sha256 of the float32 bytes of ``vectors``, row-major, read in blocks (no second copy of a large corpus)."""
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    digest = hashlib.sha256()
    for start in range(0, len(x), 65536):
        digest.update(x[start : start + 65536].tobytes())
    return digest.hexdigest()


def faiss_cache_dir(work: str | Path, doc_embeddings: np.ndarray | None = None, digest: str | None = None) -> Path:
    """Where FAISS indexes trained on this exact corpus are kept: ``WORK/frozen-faiss/<sha256 of the vectors>``.

    ``digest`` is :func:`vectors_sha256` of the vectors when the caller already has it (hashing a
    large corpus takes seconds; give one of the two).
    """
    if digest is None:
        if doc_embeddings is None:
            raise TypeError("faiss_cache_dir needs doc_embeddings or their digest.")
        digest = vectors_sha256(doc_embeddings)
    return Path(work) / "frozen-faiss" / digest[:16]


def _probe_ids(index: QuantizedIndex, probe: np.ndarray | None) -> str | None:
    """sha256 of the top-5 rows the index returns for ``probe`` (a few corpus vectors): what it holds, not its bytes."""
    if probe is None or len(probe) == 0:
        return None
    _, I = index.search(np.ascontiguousarray(probe, dtype=np.float32), 5)
    return hashlib.sha256(np.ascontiguousarray(I, dtype=np.int64).tobytes()).hexdigest()


def load_faiss_cache(folder: str | Path, probe: np.ndarray | None = None) -> dict[str, tuple[QuantizedIndex, float]]:
    """The ``faiss:`` indexes saved by :func:`save_faiss_cache` (8-bit PQ/OPQ train for minutes on a small CPU).

    Each ``.faiss`` file is checked against the sha256 its ``.json`` recorded, the index against the
    precision, dimension and count recorded there, and, with ``probe`` (the first corpus vectors,
    as at save time), its answers to them against the recorded ones (a file swapped in from another
    run, its digest recomputed, holds other vectors). A file that fails is dropped with a warning and
    rebuilt by the sweep, never scored.
    """
    import faiss

    cache: dict[str, tuple[QuantizedIndex, float]] = {}
    folder = Path(folder)
    for meta_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        index_path = meta_path.with_suffix(".faiss")
        try:
            info, _ = read_json_verified(meta_path, "", require_digest=True)
            precision = Precision(info["precision"])
            if not precision.is_faiss or meta_path.stem != _cache_stem(precision.name):
                raise ValueError(f"field 'precision' {info['precision']!r} is not the index this file name holds")
            verify_sha256(index_path, info["sha256"], "")
            backend = faiss.read_index(str(index_path))
            if backend.d != int(info["dim"]) or backend.ntotal != int(info["ntotal"]):
                raise ValueError(f"the index holds {backend.ntotal} x {backend.d}-d vectors, not the {info['ntotal']} x {info['dim']} recorded")
            index = QuantizedIndex(precision, info["dim"], backend, backend.ntotal)
            if probe is not None and _probe_ids(index, probe) != info.get("probe_sha256"):
                raise ValueError("its answers to the corpus' first vectors are not the ones recorded: it holds other vectors")
            build_s = float(info["build_s"])
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
            text = str(error).strip()
            logger.warning("%s: not used, it will be rebuilt (%s)", index_path, text.splitlines()[0] if text else type(error).__name__)
            meta_path.unlink(missing_ok=True)
            index_path.unlink(missing_ok=True)
            continue
        cache[info["precision"]] = (index, build_s)
    return cache


def _cache_stem(name: str) -> str:
    return name.replace(":", "_").replace(",", "+")


def save_faiss_cache(folder: str | Path, cache: Mapping[str, tuple[QuantizedIndex, float]], probe: np.ndarray | None = None) -> None:
    """Write every ``faiss:`` index of ``cache`` not saved yet: ``.faiss``, then a ``.json`` with its sha256 and probe answers."""
    import faiss

    folder = Path(folder)
    for name, (index, build_s) in cache.items():
        if not index.precision.is_faiss:
            continue
        stem = folder / _cache_stem(name)
        if not stem.with_suffix(".json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(stem.with_suffix(".faiss"), lambda tmp, index=index: faiss.write_index(index.backend, str(tmp)))
            write_json_with_digest(stem.with_suffix(".json"), {
                "precision": name, "dim": index.dim, "ntotal": int(index.backend.ntotal), "build_s": build_s,
                "sha256": sha256_file(stem.with_suffix(".faiss")), "probe_sha256": _probe_ids(index, probe)})


PROBE_ROWS = 16


# -- the plan --------------------------------------------------------------------------------
def _row_setting(candidate: Candidate | None, precision: str, dim: int) -> str:
    base = candidate.name if candidate is not None else f"frozen-{dim}"
    return f"{base}/{precision}"


def run_plan(
    experiment: Experiment,
    out: str | Path,
    budget_bytes: float | None = None,
    target_retention: float | None = None,
    methods: Sequence[str] = ("truncate", "pca", "dive"),
    dims: Sequence[int] | None = None,
    precisions: Sequence[str] = DEFAULT_PRECISIONS,
    peers: Sequence[str] = DEFAULT_PEERS,
    seed: int = 2027,
    final: bool = False,
    work: str | Path | None = None,
    labels: Mapping[str, Any] | None = None,
    rounds: int = 3,
    variants: Sequence[str] = (),
) -> dict[str, Any]:
    """Sweep on validation queries, choose, refit on train+val, and write a deployable plan folder.

    Args:
        experiment: a dataset with a query-disjoint split (train / val / test).
        out: the plan folder.
        budget_bytes: bytes per vector in RAM that the choice may use at most.
        target_retention: the share of the uncompressed float32 model's validation nDCG@10 to keep.
        methods: compressors to sweep (``frozen`` needs no fit; supervised ones train on the train queries).
        dims: dimensions (default :func:`sweep_dims`: d, d/2, d/3, d/6, d/12).
        precisions: precisions of every compressed space.
        peers: FAISS PQ/OPQ families on the uncompressed vectors (see :func:`peer_factories`), at
            the byte sizes the precisions reach, and the quantiser peers :data:`QUANTISER_PEERS`
            (RaBitQ, TurboQuant, SQ4 on the uncompressed vectors, at their own bytes); ``csr`` adds
            CSR's sparse codes at the budgets in :data:`CSR_PEER_BYTES` (:func:`csr_peer_rows`).
        seed: training seed.
        final: also score the chosen setting once on the held-out test queries.
        work: where the sweep's fits are kept (reused by a later run); default
            :func:`default_sweep_dir` of this experiment, shared by every plan on the same data.
        labels: JSON-safe fields for plan.json (dataset, model).
        variants: named variants (:data:`VARIANTS`, e.g. ``qat-binary``) swept beside each
            method's default, for the methods whose config has their fields.

    Returns:
        The plan (also ``OUT/plan.json``).
    """
    out = Path(out)
    for method in methods:
        get_compressor_class(method)  # fail fast on a typo
    for variant in variants:
        _check_variant(variant)
        if not any(variant_applies(m, variant) for m in methods):
            raise ValueError(f"variant {variant!r} applies to none of the methods {list(methods)}.")
    input_dim = experiment.embeddings.dim
    dims = sorted(set(dims), reverse=True) if dims else sweep_dims(input_dim)
    too_wide = [d for d in dims if d > input_dim]
    if too_wide:
        raise ValueError(f"--dims {too_wide} exceed the input dimension {input_dim}.")
    rows: list[dict[str, Any]] = []
    data = experiment_fingerprint(experiment)  # every cached fit is keyed by it (a rerun on other vectors refits)
    work = Path(work) if work is not None else default_sweep_dir(data)
    with exclusive_lock(work / SWEEP_LOCK, f"another plan is using the sweep folder {work}; waiting for it (its fits are then reused)"):
        fitted, (experiment, validation) = experiment, selection_view(experiment)  # score on `experiment`, fit on `fitted`
        cache_dir = faiss_cache_dir(work, experiment.embeddings.doc_embeddings)
        probe = np.ascontiguousarray(experiment.embeddings.doc_embeddings[:PROBE_ROWS], dtype=np.float32)
        frozen_indexes = load_faiss_cache(cache_dir, probe)  # FAISS peers trained by an earlier plan or frontier run on this corpus
        frozen_precisions = list(dict.fromkeys(["float32", *precisions]))
        budgets = sorted({Precision(p).ram_bytes(d) for p in precisions for d in dims if not Precision(p).is_faiss})
        factories = [f for kind in peers for f in peer_factories(input_dim, [b for b in budgets if b <= PEER_MAX_BYTES.get(kind, 64)], (kind,),
                                                                   len(experiment.embeddings.doc_ids))]
        quantiser_peers = [p for kind in peers for p in QUANTISER_PEERS.get(kind, ()) if p not in frozen_precisions]
        # Phase 1 of 3: the uncompressed vectors at every precision and the FAISS PQ/OPQ peers
        # (8-bit PQ/OPQ train for minutes on a small CPU; reused from WORK/frozen-faiss when cached).
        reused = sum(f"faiss:{f}" in frozen_indexes for f in factories)
        with progress_bar(len(frozen_precisions) + len(factories) + len(quantiser_peers), "plan 1/3, frozen vectors and FAISS PQ/OPQ peers",
                          unit="index",
                          postfix=f"{reused} cached" if reused else None) as bar:
            frozen_rows = precision_rows(experiment, "val", None, frozen_precisions, rounds=rounds,
                                         labels={"method": "frozen", "family": "frozen (quantised)"}, progress=bar.update)
            peer_rows = precision_rows(experiment, "val", None, [f"faiss:{f}" for f in factories], rounds=rounds, prebuilt=frozen_indexes,
                                       labels={"method": "frozen", "family": "FAISS PQ/OPQ"}, progress=bar.update)
            if quantiser_peers:  # FAISS RaBitQ / TurboQuant / SQ4 of the frozen vectors (issue 30)
                peer_rows += precision_rows(experiment, "val", None, quantiser_peers, rounds=rounds,
                                            labels={"method": "frozen", "family": "FAISS RaBitQ/TurboQuant/SQ4"}, progress=bar.update)
        save_faiss_cache(cache_dir, frozen_indexes, probe)
        for row in frozen_rows + peer_rows:
            row["setting"] = f"frozen-{input_dim}/{row['precision']}"
            row["candidate"] = None
        rows += frozen_rows + peer_rows
        if "csr" in peers:  # CSR, a learned peer fitted on the corpus alone (issue 30): compared, never chosen
            rows += csr_peer_rows(fitted, experiment, budgets, seed, work, data, rounds)
        reference = next(r["ndcg@10"] for r in frozen_rows if r["precision"] == "float32")
        # Phase 2 of 3: fit (or reuse from WORK) every candidate on the train queries, score it at every precision.
        sweep = [(method, dim, variant) for method in methods if method != "frozen" for dim in dims
                 for variant in ["default", *(v for v in variants if variant_applies(method, v))]]
        with progress_bar(len(sweep), "plan 2/3, fitting and scoring the sweep", unit="fit") as bar:
            for method, dim, variant in sweep:
                candidate = candidate_for(method, dim, variant)
                bar.set_postfix_str(candidate.name, refresh=False)
                compressor, fit_s = fit_or_load(fitted, candidate, seed, final=False, work=work, data=data)
                family = method if variant == "default" else f"{method}+{variant}"
                for row in precision_rows(experiment, "val", compressor, precisions, rounds=rounds,
                                          labels={"method": method, "variant": variant, "family": family, "candidate": candidate.name,
                                                  "fit_s": fit_s}):
                    row["setting"] = _row_setting(candidate, row["precision"], dim)
                    rows.append(row)
                bar.update(1)
        chosen = dict(choose([r for r in rows if r.get("choosable", True)], budget_bytes, target_retention, reference))
        frontier = [r["setting"] for r in pareto_frontier(rows)]
        title = f"{experiment.dataset.name}: nDCG@10 on {rows[0]['n_queries']} validation queries vs bytes per vector"
        out.mkdir(parents=True, exist_ok=True)
        plot_frontier(rows, out / "frontier.png", title, chosen=chosen)
        # Phase 3 of 3: refit the choice on train+val (what compress train --final does) and write the folder.
        candidate = None
        logger.info("plan 3/3, %s, writing %s", f"refitting {chosen['setting']} on the train and validation queries"
                    if chosen.get("candidate") else f"chose {chosen['setting']} (no fit)", out)
        if chosen.get("candidate"):
            candidate = candidate_for(chosen["method"], int(chosen["dim"]), chosen.get("variant", "default"))
            compressor, _ = fit_or_load(fitted, candidate, seed, final=True, work=work, data=data)
        else:
            frozen = get_compressor_class("frozen")
            compressor = frozen(frozen.config_class(dim=input_dim)).fit(training_data(fitted, "train"))
        reuse = None if candidate is not None else frozen_indexes.get(chosen["precision"], (None, 0.0))[0]  # a chosen PQ/OPQ peer: not retrained
        plan = write_plan(out, compressor, Precision(chosen["precision"]), experiment.embeddings.doc_embeddings, prebuilt=reuse, plan={
            "embedtune_version": __version__,
            **(labels or {}),
            "dataset": experiment.dataset.name,
            "split_seed": experiment.split.seed if experiment.split is not None else None,
            "seed": seed,
            "budget_bytes": budget_bytes,
            "target_retention": target_retention,
            "chosen": _public(chosen),
            # How to serve the choice: FAISS's factory string and the equivalent LanceDB settings (index/deployment.py).
            "deployment": deployment_recipe(Precision(chosen["precision"]), compressor.output_dim),
            "reference": {"setting": f"frozen-{input_dim}/float32", "ndcg@10": reference, "queries": "val"},
            "validation": validation,
            "retention": chosen["ndcg@10"] / reference if reference > 0 else None,  # no retention of a reference that finds nothing
            "frontier": [_public(r) for r in sorted((r for r in rows if r["setting"] in frontier), key=lambda r: r["ram_bytes"])],
            "sweep": [_public(r) for r in rows],
        })
        if final:
            plan["test"] = score_plan(fitted, out, "test")
            write_json_with_digest(out / PLAN_FILE, plan)
        return plan


#: Fewer unseen validation queries than this and the plan chooses on all of them, and says so.
MIN_UNSEEN_VALIDATION = 20


def selection_view(experiment: Experiment) -> tuple[Experiment, dict[str, Any]]:
    """The experiment whose ``val`` part holds only the validation queries with no positive among the train part's.

    Choosing on validation queries whose relevant documents are training positives rewards a
    compressor that learned where this corpus's popular documents lie (issue 27); choosing on
    the others rewards what carries over to documents the fit never saw. With fewer than
    :data:`MIN_UNSEEN_VALIDATION` such queries the plan keeps every validation query and says so
    (the stated fallback). Returns the view and what ``plan.json`` records about it.
    """
    if experiment.split is None:
        return experiment, {"rule": "no split"}
    val = experiment.split.val
    seen = training_positives(experiment.qrels_for(experiment.split.train))
    unseen = query_subsets(experiment.qrels_for(val), seen)["unseen"]
    record: dict[str, Any] = {"n_val": len(val), "n_unseen_val": len(unseen)}
    if len(unseen) < MIN_UNSEEN_VALIDATION:
        logger.warning("compress plan: only %d of the %d validation queries have no positive among the training queries' "
                       "(fewer than %d); choosing on all of them, which rewards memorising the training positives.",
                       len(unseen), len(val), MIN_UNSEEN_VALIDATION)
        return experiment, {**record, "rule": f"all validation queries (fewer than {MIN_UNSEEN_VALIDATION} unseen)"}
    keep = set(unseen)
    split = dataclasses.replace(experiment.split, val=[q for q in val if q in keep])
    return dataclasses.replace(experiment, split=split), {**record, "rule": "validation queries with no positive among the train part's"}


def _public(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "per_query"}


def score_plan(experiment: Experiment, directory: str | Path, part: str = "test") -> dict[str, Any]:
    """Score a plan folder on ``part``: its compressor, its precision and its saved calibration, as deployed."""
    plan, compressor, precision, calibration = load_plan(directory)
    ids = experiment.part_ids(part)
    qrels = experiment.qrels_for(ids)
    ids = [qid for qid in ids if qrels.get(qid)]
    xq = compressor.transform(experiment.embeddings.queries(ids))
    xb = compressor.transform(np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32))
    index = QuantizedIndex.build(xb, precision, calibration=calibration)
    D, I = index.search(xq, 101)
    metrics = evaluate_run(qrels, run_from_topk(ids, D, I, experiment.embeddings.doc_ids, 100, True), ("ndcg@10", "recall@10"))
    # Seen and unseen (issue 27), relative to the train+val labels the plan fitted and chose on.
    groups = query_subsets(qrels, training_positives(experiment.qrels_for(experiment.part_ids("train+val"))))
    subsets = subset_means(metrics.per_query, groups)
    return {"queries": part, "ndcg@10": metrics["ndcg@10"], "recall@10": metrics["recall@10"], "n_queries": metrics.n_queries,
            "setting": plan["chosen"]["setting"],
            "subsets": {name: subsets[name] for name in ("seen", "unseen")}}


__all__.append("score_plan")
