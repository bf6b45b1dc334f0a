"""Refinement with the original vectors: an in-RAM code finds candidates, the model's own float32 vectors rank them.

This is FAISS's ``IndexRefineFlat`` route. A setting ``<compressor>/<precision>+refine<N>`` (for example
``pca-128/int8+refine100``) holds the precision's codes of the compressed vectors in RAM, searches them for
each query's top ``N``, and rescores those ``N`` exactly with the *original* float32 vectors (the model's,
before any compressor) read from disk, against the query's original float vector. So:

- RAM per vector: the code's bytes (the compressor's weights and the code's tables are fixed bytes);
- disk per vector: the code plus ``4 × d_original`` bytes (``original_vectors.npy`` beside the index);
- disk read per query: ``N × 4 × d_original`` bytes;
- tier ``"disk-rescore"``: chosen by ``compress plan`` only with ``--allow-disk-rescore``.

Unlike ``binary-rescore`` and ``rabitq1-rescore``, which rescore with the float32 vectors *of the compressed
space*, the final ranking here is the uncompressed model's own ranking of the candidates: only whether the
candidates hold the right documents depends on the compressor and the code.

A refinement is a wrapper, not a precision: :class:`Refine` (what a plan records), :class:`RefinedIndex`
(a :class:`~embedtune.index.codecs.QuantizedIndex` with the original vectors, what a plan scores) and
:func:`refine_candidates` (the rescoring both the plan and the deployed index run, so they rank alike).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from embedtune.evaluate.search import as_rows, break_ties, rescore
from embedtune.index.codecs import Precision, QuantizedIndex
from embedtune.index.store import ORIGINAL_VECTORS_FILE  # the index folder's file of original float32 vectors

if TYPE_CHECKING:
    from embedtune.compress import Compressor

__all__ = [
    "REFINE_MARK",
    "DEFAULT_REFINE_CANDIDATES",
    "REFINE_TIER",
    "ORIGINAL_VECTORS_FILE",
    "Refine",
    "RefinedIndex",
    "refine_candidates",
    "refinable",
    "refined_name",
    "split_refined",
    "plan_refine",
    "faiss_refine_peers",
]

#: What a refined setting's name ends with, before the candidates: ``pca-128/int8+refine100``.
REFINE_MARK = "+refine"
#: Candidates rescored with the original vectors unless told otherwise: FAISS users' usual ``k_factor`` for k = 10.
DEFAULT_REFINE_CANDIDATES = 100
#: The tier of every refined setting: it reads float32 vectors from disk at query time.
REFINE_TIER = "disk-rescore"
_REFINED = re.compile(r"^(?P<base>.+)\+refine(?P<candidates>[1-9]\d*)$")


@dataclass(frozen=True)
class Refine:
    """Rescore each query's top ``candidates`` with the original float32 vectors of ``original_dim`` dimensions."""

    candidates: int
    original_dim: int

    def __post_init__(self) -> None:
        for field, value in (("candidates", self.candidates), ("original_dim", self.original_dim)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"refine {field} must be a positive integer; got {value!r}.")

    @property
    def suffix(self) -> str:
        return f"{REFINE_MARK}{self.candidates}"

    def disk_read_per_query(self) -> int:
        """Bytes one query reads from disk: ``candidates`` original float32 vectors."""
        return int(self.candidates) * 4 * int(self.original_dim)

    def disk_bytes(self, ram_bytes: int) -> int:
        """Bytes per vector on disk: the code, and the original float32 vector beside it."""
        return int(ram_bytes) + 4 * int(self.original_dim)

    def to_dict(self) -> dict[str, Any]:
        return {"candidates": int(self.candidates), "original_dim": int(self.original_dim), "vectors": ORIGINAL_VECTORS_FILE,
                "disk_read_per_query": self.disk_read_per_query()}

    def recipe(self) -> dict[str, Any]:
        """How to serve the refinement outside embedtune (``plan.json`` field ``deployment.refine``)."""
        return {**self.to_dict(),
                "faiss": ("faiss.IndexRefineFlat(base, original float32 vectors) when the compressor is a FAISS pre-transform "
                          "(PCA, OPQ) of the base index; otherwise search the base index for the top candidates and rescore them "
                          "with the original vectors, as `embedtune index build --plan` and `search` do"),
                "lancedb": "not expressible: LanceDB's refine_factor rescores with the indexed column, not the model's original vectors"}


def refined_name(name: str, candidates: int) -> str:
    """``name`` (a precision or a setting) with the refinement's suffix: ``int8`` -> ``int8+refine100``."""
    return f"{name}{REFINE_MARK}{int(candidates)}"


def split_refined(name: str) -> tuple[str, int | None]:
    """``(base, candidates)`` of a refined name, ``(name, None)`` of any other."""
    match = _REFINED.match(name)
    return (match.group("base"), int(match.group("candidates"))) if match else (name, None)


def refinable(precision: Precision, frozen_space: bool) -> bool:
    """Whether a refined copy of ``precision``'s setting is worth scoring.

    Not a precision that rescores from disk already (``binary-rescore``, ``rabitq1-rescore``), not ``binary-asym``
    (its float · ±1 rescoring reorders the same Hamming candidates, so refined it is ``binary`` refined), not a
    reference codec (no FAISS index, never shipped), and not float32 of the uncompressed vectors (RAM already holds
    the original vectors: refining them changes nothing).
    """
    if precision.rescores_float or precision.name == "binary-asym":
        return False
    if precision.is_codec and not precision.uses_factory:
        return False
    return not (frozen_space and precision.name == "float32")


def refine_candidates(I: np.ndarray, original_queries: np.ndarray, original_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of each query's candidate rows ``I``, scored exactly against the original vectors.

    ``original_vectors`` may be a memory map: only the candidates' rows are read. FAISS's ``-1`` padding (an
    index that found fewer candidates) scores ``-inf`` and stays last. Ties are broken by ascending row, as
    every search in embedtune does, so the plan's scoring and the deployed index return the same hits.
    """
    I = np.asarray(I, dtype=np.int64)
    xq = as_rows(original_queries, "original query vectors")
    if xq.shape[0] != I.shape[0]:
        raise ValueError(f"{xq.shape[0]} original query vectors for {I.shape[0]} queries' candidates.")
    if xq.shape[1] != original_vectors.shape[1]:
        raise ValueError(f"the original query vectors are {xq.shape[1]}-d but the original document vectors are "
                         f"{original_vectors.shape[1]}-d: give the queries' vectors from the model the documents came from.")
    missing = I < 0
    D = rescore(xq, original_vectors, np.where(missing, 0, I))
    D[missing] = -np.inf
    D, I = break_ties(D, np.where(missing, np.iinfo(np.int64).max, I))
    I[I == np.iinfo(np.int64).max] = -1
    return D[:, :k], I[:, :k]


class RefinedIndex:
    """A :class:`~embedtune.index.codecs.QuantizedIndex` whose top ``refine.candidates`` are rescored with original vectors.

    ``search`` takes the queries' *original* vectors, maps them into the code's space with ``compressor`` (None:
    the code holds the original space) and rescores with them normalised as the compressor normalises its input,
    as the deployed index does (``original_vectors`` must be normalised so too). The byte accounting of
    :class:`QuantizedIndex` is kept, so a sweep scores it as any other index.
    """

    def __init__(self, base: QuantizedIndex, original_vectors: np.ndarray, refine: Refine, compressor: Compressor | None = None) -> None:
        if original_vectors.shape != (base.ntotal, refine.original_dim):
            raise ValueError(f"the original vectors have shape {original_vectors.shape}; the index holds {base.ntotal} vectors "
                             f"of {refine.original_dim} original dimensions.")
        self.base, self.original_vectors, self.refine, self.compressor = base, original_vectors, refine, compressor
        self.precision, self.dim, self.ntotal = base.precision, base.dim, base.ntotal

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)``: the top ``min(k, ntotal)`` of the base's top ``max(k, candidates)``, by exact original inner product."""
        xq = as_rows(xq, "xq")
        code_queries = self.compressor.transform(xq) if self.compressor is not None else xq
        original_queries = self.compressor.normalize_input(xq) if self.compressor is not None else xq
        fetch = min(self.ntotal, max(int(k), self.refine.candidates))
        _, I = self.base.search(code_queries, fetch)
        return refine_candidates(I, original_queries, self.original_vectors, min(int(k), self.ntotal))

    def ram_bytes(self) -> int:
        return self.base.ram_bytes()

    def fixed_bytes(self) -> int:
        return self.base.fixed_bytes()

    def disk_bytes(self) -> int:
        return self.refine.disk_bytes(self.base.ram_bytes())

    def reconstruct(self, x: np.ndarray) -> np.ndarray | None:
        """The base codes' reconstruction: the codes in RAM are the base's (the distortion reported is theirs)."""
        return self.base.reconstruct(x)


def plan_refine(plan: Mapping[str, Any], where: str = "plan.json") -> Refine | None:
    """The :class:`Refine` a plan records (field ``refine``), or None for a plan served from its codes alone."""
    recorded = plan.get("refine")
    if recorded is None:
        return None
    fix = "write the plan again with `embedtune compress plan --allow-disk-rescore`"
    if not isinstance(recorded, Mapping):
        raise ValueError(f"{where}: field 'refine' must be an object with 'candidates' and 'original_dim'; got {recorded!r}; {fix}.")
    try:
        refine = Refine(recorded.get("candidates"), recorded.get("original_dim"))  # type: ignore[arg-type]
    except ValueError as error:
        raise ValueError(f"{where}: field 'refine': {error} Fix: {fix}.") from None
    if recorded.get("vectors") != ORIGINAL_VECTORS_FILE:
        raise ValueError(f"{where}: field 'refine.vectors' is {recorded.get('vectors')!r}, not {ORIGINAL_VECTORS_FILE!r}; {fix}.")
    return refine


def faiss_refine_peers(input_dim: int, budgets: Sequence[int], n_train: int | None = None, min_train: int = 1024) -> list[str]:
    """The FAISS user's refined route at each budget: ``faiss:PCA{k},PQ{m}`` precisions of the uncompressed vectors.

    ``m`` is the budget (8-bit PQ, ``m`` bytes a vector); ``k`` is half the input dimension rounded down to a
    multiple of ``m`` (PCA halving the width is the usual first try; PQ needs ``m`` to divide it). Refined with
    the original vectors, each is ``IndexRefineFlat(IndexPreTransform(PCAMatrix, IndexPQ))``. Left out below
    ``min_train`` training points, as the 8-bit PQ peers are: 256 centroids per codebook need points to fit.
    """
    if n_train is not None and n_train < min_train:
        return []
    factories = []
    for budget in sorted(set(int(b) for b in budgets)):
        k = (input_dim // 2) // budget * budget
        if budget >= 1 and k >= budget:
            factories.append(f"faiss:PCA{k},PQ{budget}")
    return factories
