"""In-RAM peer codecs a user would pick instead of ours, at a budget of bytes per vector held in RAM.

FAISS-contrib style: plain functions, numpy in and numpy out. ``xb`` is the ``(n, d)`` float32 corpus,
``xq`` the ``(nq, d)`` float32 queries; every search returns ``(D, I)``, ``D`` float32 scores with higher
better (an estimate of the inner product; the vectors are unit-norm sentence embeddings, so cosine = dot)
and ``I`` int64 row ids of ``xb``. Every search is exhaustive: no partition is skipped.

Peers (``PEERS`` maps each name to ``(xb, budget, seed) -> PeerIndex | None``):

``scann-ah``
    ScaNN (``scann`` on PyPI, tested with 1.4.2) anisotropic vector quantisation, brute force over
    the codes (``scann.scann_ops_pybind.builder(xb, k, "dot_product").score_ah(...)``, no ``tree``,
    no ``reorder``), LUT16 hashing as ScaNN defaults to: 16 centres (4 bits) per block, so a
    ``budget``-byte code has ``2 * budget`` blocks. When ``d`` divides into them every block has
    ``d / blocks`` dimensions (``CHUNK`` projection, exactly what ``score_ah(dimensions_per_block)``
    writes); when it does not (d=384 at 128 B: 256 blocks) the same config is written with ScaNN's
    ``VARIABLE_CHUNK`` projection, ``d mod blocks`` blocks one dimension wider than the rest, so the
    code is still exactly ``budget`` bytes. ``None`` when ``2 * budget > d`` (a block needs a dimension).
``scann-ah256``
    The same with ScaNN's other hash type, LUT256 (256 centres, 8 bits per block): ``budget`` blocks.
    Listed because of how ScaNN 1.4.2 holds LUT16 codes (``held_bytes`` below): LUT256 holds exactly its
    code, so it is the ScaNN variant whose *held* RAM equals the budget.
``scann-ah+int8-reorder``
    ``scann-ah`` followed by ScaNN's exact reordering over int8 data (``reorder(..., quantize=INT8)``,
    100 candidates by default): RAM = AH code + ``d`` bytes of int8 per vector, so the AH code gets
    ``budget - d`` bytes. ``None`` whenever ``budget - d`` cannot be such a code (always for d=384
    or 768 at budgets of at most 128 B: the int8 copy alone is over the budget).
``rabitq-ext``
    Extended (multi-bit) RaBitQ from ``rabitqlib`` (RaBitQ-Library's bindings, tested with 0.7.1):
    ``rabitqlib.IvfIndex(dim, max_elements, num_clusters=1, nbits, metric="ip")`` built with one
    cluster (centroid = the corpus mean, the one-centroid k-means solution) and searched with
    ``nprobe=1``, so every vector is scanned; the query is passed as float32 (the library builds its
    FastScan lookup tables from it, and the extra bits are scored against the rotated float query).
    ``nbits`` (total bits per dimension, 1-9) is the largest whose code plus per-vector factors fits
    in the budget. The layout (RaBitQ-Library ``quantization/data_layout.hpp``): a 1-bit code of
    ``D/8`` bytes and three float32 factors (``f_add``, ``f_rescale``, ``f_error``: 12 B) per vector,
    plus for ``nbits > 1`` an extra-bit code of ``D * (nbits-1) / 8`` bytes and two float32 factors
    (``f_add_ex``, ``f_rescale_ex``: 8 B), where ``D`` is ``d`` padded to a multiple of 32 (its
    rotator pads). ``None`` when even 1 bit does not fit: the smallest code at d=384 is
    48 + 12 = 60 B, at d=768 96 + 12 = 108 B, so 16-48 B budgets (and 64 B at d=768) are out of reach.

Bytes. ``PeerIndex.ram_bytes`` is the codec's bytes per vector, the number compared with the budget:
the packed AH code for ScaNN (``blocks * bits / 8``; with int8 reordering plus ``d``), code plus
per-vector factors for RaBitQ. ``PeerIndex.held_bytes`` is what the installed build of the library
actually keeps per vector in RAM, which can be more, and was measured (``in_ram_peers_check.py
--measure-ram``: RSS growth between two corpus sizes, the float input freed):

* ScaNN LUT16 (``scann-ah``) holds ``3 * ram_bytes``: the searcher keeps the unpacked hashed dataset,
  one byte per block (the ``hashed_dataset.npy`` that ``serialize`` writes, shape ``(n, blocks)``
  uint8), besides the packed 4-bit copy it scans (measured at d=384: 48 B per vector for a 16 B code,
  192 B for a 64 B code). LUT256 holds its code only (measured 128 B for a 128 B code); int8
  reordering adds exactly ``d`` (its serialized ``int8_dataset.npy`` is ``(n, d)`` int8; the
  per-dimension ``int8_multipliers`` and the empty ``dp_norms`` of dot product are fixed bytes).
* RaBitQ's IVF also keeps a 4-byte id (uint32 ``PID``) per vector: ``held_bytes = ram_bytes + 4``
  (measured: 64 B at d=384 and 1 bit, 120 B at 2 bits). ``ram_bytes`` is not guessed: at build the
  per-vector bytes are measured from the saved sizes of two throwaway indexes of 64 and 128 vectors
  (their difference over 64, minus the 4-byte id) and checked against the layout above.

``PeerIndex.fixed_bytes`` are the bytes that do not grow with the corpus (ScaNN's codebooks,
``centres * d * 4``, and the int8 multipliers, ``4 d``; RaBitQ's centroid and rotation, taken from
the saved file).

Seeds. Neither library takes one from Python: ScaNN's training is deterministic (same codes every
build), RaBitQ draws its random rotation itself, so two builds of ``rabitq-ext`` differ (on SciFact
MiniLM, nDCG@10 over 10 builds: 0.625 ± 0.009 at 64 B, 0.641 ± 0.005 at 128 B).
``seed`` is accepted for the common signature and recorded in ``params``.

Threads: training and search run on one thread (``set_n_training_threads(1)``, ``search_batched``
without ``parallel``; RaBitQ ``num_threads=1``); set ``OMP_NUM_THREADS=1`` as well.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = [
    "PeerIndex",
    "Infeasible",
    "PEERS",
    "BUDGETS",
    "build_scann_ah",
    "build_scann_ah256",
    "build_scann_ah_int8_reorder",
    "build_rabitq_ext",
    "search",
    "ram_bytes",
    "infeasible_reason",
    "exact_search",
]

BUDGETS = (16, 32, 48, 64, 128)
RABITQ_ID_BYTES = 4  # uint32 PID per vector in IvfIndex


class Infeasible(ValueError):
    """The peer cannot hold a code of this budget at this dimension."""


@dataclass
class PeerIndex:
    """A built peer: ``search(xq, k) -> (D, I)``; bytes are per vector (see the module docstring)."""

    name: str
    budget: int
    ram_bytes: int  # the codec's bytes per vector (what the budget is compared with)
    held_bytes: int  # what the installed library keeps per vector in RAM
    fixed_bytes: int  # bytes that do not grow with the corpus
    fit_s: float
    params: dict[str, Any]
    impl: Any = field(repr=False)
    _search: Callable[[Any, np.ndarray, int], tuple[np.ndarray, np.ndarray]] = field(repr=False)

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if xq.ndim != 2:
            raise ValueError(f"xq must be 2-d, got shape {xq.shape}")
        D, I = self._search(self.impl, xq, int(k))
        return np.asarray(D, dtype=np.float32), np.asarray(I, dtype=np.int64)


def search(obj: PeerIndex, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(D, I)`` of the ``k`` best rows of the peer's corpus for each query; D higher is better."""
    return obj.search(xq, k)


def ram_bytes(obj: PeerIndex) -> int:
    """The codec's bytes per vector in RAM (``obj.held_bytes`` is what the library build really keeps)."""
    return int(obj.ram_bytes)


def exact_search(xb: np.ndarray, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact float32 inner-product top-k (the reference every peer is measured against)."""
    scores = np.asarray(xq, dtype=np.float32) @ np.asarray(xb, dtype=np.float32).T
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    I = np.take_along_axis(part, order, axis=1).astype(np.int64)
    return np.take_along_axis(scores, I, axis=1), I


def _as_corpus(xb: np.ndarray) -> np.ndarray:
    xb = np.ascontiguousarray(xb, dtype=np.float32)
    if xb.ndim != 2 or xb.shape[0] == 0:
        raise ValueError(f"xb must be a non-empty (n, d) array, got shape {xb.shape}")
    return xb


# ---------------------------------------------------------------------------------------------- ScaNN

_SCANN_HASH = {"lut16": (16, 4), "lut256": (256, 8)}  # centres per block, bits per block


def _scann_plan(d: int, budget: int, hash_type: str, int8_reorder: bool) -> dict[str, Any]:
    centres, bits = _SCANN_HASH[hash_type]
    code_bytes = budget - d if int8_reorder else budget
    if code_bytes <= 0:
        raise Infeasible(f"int8 reordering holds d={d} bytes per vector by itself, over the {budget} B budget")
    if (code_bytes * 8) % bits:
        raise Infeasible(f"a {code_bytes} B code is not a whole number of {bits}-bit blocks")
    blocks = code_bytes * 8 // bits
    if blocks > d:
        raise Infeasible(f"{blocks} blocks of {bits} bits need {blocks} dimensions; d={d}")
    width, wider = divmod(d, blocks)  # `wider` blocks of width+1 dims, the rest of width dims
    return {
        "hash_type": hash_type,
        "centres_per_block": centres,
        "bits_per_block": bits,
        "blocks": blocks,
        "dims_per_block": width if wider == 0 else f"{wider}×{width + 1}+{blocks - wider}×{width}",
        "ah_code_bytes": code_bytes,
        "reorder_int8_bytes": d if int8_reorder else 0,
        "_width": width,
        "_wider": wider,
    }


_CHUNK_STANZA = re.compile(r"projection \{[^{}]*projection_type: CHUNK[^{}]*\}")


def _scann_config(xb: np.ndarray, k: int, plan: dict[str, Any], aq_threshold: float, training_iterations: int,
                  reorder_k: int | None, training_sample_size: int | None = None) -> str:
    from scann.scann_ops.py import scann_builder
    import scann

    n, d = xb.shape
    width, wider, blocks = plan["_width"], plan["_wider"], plan["blocks"]
    builder = scann.scann_ops_pybind.builder(xb, k, "dot_product").score_ah(
        width if wider == 0 else d,  # placeholder width when the projection is rewritten below
        anisotropic_quantization_threshold=aq_threshold,
        training_sample_size=training_sample_size or n,  # default: train on every vector
        hash_type=plan["hash_type"],
        training_iterations=training_iterations,
    )
    if reorder_k is not None:
        builder = builder.reorder(reorder_k, quantize=scann_builder.ReorderType.INT8)
    config = builder.create_config()
    if wider:
        stanza = (f"projection {{ input_dim: {d} projection_type: VARIABLE_CHUNK "
                  f"variable_blocks {{ num_blocks: {wider} num_dims_per_block: {width + 1} }} "
                  f"variable_blocks {{ num_blocks: {blocks - wider} num_dims_per_block: {width} }} }}")
        config, count = _CHUNK_STANZA.subn(stanza, config)
        if count != 1:
            raise RuntimeError("could not find ScaNN's CHUNK projection stanza to rewrite:\n" + config)
    return config


def _scann_blocks(config: str) -> int:
    """Blocks of the AH projection, read back from the searcher's own config."""
    proj = config[config.index("asymmetric_hash"):]
    if "VARIABLE_CHUNK" in proj:
        body = proj[: proj.index("num_clusters_per_block")]
        return sum(int(b) for b in re.findall(r"variable_blocks \{\s*num_blocks: (\d+)", body))
    return int(re.search(r"num_blocks: (\d+)", proj).group(1))


def _scann_search(reorder_k: int | None):
    def run(searcher, xq: np.ndarray, k: int):
        pre = k if reorder_k is None else max(reorder_k, k)
        I, D = searcher.search_batched(xq, final_num_neighbors=k, pre_reorder_num_neighbors=pre)
        return D, I

    return run


def _build_scann(name: str, xb: np.ndarray, budget: int, seed: int, hash_type: str, int8_reorder: bool,
                 k: int = 10, aq_threshold: float = 0.2, training_iterations: int = 10,
                 reorder_k: int = 100, training_sample_size: int | None = None) -> PeerIndex | None:
    import scann  # noqa: F401  (ImportError when the peer is not installed)

    xb = _as_corpus(xb)
    n, d = xb.shape
    try:
        plan = _scann_plan(d, budget, hash_type, int8_reorder)
    except Infeasible:
        return None
    start = time.perf_counter()
    config = _scann_config(xb, k, plan, aq_threshold, training_iterations, reorder_k if int8_reorder else None,
                           training_sample_size)
    searcher = scann.scann_ops_pybind.create_searcher(xb, config, 1)
    fit_s = time.perf_counter() - start
    blocks = _scann_blocks(searcher.config())
    if blocks != plan["blocks"]:
        raise RuntimeError(f"ScaNN built {blocks} AH blocks, {plan['blocks']} were configured")
    code = blocks * plan["bits_per_block"] // 8
    ram = code + plan["reorder_int8_bytes"]
    if ram != budget:
        raise RuntimeError(f"{name}: {ram} B per vector configured for a {budget} B budget")
    # LUT16: ScaNN keeps the unpacked hashed dataset (1 B per block) next to the packed 4-bit codes.
    held = (blocks + code if hash_type == "lut16" else code) + plan["reorder_int8_bytes"]
    fixed = plan["centres_per_block"] * d * 4 + (4 * d if int8_reorder else 0)
    params = {k_: v for k_, v in plan.items() if not k_.startswith("_")}
    params.update(aq_threshold=aq_threshold, training_iterations=training_iterations,
                  training_sample_size=training_sample_size or n, seed=seed,
                  reorder_candidates=reorder_k if int8_reorder else None, tree=None)
    return PeerIndex(name=name, budget=budget, ram_bytes=ram, held_bytes=held, fixed_bytes=fixed, fit_s=fit_s,
                     params=params, impl=searcher, _search=_scann_search(reorder_k if int8_reorder else None))


def build_scann_ah(xb: np.ndarray, budget: int, seed: int = 0, **kw) -> PeerIndex | None:
    """ScaNN AH (LUT16, 4-bit blocks), brute force, no reordering; ``None`` when ``2 * budget > d``."""
    return _build_scann("scann-ah", xb, budget, seed, "lut16", False, **kw)


def build_scann_ah256(xb: np.ndarray, budget: int, seed: int = 0, **kw) -> PeerIndex | None:
    """ScaNN AH with LUT256 (8-bit blocks), brute force, no reordering; ``None`` when ``budget > d``."""
    return _build_scann("scann-ah256", xb, budget, seed, "lut256", False, **kw)


def build_scann_ah_int8_reorder(xb: np.ndarray, budget: int, seed: int = 0, **kw) -> PeerIndex | None:
    """ScaNN AH (LUT16) + int8 reordering; the AH code gets ``budget - d`` bytes; ``None`` when that is
    not a positive whole number of 4-bit blocks of at least one dimension each (``budget <= d``, always
    so for d=384/768 at budgets of at most 128 B)."""
    return _build_scann("scann-ah+int8-reorder", xb, budget, seed, "lut16", True, **kw)


# ---------------------------------------------------------------------------------------------- RaBitQ

def _rabitq_padded_dim(d: int) -> int:
    return -(-d // 32) * 32


def _rabitq_layout_bytes(d: int, nbits: int) -> int:
    """Code + per-vector factors, from RaBitQ-Library's data layout (see the module docstring)."""
    padded = _rabitq_padded_dim(d)
    one_bit = padded // 8 + 3 * 4
    extra = padded * (nbits - 1) // 8 + 2 * 4 if nbits > 1 else 0
    return one_bit + extra


def _rabitq_measured_bytes(d: int, nbits: int) -> tuple[int, int]:
    """(per-vector bytes incl. the 4-byte id, fixed file bytes), from the saved sizes of 64- and 128-vector indexes."""
    import rabitqlib

    rng = np.random.default_rng(0)
    sizes = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (64, 128):
            x = rng.standard_normal((n, d)).astype(np.float32)
            index = rabitqlib.IvfIndex(dim=d, max_elements=n, num_clusters=1, nbits=nbits, metric="ip")
            index.build(x, x.mean(0, keepdims=True), np.zeros(n, dtype=np.uint32), num_threads=1)
            path = os.path.join(tmp, f"ivf{n}")
            index.save(path)
            sizes.append(os.path.getsize(path))
    per_vector, rest = divmod(sizes[1] - sizes[0], 64)
    if rest:
        raise RuntimeError(f"RaBitQ index grew by {sizes[1] - sizes[0]} B for 64 vectors: not a whole number per vector")
    return per_vector, sizes[0] - 64 * per_vector


def _rabitq_nbits(d: int, budget: int) -> int:
    fits = [b for b in range(1, 10) if _rabitq_layout_bytes(d, b) <= budget]
    if not fits:
        raise Infeasible(f"1-bit RaBitQ at d={d} needs {_rabitq_layout_bytes(d, 1)} B (code {_rabitq_padded_dim(d) // 8} B "
                         f"+ 12 B of factors), over the {budget} B budget")
    return max(fits)


def _rabitq_search(index, xq: np.ndarray, k: int):
    ids, dist = index.search(xq, k, 1, num_threads=1)  # nprobe = 1 = every cluster
    return 1.0 - np.asarray(dist, dtype=np.float32), np.asarray(ids).astype(np.int64)  # "ip" distance is 1 - <q, x>


def build_rabitq_ext(xb: np.ndarray, budget: int, seed: int = 0, fast_quantization: bool = False) -> PeerIndex | None:
    """Extended RaBitQ, exhaustive (IVF with one cluster, probed); ``None`` when 1 bit/dim does not fit the budget."""
    import rabitqlib

    xb = _as_corpus(xb)
    n, d = xb.shape
    try:
        nbits = _rabitq_nbits(d, budget)
    except Infeasible:
        return None
    measured, fixed = _rabitq_measured_bytes(d, nbits)
    ram = measured - RABITQ_ID_BYTES
    if ram != _rabitq_layout_bytes(d, nbits) or ram > budget:
        raise RuntimeError(f"RaBitQ {nbits}-bit at d={d}: measured {ram} B per vector, layout says "
                           f"{_rabitq_layout_bytes(d, nbits)} B (budget {budget} B)")
    start = time.perf_counter()
    index = rabitqlib.IvfIndex(dim=d, max_elements=n, num_clusters=1, nbits=nbits, metric="ip")
    index.build(xb, xb.mean(0, keepdims=True), np.zeros(n, dtype=np.uint32), num_threads=1,
                fast_quantization=fast_quantization)
    fit_s = time.perf_counter() - start
    params = {"nbits": nbits, "padded_dim": _rabitq_padded_dim(d), "num_clusters": 1, "nprobe": 1,
              "code_bytes": _rabitq_padded_dim(d) * nbits // 8, "factor_bytes": ram - _rabitq_padded_dim(d) * nbits // 8,
              "fast_quantization": fast_quantization, "seed": seed}
    return PeerIndex(name="rabitq-ext", budget=budget, ram_bytes=ram, held_bytes=measured, fixed_bytes=fixed,
                     fit_s=fit_s, params=params, impl=index, _search=_rabitq_search)


# ---------------------------------------------------------------------------------------------- registry

PEERS: dict[str, Callable[..., PeerIndex | None]] = {
    "scann-ah": build_scann_ah,
    "scann-ah256": build_scann_ah256,
    "scann-ah+int8-reorder": build_scann_ah_int8_reorder,
    "rabitq-ext": build_rabitq_ext,
}

PEER_PACKAGES = {"scann-ah": "scann", "scann-ah256": "scann", "scann-ah+int8-reorder": "scann", "rabitq-ext": "rabitqlib"}


def infeasible_reason(name: str, d: int, budget: int) -> str | None:
    """Why ``PEERS[name]`` returns ``None`` at this ``d`` and ``budget`` (``None`` when it builds)."""
    try:
        if name == "rabitq-ext":
            _rabitq_nbits(d, budget)
        else:
            _scann_plan(d, budget, "lut256" if name == "scann-ah256" else "lut16", name == "scann-ah+int8-reorder")
    except Infeasible as why:
        return str(why)
    return None
