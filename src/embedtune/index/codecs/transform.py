"""Transform coding: rotate onto the corpus's principal axes (the KLT), keep the axes worth bits, quantise them.

The textbook recipe for a Gaussian-like source at a fixed rate (Huang & Schultheiss 1963; Gersho &
Gray, *Vector Quantization and Signal Compression*, ch. 8) and the FAISS-backed codecs of this
module:

``klt-pq:B`` (``B`` bytes per vector)
    the KLT (eigenvectors of the corpus covariance, as one FAISS ``LinearTransform`` with no bias,
    so a float query is rotated exactly as the documents are), then ``r`` principal axes grouped
    into ``B`` sub-spaces by eigenvalue allocation (Ge et al., *Optimized Product Quantization*,
    2013: each sub-space gets a balanced product of eigenvalues) and product-quantised with 256
    centroids each (8 bits). ``r`` is the number of axes whose reconstruction error on held-out
    corpus rows is lowest; the axes left out cost no bits (reverse water-filling gives them none).
    When no whole number of axes per sub-quantiser covers all ``d`` (48 sub-quantisers on 64 or on
    128 axes), every option leaves the weakest axes out; the choice then also tries every axis,
    zero-padded to the smallest multiple of ``B`` that holds them, at most ``2d``
    (:func:`padded_transform`): some sub-quantisers code an always-zero padded axis (eigenvalue 0)
    beside a real one, so the strongest axes get more of a sub-quantiser than the weakest.
``klt-pq4:B``
    the same with 4-bit sub-quantisers (``2B`` of them, 16 centroids each) searched by FAISS's
    fast-scan kernels: smaller tables (a corpus of a few thousand documents trains them well) and
    the fastest scan.
``klt-rq:B``
    the KLT, then residual quantisation of the ``r`` axes (``B`` stages of 256 centroids, beam
    search; Chen et al. 2010), scored by look-up tables. Lower error than ``klt-pq`` at the same
    bytes; slower to encode (minutes per million vectors per core).

Every codec takes the float query and scores it against the decoded documents, as FAISS's
asymmetric distance computation does. The centre of the corpus is not subtracted in the transform:
``q · (x - μ)`` and ``q · x`` differ by ``q · μ``, the same for every document, so rankings are
those of the centred code, and the quantisers' centroids absorb the mean. Scores therefore differ
from the float inner products by a per-query constant over the axes left out.

The codecs are fitted on at most :data:`FIT_SAMPLE` rows of the corpus (a seeded sample), so
their fit time stops growing with the corpus.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from embedtune.index.codecs.rate_distortion import water_level
from embedtune.index.codecs.registry import CodecFamily, register_codec
from embedtune.index.codecs.row_encoding import transform_matrix
from embedtune.index.codecs.sphere import SphereRanked
from embedtune.runtime import map_single_threaded, native_chatter_filtered, single_threaded

__all__ = ["FIT_SAMPLE", "fit_klt", "sampled_klt", "eigenvalue_allocation", "klt_transform", "padded_transform", "transform_matrix", "KltPQ", "KltPQ4",
           "KltPQ4Sphere", "KltRQ", "training_sample"]

#: Rows a transform codec is fitted on, at most (the KLT, the choice of axes and the quantisers' tables).
FIT_SAMPLE = 65_536
#: Share of the fit sample held out to choose how many axes to keep (at most :data:`MAX_HELD_OUT` rows).
HELD_OUT_FRACTION = 0.1
MAX_HELD_OUT = 5_000
#: The choice of axes trains each candidate on at most this many rows, with :data:`SELECTION_ITERATIONS` k-means
#: iterations (FAISS's default is 25): it ranks candidates, it does not build the final tables.
SELECTION_SAMPLE = 20_000
SELECTION_ITERATIONS = 10


def training_sample(x: np.ndarray, limit: int = FIT_SAMPLE, seed: int = 0) -> np.ndarray:
    """At most ``limit`` rows of ``x`` (a seeded random sample, in row order), as contiguous float32."""
    x = np.asarray(x)
    if len(x) > limit:
        x = x[np.sort(np.random.default_rng(seed).choice(len(x), size=limit, replace=False))]
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():  # a NaN or inf row would poison the KLT and every codebook, silently
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise ValueError(f"the vectors to fit a codec on hold NaN or inf (sampled row {bad}); drop or re-encode those rows first.")
    return x


def fit_klt(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(eigenvalues (d,), axes (d, d))`` of the covariance of ``x``'s rows, descending; ``axes[:, i]`` is axis ``i``."""
    x64 = np.asarray(x, dtype=np.float64)
    centred = x64 - x64.mean(axis=0)
    with single_threaded():  # the same axes on any thread count (a codec's k-means then finds the same codebooks)
        eigenvalues, axes = np.linalg.eigh(centred.T @ centred / max(1, len(centred)))
    order = np.argsort(-eigenvalues, kind="stable")
    axes = axes[:, order]
    # A fixed sign per axis (largest component positive), so the same corpus always gives the same transform.
    signs = np.sign(axes[np.abs(axes).argmax(axis=0), np.arange(axes.shape[1])])
    return np.clip(eigenvalues[order], 0.0, None), axes * np.where(signs == 0, 1.0, signs)


def sampled_klt(family: CodecFamily, x: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sample, eigenvalues, axes)`` for a transform codec's fit: ``x`` checked as a ``(n, d)`` matrix the family can code,
    at most :data:`FIT_SAMPLE` of its rows (:func:`training_sample`), and their KLT (:func:`fit_klt`)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"codec {family.name!r}: expected a (n, d) matrix; got shape {x.shape}.")
    family.check_dim(x.shape[1])
    sample = training_sample(x, seed=seed)
    eigenvalues, axes = fit_klt(sample)
    return sample, eigenvalues, axes


def eigenvalue_allocation(eigenvalues: np.ndarray, r: int, m: int) -> np.ndarray:
    """The first ``r`` axes in ``m`` groups of ``r / m``, each group's product of eigenvalues balanced (Ge et al. 2013).

    Returns the permutation: group ``j`` is ``perm[j * r/m : (j + 1) * r/m]``. Axes are dealt in
    decreasing variance, each to the non-full group with the smallest log-product so far.
    """
    if r % m:
        raise ValueError(f"{r} axes do not split into {m} equal groups.")
    size = r // m
    groups: list[list[int]] = [[] for _ in range(m)]
    log_product = np.zeros(m)
    for axis in range(r):
        open_groups = [j for j in range(m) if len(groups[j]) < size]
        empty = [j for j in open_groups if not groups[j]]
        j = empty[0] if empty else min(open_groups, key=lambda g: (log_product[g], g))
        groups[j].append(axis)
        log_product[j] += math.log(max(float(eigenvalues[axis]), 1e-30))
    return np.array([axis for group in groups for axis in group], dtype=np.int64)


def klt_transform(axes: np.ndarray) -> Any:
    """A FAISS ``LinearTransform`` ``y = axesᵀ x`` (no bias), marked orthonormal so ``sa_decode`` rotates back."""
    import faiss

    d_in, d_out = axes.shape
    transform = faiss.LinearTransform(int(d_in), int(d_out), False)
    faiss.copy_array_to_vector(np.ascontiguousarray(axes.T, dtype=np.float32).ravel(), transform.A)
    transform.is_trained = True
    transform.set_is_orthonormal()
    return transform


def padded_transform(axes: np.ndarray, perm: np.ndarray) -> list[Any]:
    """FAISS transforms ``x -> y`` (``r = len(perm)`` outputs) for axes ``perm`` of ``axes`` (``(d, d)``), where indices
    ``>= d`` are padded, always-zero axes.

    With no padded index, one :func:`klt_transform` (as always). With padded ones (``r > d``), the rotation onto the
    real axes in ``perm``'s order (a square, orthonormal ``LinearTransform``), then a ``RemapDimensionsTransform`` that
    places them among the ``r − d`` zero outputs: both invertible in any FAISS (``sa_decode`` after ``read_index``).
    """
    import faiss

    d = axes.shape[1]
    perm = np.asarray(perm, dtype=np.int64)
    if perm.max(initial=-1) < d:
        return [klt_transform(axes[:, perm])]
    real = perm[perm < d]
    if len(real) != d or len(np.unique(real)) != d:
        raise ValueError(f"a padded transform keeps every one of the {d} axes once; got {len(np.unique(real))} distinct of {len(real)}.")
    slots = np.full(len(perm), -1, dtype=np.int32)
    slots[perm < d] = np.arange(d, dtype=np.int32)
    remap = faiss.RemapDimensionsTransform(int(d), int(len(perm)), faiss.swig_ptr(slots))
    return [klt_transform(axes[:, real]), remap]


def _held_out_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    held = min(MAX_HELD_OUT, max(1, int(n * HELD_OUT_FRACTION)))
    order = np.random.default_rng(seed + 1).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


def _clustering(index: Any) -> Any:
    """The k-means parameters of the quantiser behind a KLT codec's transform."""
    import faiss

    inner = faiss.downcast_index(index.index)
    return inner.rq.cp if hasattr(inner, "rq") else inner.pq.cp


def train_quantiser(index: Any, x: np.ndarray) -> None:
    """``index.train(x)`` for a KLT codec's ``IndexPreTransform`` (its transforms fixed already), bit for bit.

    A plain 8-bit ``IndexPQ`` behind the transforms trains its sub-quantisers side by side
    (:func:`~embedtune.runtime.map_single_threaded`), each by the k-means ``ProductQuantizer::train`` runs for it
    (``Clustering(dsub, ksub, cp)`` on its slice of the transformed rows, with a flat L2 index), so the codebooks are
    the ones FAISS writes on one thread. FAISS trains them one after another; a fit runs on one thread so that its
    tables do not depend on the thread count, and this gives the sub-quantisers back the cores. Other quantisers train
    as FAISS trains them.
    """
    import faiss

    inner = faiss.downcast_index(index.index)
    plain_pq = (type(inner) is faiss.IndexPQ and not inner.do_polysemous_training
                and inner.pq.train_type == faiss.ProductQuantizer.Train_default and inner.pq.assign_index is None)
    if not plain_pq or not all(index.chain.at(i).is_trained for i in range(index.chain.size())):
        with single_threaded():
            index.train(x)
        return
    rows = np.ascontiguousarray(x, dtype=np.float32)
    with single_threaded():
        for i in range(index.chain.size()):  # as IndexPreTransform::train: each step's apply, in order
            rows = faiss.downcast_VectorTransform(index.chain.at(i)).apply(rows)
    pq = inner.pq
    dsub, ksub = int(pq.dsub), int(pq.ksub)

    def sub_quantiser(m: int) -> np.ndarray:
        clustering = faiss.Clustering(dsub, ksub, pq.cp)
        clustering.train(np.ascontiguousarray(rows[:, m * dsub : (m + 1) * dsub]), faiss.IndexFlatL2(dsub))
        return faiss.vector_to_array(clustering.centroids)

    centroids = map_single_threaded(sub_quantiser, range(int(pq.M)))
    faiss.copy_array_to_vector(np.concatenate(centroids).astype(np.float32), pq.centroids)
    inner.is_trained = True
    index.is_trained = True


class _KltCodec(CodecFamily):
    """Shared by the KLT codecs: fit the KLT, choose the axes on held-out rows, train the quantiser on the rest."""

    #: Axes per sub-quantiser the choice tries (``r = groups × this``).
    axes_per_group: ClassVar[tuple[int, ...]] = (1, 2, 3, 4, 6, 8, 12)

    def groups(self) -> int:
        """Sub-quantisers (or stages) the budget pays for."""
        return self.code_bytes

    def quantiser(self, r: int) -> Any:
        raise NotImplementedError

    def candidate_axes(self, eigenvalues: np.ndarray) -> list[int]:
        """The numbers of axes worth trying: multiples of :meth:`groups` up to ``d``, near the water-filling count."""
        d, m = len(eigenvalues), self.groups()
        active = int((eigenvalues > water_level(eigenvalues, self.bits(d))).sum())
        options = sorted({m * k for k in self.axes_per_group if m * k <= d})
        if not options:
            raise ValueError(f"codec {self.name!r}: {m} sub-quantisers need at least {m} dimensions; the vectors have {d}.")
        if options[-1] < d:
            # No whole number of axes per sub-quantiser covers d (48 groups on 64 or on 128 axes): the largest option
            # drops the weakest axes. Also try every axis, zero-padded to the smallest multiple of m that holds them
            # (at most 2d; held-out error decides).
            padded = [m * k for k in self.axes_per_group if d <= m * k <= 2 * d]
            options += padded[:1]
        # Those from about a third of the active axes to all of them (and the nearest above): PQ codes spend few
        # bits per axis, so the best r is below the Gaussian water-filling count, never far above it.
        lower = [r for r in options if r <= active]
        keep = [r for r in lower if r >= active / 3] or lower[-1:]
        above = [r for r in options if r > active][:1]
        return keep + above

    def check_dim(self, dim: int) -> None:
        super().check_dim(dim)
        if self.groups() > dim:
            raise ValueError(f"codec {self.name!r}: {self.groups()} sub-quantisers need at least {self.groups()} dimensions; "
                             f"the vectors have {dim}. Use a smaller budget, or int8 / float16 at this dimension.")

    def _index(self, axes: np.ndarray, r: int, perm: np.ndarray | None) -> Any:
        """The untrained codec on axes ``perm`` (the first ``r`` when None); indices ``>= d`` are zero-padded axes."""
        import faiss

        steps = padded_transform(axes, np.arange(r) if perm is None else perm)
        index = faiss.IndexPreTransform(steps[-1], self.quantiser(r))
        for step in reversed(steps[:-1]):
            index.prepend_transform(step)
        return index

    def _permutation(self, eigenvalues: np.ndarray, r: int) -> np.ndarray | None:
        # Beyond d, padded axes of eigenvalue 0 (dealt last, so the strongest axes get the groups of their own).
        padded = np.concatenate([eigenvalues, np.zeros(max(0, r - len(eigenvalues)))])
        return eigenvalue_allocation(padded, r, self.groups())

    def train(self, x: np.ndarray, seed: int = 0) -> Any:
        sample, eigenvalues, axes = sampled_klt(self, x, seed)
        candidates = self.candidate_axes(eigenvalues)
        if len(candidates) > 1 and len(sample) >= 20:
            fit_rows, held_rows = _held_out_split(len(sample), seed)
            fit_rows = fit_rows[:SELECTION_SAMPLE]
            errors = {}
            for r in candidates:
                index = self._index(axes, r, self._permutation(eigenvalues, r))
                _clustering(index).niter = SELECTION_ITERATIONS
                with native_chatter_filtered():
                    train_quantiser(index, sample[fit_rows])
                held = sample[held_rows]
                decoded = index.sa_decode(index.sa_encode(held))
                residual = held - decoded
                residual -= residual.mean(axis=0)  # the left-out axes' mean: a per-query constant, no ranking change
                errors[r] = float(np.mean(np.sum(residual.astype(np.float64) ** 2, axis=1)))
            r = min(candidates, key=lambda c: (errors[c], c))
        else:
            r = candidates[0]
        index = self._index(axes, r, self._permutation(eigenvalues, r))
        with native_chatter_filtered():
            train_quantiser(index, sample)
        return index


@register_codec
class KltPQ(_KltCodec):
    family = "klt-pq"
    summary = "KLT, then 8-bit product quantisation of the principal axes (eigenvalue allocation)"

    def quantiser(self, r: int) -> Any:
        import faiss

        return faiss.IndexPQ(int(r), self.groups(), 8, faiss.METRIC_INNER_PRODUCT)


@register_codec
class KltPQ4(_KltCodec):
    family = "klt-pq4"
    summary = "KLT, then 4-bit fast-scan product quantisation of the principal axes (eigenvalue allocation)"

    def groups(self) -> int:
        return 2 * self.code_bytes

    def quantiser(self, r: int) -> Any:
        import faiss

        return faiss.IndexPQFastScan(int(r), self.groups(), 4, faiss.METRIC_INNER_PRODUCT)


@register_codec
class KltPQ4Sphere(SphereRanked, KltPQ4):
    """``klt-pq4-sphere:B``: ``klt-pq4``'s codes and fast scan, each query's top candidates then ranked by the direction of
    their decoded vectors (:mod:`embedtune.index.codecs.sphere`): same bytes, for a cosine model's unit vectors."""

    family = "klt-pq4-sphere"
    summary = ("klt-pq4's codes and fast scan, the top candidates ranked by their decoded direction "
               "(a cosine model's unit vectors; no extra byte)")


@register_codec
class KltRQ(_KltCodec):
    family = "klt-rq"
    summary = "KLT, then 8-bit residual quantisation of the principal axes (beam search, look-up-table scoring)"
    #: Residual stages span every kept axis, so any r works; the choice tries these shares of the water-filling count.
    axes_shares: ClassVar[tuple[float, ...]] = (0.35, 0.5, 0.7)
    #: Beam width of the residual encoder (FAISS's default is 5).
    beam: ClassVar[int] = 5

    def candidate_axes(self, eigenvalues: np.ndarray) -> list[int]:
        d = len(eigenvalues)
        active = int((eigenvalues > water_level(eigenvalues, self.bits(d))).sum())
        return sorted({min(d, max(8, int(round(active * share / 8)) * 8)) for share in self.axes_shares})

    def _permutation(self, eigenvalues: np.ndarray, r: int) -> np.ndarray | None:
        return None

    def check_dim(self, dim: int) -> None:
        CodecFamily.check_dim(self, dim)

    def quantiser(self, r: int) -> Any:
        import faiss

        index = faiss.IndexResidualQuantizer(int(r), self.code_bytes, 8, faiss.METRIC_INNER_PRODUCT,
                                             faiss.AdditiveQuantizer.ST_LUT_nonorm)
        index.rq.max_beam_size = self.beam
        return index
