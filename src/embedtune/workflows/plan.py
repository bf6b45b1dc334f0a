"""Quality per byte: sweep (compressor × dimension × precision), find the Pareto frontier, and plan a deployment.

The library engine behind ``embedtune compress plan`` and ``benchmarks/frontier.py``:

- :func:`fit_or_load` fits one compressor through :func:`embedtune.workflows.fit_compressor`
  (the method's default preset: DIVE's ``robust``) or reloads it from a previous run's folder;
- :func:`precision_rows` scores one compressed space at every precision: nDCG@10, Recall@10,
  per-query nDCG@10 (for paired tests), bytes in RAM and on disk, fixed bytes, and the batched
  search latency, all precisions timed side by side in the same rounds;
- :mod:`embedtune.workflows.pareto` reads the rows (the frontier, the best within a budget, the
  choice), and :mod:`embedtune.workflows.frontier_plot` draws them;
- :func:`run_sweep` is the one sweep engine of a plan: the frozen vectors and their peers, every
  compressor at every precision, the choice (the cheapest setting meeting a retention target, or
  the best within a byte budget), the refit of the choice and a deployable folder (the format:
  :mod:`embedtune.index.plan_format`; the codecs it scores with are the deployed ones,
  :mod:`embedtune.index.codecs`). What it scores on and how it fits is a :class:`PlanObjective`;
- every row also says how far its codes are from the vectors they code and from the Gaussian
  rate-distortion bound (``mse``, ``score_mse``, ``bound_mse``, ``gap_db``), how far its served
  scores are from the uncompressed inner products (``score_error``), its bytes with the share of
  what it holds once, its codec's tables and its map's weights (``amortized_bytes``, :func:`held_once_bytes`) and its ``tier`` (in RAM, or rescored from disk: chosen only with
  ``allow_disk``); the registered codecs (:data:`DEFAULT_CODECS` at :data:`CODEC_BUDGETS`) are
  scored on every space beside the precisions, the textbook coder as their reference;
- :func:`run_plan` is the engine with the labelled objective (:class:`LabelledObjective`): fitted
  on the train queries, chosen on the validation queries only, refitted on train+val. The
  label-free objective is :class:`embedtune.workflows.label_free.LabelFreeObjective`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedtune import __version__
from embedtune.compress import Compressor, get_compressor_class, load_compressor
from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.subsets import query_subsets, subset_means, training_positives
from embedtune.evaluate.search import run_from_topk
from embedtune.encoders.paths import cache_root
from embedtune.index.codecs import (
    Precision,
    QuantizedIndex,
    codec_family,
    corpus_spectrum,
    distortion_report,
    factory_code_bytes,
    registered_codecs,
)
from embedtune.index.codecs.sphere import plain_family_name, shares_one_norm
from embedtune.index.bill import BILL_SCALES, DEFAULT_PRICE_PER_GB_MONTH, bill_record, float32_bytes, scale_label, vector_bill
from embedtune.index.deployment import deployment_recipe
from embedtune.index.fit_sample import fit_sample_record, fit_sample_rows, fit_sample_size
from embedtune.index.plan_format import PLAN_FILE, load_plan, write_plan
from embedtune.index.refine import (
    DEFAULT_REFINE_CANDIDATES,
    REFINE_TIER,
    Refine,
    RefinedIndex,
    faiss_refine_peers,
    plan_refine,
    refinable,
    refined_name,
)
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
from embedtune.runtime import progress_bar, thread_budget
from embedtune.workflows.experiment import Experiment, training_data
from embedtune.workflows.frontier_plot import plot_frontier
from embedtune.workflows.pareto import choose, pareto_frontier
from embedtune.workflows.significance import align_by_query, paired_test
from embedtune.workflows.train_compressor import fit_compressor, resolve_preset

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PRECISIONS",
    "DEFAULT_PEERS",
    "DEFAULT_CODECS",
    "CODEC_BUDGETS",
    "REFERENCE_CODEC",
    "check_codecs",
    "codec_precisions",
    "precision_tier",
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
    "part_queries",
    "peer_factories",
    "additive_factory",
    "ADDITIVE_PEERS",
    "PEER_KINDS",
    "csr_candidates",
    "csr_peer_rows",
    "PlanObjective",
    "LabelledObjective",
    "sweep_rows",
    "sweep_csr_rows",
    "run_sweep",
    "faiss_cache_dir",
    "space_cache_dir",
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
# rotation with 8-bit PQ many times over (minutes per code on a small CPU), so only up to 32 B; the additive
# quantisers train one codebook after another (RQ) or re-encode the corpus at every step (LSQ), slower still.
PEER_MAX_BYTES = {"pq": 64, "pq-fs": 64, "ivf-pq-fs": 64, "opq": 32, "rq": 32, "prq": 32, "lsq": 16}
#: The learned peer kind: CSR (sentence-transformers' sparse autoencoder), fitted on the corpus alone, at the budgets
#: between these bytes that its k (index, fp16 value) pairs fill. Not a default peer: each budget is one fit.
CSR_PEER_BYTES = (16, 128)
CSR_LATENT_MULTIPLE = 4  # m = 4d latents, the width the CSR paper and s-t's examples use
#: The registered codec families (:mod:`embedtune.index.codecs.registry`) a plan puts on every space by default: the
#: one that fits in seconds (``klt-pq`` takes tens of seconds per budget and space, ``klt-rq`` minutes: both opt-in), and
#: its codes ranked by their decoded direction where the documents share one norm (every compressor's output, and a
#: cosine model's uncompressed vectors; the same fit, only the search differs).
DEFAULT_CODECS = ("klt-pq4", "klt-pq4-sphere")
#: The bytes per vector each codec family is scored at (where the dimension allows; see :func:`codec_precisions`).
CODEC_BUDGETS = (16, 32, 48, 64)
#: Codec families a plan fits on the uncompressed vectors only, at the fewest of :data:`SEARCHED_CODEC_BUDGETS` that find the
#: cheapest keeping the target (:func:`search_budgets`). klt-apq came nearest the textbook coder in the near-limit benchmark
#: (agreement@10 0.949 at 128 B on NPL's 11,429 MiniLM vectors, against 0.849 for klt-pq4 and 0.928 for TurboQuant at
#: 192 B), but fits for about a minute a budget on 65,536 rows: too slow for every compressor's space. ``klt-apq-sphere``
#: reuses ``klt-apq``'s fit at each budget both score.
SEARCHED_CODECS = ("klt-apq", "klt-apq-sphere")
SEARCHED_CODEC_BUDGETS = (16, 32, 48, 64, 96, 128)
#: A compressed space whose float32 vectors fall short of the target by more than this share of the reference's objective
#: is not scored at any other precision or codec, once a setting within the budget keeps the target (the choice is then one
#: of those). Codes of a space rank no better than its float32 vectors, up to noise: in the committed frontier runs
#: (``benchmarks/results/frontier``: SciFact and ArguAna, MiniLM and mpnet, 662 settings with labels) no setting's nDCG@10 was
#: more than 1.1 % of the reference above its space's float32 row, and in label-free plans (agreement@10 on held-out
#: documents: SciFact, ArguAna, NPL, 10k to 1M tiled vectors) no more than 0.002 (``tests/test_plan_engine.py`` re-reads the
#: frontier's rows; ``benchmarks/sweep_bounds.py`` reads plans). A refined row rescores with the original vectors and is not bounded so: with ``allow_disk`` the rule is
#: off, as with ``--full-sweep``.
SPACE_CEILING_MARGIN = 0.02
#: An 8-bit FAISS peer (PQ, OPQ, RQ, PRQ, LSQ; minutes each to train) with fewer bytes than a searched codec's budget that
#: fell short of the target is not trained: in the near-limit benchmark (``benchmarks/results/near-limit``: SciFact,
#: ArguAna, NPL, CACM and MED with MiniLM, SciFact and ArguAna with mpnet) every such peer scored at least 0.037 agreement@10
#: below ``klt-apq`` at the larger budget, in all 26 comparisons (0.09 to 0.22 in most). At equal bytes a peer can win
#: (``RQ16x8`` on ArguAna), so a peer at the same bytes is still trained. ``--full-sweep`` trains them all.
SEARCHED_CODEC_BEATS_CHEAPER_PEERS = True
#: The level a learned map's validation scores must beat the best setting without one at by a paired test (two-sided,
#: the learned mean higher) to stay choosable (:func:`gate_learned`).
LEARNED_GATE_P = 0.05
#: The textbook transform coder: scored on the uncompressed vectors beside the codecs, as the reference they are
#: measured against, and never chosen (it is not a FAISS index, so a plan could not ship it).
REFERENCE_CODEC = "klt-sq"
#: Codewords per codebook of the built-in codec families, for the too-few-training-points rule of
#: :func:`codec_precisions` (a family not listed is taken to train 256 codewords, the cautious guess).
CODEC_CODEWORDS = {"klt-pq": 256, "klt-rq": 256, "klt-pq4": 16, "klt-pq4-sphere": 16, "klt-sq": 0, "klt-sq-sphere": 0, "klt-tcq": 0,
                   "klt-tcq-sphere": 0, "klt-tcq12": 0, "klt-tcq12-sphere": 0}
#: Row labels (``family``) of codec rows: a deployable codec, and the reference codecs.
CODEC_FAMILY_LABEL = "embedtune codec ({family})"
REFERENCE_FAMILY_LABEL = "textbook transform coder (reference)"
#: The label of any other reference codec asked for by name (``--codecs klt-tcq``).
OTHER_REFERENCE_LABEL = "reference codec ({family})"
#: Corpus rows the distortion of a precision is measured on (a seeded sample beyond this; reconstruction is cheap, not free).
DISTORTION_SAMPLE = 20_000
#: Queries the inner-product error of the decoded corpus (``score_mse``) is measured with (a seeded sample beyond this).
DISTORTION_QUERIES = 256
#: Queries each timed search round of a sweep searches (a seeded sample beyond this; every query is still scored).
TIMING_QUERIES = 100
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


#: Fewer training points than this per centroid and a plan leaves out the 8-bit PQ/OPQ and additive peers (FAISS itself warns below 39).
MIN_POINTS_PER_CENTROID = 4
#: Peer kinds that are FAISS additive quantisers of the uncompressed vectors, ``budget`` codebooks of 256 codewords
#: (8 bits) each: residual (``RQ{m}x8``), product residual over two halves of the dimensions (``PRQ2x{m/2}x8``) and
#: local-search (``LSQ{m}x8``). Not default peers: they train for minutes (RQ32x8 took 144 s, LSQ8x8 76 s, on 5,183
#: MiniLM vectors on one CPU thread).
ADDITIVE_PEERS = {"rq": "RQ{m}x8", "prq": "PRQ2x{half}x8", "lsq": "LSQ{m}x8"}
#: The peer kinds that train 256 centroids per codebook, so need :data:`MIN_POINTS_PER_CENTROID` times that many points.
EIGHT_BIT_PEERS = ("pq", "opq", *ADDITIVE_PEERS)
PEER_KINDS = ("pq", "opq", "pq-fs", "ivf-pq-fs", *ADDITIVE_PEERS, *QUANTISER_PEERS, "csr")


def additive_factory(kind: str, input_dim: int, budget: int) -> str | None:
    """The ``index_factory`` string of additive peer ``kind`` whose code is ``budget`` bytes, or None when there is none.

    A string is kept only when FAISS's own code size for inner-product search (``sa_code_size``, the
    metric every plan index uses) and the codecs' byte accounting
    (:func:`embedtune.index.codecs.factory_code_bytes`, what the rows report) both say ``budget``:
    an L2 additive index stores each vector's norm beside its codes (a ``_N...`` suffix), an
    inner-product one needs none, and a string the accounting cannot count is never scored.
    """
    import faiss

    if kind == "prq" and (budget % 2 or input_dim % 2):  # two splits: an even budget over an even dimension
        return None
    factory = ADDITIVE_PEERS[kind].format(m=budget, half=budget // 2)
    try:
        counted = factory_code_bytes(factory, input_dim)
    except ValueError:
        return None
    stored = faiss.index_factory(input_dim, factory, faiss.METRIC_INNER_PRODUCT).sa_code_size()
    return factory if counted == stored == budget else None


def peer_factories(input_dim: int, budgets: Sequence[int], kinds: Sequence[str] = DEFAULT_PEERS, n_train: int | None = None) -> list[str]:
    """FAISS ``index_factory`` strings at code sizes equal to ``budgets`` (bytes) that divide ``input_dim``.

    ``pq``: ``PQm`` (m bytes, 8 bits per sub-quantizer); ``opq``: ``OPQm,PQm``; ``pq-fs``:
    ``PQ{2m}x4fs`` (fast-scan, 4 bits); ``ivf-pq-fs``: ``IVFn,PQ{2m}x4fs`` with ``n`` fitted to
    ``n_train`` (39 training points per list at least; its 8-byte ids count as RAM); ``rq``, ``prq``
    and ``lsq``: the additive quantisers ``RQmx8``, ``PRQ2x(m/2)x8`` and ``LSQmx8``
    (:func:`additive_factory`). With ``n_train``, the 8-bit codes (:data:`EIGHT_BIT_PEERS`: 256 centroids per
    codebook) are left out below :data:`MIN_POINTS_PER_CENTROID` training points per centroid:
    such a codebook is mostly cells of one point, and OPQ spent over 9 CPU-minutes per plan fitting
    them on 400 documents (4-bit fast-scan codes, 16 centroids, stay).
    """
    unknown = [kind for kind in kinds if kind not in PEER_KINDS]
    if unknown:
        raise ValueError(f"unknown peer kind {unknown[0]!r}; valid: {', '.join(PEER_KINDS)}.")
    factories = []
    for budget in budgets:
        for kind in kinds:
            if kind in QUANTISER_PEERS or kind == "csr":  # precisions or codes of their own bytes, not factory strings
                continue
            if kind in EIGHT_BIT_PEERS and n_train is not None and n_train < MIN_POINTS_PER_CENTROID * 256:
                continue
            if kind in ("pq", "opq") and input_dim % budget == 0:
                factories.append(f"PQ{budget}" if kind == "pq" else f"OPQ{budget},PQ{budget}")
            elif kind == "pq-fs" and input_dim % (2 * budget) == 0:
                factories.append(f"PQ{2 * budget}x4fs")
            elif kind == "ivf-pq-fs" and budget > 8 and input_dim % (2 * (budget - 8)) == 0:
                nlist = max(1, min(1024, (n_train or 39 * 64) // 39))
                factories.append(f"IVF{nlist},PQ{2 * (budget - 8)}x4fs")
            elif kind in ADDITIVE_PEERS and (factory := additive_factory(kind, input_dim, budget)) is not None:
                factories.append(factory)
    return factories


def check_codecs(codecs: Sequence[str], budgets: Sequence[int] = CODEC_BUDGETS) -> None:
    """Raise unless every name of ``codecs`` is a registered codec family and every budget a positive byte count."""
    known = registered_codecs()
    unknown = [family for family in codecs if family not in known]
    if unknown:
        raise ValueError(f"--codecs: unknown codec family {unknown[0]!r}; registered: {', '.join(sorted(known))} "
                         "(or `--codecs none` for none).")
    bad = [b for b in budgets if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1]
    if bad:
        raise ValueError(f"--codec-budgets: bytes per vector must be positive integers; got {bad[0]!r}.")


def codec_precisions(families: Sequence[str], budgets: Sequence[int], dim: int, n_train: int | None = None,
                     one_norm: bool = True) -> list[str]:
    """The codec precisions ``"{family}:{budget}"`` that fit ``dim``-d vectors, family by family, budgets ascending.

    A budget is left out where the family refuses the dimension (:meth:`~embedtune.index.codecs.registry.CodecFamily.check_dim`:
    more bytes than float32 of the vectors, more sub-quantisers than dimensions) and, with ``n_train``
    (the documents a codec is trained on), where its codebooks would have fewer than
    :data:`MIN_POINTS_PER_CENTROID` training points per codeword (:data:`CODEC_CODEWORDS`), the rule
    the 8-bit FAISS peers follow: FAISS's k-means needs at least as many points as codewords. A family that
    needs rows of one norm (the ``-sphere`` families) is left out where ``one_norm`` is False.
    """
    names = []
    for family in dict.fromkeys(families):
        if not one_norm and codec_family(f"{family}:1").requires_common_norm:
            continue
        codewords = CODEC_CODEWORDS.get(family, 256)
        if n_train is not None and n_train < MIN_POINTS_PER_CENTROID * codewords:
            continue
        for budget in sorted(set(int(b) for b in budgets)):
            name = f"{family}:{budget}"
            if budget > 4 * dim:  # more than float32 of the vectors: never worth a codec, whatever the family says
                continue
            try:
                Precision(name).codec.check_dim(dim)
            except ValueError:
                continue
            names.append(name)
    return names


def precision_tier(precision: Precision | str) -> str:
    """``"disk-rescore"`` for a precision that rescores with float32 vectors read from disk at query time, else ``"ram"``."""
    precision = Precision(precision) if isinstance(precision, str) else precision
    return precision.tier


def _label_codec_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Name each codec row's family (the codec's, or the reference's) and keep the reference codecs out of the choice."""
    for row in rows:
        codec = Precision(row["precision"]).precision_codec
        if codec.family_codec is None:  # not a <family>:<bytes> codec
            continue
        if codec.deployable:
            row["family"] = CODEC_FAMILY_LABEL.format(family=codec.family_codec.family)
        else:
            family = codec.family_codec.family
            row["family"] = REFERENCE_FAMILY_LABEL if family == REFERENCE_CODEC else OTHER_REFERENCE_LABEL.format(family=family)
            row["choosable"] = False  # not a FAISS index: a plan could not ship it
    return rows


def csr_candidates(input_dim: int, budgets: Sequence[int]) -> list[tuple[Candidate, int]]:
    """The CSR peers of a sweep, with their code bytes: one per budget of :data:`CSR_PEER_BYTES` that k (index, fp16 value) pairs fill.

    The latent width is :data:`CSR_LATENT_MULTIPLE` times ``input_dim``; CSR's top-4k term needs at least 4k latents.
    """
    latent_dim = CSR_LATENT_MULTIPLE * input_dim
    from embedtune.compress.csr import sparse_code_bytes  # imports torch: only when CSR is swept

    pair_bytes = sparse_code_bytes(1, latent_dim)
    peers = []
    for budget in sorted(set(budgets)):
        active = budget // pair_bytes
        if CSR_PEER_BYTES[0] <= budget <= CSR_PEER_BYTES[1] and not budget % pair_bytes and 4 * active <= latent_dim:
            peers.append((Candidate("csr", latent_dim, f"k{active}", (("active", active),)), sparse_code_bytes(active, latent_dim)))
    return peers


def csr_peer_rows(fitted: Experiment, experiment: Experiment, budgets: Sequence[int], seed: int = 2027, work: str | Path | None = None,
                  data: Mapping[str, Any] | None = None, rounds: int = 3) -> list[dict[str, Any]]:
    """CSR, fitted on ``fitted``'s corpus without labels, at each budget of :data:`CSR_PEER_BYTES` its codes fill, scored on ``experiment``'s val.

    The rows of a labelled plan's ``csr`` peers (:func:`run_sweep` with a :class:`LabelledObjective`);
    see :func:`sweep_csr_rows` for what a row holds.
    """
    objective = LabelledObjective(fitted, data, scored=experiment)
    return sweep_csr_rows(objective, budgets, seed, Path(work) if work is not None else None, rounds)


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
    and ``disk_bytes`` per vector, ``fixed_bytes`` (tables that do not grow with the corpus), ``transform_bytes`` (the map's
    weights, also held once),
    ``build_s`` and ``latency_ms``: the median over ``rounds`` of one batched search of the
    queries (a seeded sample of at most :data:`TIMING_QUERIES`, ``latency_queries``), every precision (and, with ``time_reference``, exact float32 search of the
    uncompressed vectors) timed once per round in rotating order, so they share the machine's
    noise; ``latency_vs_reference`` is the ratio to that reference's median in the same rounds.

    ``prebuilt`` (precision name -> (index, build seconds)) reuses indexes built on the same vectors
    before (e.g. FAISS PQ on the frozen corpus for validation and then test queries), and
    receives the ones built here. ``progress`` is called with 1 after each index is built or reused
    (e.g. the ``update`` of a bar over a larger job).
    """
    return score_precisions(part_queries(experiment, part), experiment.embeddings.doc_ids, experiment.embeddings.doc_embeddings, compressor,
                            precisions, top_k=top_k, rounds=rounds, time_reference=time_reference, labels=labels, prebuilt=prebuilt,
                            progress=progress)


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


def part_queries(experiment: Experiment, part: str) -> QuerySet:
    """The judged queries of ``part`` (``val``, ``test``...) of ``experiment``, with their qrels: what a labelled sweep scores on."""
    ids = experiment.part_ids(part)
    qrels = experiment.qrels_for(ids)
    ids = [qid for qid in ids if qrels.get(qid)]
    return QuerySet(ids, experiment.embeddings.queries(ids), qrels, part)


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
    distortion: bool = True,
    train_rows: np.ndarray | None = None,
    refine_candidates: int | None = None,
    refine_max_bytes: float | None = None,
    space: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """:func:`precision_rows` on any :class:`QuerySet` against the documents ``doc_ids`` (vectors ``doc_embeddings``).

    ``per_query`` holds ``per_query_metric`` (``ndcg@10`` or ``recall@10``) by query id. Every row
    also holds:

    - ``transform_bytes``: the weights of ``compressor``'s map (:meth:`~embedtune.compress.base.Compressor.transform_bytes`;
      0 without one), held once as the codec's tables (``fixed_bytes``) are;
    - ``amortized_bytes``: ``ram_bytes + (fixed_bytes + transform_bytes) / n_docs``, the share of each vector of what is
      held once (the plan sets it again over every corpus row where it ran on a sample);
    - ``tier``: ``"ram"``, or ``"disk-rescore"`` for a precision that reads float32 vectors from
      disk at query time (:func:`precision_tier`);
    - with ``distortion``, how far the codes are from the compressed vectors they code, and from the
      limit (:func:`~embedtune.index.codecs.rate_distortion.distortion_report` on a seeded sample of
      at most :data:`DISTORTION_SAMPLE` documents of this space, at ``8 × ram_bytes`` bits):
      ``mse`` (of the decoded vectors), ``score_mse`` (of their inner products with at most
      :data:`DISTORTION_QUERIES` of the queries), ``bound_mse`` (the Gaussian rate-distortion bound
      of the space's covariance spectrum) and ``gap_db`` (``10 log10(mse / bound_mse)``); None where
      a precision's codes decode to nothing the search scores against (Hamming codes, RaBitQ);
    - ``score_error``: measured from the search itself, what the index scored each query's top
      ``top_k`` against the exact float32 inner products of the *uncompressed* query and documents,
      each centred per query (an offset common to a query's scores ranks nothing), mean squared:
      the compressor's and the codes' error together, as served. None for ``binary``, whose
      scores are Hamming distances; scores on another scale than the inner product (binary-asym's
      float query · ±1 signs) show as a large error, though they may rank well.

    ``train_rows``: the rows of ``doc_embeddings`` that precisions needing training are fitted on
    (a plan's fit sample); None fits them on every row. Every row is encoded and searched either way.

    ``refine_candidates`` (N): every precision worth refining (:func:`~embedtune.index.refine.refinable`) with
    ``ram_bytes`` at most ``refine_max_bytes`` (None: any) also gets a ``+refine<N>`` row: the same index, its
    top N rescored with the uncompressed vectors (:class:`~embedtune.index.refine.RefinedIndex`; ``precision``
    is the base's, ``refine`` is N, ``tier`` ``"disk-rescore"``, ``disk_bytes`` the code plus the float32
    vector). It reuses the index built here, so it costs one more candidate search and the exact rescoring of N.

    ``space``: a dict kept between calls on the same compressor, queries and documents (a sweep that scores one space's
    precisions a few at a time), which holds the compressed queries and documents and the space's spectrum after the first.
    """
    if per_query_metric not in ("ndcg@10", "recall@10"):
        raise ValueError(f"per_query_metric must be ndcg@10 or recall@10; got {per_query_metric!r}.")
    ids, qrels = list(queries.ids), queries.judgments
    doc_ids = list(doc_ids)
    frozen_q = np.ascontiguousarray(queries.vectors, dtype=np.float32)
    frozen_b = np.ascontiguousarray(doc_embeddings, dtype=np.float32)
    space = space if space is not None else {}
    if "xb" not in space:
        space["xq"], space["xb"] = ((compressor.transform(frozen_q), compressor.transform(frozen_b)) if compressor is not None
                                    else (frozen_q, frozen_b))
    xq, xb = space["xq"], space["xb"]
    dim = xb.shape[1]
    # The map in front is held once beside the index, as a codec's own rotation is: counted with the tables.
    transform = compressor.transform_bytes() if compressor is not None else 0
    fetch = top_k + 1  # one extra: identical query/doc ids are dropped, as BEIR does
    # The distortion sample and the space's spectrum, once for every precision of this space.
    measured = distortion and len(xb) >= 2
    sample_rows = _seeded_rows(len(xb), DISTORTION_SAMPLE) if measured else None
    sample_q = xq[_seeded_rows(len(xq), DISTORTION_QUERIES)] if measured else None
    if measured and "spectrum" not in space:
        space["spectrum"] = corpus_spectrum(xb)
    spectrum = space.get("spectrum") if measured else None
    indexes: list[tuple[str, QuantizedIndex | None, np.ndarray]] = []
    builds: dict[str, float] = {}
    for spec in precisions:
        precision = Precision(spec) if isinstance(spec, str) else spec
        plain = plain_family_name(precision.name) if precision.is_codec and precision.codec.sphere_candidates else None
        if prebuilt is not None and precision.name in prebuilt:
            index, builds[precision.name] = prebuilt[precision.name]
        elif prebuilt is not None and plain in prebuilt:
            # A -sphere family's codes are its plain family's, fitted and encoded alike: only the search differs, so the
            # index built for the plain family is searched the sphere's way, not fitted again.
            built, builds[precision.name] = prebuilt[plain]
            index = QuantizedIndex(precision, built.dim, built.backend, built.ntotal)
            prebuilt[precision.name] = (index, builds[precision.name])
        else:
            start = time.perf_counter()
            # Trained precisions (FAISS factories, codecs, int4's ranges, RaBitQ's centroid) fit on the sample rows only.
            index = QuantizedIndex.build(xb, precision, train=xb[train_rows] if train_rows is not None else None)
            builds[precision.name] = time.perf_counter() - start
            if prebuilt is not None:
                prebuilt[precision.name] = (index, builds[precision.name])
        indexes.append((precision.name, index, xq))
        if progress is not None:
            progress(1)
    if refine_candidates is not None:
        refine = Refine(int(refine_candidates), int(frozen_b.shape[1]))
        # Rescored with the vectors the compressor was fitted on, as the deployed index stores them (index build
        # normalises its original vectors the same way), against the queries' own uncompressed vectors.
        originals = compressor.normalize_input(frozen_b) if compressor is not None else frozen_b
        for name, index, _ in list(indexes):
            if refinable(index.precision, compressor is None) and (refine_max_bytes is None or index.ram_bytes() <= refine_max_bytes):
                name_refined = refined_name(name, refine.candidates)
                builds[name_refined] = builds[name]  # the same index: nothing more is built
                indexes.append((name_refined, RefinedIndex(index, originals, refine, compressor), frozen_q))  # type: ignore[arg-type]
    timed = list(indexes)
    if time_reference:
        timed.append(("__reference__", QuantizedIndex.build(frozen_b, "float32"), frozen_q))
    times: dict[str, list[float]] = {name: [] for name, _, _ in timed}
    results: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    # The timed rounds search a seeded sample of at most TIMING_QUERIES queries: a batch that size times a scan as well
    # as the whole set does, and the rounds (every precision, three times) were most of a sweep's time on a large corpus.
    timing_rows = _seeded_rows(len(ids), TIMING_QUERIES)
    for name, index, rows_q in timed:  # warm-up, and the results every query is scored on (the reference: only warmed up)
        if name == "__reference__":
            index.search(np.ascontiguousarray(rows_q[timing_rows]), fetch)  # type: ignore[union-attr]
        else:
            results[name] = index.search(rows_q, fetch)  # type: ignore[union-attr]
    for round_index in range(rounds):
        shift = round_index % len(timed)
        for name, index, rows_q in timed[shift:] + timed[:shift]:
            batch = np.ascontiguousarray(rows_q[timing_rows])
            start = time.perf_counter()
            index.search(batch, fetch)  # type: ignore[union-attr]
            times[name].append(time.perf_counter() - start)
    reference_ms = statistics.median(times["__reference__"]) * 1e3 if time_reference and rounds else None
    rows = []
    for name, index, _ in indexes:
        refined = isinstance(index, RefinedIndex)
        D, I = results[name]
        metrics = evaluate_run(qrels, run_from_topk(ids, D, I, doc_ids, top_k, queries.ignore_identical_ids), ("ndcg@10", "recall@10", "recall@100"))
        latency = statistics.median(times[name]) * 1e3 if rounds else None
        ram, fixed = index.ram_bytes(), index.fixed_bytes()  # type: ignore[union-attr]
        report: dict[str, Any] = {"mse": None, "score_mse": None, "bound_mse": None, "gap_db": None}
        if measured:
            xs = xb[sample_rows]
            full = distortion_report(xs, index.reconstruct(xs), 8 * ram, sample_q, spectrum)  # type: ignore[union-attr]
            report = {key: full[key] for key in report}
        rows.append({
            **(labels or {}),
            "dim": dim,
            "precision": index.precision.name if refined else name,  # type: ignore[union-attr]
            **({"refine": index.refine.candidates} if refined else {}),  # type: ignore[union-attr]
            "ram_bytes": ram,
            "disk_bytes": index.disk_bytes(),  # type: ignore[union-attr]
            "fixed_bytes": fixed,
            "transform_bytes": transform,
            "amortized_bytes": ram + (fixed + transform) / len(doc_ids) if doc_ids else None,
            "tier": REFINE_TIER if refined else precision_tier(name),
            **report,
            # A refined row's scores are exact inner products of the original vectors, whatever its codes score.
            "score_error": None if not (refined or index.precision.precision_codec.scores_are_inner_products) else _score_error(D[:, :top_k], I[:, :top_k], frozen_q, frozen_b),
            "ndcg@10": metrics["ndcg@10"],
            "recall@10": metrics["recall@10"],
            "recall@100": metrics["recall@100"],
            "n_queries": metrics.n_queries,
            "queries": queries.part,
            "build_s": builds[name],
            "latency_ms": latency,
            "latency_queries": len(timing_rows),
            "latency_vs_reference": (latency / reference_ms) if latency is not None and reference_ms else None,
            "per_query": {qid: round(values[per_query_metric], 6) for qid, values in metrics.per_query.items()},
        })
    return rows


def _seeded_rows(n: int, limit: int, seed: int = 0) -> np.ndarray:
    """All of ``range(n)``, or a seeded sample of ``limit`` of them in ascending order."""
    if n <= limit:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))


def _score_error(D: np.ndarray, I: np.ndarray, queries: np.ndarray, docs: np.ndarray, block: int = 256) -> float | None:
    """Mean squared error of the returned scores ``D`` against the exact inner products of ``queries`` and ``docs`` rows ``I``,
    both centred per query over the rows returned (FAISS's -1 padding left out); None when nothing was returned."""
    total, count = 0.0, 0
    for start in range(0, len(I), block):
        rows, scores = I[start : start + block], np.asarray(D[start : start + block], dtype=np.float64)
        valid = rows >= 0
        exact = np.einsum("qd,qkd->qk", queries[start : start + block], docs[np.where(valid, rows, 0)], dtype=np.float64)
        error = np.where(valid, scores - exact, 0.0)
        per_query = valid.sum(axis=1)
        mean = error.sum(axis=1) / np.maximum(per_query, 1)
        total += float((np.where(valid, error - mean[:, None], 0.0) ** 2).sum())
        count += int(per_query.sum())
    return total / count if count else None


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


def space_cache_dir(work: str | Path, docs_digest: str, compressor: Compressor) -> Path:
    """Where the codecs fitted on one compressor's output of this corpus are kept: ``WORK/space-faiss/<sha256 of both>``.

    Keyed by the corpus vectors' digest and the compressor's fitted state (:meth:`Compressor.state_sha256`), so a
    later plan reusing the fit reuses its codecs too (an 8-bit ``klt-pq`` fits for tens of seconds on a few thousand
    documents), and a refitted compressor never meets another fit's.
    """
    key = sha256_json({"docs": docs_digest, "method": compressor.method, "dim": compressor.output_dim, "state": compressor.state_sha256()})
    return Path(work) / "space-faiss" / key[:16]


def _probe_ids(index: QuantizedIndex, probe: np.ndarray | None) -> str | None:
    """sha256 of the top-5 rows the index returns for ``probe`` (a few corpus vectors): what it holds, not its bytes."""
    if probe is None or len(probe) == 0:
        return None
    _, I = index.search(np.ascontiguousarray(probe, dtype=np.float32), 5)
    return hashlib.sha256(np.ascontiguousarray(I, dtype=np.int64).tobytes()).hexdigest()


def load_faiss_cache(folder: str | Path, probe: np.ndarray | None = None) -> dict[str, tuple[QuantizedIndex, float]]:
    """The ``faiss:`` indexes and registered codecs saved by :func:`save_faiss_cache` (8-bit PQ/OPQ train for minutes on a small CPU).

    A codec is reused only when the same embedtune release fitted it (its fit is embedtune's code).

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
            if not _cacheable(precision) or meta_path.stem != _cache_stem(precision.name):
                raise ValueError(f"field 'precision' {info['precision']!r} is not the index this file name holds")
            if precision.precision_codec.fitted_by_embedtune and info.get("embedtune_version") != __version__:
                # A codec's fit is embedtune's own code (a FAISS factory string is FAISS's): another release may fit it otherwise.
                raise ValueError(f"the codec was fitted by embedtune {info.get('embedtune_version')}, not {__version__}")
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


def _cacheable(precision: Precision) -> bool:
    """Indexes kept in the FAISS cache: ``faiss:`` factories and the deployable registered codecs (FAISS indexes fitted on the corpus)."""
    return precision.precision_codec.sweep_cache


def save_faiss_cache(folder: str | Path, cache: Mapping[str, tuple[QuantizedIndex, float]], probe: np.ndarray | None = None) -> None:
    """Write every ``faiss:`` index and deployable codec of ``cache`` not saved yet: ``.faiss``, then a ``.json`` with its
    sha256, its probe answers and the embedtune release that fitted it."""
    import faiss

    folder = Path(folder)
    for name, (index, build_s) in cache.items():
        if not _cacheable(index.precision):
            continue
        stem = folder / _cache_stem(name)
        if not stem.with_suffix(".json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(stem.with_suffix(".faiss"), lambda tmp, index=index: faiss.write_index(index.backend, str(tmp)))
            write_json_with_digest(stem.with_suffix(".json"), {
                "precision": name, "dim": index.dim, "ntotal": int(index.backend.ntotal), "build_s": build_s,
                "sha256": sha256_file(stem.with_suffix(".faiss")), "probe_sha256": _probe_ids(index, probe),
                "embedtune_version": __version__})


PROBE_ROWS = 16


# -- the sweep engine ------------------------------------------------------------------------
class PlanObjective(ABC):
    """What a plan's sweep is chosen by: the one part a labelled plan and a label-free plan differ in.

    :func:`run_sweep` does the rest the same way for both (the frozen vectors, the peers, the fits
    at every precision, the choice, the frontier, the refit and the plan folder). An objective says:

    - ``queries``: the :class:`QuerySet` that scores every row, against ``experiment``'s whole corpus;
    - ``metric``: the row field the objective is (``ndcg@10`` or ``recall@10``; also each row's ``per_query``);
    - ``y``: the row field the choice, the frontier and the reference read: ``metric`` itself, or
      another name that every row also holds ``metric``'s value under (a label-free plan's ``objective``);
    - :meth:`fit`: how a candidate is fitted for the sweep and refitted for the plan;
    - :meth:`record`: what ``plan.json`` records about the validation.
    """

    #: What the progress bars and log lines call the run ("plan", "label-free plan").
    name: str = "plan"
    metric: str = "ndcg@10"
    y: str = "ndcg@10"
    #: Where the chosen setting is refitted, in words for the log ("the train and validation queries").
    refit_on: str = ""
    experiment: Experiment
    queries: QuerySet
    #: :func:`vectors_sha256` of the corpus when the objective has it already (hashing a large corpus takes seconds).
    docs_digest: str | None = None
    #: The most a learned method fitted from a PCA start (DIVE) has scored above that start's float32 vectors, as a share of
    #: the reference's objective, where the objective fits it without labels; None: unbounded (with labels DIVE gained up
    #: to 30 % of the reference over PCA at 32 dims). With a bound, :func:`run_sweep` does not fit a DIVE candidate whose
    #: PCA starts' float32 vectors (centred and uncentred, same dimension) fall short of the target by more than it.
    learned_start_margin: float | None = None

    @abstractmethod
    def fit(self, candidate: Candidate, seed: int, work: Path | None, final: bool) -> tuple[Compressor, float]:
        """``(compressor, fit seconds)`` of ``candidate``, kept under ``work`` (None: not kept): for the sweep, or (``final``) for the plan."""

    @abstractmethod
    def fit_frozen(self) -> Compressor:
        """The uncompressed vectors' compressor, fitted as the plan ships it when the choice is a frozen or peer setting."""

    @abstractmethod
    def default_work(self) -> Path:
        """The sweep folder when the caller gives none: shared by every plan on the same data (:func:`default_sweep_dir`)."""

    @abstractmethod
    def plot_title(self) -> str:
        """The title of ``frontier.png``."""

    @abstractmethod
    def record(self) -> dict[str, Any]:
        """What ``plan.json`` records about the validation: its ``validation`` field (and any of the objective's own)."""

    def candidates(self, cells: list[Candidate]) -> list[Candidate]:
        """The candidates of ``cells`` (methods x dims x variants) this objective can fit; all of them unless it says otherwise."""
        return cells


class LabelledObjective(PlanObjective):
    """A labelled plan's objective: nDCG@10 on the validation queries, each candidate fitted on the train queries (:func:`fit_or_load`).

    The scored view is :func:`selection_view` of ``experiment`` (the validation queries whose
    positives are no training query's) unless ``scored`` gives it; the refit is on train+val.
    """

    name = "plan"
    refit_on = "the train and validation queries"

    def __init__(self, experiment: Experiment, data: Mapping[str, Any] | None = None, scored: Experiment | None = None) -> None:
        self.experiment = experiment
        if scored is None:
            scored, self.validation = selection_view(experiment)
        else:
            self.validation = {"rule": "the validation queries of the given view"}
        self.queries = part_queries(scored, "val")
        # Every cached fit is keyed by it (a rerun on other vectors refits).
        self.data = dict(data) if data is not None else experiment_fingerprint(experiment)

    def fit(self, candidate: Candidate, seed: int, work: Path | None, final: bool) -> tuple[Compressor, float]:
        return fit_or_load(self.experiment, candidate, seed, final=final, work=work, data=self.data)

    def fit_frozen(self) -> Compressor:
        frozen = get_compressor_class("frozen")
        return frozen(frozen.config_class(dim=self.experiment.embeddings.dim)).fit(training_data(self.experiment, "train"))

    def default_work(self) -> Path:
        return default_sweep_dir(self.data)

    def plot_title(self) -> str:
        return f"{self.experiment.dataset.name}: nDCG@10 on {len(self.queries.ids)} validation queries vs bytes per vector"

    def record(self) -> dict[str, Any]:
        return {"validation": self.validation}


def sweep_rows(objective: PlanObjective, compressor: Compressor | None, precisions: Sequence[str | Precision], labels: Mapping[str, Any],
               rounds: int = 3, prebuilt: dict[str, tuple[QuantizedIndex, float]] | None = None,
               progress: Callable[[int], object] | None = None, train_rows: np.ndarray | None = None,
               refine: tuple[int, float | None] | None = None, space: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """:func:`score_precisions` of ``compressor``'s space on ``objective``'s queries, each row with its ``y`` field set
    (``train_rows``: the corpus rows trained precisions are fitted on; None: all; ``refine``: ``(N, max RAM bytes)``
    of the ``+refine<N>`` rows to add, None for none; ``space``: what one space's calls share, :func:`score_precisions`)."""
    embeddings = objective.experiment.embeddings
    rows = score_precisions(objective.queries, embeddings.doc_ids, embeddings.doc_embeddings, compressor, precisions, rounds=rounds,
                            labels=labels, prebuilt=prebuilt, progress=progress, per_query_metric=objective.metric, train_rows=train_rows,
                            refine_candidates=refine[0] if refine is not None else None,
                            refine_max_bytes=refine[1] if refine is not None else None, space=space)
    if objective.y != objective.metric:
        for row in rows:
            row[objective.y] = row[objective.metric]
    return rows


def sweep_csr_rows(objective: PlanObjective, budgets: Sequence[int], seed: int, work: Path | None, rounds: int = 3) -> list[dict[str, Any]]:
    """The ``csr`` peer rows: CSR fitted by ``objective`` at each of :func:`csr_candidates`, scored on its queries.

    A row's bytes are the sparse code's, ``k × (index bytes + 2)`` (:func:`embedtune.compress.csr.sparse_code_bytes`),
    and its search is exact over the densified k-sparse codes, the documents' values at fp16 (``SQfp16``): the
    ranking a sparse store of those pairs gives. The rows are peers on the frontier, never the plan's choice
    (``choosable`` False): the deployed index has no sparse store yet, so a chosen CSR would not hold its bytes.
    """
    rows: list[dict[str, Any]] = []
    for candidate, code_bytes in csr_candidates(objective.experiment.embeddings.dim, budgets):
        compressor, fit_s = objective.fit(candidate, seed, work, final=False)
        for row in sweep_rows(objective, compressor, ["float16"], rounds=rounds,
                              labels={"method": "csr", "variant": candidate.variant, "family": "CSR (learned peer)",
                                      "candidate": candidate.name, "fit_s": fit_s}):
            # The bytes are the sparse code's; the distortion measured was fp16's of the densified codes, not the
            # sparse code's of the input, so it is not reported (score_error, against the uncompressed vectors, is).
            row.update(precision="sparse-fp16", setting=f"{candidate.name}/sparse-fp16", ram_bytes=code_bytes, disk_bytes=code_bytes,
                       amortized_bytes=code_bytes + held_once_bytes(row) / len(objective.experiment.embeddings.doc_ids),
                       mse=None, score_mse=None, bound_mse=None, gap_db=None, choosable=False)
            rows.append(row)
    return rows


def _learned_fit(compressor: Compressor) -> dict[str, Any]:
    """``{"fit_details": ...}`` for a learned map (DIVE: its heads, its PCA start, its training guard's verdict), so a row
    says how its fit went; nothing for a projection."""
    if not get_compressor_class(compressor.method).supervised:
        return {}
    details = compressor.fit_details()
    return {"fit_details": json.loads(json.dumps(details, default=str))} if details else {}


def run_sweep(
    objective: PlanObjective,
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
    codecs: Sequence[str] = DEFAULT_CODECS,
    codec_budgets: Sequence[int] = CODEC_BUDGETS,
    allow_disk: bool = False,
    fit_sample: int | None = None,
    price_per_gb_month: float = DEFAULT_PRICE_PER_GB_MONTH,
    sample_record: Mapping[str, Any] | None = None,
    refine_candidates: int = DEFAULT_REFINE_CANDIDATES,
    full_sweep: bool = False,
    verify: Callable[[Path], tuple[bool, Mapping[str, Any]]] | None = None,
    searched_codecs: Sequence[str] = SEARCHED_CODECS,
    learned_gate_p: float = LEARNED_GATE_P,
    count_tables: bool = False,
    allow_index_over_float32: bool = False,
) -> dict[str, Any]:
    """The plan sweep of :func:`run_plan` and :func:`embedtune.workflows.label_free.run_label_free_plan`, chosen by ``objective``.

    Phase 1: the uncompressed vectors at float32 and every precision, the FAISS peers
    (:func:`peer_factories`, reused from ``WORK/frozen-faiss`` when cached), the quantiser peers
    (:data:`QUANTISER_PEERS`), the codecs (every family of ``codecs`` at every budget of
    ``codec_budgets`` that fits, :func:`codec_precisions`; cached beside the FAISS peers) with the
    textbook transform coder :data:`REFERENCE_CODEC` at the same budgets as their reference, and,
    with ``csr`` among ``peers``, CSR's sparse codes (:func:`sweep_csr_rows`). Phase 2: every
    method x dimension x variant the objective can fit, fitted (or reused from ``work``) and scored
    at every precision and every codec that fits its dimension. Then the choice
    (:func:`~embedtune.workflows.pareto.choose` on ``objective.y``, relative to the uncompressed
    float32 row) among the rows that are ``choosable``, the frontier and ``frontier.png``; phase 3
    refits the choice (the objective's final fit) and writes the plan folder
    (:func:`~embedtune.index.plan_format.write_plan`). ``final``: also score the choice once on the
    experiment's labelled test queries. ``fit_sample`` (default: :func:`~embedtune.index.fit_sample.fit_sample_size`'s
    rule) caps the corpus rows the FAISS peers and codecs train on (a seeded sample); ``sample_record`` is what
    ``plan.json`` records under ``fit_sample`` when the caller sampled the corpus itself (a label-free plan).
    Phase 2 fits and scores only what the choice could still be: a setting above ``budget_bytes``, or dearer than a
    scored setting that already keeps ``target_retention``, is listed under ``skipped_settings`` instead (a candidate
    none of whose settings could be chosen is not fitted). The frontier therefore stops at the choice's bytes;
    ``full_sweep`` scores every setting (the whole frontier, for a report), and chooses the same.
    Three more rules rest on measurement rather than logic, and ``full_sweep`` turns them off too: once a setting keeps the
    target, a compressed space whose float32 vectors fall short of it (:data:`SPACE_CEILING_MARGIN`) gets no other
    precision, and a label-free DIVE candidate whose PCA starts fall far short is not fitted
    (:attr:`PlanObjective.learned_start_margin`); no 8-bit FAISS peer cheaper than a searched codec's budget that fell short
    is trained (:data:`SEARCHED_CODEC_BEATS_CHEAPER_PEERS`).
    ``verify(out)`` (a label-free plan on a sample: :mod:`~embedtune.workflows.full_corpus_check`) measures the written
    plan as served and says whether it keeps the target; when not, the next dearer scored setting
    (:func:`_dearer_choice`) is written and measured, up to :data:`MAX_VERIFIED`, and ``plan.json`` records every
    measurement under ``full_corpus_checks`` and the kept one under ``full_corpus``.
    ``count_tables``: a setting costs its codes and its share over the corpus rows of what it holds once, its codec's tables
    and the weights of the map in front (``amortized_bytes``), in
    the budget, the choice and the frontier, instead of its codes alone; with a target this scores every setting, as
    ``full_sweep`` does (a setting of more code bytes can cost less with its tables), and with a budget alone every level of
    a codec or peer ladder from the dearest within the budget down to the first whose tables keep it within (the dearest
    level's tables may put it above the budget).
    Unless ``allow_index_over_float32``, a setting whose index, codes and what it holds once over every corpus row
    (``amortized_bytes``), is larger than the float32 vectors is never chosen (``over_float32``; on a corpus of a few thousand
    rows a codec's tables alone can outweigh them): float32 vectors would be the smaller index, and better. A ladder
    is then searched down from such a level, as with ``count_tables``.
    The 8-bit FAISS PQ/OPQ and additive peers are trained after phase 2, one ladder per kind (``PQm``, ``OPQm,PQm``, ...),
    and only the fewest the choice needs (:func:`search_budgets`, the ladder's dearest possible peer first); a peer the
    choice could not be (:func:`_skip_reason`), or a ladder's peer the search left out, is listed under ``skipped_peers``. Every row gains the bill's
    columns (:func:`embedtune.index.bill.vector_bill` at ``price_per_gb_month``) and ``frontier_cost.png`` plots
    the objective against dollars a month at a billion vectors. With ``allow_disk``, every in-RAM row within the
    byte budget also gets a ``+refine<N>`` row (``N`` = ``refine_candidates``: its top N rescored with the
    uncompressed vectors, :mod:`embedtune.index.refine`), and the FAISS user's refined route
    (:func:`~embedtune.index.refine.faiss_refine_peers`) is scored beside them. The other arguments are :func:`run_plan`'s.

    Returns:
        The plan (also ``OUT/plan.json``).
    """
    out = Path(out)
    check_codecs(codecs, codec_budgets)
    Refine(refine_candidates, 1)  # a bad candidate count fails before any fit
    # Which rows get a refined copy: every in-RAM row within the budget. A refined row reuses the index its base row
    # was scored with (one more candidate search, then N exact inner products a query), so refining all of them costs
    # far less than choosing which to refine would risk: the best candidates for refining need not be the best
    # in-RAM ranking at the same bytes. Rows above the budget could never be chosen, so they are not refined.
    refine = (int(refine_candidates), budget_bytes) if allow_disk else None
    # What a setting costs: its codes, or its codes and its tables' share; a target then needs every setting scored.
    cost = "amortized_bytes" if count_tables else "ram_bytes"
    full_sweep = full_sweep or (count_tables and target_retention is not None)
    experiment = objective.experiment
    input_dim = experiment.embeddings.dim
    dims = sorted(set(dims), reverse=True) if dims else sweep_dims(input_dim)
    too_wide = [d for d in dims if d > input_dim]
    if too_wide:
        raise ValueError(f"--dims {too_wide} exceed the input dimension {input_dim}.")
    docs = np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
    work = Path(work) if work is not None else objective.default_work()
    name, y = objective.name, objective.y
    with exclusive_lock(work / SWEEP_LOCK, f"another plan is using the sweep folder {work}; waiting for it (its fits are then reused)"):
        docs_digest = objective.docs_digest or vectors_sha256(docs)
        cache_dir = faiss_cache_dir(work, digest=docs_digest)
        probe = docs[:PROBE_ROWS]
        frozen_indexes = load_faiss_cache(cache_dir, probe)  # FAISS peers trained by an earlier plan or frontier run on this corpus
        frozen_precisions = list(dict.fromkeys(["float32", *precisions]))
        budgets = sorted({Precision(p).ram_bytes(d) for p in precisions for d in dims if not Precision(p).is_faiss})
        # Fast-scan peers (4-bit, 16 centroids: seconds to train) are scored in phase 1; the 8-bit and additive ones (minutes)
        # after phase 2, one ladder per kind (``deferred``).
        factories, deferred = ({family: {kind: [f"faiss:{f}" for f in peer_factories(input_dim, [b for b in budgets if b <= PEER_MAX_BYTES.get(kind, 64)],
                                                                                      (kind,), fit_sample_size(len(experiment.embeddings.doc_ids), input_dim, fit_sample))]
                                         for kind in peers if (kind in ADDITIVE_PEERS) == additive and (kind in EIGHT_BIT_PEERS) == late}
                                for family, additive in (("FAISS PQ/OPQ", False), ("FAISS RQ/LSQ", True))} for late in (False, True))
        factories = {family: [spec for specs in kinds.values() for spec in specs] for family, kinds in factories.items()}
        quantiser_peers = [p for kind in peers for p in QUANTISER_PEERS.get(kind, ()) if p not in frozen_precisions]
        n_docs = len(experiment.embeddings.doc_ids)
        size = fit_sample_size(n_docs, input_dim, fit_sample)
        # The FAISS user's disk tier: IndexRefineFlat over PCA + 8-bit PQ at the codec budgets, scored beside the refined rows.
        refine_peers = faiss_refine_peers(input_dim, [b for b in codec_budgets if budget_bytes is None or b <= budget_bytes],
                                          size) if allow_disk else []
        refine_peers = [p for p in refine_peers if p not in frozen_precisions]
        train_rows = fit_sample_rows(n_docs, size, seed) if size < n_docs else None
        if sample_record is None:
            sample_record = {**fit_sample_record(n_docs, input_dim, size, seed, fit_sample), "fits": "FAISS peers and codecs"}
        # The tables' share of every row the corpus holds (a label-free plan may have run on a sample of it).
        corpus_rows = int(sample_record.get("of") or n_docs)

        def admit(scored: list[dict[str, Any]]) -> None:
            """Each row's cost with its tables, and whether the plan may choose it (in its tier, and not larger than float32)."""
            _mark_choosable(scored, allow_disk)
            for row in scored:
                row["amortized_bytes"] = row["ram_bytes"] + held_once_bytes(row) / corpus_rows
                if not allow_index_over_float32 and row["choosable"] and row["amortized_bytes"] > float32_bytes(input_dim):
                    row["choosable"] = False
                    row["over_float32"] = True

        def oversized(setting: str) -> bool:
            """Whether the scored setting's index costs more than the choice allows with its tables (:func:`search_budgets`)."""
            found = [r for r in rows if r.get("setting") == setting]
            return bool(found) and all(r.get("over_float32") or (count_tables and budget_bytes is not None
                                                                 and r["amortized_bytes"] > budget_bytes) for r in found)
        deployable = [family for family in codecs if Precision(f"{family}:1").precision_codec.deployable]
        # The reference codecs (the textbook coder, and any other non-deployable family asked for) on the frozen vectors only:
        # they say how far the deployable codecs are from the textbook, not what a compressor's space could ship.
        references = list(dict.fromkeys([REFERENCE_CODEC, *(f for f in codecs if f not in deployable)])) if codecs else []
        # The -sphere families rank by decoded direction, which needs documents of one norm (a cosine model's unit vectors):
        # scored on the uncompressed vectors where theirs share one (a compressor's output is unit rows: checked per space).
        frozen_one_norm = shares_one_norm(docs)
        frozen_codecs = [p for p in codec_precisions([*deployable, *references], codec_budgets, input_dim, n_docs, frozen_one_norm)
                         if p not in frozen_precisions]
        # Every scoring of the uncompressed vectors shares their spectrum (score_precisions' ``space``).
        frozen_space: dict[str, Any] = {}

        def frozen_rows(precisions: Sequence[str], labels: Mapping[str, Any], rounds: int, **options: Any) -> list[dict[str, Any]]:
            return sweep_rows(objective, None, precisions, labels, rounds, space=frozen_space, **options)

        # Phase 1 of 3: the uncompressed vectors at every precision, the FAISS peers and the codecs
        # (8-bit PQ/OPQ train for minutes on a small CPU; reused from WORK/frozen-faiss when cached).
        # The 8-bit FAISS PQ/OPQ and additive peers are trained last (after phase 2), the fewest each ladder needs, on the fit sample: see
        # _skip_reason for the ones left out because the choice could not be them.
        reused = sum(f in frozen_indexes for f in [*(f for specs in factories.values() for f in specs), *frozen_codecs])
        with progress_bar(len(frozen_precisions) + sum(map(len, factories.values())) + len(quantiser_peers) + len(frozen_codecs)
                          + len(refine_peers),
                          f"{name} 1/3, frozen vectors, fast-scan peers and codecs", unit="index",
                          postfix=f"{reused} cached" if reused else None) as bar:
            rows = frozen_rows(frozen_precisions, {"method": "frozen", "family": "frozen (quantised)"}, rounds,
                               progress=bar.update, refine=refine)
            for family, specs in factories.items():
                if specs:
                    rows += frozen_rows(specs, {"method": "frozen", "family": family}, rounds, prebuilt=frozen_indexes,
                                        progress=bar.update, train_rows=train_rows, refine=refine)
            if quantiser_peers:
                rows += frozen_rows(quantiser_peers, {"method": "frozen", "family": "FAISS RaBitQ/TurboQuant/SQ4"}, rounds,
                                    progress=bar.update, refine=refine)
            if frozen_codecs:
                rows += _label_codec_rows(frozen_rows(frozen_codecs, {"method": "frozen", "family": "codec"}, rounds,
                                                      prebuilt=frozen_indexes, progress=bar.update, train_rows=train_rows, refine=refine))
            if refine_peers:
                rows += frozen_rows(refine_peers, {"method": "frozen", "family": "FAISS PCA+PQ (IndexRefineFlat peer)"},
                                    rounds, prebuilt=frozen_indexes, progress=bar.update, train_rows=train_rows, refine=refine)
        save_faiss_cache(cache_dir, frozen_indexes, probe)
        _name_frozen_rows(rows, input_dim)
        reference = next(r[y] for r in rows if r["precision"] == "float32")
        if "csr" in peers:  # a learned peer fitted on the corpus alone: compared, never chosen
            rows += sweep_csr_rows(objective, budgets, seed, work, rounds)
        admit(rows)

        def why_not(ram_bytes: float) -> str | None:
            """Why a setting of ``ram_bytes`` cannot be the choice among the rows scored so far (never, with ``full_sweep``)."""
            return None if full_sweep else _skip_reason(rows, ram_bytes, budget_bytes, target_retention, reference, y)

        # Phase 2 of 3: fit (or reuse from WORK) every candidate, score it at every precision the choice could still be:
        # a setting above the budget, or dearer than a scored setting that already keeps the target, is neither fitted
        # nor scored (skipped_settings says which and why; it is absent from the frontier).
        # Truncation to every dimension is the uncompressed vectors themselves, scored in phase 1: not a second time.
        sweep = objective.candidates([candidate_for(method, dim, variant) for method in methods if method != "frozen" for dim in dims
                                      for variant in ["default", *(v for v in variants if variant_applies(method, v))]
                                      if not (method == "truncate" and variant == "default" and dim == input_dim)])
        skipped_settings: list[dict[str, Any]] = []
        with progress_bar(len(sweep), f"{name} 2/3, fitting and scoring the sweep", unit="fit") as bar:
            for candidate in sweep:
                bar.set_postfix_str(candidate.name, refresh=False)
                # Each codec family is a ladder of budgets, searched like the peers' (search_budgets): only the levels the choice needs.
                space_codecs = {family: [p for p in codec_precisions([family], codec_budgets, candidate.dim, n_docs) if p not in precisions]
                                for family in deployable}
                space_precisions = []
                for spec in [*precisions, *(s for names in space_codecs.values() for s in names)]:
                    ram_bytes = Precision(spec).ram_bytes(candidate.dim)
                    reason = why_not(ram_bytes)
                    if reason is None:
                        space_precisions.append(spec)
                    else:
                        skipped_settings.append({"setting": f"{candidate.name}/{spec}", "ram_bytes": ram_bytes, "reason": reason})
                if not space_precisions:
                    bar.update(1)
                    continue
                start_reason = _start_falls_short(rows, candidate, objective.learned_start_margin, target_retention, reference, y)
                if start_reason is not None and _ceiling_applies(rows, budget_bytes, target_retention, reference, y, allow_disk, full_sweep):
                    skipped_settings += [{"setting": f"{candidate.name}/{spec}", "ram_bytes": Precision(spec).ram_bytes(candidate.dim),
                                          "reason": start_reason} for spec in space_precisions]
                    bar.update(1)
                    continue
                compressor, fit_s = objective.fit(candidate, seed, work, final=False)
                family = candidate.method if candidate.variant == "default" else f"{candidate.method}+{candidate.variant}"
                # The codecs (and any faiss: precision) fitted on this compressor's output: reused by a later plan on the same fit.
                space_dir, space_probe = space_cache_dir(work, docs_digest, compressor), compressor.transform(probe)
                if not shares_one_norm(space_probe):  # a -sphere family ranks by direction: only where the output rows share a norm
                    sphere = {spec for names in space_codecs.values() for spec in names if codec_family(spec).requires_common_norm}
                    space_codecs = {family: [spec for spec in names if spec not in sphere] for family, names in space_codecs.items()}
                    space_precisions = [spec for spec in space_precisions if spec not in sphere]
                space_indexes = load_faiss_cache(space_dir, space_probe)

                space_state: dict[str, Any] = {}  # this space's compressed vectors and spectrum, shared by its scorings

                def score_space(specs: Sequence[str], candidate: Candidate = candidate, compressor: Any = compressor, fit_s: float = fit_s,
                                family: str = family, space_indexes: dict = space_indexes, space_state: dict = space_state) -> bool:
                    scored = _label_codec_rows(sweep_rows(objective, compressor, list(specs),
                                                          {"method": candidate.method, "variant": candidate.variant, "family": family,
                                                           "candidate": candidate.name, "fit_s": fit_s, **_learned_fit(compressor)},
                                                          rounds, prebuilt=space_indexes,
                                                          train_rows=train_rows, refine=refine, space=space_state))
                    for row in scored:
                        row["setting"] = _setting(candidate.name, row)
                    admit(scored)
                    rows.extend(scored)
                    return target_retention is not None and any(r["choosable"] and r[y] >= target_retention * reference for r in scored)

                ceiling = None
                if _ceiling_applies(rows, budget_bytes, target_retention, reference, y, allow_disk, full_sweep):
                    # The space's float32 vectors first (scored even when dearer than the choice): no code of them ranks better.
                    before = len(rows)
                    score_space(["float32"])
                    ceiling = max((r[y] for r in rows[before:]), default=None)
                    skipped_settings[:] = [s for s in skipped_settings if s["setting"] != f"{candidate.name}/float32"]
                if ceiling is not None and ceiling + SPACE_CEILING_MARGIN * reference < target_retention * reference:
                    reason = (f"{candidate.name}'s float32 vectors keep {ceiling / reference:.4f} of the reference, below the target: "
                              f"no code of a space has scored more than {SPACE_CEILING_MARGIN:g} above its float32 vectors")
                    skipped_settings += [{"setting": f"{candidate.name}/{spec}", "ram_bytes": Precision(spec).ram_bytes(candidate.dim),
                                          "reason": reason} for spec in space_precisions if spec != "float32"]
                    save_faiss_cache(space_dir, space_indexes, space_probe)
                    del space_indexes, space_state
                    bar.update(1)
                    continue
                score_space([spec for spec in space_precisions if spec in precisions and not (ceiling is not None and spec == "float32")])
                for names in space_codecs.values():
                    levels = [spec for spec in names if spec in space_precisions]
                    not_scored = search_budgets(levels, lambda spec, dim=candidate.dim: why_not(Precision(spec).ram_bytes(dim)),
                                                lambda spec: score_space([spec]), target_retention is not None, everything=full_sweep,
                                                top_first=True, oversized=lambda spec, space=candidate.name: oversized(f"{space}/{spec}"))
                    skipped_settings += [{"setting": f"{candidate.name}/{spec}", "ram_bytes": Precision(spec).ram_bytes(candidate.dim),
                                          "reason": reason} for spec, reason in not_scored.items()]
                save_faiss_cache(space_dir, space_indexes, space_probe)
                del space_indexes, space_state  # every index and copy of this space: freed before the next candidate's
                bar.update(1)
        admit(rows)
        # The searched codecs (klt-apq: near the textbook coder, a minute a budget on 65,536 rows) on the uncompressed vectors, at
        # the fewest budgets that find the cheapest keeping the target (quality grows with a family's bytes), before the peers.
        levels = {family: [p for p in codec_precisions([family], SEARCHED_CODEC_BUDGETS, input_dim, n_docs, frozen_one_norm)
                           if p not in frozen_precisions]
                  for family in searched_codecs}
        with progress_bar(sum(map(len, levels.values())), f"{name} 2/3, searched codecs on the uncompressed vectors", unit="budget") as bar:
            def score(spec: str) -> bool:
                scored = _label_codec_rows(frozen_rows([spec], {"method": "frozen", "family": "codec"}, rounds,
                                                       prebuilt=frozen_indexes, train_rows=train_rows, refine=refine))
                _name_frozen_rows(scored, input_dim)
                admit(scored)
                rows.extend(scored)
                save_faiss_cache(cache_dir, frozen_indexes, probe)
                bar.update(1)
                return target_retention is not None and any(r["choosable"] and r[y] >= target_retention * reference for r in scored)

            for names in levels.values():
                not_scored = search_budgets(names, lambda spec: why_not(Precision(spec).ram_bytes(input_dim)), score,
                                            target_retention is not None, everything=full_sweep,
                                            top_first=_target_out_of_reach(rows, names, input_dim, target_retention, reference, y),
                                            oversized=lambda spec: oversized(f"frozen-{input_dim}/{spec}"))
                skipped_settings += [{"setting": f"frozen-{input_dim}/{spec}", "ram_bytes": Precision(spec).ram_bytes(input_dim),
                                      "reason": reason} for spec, reason in not_scored.items()]
                bar.update(len(not_scored))
        # The 8-bit FAISS PQ/OPQ and additive peers (minutes each to train on a small CPU), one ladder per kind (PQm, OPQm,PQm, ...):
        # a peer the choice could not be (above the byte budget, or dearer than a setting already keeping the target) is not
        # trained, and within a ladder only the fewest the choice needs are: its dearest possible first (search_budgets), since
        # these peers usually fall short of a target everywhere. A ladder's peer cached by an earlier plan is scored anyway.
        ladders = [(family, sorted(specs, key=lambda spec: Precision(spec).ram_bytes(input_dim)))
                   for family, kinds in deferred.items() for specs in kinds.values() if specs]
        skipped_peers: list[dict[str, Any]] = []
        with progress_bar(sum(len(specs) for _, specs in ladders), f"{name} 2/3, 8-bit FAISS PQ/OPQ peers", unit="index",
                          postfix=f"{sum(s in frozen_indexes for _, specs in ladders for s in specs)} cached" if ladders else None) as bar:
            for family, specs in ladders:
                def score_peer(spec: str, family: str = family) -> bool:
                    peer_rows = frozen_rows([spec], {"method": "frozen", "family": family}, rounds, prebuilt=frozen_indexes,
                                            progress=bar.update, train_rows=train_rows, refine=refine)
                    _name_frozen_rows(peer_rows, input_dim)
                    admit(peer_rows)
                    rows.extend(peer_rows)
                    save_faiss_cache(cache_dir, frozen_indexes, probe)
                    return target_retention is not None and any(r["choosable"] and r[y] >= target_retention * reference for r in peer_rows)

                def peer_skip(spec: str) -> str | None:
                    ram_bytes = Precision(spec).ram_bytes(input_dim)
                    # Counting the tables, a searched codec's large tables say nothing of a cheaper peer's cost: no such skip.
                    return why_not(ram_bytes) or (None if full_sweep or count_tables else _short_searched_codec(
                        rows, searched_codecs, ram_bytes, target_retention, reference, y))

                cached = [spec for spec in specs if spec in frozen_indexes and peer_skip(spec) is None]
                for spec in cached:
                    score_peer(spec)
                not_scored = search_budgets([spec for spec in specs if spec not in cached], peer_skip, score_peer,
                                            target_retention is not None, everything=full_sweep, top_first=True,
                                            oversized=lambda spec: oversized(f"frozen-{input_dim}/{spec}"))
                skipped_peers += [{"setting": f"frozen-{input_dim}/{spec}", "family": family, "ram_bytes": Precision(spec).ram_bytes(input_dim),
                                   "reason": reason} for spec, reason in not_scored.items()]
                bar.update(len(not_scored))
        if skipped_peers:
            logger.info("%s: %d FAISS peers not trained, as the choice could not be them: %s", name, len(skipped_peers),
                        "; ".join(f"{p['setting']} ({p['reason']})" for p in skipped_peers))
        if skipped_settings:
            logger.info("%s: %d settings of the sweep not scored, as the choice could not be them", name, len(skipped_settings))
        for row in rows:
            row.update(_bill_columns(row, input_dim, price_per_gb_month))
        gated = gate_learned(rows, y, learned_gate_p)
        if gated:
            logger.info("%s: %d learned settings not choosable, as none beats the best setting without a learned map at its bytes by a "
                        "paired test: %s", name, len(gated), "; ".join(f"{r['setting']} (p {r['gated_by']['p']:.3f} against "
                                                                     f"{r['gated_by']['setting']})" for r in gated))
        chosen = _choose_in_tier(rows, budget_bytes, target_retention, reference, y, allow_disk, x=cost)
        # The frontier a user reads is that of what the plan may choose; the rest (the disk tier without allow_disk, learned
        # maps the gate kept out, reference codecs, the CSR peer) get a frontier of their own, each row saying why.
        frontier = {r["setting"] for r in pareto_frontier([r for r in rows if r.get("choosable")], x=cost, y=y)}
        set_aside = {r["setting"] for r in pareto_frontier([r for r in rows if not r.get("choosable")], x=cost, y=y)}
        out.mkdir(parents=True, exist_ok=True)

        def write(chosen: dict[str, Any]) -> dict[str, Any]:
            choosable = [r for r in rows if r.get("choosable")]
            plot_frontier(rows, out / "frontier.png", objective.plot_title(), y=y, chosen=chosen, frontier_of=choosable)
            plot_frontier(rows, out / COST_PLOT, f"{experiment.dataset.name}: {y} against the RAM bill of {BILL_AT} vectors",
                          x=f"usd_month@{BILL_AT}", y=y, chosen=chosen, frontier_of=choosable,
                          x_label=f"dollars a month for {BILL_AT} vectors in RAM at ${price_per_gb_month:g} per GB-month")
            # Phase 3 of 3: refit the choice (a labelled plan: on train+val, what compress train --final does) and write the folder.
            logger.info("%s 3/3, %s, writing %s", name, f"refitting {chosen['setting']} on {objective.refit_on}" if chosen.get("candidate")
                        else f"chose {chosen['setting']} (no fit)", out)
            if chosen.get("candidate"):
                candidate = candidate_for(chosen["method"], int(chosen["dim"]), chosen.get("variant", "default"))
                compressor, _ = objective.fit(candidate, seed, work, final=True)
                reuse = None
            else:
                compressor = objective.fit_frozen()
                reuse = frozen_indexes.get(chosen["precision"], (None, 0.0))[0]  # a chosen PQ/OPQ peer: not retrained
            chosen_refine = Refine(int(chosen["refine"]), input_dim) if chosen.get("refine") else None
            deployment = deployment_recipe(Precision(chosen["precision"]), compressor.output_dim)
            if chosen_refine is not None:
                deployment["refine"] = chosen_refine.recipe()
            # Only a refined choice passes ``refine``, and only a plan with the disk tier records its N: without
            # --allow-disk-rescore the plan folder is what it always was.
            plan = write_plan(out, compressor, Precision(chosen["precision"]), docs, prebuilt=reuse,
                              **({"refine": chosen_refine} if chosen_refine is not None else {}), plan={
                "embedtune_version": __version__,
                **(labels or {}),
                "dataset": experiment.dataset.name,
                "split_seed": experiment.split.seed if experiment.split is not None else None,
                "seed": seed,
                # The codecs' fits (BLAS, FAISS's k-means) round differently on other thread counts, so the same seed and
                # data give the same plan only on the same count: `embedtune --threads N` reproduces it.
                "threads": thread_budget(),
                "budget_bytes": budget_bytes,
                "target_retention": target_retention,
                "allow_disk": allow_disk,
                "count_tables": count_tables,
                "allow_index_over_float32": allow_index_over_float32,
                **({"refine_candidates": int(refine_candidates)} if allow_disk else {}),
                "codecs": {"families": list(codecs), "budgets": sorted(set(int(b) for b in codec_budgets)),
                           "reference": REFERENCE_CODEC if codecs else None,
                           "searched": {"families": list(searched_codecs), "budgets": list(SEARCHED_CODEC_BUDGETS)}},
                "chosen": _public(chosen),
                "fit_sample": dict(sample_record),
                "bill": dict(bill_record(price_per_gb_month)),
                "skipped_peers": skipped_peers,
                "skipped_settings": skipped_settings,
                # How to serve the choice: FAISS's factory string and the equivalent LanceDB settings (index/deployment.py).
                "deployment": deployment,
                "reference": {"setting": f"frozen-{input_dim}/float32", y: reference, "queries": objective.queries.part},
                **objective.record(),
                "retention": chosen[y] / reference if reference > 0 else None,  # no retention of a reference that finds nothing
                "frontier": [_public(r) for r in sorted((r for r in rows if r["setting"] in frontier), key=lambda r: r[cost])],
                "frontier_not_choosable": [{**_public(r), "why_not_choosable": why_not_choosable(r, allow_disk)}
                                           for r in sorted((r for r in rows if r["setting"] in set_aside), key=lambda r: r[cost])],
                "sweep": [_public(r) for r in rows],
            })
            return plan

        plan = write(chosen)
        if verify is not None:
            # The choice was made on what the objective scored (a label-free plan: its sample); ``verify`` measures the
            # written plan as it will serve (every corpus row). Below the target, the next dearer setting is written and
            # measured, up to MAX_VERIFIED settings; the first that keeps the target stays, else the best measured.
            checks: list[tuple[dict[str, Any], bool, dict[str, Any]]] = []
            while True:
                meets, record = verify(out)
                checks.append((chosen, meets, dict(record)))
                if meets or len(checks) >= MAX_VERIFIED:
                    break
                following = _dearer_choice(rows, chosen, budget_bytes, target_retention, reference, y, x=cost)
                if following is None:
                    break
                logger.info("%s: %s keeps %.4f when served, below the target; trying %s (%g B)", name, chosen["setting"],
                            record.get("agreement", float("nan")), following["setting"], following["ram_bytes"])
                chosen = following
                plan = write(chosen)
            kept = next((c for c in checks if c[1]), None) or max(checks, key=lambda c: c[2].get("agreement", 0.0))
            if kept[0] is not chosen:
                chosen = kept[0]
                plan = write(chosen)
            plan["full_corpus"] = kept[2]
            plan["full_corpus_checks"] = [c[2] for c in checks]
            write_json_with_digest(out / PLAN_FILE, plan)
        if final:
            plan["test"] = score_plan(experiment, out, "test")
            write_json_with_digest(out / PLAN_FILE, plan)
        return plan


#: The corpus size the cost plot (``frontier_cost.png``) and the printed $/month are at.
BILL_AT = scale_label(BILL_SCALES[-1])
COST_PLOT = "frontier_cost.png"


def _setting(space: str, row: Mapping[str, Any]) -> str:
    """A row's setting: its space and precision, and a refined row's ``+refine<N>``."""
    name = f"{space}/{row['precision']}"
    return refined_name(name, row["refine"]) if row.get("refine") else name


def _name_frozen_rows(rows: list[dict[str, Any]], input_dim: int) -> None:
    for row in rows:
        row["setting"] = _setting(f"frozen-{input_dim}", row)
        row["candidate"] = None


def is_learned(method: str | None) -> bool:
    """Whether compressor ``method`` is a learned map: trained from a seed (DIVE, the adaptors, the autoencoder), unlike the
    closed-form truncation and PCA, and the frozen vectors."""
    return method is not None and method != "frozen" and get_compressor_class(method).seed_dependent


def gate_learned(rows: list[dict[str, Any]], y: str, p_below: float = LEARNED_GATE_P) -> list[dict[str, Any]]:
    """Make a learned map's rows choosable only where they beat the best choosable row without a learned map at the same
    or fewer bytes, in the same tier, by a paired test over the validation's queries (``per_query``; p < ``p_below``,
    :data:`LEARNED_GATE_P` by default, and a higher mean; ``p_below`` above 1 turns the gate off); returns the rows it
    made unchoosable, each with ``gated_by`` (the rival, p and the difference).

    A learned map is kept in a plan only where it earns its place, and a higher mean alone is not that. In the near-limit
    benchmark (label-free DIVE in front of a codec, against the best codec without it at the same bytes, each chosen by
    agreement@10 on held-out documents), agreement differences of +0.004 to +0.009 came with test nDCG@10 differences of
    −0.027 (p 0.009) to −0.002, and differences of +0.012 to +0.020 with −0.003 to +0.009.
    """
    if p_below > 1:
        return []
    plain = [r for r in rows if r.get("choosable") and not is_learned(r.get("method")) and r.get("per_query")]
    gated = []
    for row in rows:
        if not row.get("choosable") or not is_learned(row.get("method")) or not row.get("per_query"):
            continue
        rivals = [r for r in plain if r["ram_bytes"] <= row["ram_bytes"] and r.get("tier", "ram") == row.get("tier", "ram")]
        if not rivals:
            continue
        rival = max(rivals, key=lambda r: (r[y], -r["ram_bytes"], str(r.get("setting", ""))))
        test = paired_test(*align_by_query(row["per_query"], rival["per_query"]))
        if test.mean_difference <= 0 or test.p_value >= p_below:
            row["choosable"] = False
            row["gated_by"] = {"setting": rival["setting"], "p": float(test.p_value), "difference": float(test.mean_difference)}
            gated.append(row)
    return gated


def _mark_choosable(rows: list[dict[str, Any]], allow_disk: bool) -> None:
    for row in rows:
        # A disk-rescore setting reads float32 vectors from disk for every query: another tier of serving, chosen only when asked.
        row["choosable"] = row.get("choosable", True) and (allow_disk or row.get("tier", "ram") == "ram")


def search_budgets(levels: Sequence[str], skip_reason: Callable[[str], str | None], score: Callable[[str], bool], has_target: bool,
                   everything: bool = False, top_first: bool = False,
                   oversized: Callable[[str], bool] | None = None) -> dict[str, str]:
    """Score the fewest ``levels`` (one family's settings, bytes ascending) the plan's choice needs; returns the others with why.

    ``score(level)`` scores one and says whether it keeps the target; ``skip_reason(level)`` says why the choice could not be
    it (above the budget, dearer than a setting keeping the target), or None. Quality grows with a family's bytes, so with a
    target this bisects for the cheapest level keeping it (about log2 of the levels scored); with a byte budget alone
    only the dearest level within it can be the best of the family. ``top_first`` scores the dearest level the choice could
    be before bisecting: one fit settles a family that falls short of the target everywhere (the 8-bit FAISS peers, minutes
    a fit, usually do), at the cost of one more fit for a family that keeps it. ``everything`` scores every level.

    ``oversized(level)``, asked after ``level`` is scored, says that the index it built costs more than the choice allows
    once its tables are counted (``count_tables``: above the budget; by default: larger than the float32 vectors). Tables
    grow with a family's bytes, so every dearer level is oversized too: with a budget alone the search steps down from
    the dearest level within it until one is not, and with a target an oversized level sends the bisection to cheaper ones.
    """
    if everything:
        for level in levels:
            score(level)
        return {}
    not_scored: dict[str, str] = {}
    too_big = oversized or (lambda level: False)
    if not has_target:
        allowed = [level for level in levels if skip_reason(level) is None]
        scored: list[str] = []
        for level in reversed(allowed):
            score(level)
            scored.append(level)
            if not too_big(level):
                break
        fits = scored[-1] if scored and not too_big(scored[-1]) else None  # the loop stops at the first that is not oversized
        for level in levels:
            if level not in scored:
                not_scored[level] = skip_reason(level) or (f"{fits} of the same family costs more and fits the budget" if fits
                                                           else "a cheaper level of the same family fits the budget")
        return not_scored
    kept: dict[int, bool] = {}
    big: set[int] = set()
    lo, hi = 0, len(levels) - 1

    def settle(index: int) -> bool:
        """Score a level; whether the bisection goes to cheaper levels (it keeps the target, or its index is oversized)."""
        kept[index] = score(levels[index])
        if too_big(levels[index]):
            big.add(index)
        return kept[index] or index in big

    if top_first:
        top = next((i for i in range(hi, -1, -1) if skip_reason(levels[i]) is None), None)
        if top is not None:
            hi = top - 1 if settle(top) else -1
    while lo <= hi:
        mid = (lo + hi) // 2
        if skip_reason(levels[mid]) is not None:
            hi = mid - 1
            continue
        lo, hi = (lo, mid - 1) if settle(mid) else (mid + 1, hi)
    for index, level in enumerate(levels):
        if index in kept:
            continue
        short = [levels[i] for i, ok in kept.items() if i > index and not ok and i not in big]
        oversized_above = [levels[i] for i in sorted(big) if i < index]
        not_scored[level] = skip_reason(level) or (
            f"{oversized_above[0]} of the same family is oversized with its tables, and this costs more" if oversized_above
            else f"{short[0]} of the same family costs more and fell short of the target" if short
            else "a cheaper level of the same family keeps the target")
    return not_scored


#: The most settings a plan writes and measures as served (``run_sweep``'s ``verify``) before it keeps the best of them.
MAX_VERIFIED = 4
#: Each setting tried after one that fell short as served costs at least this many times its bytes: a denser corpus
#: usually needs a clearly larger code, and every try encodes and searches the whole corpus.
VERIFY_STEP = 1.5


def _dearer_choice(rows: Sequence[Mapping[str, Any]], chosen: Mapping[str, Any], budget_bytes: float | None,
                   target_retention: float | None, reference: float, y: str, x: str = "ram_bytes") -> dict[str, Any] | None:
    """The setting to try after ``chosen`` fell short as served, or None.

    Among the choosable rows within the budget costing at least :data:`VERIFY_STEP` times ``chosen``'s bytes (``x``) and
    keeping the target where they were scored, the cheapest (the best-scored at those bytes); without a target, none.
    """
    if target_retention is None:
        return None
    floor = VERIFY_STEP * float(chosen[x])
    pool = [r for r in rows if r.get("choosable") and r[x] >= floor and r[y] >= target_retention * reference
            and (budget_bytes is None or r[x] <= budget_bytes)]
    if not pool:
        return None
    return dict(min(pool, key=lambda r: (r[x], -r[y], str(r.get("setting", "")))))


def _target_out_of_reach(rows: Sequence[Mapping[str, Any]], levels: Sequence[str], dim: int, target_retention: float | None,
                         reference: float, y: str) -> bool:
    """Whether no choosable row scored so far keeps ``target_retention`` at or below the bytes of ``levels``' dearest level.

    Where to start a searched codec's budget search (:func:`search_budgets`' ``top_first``). When every setting at or
    below the family's top bytes has fallen short, the family usually falls short too (a 1M-row corpus at 0.95: every
    budget of ``klt-apq`` did), and its top level alone settles it in one fit instead of three; when something cheaper
    already keeps the target, the family's levels dearer than it are not scored and the family likely keeps the target
    too: a bisection from the middle is cheaper.
    """
    if target_retention is None or not levels or reference <= 0:
        return False
    top_bytes = max(Precision(level).ram_bytes(dim) for level in levels)
    return not any(r.get("choosable") and r["ram_bytes"] <= top_bytes and r[y] >= target_retention * reference for r in rows)


def _ceiling_applies(rows: Sequence[Mapping[str, Any]], budget_bytes: float | None, target_retention: float | None,
                     reference: float, y: str, allow_disk: bool, full_sweep: bool) -> bool:
    """Whether a compressed space is probed at float32 first (:data:`SPACE_CEILING_MARGIN`): with a target, no disk tier, not a
    full sweep, and a choosable row within the budget already keeping the target (so the choice keeps it whatever is skipped)."""
    if target_retention is None or allow_disk or full_sweep or reference <= 0:
        return False
    return any(r.get("choosable") and r[y] >= target_retention * reference and (budget_bytes is None or r["ram_bytes"] <= budget_bytes)
               for r in rows)


def _start_falls_short(rows: Sequence[Mapping[str, Any]], candidate: Candidate, margin: float | None, target_retention: float | None,
                       reference: float, y: str) -> str | None:
    """Why ``candidate`` (DIVE, fitted from a PCA start) is not fitted: its starts' float32 vectors, scored already, fall
    short of the target by more than ``margin`` of the reference (:attr:`PlanObjective.learned_start_margin`); else None."""
    if margin is None or candidate.method != "dive" or target_retention is None or reference <= 0:
        return None
    starts = {f"pca-{candidate.dim}", f"pca-uncentred-{candidate.dim}"}
    scored = [r[y] for r in rows if r.get("candidate") in starts and r.get("precision") == "float32" and "refine" not in r]
    if not scored or max(scored) + margin * reference >= target_retention * reference:
        return None
    return (f"its PCA starts' float32 vectors keep at most {max(scored) / reference:.4f} of the reference, more than {margin:g} "
            "below the target; label-free DIVE has scored at most 0.058 above its start")


def _short_searched_codec(rows: Sequence[Mapping[str, Any]], searched_codecs: Sequence[str], peer_bytes: float,
                          target_retention: float | None, reference: float, y: str) -> str | None:
    """Why an 8-bit FAISS peer of ``peer_bytes`` is not trained: a searched codec on the uncompressed vectors, at more bytes,
    fell short of the target (:data:`SEARCHED_CODEC_BEATS_CHEAPER_PEERS`, the measured rule); None when none did."""
    if not SEARCHED_CODEC_BEATS_CHEAPER_PEERS or target_retention is None or reference <= 0:
        return None
    short = [r for r in rows if r.get("method") == "frozen" and str(r.get("precision", "")).split(":")[0] in searched_codecs
             and "refine" not in r and r["ram_bytes"] > peer_bytes and r[y] < target_retention * reference]
    if not short:
        return None
    cheapest = min(short, key=lambda r: r["ram_bytes"])
    return (f"cheaper than {cheapest['setting']} ({cheapest['ram_bytes']:g} B), which fell short of the target; an 8-bit "
            "FAISS peer with fewer bytes than klt-apq scored below it on every corpus measured")


def _skip_reason(rows: Sequence[Mapping[str, Any]], peer_bytes: float, budget_bytes: float | None, target_retention: float | None,
                 reference: float, y: str) -> str | None:
    """Why a setting (a peer, a compressed space's precision, a codec budget) of ``peer_bytes`` per vector cannot be the
    choice among ``rows`` plus itself, or None when it could.

    Sound for the choice (:func:`~embedtune.workflows.pareto.choose`): above the byte budget it is never in the pool;
    with a retention target the choice is the cheapest row keeping it, so a setting dearer than a choosable row that
    already keeps it (within the budget) cannot be chosen, whatever its score. It may still have been on the frontier.
    """
    if budget_bytes is not None and peer_bytes > budget_bytes:
        return f"{peer_bytes:g} B is above the budget of {budget_bytes:g} B"
    if target_retention is None or reference <= 0:
        return None
    keeping = [r for r in rows if r.get("choosable") and r[y] >= target_retention * reference
               and (budget_bytes is None or r["ram_bytes"] <= budget_bytes)]
    if not keeping:
        return None
    cheapest = min(keeping, key=lambda r: (r["ram_bytes"], -r[y], str(r.get("setting", ""))))
    if peer_bytes > cheapest["ram_bytes"]:
        return f"dearer than {cheapest['setting']} ({cheapest['ram_bytes']:g} B), which already keeps the target"
    return None


def _bill_columns(row: Mapping[str, Any], input_dim: int, price_per_gb_month: float) -> dict[str, Any]:
    """The bill of one row (:func:`embedtune.index.bill.vector_bill`): its bytes, their share of float32, RAM and dollars at scale."""
    precision = Precision(row["precision"]) if row["precision"] != "sparse-fp16" else None
    if row.get("refine"):  # N original float32 vectors a query
        disk_read = Refine(int(row["refine"]), input_dim).disk_read_per_query()
    else:
        disk_read = precision.disk_read_per_query(int(row["dim"])) if precision is not None else 0
    return vector_bill(row["ram_bytes"], input_dim, held_once_bytes(row), disk_read, price_per_gb_month)


def held_once_bytes(row: Mapping[str, Any]) -> float:
    """What a setting holds once whatever the corpus's size: its codec's tables (``fixed_bytes``: codebooks, a codec's own
    rotation) and the weights of the map in front of it (``transform_bytes``: PCA's matrix, DIVE's adapter)."""
    return float((row.get("fixed_bytes") or 0) + (row.get("transform_bytes") or 0))


def why_not_choosable(row: Mapping[str, Any], allow_disk: bool) -> str:
    """Why a plan may not choose ``row``, in a few words (for the frontier of the settings set aside)."""
    if row.get("over_float32"):
        return (f"its index, {row['amortized_bytes']:,.0f} bytes per vector with its tables, is larger than the float32 vectors: "
                "--allow-index-over-float32")
    if row.get("gated_by"):
        gate = row["gated_by"]
        return f"a learned map not significantly better than {gate['setting']} at its bytes (p {gate['p']:.3f})"
    if row.get("tier", "ram") != "ram" and not allow_disk:
        return "reads float32 vectors from disk per query: --allow-disk-rescore"
    if row.get("method") == "csr":
        return "a learned peer, compared, never chosen"
    return "a reference: no FAISS index or store holds it"


def _choose_in_tier(rows: list[dict[str, Any]], budget_bytes: float | None, target_retention: float | None, reference: float,
                    y: str, allow_disk: bool, x: str = "ram_bytes") -> dict[str, Any]:
    """:func:`~embedtune.workflows.pareto.choose` among the ``choosable`` rows; when nothing qualifies but a disk-rescore
    row, or one whose index is larger than the float32 vectors, would, the error says so and names the flag that allows it."""
    try:
        return dict(choose([r for r in rows if r["choosable"]], budget_bytes, target_retention, reference, y=y, x=x))
    except ValueError as error:
        oversized = [r for r in rows if r.get("over_float32")]
        try:
            would = choose([r for r in rows if r["choosable"]] + oversized, budget_bytes, target_retention, reference, y=y, x=x)
        except ValueError:
            would = None
        if would is not None and would.get("over_float32"):
            raise ValueError(f"no setting qualifies whose index is smaller than the float32 vectors. {would['setting']} would "
                             f"({would['ram_bytes']:g} B of codes), but with its tables and map its index takes "
                             f"{would['amortized_bytes']:,.0f} bytes per vector over this corpus, larger than the float32 vectors: "
                             "keep the float32 vectors, or pass --allow-index-over-float32 (allow_index_over_float32=True) to "
                             "choose it anyway (a larger corpus shares the tables over more rows).") from None
        if allow_disk:
            raise
        disk = [r for r in rows if r.get("tier") == "disk-rescore"]
        try:
            would = choose([r for r in rows if r["choosable"]] + disk, budget_bytes, target_retention, reference, y=y, x=x)
        except ValueError:
            raise error from None
        if would.get("tier") != "disk-rescore":
            raise
        raise ValueError(f"{error} {would['setting']} would qualify, but it rescores with float32 vectors read from disk at query "
                         "time; pass --allow-disk-rescore (allow_disk=True) to choose such a setting.") from None


# -- the labelled plan -----------------------------------------------------------------------
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
    codecs: Sequence[str] = DEFAULT_CODECS,
    codec_budgets: Sequence[int] = CODEC_BUDGETS,
    allow_disk: bool = False,
    fit_sample: int | None = None,
    price_per_gb_month: float = DEFAULT_PRICE_PER_GB_MONTH,
    refine_candidates: int = DEFAULT_REFINE_CANDIDATES,
    full_sweep: bool = False,
    searched_codecs: Sequence[str] = SEARCHED_CODECS,
    learned_gate_p: float = LEARNED_GATE_P,
    count_tables: bool = False,
    allow_index_over_float32: bool = False,
) -> dict[str, Any]:
    """Sweep on validation queries, choose, refit on train+val, and write a deployable plan folder.

    :func:`run_sweep` with a :class:`LabelledObjective`.

    Args:
        experiment: a dataset with a query-disjoint split (train / val / test).
        out: the plan folder.
        budget_bytes: bytes per vector in RAM that the choice may use at most.
        target_retention: the share of the uncompressed float32 model's validation nDCG@10 to keep.
        methods: compressors to sweep (``frozen`` needs no fit; supervised ones train on the train queries).
        dims: dimensions (default :func:`sweep_dims`: d, d/2, d/3, d/6, d/12).
        precisions: precisions of every compressed space.
        peers: FAISS PQ/OPQ and additive families on the uncompressed vectors (see :func:`peer_factories`), at
            the byte sizes the precisions reach, and the quantiser peers :data:`QUANTISER_PEERS`
            (RaBitQ, TurboQuant, SQ4 on the uncompressed vectors, at their own bytes); ``csr`` adds
            CSR's sparse codes at the budgets in :data:`CSR_PEER_BYTES` (:func:`sweep_csr_rows`).
        seed: training seed.
        final: also score the chosen setting once on the held-out test queries.
        work: where the sweep's fits are kept (reused by a later run); default
            :func:`default_sweep_dir` of this experiment, shared by every plan on the same data.
        labels: JSON-safe fields for plan.json (dataset, model).
        variants: named variants (:data:`VARIANTS`, e.g. ``qat-binary``) swept beside each
            method's default, for the methods whose config has their fields.
        codecs: registered codec families (:mod:`embedtune.index.codecs.registry`) scored on the
            uncompressed vectors and on every compressor's output, at each of ``codec_budgets``
            bytes per vector that fits the dimension (:func:`codec_precisions`); with any, the
            textbook transform coder :data:`REFERENCE_CODEC` is scored on the uncompressed vectors
            as their reference, never chosen. ``()`` for none.
        codec_budgets: the codecs' bytes per vector.
        allow_disk: let the choice be a precision that rescores with float32 vectors read from
            disk at query time (``binary-rescore``, ``rabitq1-rescore``: rows of ``tier``
            ``"disk-rescore"``); by default the plan chooses among settings served from RAM alone. It also
            scores a ``+refine<N>`` copy of every in-RAM row within the budget (:mod:`embedtune.index.refine`) and
            FAISS's ``IndexRefineFlat`` over PCA + PQ as their peer.
        refine_candidates: N of the ``+refine<N>`` rows: candidates rescored with the uncompressed vectors.
        fit_sample: corpus rows the FAISS peers and codecs train on (default: the rule of
            :func:`~embedtune.index.fit_sample.fit_sample_size`); recorded in ``plan.json``.
        price_per_gb_month: dollars per GB of RAM a month for the bill's columns (an assumption by default:
            :data:`embedtune.index.bill.DEFAULT_PRICE_PER_GB_MONTH`).
        full_sweep: fit and score every setting, even those the choice could not be (above the budget, or dearer
            than a scored setting that keeps the target); by default they are listed under ``skipped_settings``
            and the FAISS peers among them are not trained. The choice is the same either way.
        searched_codecs: codec families fitted on the uncompressed vectors only, at the fewest of
            :data:`SEARCHED_CODEC_BUDGETS` that find the cheapest keeping the target (:func:`search_budgets`;
            every budget with ``full_sweep``); after the compressors, before the 8-bit peers. ``()`` for none.
        learned_gate_p: a learned map (DIVE) is chosen only where its validation scores beat the best setting without one
            at its bytes by a paired test below this p (:func:`gate_learned`); above 1: by any higher mean.
        count_tables: a setting costs its codes and its share of the corpus rows of what it holds once (a codec's
            rotations and codebooks, the weights of a map in front: :func:`held_once_bytes`), in the budget, the choice
            and the frontier: on a small corpus a codec's tables can outweigh its codes, and the float32 vectors. Off, it
            costs its codes, as FAISS's ``sa_code_size`` counts.
        allow_index_over_float32: also choose a setting whose index, its codes and its share of what it holds once, is
            larger than the float32 vectors (on a corpus of a few thousand rows, a codec's tables can be); off, such a
            setting is scored but never chosen, and the choice falls to a cheaper level or another setting.

    Returns:
        The plan (also ``OUT/plan.json``).
    """
    for method in methods:
        get_compressor_class(method)  # fail fast on a typo
    for variant in variants:
        _check_variant(variant)
        if not any(variant_applies(m, variant) for m in methods):
            raise ValueError(f"variant {variant!r} applies to none of the methods {list(methods)}.")
    return run_sweep(LabelledObjective(experiment), out, budget_bytes, target_retention, methods, dims, precisions, peers, seed, final, work,
                     labels, rounds, variants, codecs=codecs, codec_budgets=codec_budgets, allow_disk=allow_disk, fit_sample=fit_sample,
                     price_per_gb_month=price_per_gb_month, refine_candidates=refine_candidates, full_sweep=full_sweep,
                     searched_codecs=searched_codecs, learned_gate_p=learned_gate_p, count_tables=count_tables,
                     allow_index_over_float32=allow_index_over_float32)


#: Fewer unseen validation queries than this and the plan chooses on all of them, and says so.
MIN_UNSEEN_VALIDATION = 20


def selection_view(experiment: Experiment) -> tuple[Experiment, dict[str, Any]]:
    """The experiment whose ``val`` part holds only the validation queries with no positive among the train part's.

    Choosing on validation queries whose relevant documents are training positives rewards a
    compressor that learned where this corpus's popular documents lie; choosing on
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
    originals = np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32)
    xb = compressor.transform(originals)
    index = QuantizedIndex.build(xb, precision, calibration=calibration)
    refine = plan_refine(plan, str(Path(directory) / PLAN_FILE))
    if refine is not None:  # as `index build --plan` serves it: the codes' candidates, ranked by the original vectors
        refined = RefinedIndex(index, compressor.normalize_input(originals), refine, compressor)
        D, I = refined.search(experiment.embeddings.queries(ids), 101)
    else:
        D, I = index.search(xq, 101)
    metrics = evaluate_run(qrels, run_from_topk(ids, D, I, experiment.embeddings.doc_ids, 100, True), ("ndcg@10", "recall@10"))
    # Seen and unseen, relative to the train+val labels the plan fitted and chose on.
    groups = query_subsets(qrels, training_positives(experiment.qrels_for(experiment.part_ids("train+val"))))
    subsets = subset_means(metrics.per_query, groups)
    return {"queries": part, "ndcg@10": metrics["ndcg@10"], "recall@10": metrics["recall@10"], "n_queries": metrics.n_queries,
            "setting": plan["chosen"]["setting"],
            "subsets": {name: subsets[name] for name in ("seen", "unseen")}}


__all__.append("score_plan")
