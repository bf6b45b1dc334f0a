"""``klt-tcq:B``: KLT, then a bit-shift trellis code over the principal axes, chosen by the Viterbi algorithm.

A scalar quantiser per axis (the textbook coder, ``klt-sq``) spends a whole number of bits on each
axis and quantises each alone: at about one bit an axis it sits 1.5–2.5 dB above the Gaussian
rate-distortion bound, and a product quantiser of 8-bit tables over groups of axes (``klt-pq``) is
not much nearer. A *trellis* code quantises the whole sequence of axes at once (Marcellin & Fischer,
*Trellis coded quantization of memoryless and Gauss-Markov sources*, IEEE Trans. Comm. 1990; the
bit-shift trellis of Tseng et al., *QTIP*, 2024):

1. rotate onto the principal axes (the KLT) and split the ``8B`` bits over them by reverse
   water-filling: axis ``i`` gets rate ``R_i = max(0, ½ log2(λ_i / θ))``; the *running* sum of the
   rates, rounded down, says after which axis each bit is emitted, so an axis may get no bit of its
   own (a fractional rate) and the bits add up to ``8B`` exactly;
2. the code of a vector is one stream of ``8B`` bits. The decoder reads the axes weakest first; on
   reaching axis ``i`` it shifts that axis's ``k_i`` bits into an ``L``-bit register (the *state*,
   :data:`STATE_BITS`, zero at the start) and reconstructs ``ŷ_i = s_i · c_i[state]`` from a fixed table
   ``c_i`` of ``2^L`` Gaussian values (seeded) and a scale ``s_i`` fitted by least squares. An axis with no
   bit of its own still gets a value that depends on the bits before it, so the axes share bits, as a
   vector quantiser's do;
3. the encoder chooses the whole stream that minimises ``Σ (y_i − ŷ_i)²``: a shortest path through
   the ``2^L`` states, found by the Viterbi algorithm (``O(r · 2^L)`` per vector; a state's cost depends
   only on the state, so each step is a minimum over the ``2^k`` states that shift into it).

Measured (``benchmarks/near_limit.py``, each half of the corpus coded by tables fitted on the other):
at 32 B on SciFact MiniLM it is 0.9 dB above the bound, where ``klt-pq`` is 1.6 and ``klt-sq`` 1.9.
Much of that is the small fit sample and the coded half's own (too spread) sample spectrum: fitted on 50,000
draws of a Gaussian with a corpus's spectrum, it is 0.43-0.56 dB above that source's bound at 32 B, and with a
12-bit register (``KltTCQ(B, state_bits=12)``, four times the encoding time) 0.32-0.42 dB
(``benchmarks/trellis_gap_at_scale.py``). :data:`STATE_BITS` is 10.

Scoring decodes blocks of codes to the rotated axes and takes the float query's inner products with
them (as :class:`~embedtune.index.codecs.textbook.ScalarTransformIndex` does). FAISS has no index type
for these codes, so embedtune's numpy scan serves them (``numpy_scan``): a plan saves the tables as
``codec.safetensors``, ``index build --plan`` writes the tables and the codes as ``index.safetensors``,
and ``search`` scans them. The scan decodes every code it scores, once per batch of queries: fast for
batches (at 1M vectors and 32 B, 1.1-1.35 times as many queries a second as FAISS's 8-bit ``PQ32`` scan);
up to four queries are scored by look-up tables over runs of axes instead, summed a block of codes at a time
(:mod:`~embedtune.index.codecs.window_sums`; 0.09-0.1 s over 1M codes, FAISS ``PQ32`` 0.010 s;
:meth:`TrellisTransformIndex.search`). Encoding is the Viterbi search, about 5,000 vectors a second per
thread at 32 B (``benchmarks/trellis_speed.py``). FAISS and the vector stores cannot load the
codes, so the family is not among a plan's defaults: ask for it with ``--codecs`` or ``--searched-codecs``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from embedtune.index.codecs.rate_distortion import water_level
from embedtune.index.codecs.registry import CodecFamily, register_codec
from embedtune.index.codecs.sphere import common_norm
from embedtune.index.codecs.textbook import TABLES_FILE, RotatedCodeIndex, read_rotated_index, register_rotated_index
from embedtune.index.codecs.transform import sampled_klt
from embedtune.index.codecs.window_sums import window_sums
from embedtune.runtime import progress_bar, thread_budget

__all__ = ["STATE_BITS", "MAX_STATE_BITS", "KltTCQ", "KltTCQSphere", "KltTCQ12", "KltTCQ12Sphere", "TrellisTransformIndex", "trellis_bits", "viterbi_states"]

#: ``L``: bits of the trellis register (``2^L`` states). Encoding time grows as ``2^L``.
STATE_BITS = 10
#: The longest register :class:`KltTCQ` takes: a block's back-pointers are ``ENCODE_BLOCK × r × 2^L / 2`` bytes (about 200 MB
#: at 12 bits and 384 axes).
MAX_STATE_BITS = 12
#: Rows the per-axis scales are fitted on (least squares over the Viterbi codes, :data:`SCALE_PASSES` times).
SCALE_FIT_ROWS = 4_096
SCALE_PASSES = 2
#: Rows encoded per piece (:meth:`TrellisTransformIndex.sa_encode`): their states take ``rows × r × 8`` bytes.
ENCODE_ROWS = 32_768
#: A lone query (or a few) is scored by look-up tables over runs of axes (:meth:`TrellisTransformIndex.search`): a run's
#: axes read one window of the stream, the register plus at most this many later bits, so one table of ``2^(L + 3)``
#: sums scores the whole run (about a quarter as many look-ups per code as decoding every axis).
RUN_EXTRA_BITS = 3
#: Batches of at most this many queries take the look-up tables; larger ones decode each block once for all of them.
#: Over 1M codes of 32 B (one thread, 2026-12-07): 3 queries 0.25 s by the tables against 0.61 s decoding, 4 queries 0.32 s
#: against 0.61 s (0.44 s against 0.82 s on the sphere), 6 queries 0.50 s against 0.65 s, 8 queries 0.67 s against 0.73 s;
#: over fewer codes both take a few milliseconds.
TABLE_SCAN_QUERIES = 4
#: Candidates the tables pass, past ``k``, to the exact scoring of the decoded rows.
TABLE_SCAN_MARGIN = 32
#: Codes decoded at once: their registers and values (``rows × r × 4`` bytes each) stay in a core's cache.
DECODE_BLOCK = 1_024
#: At most this many bytes of Viterbi work (back-pointers and costs) held at once by blocks encoded on several threads.
ENCODE_BYTES = 1 << 30
#: Rows encoded at once: the Viterbi back-pointers of a block take ``rows × r × 2^L / 2`` bytes or less.
ENCODE_BLOCK = 256


def trellis_bits(eigenvalues: np.ndarray, bits: int, state_bits: int = STATE_BITS) -> np.ndarray:
    """Bits emitted at each axis (descending eigenvalues): the running sum of the water-filling rates, rounded down.

    Returns ``(d,)`` integers summing to ``bits``, each at most ``state_bits``; zero beyond the axes whose rate is positive.
    """
    lam = np.clip(np.asarray(eigenvalues, dtype=np.float64), 0.0, None)
    if not (lam > 0).any():
        raise ValueError("the vectors to fit a trellis code on do not vary (every row is the same), so there is nothing to code; "
                         "check that the input holds the embeddings you meant.")
    if bits < 1 or bits > state_bits * int((lam > 0).sum()):
        raise ValueError(f"{bits} bits do not fit {int((lam > 0).sum())} axes of positive variance at most {state_bits} bits "
                         "each; use a smaller budget.")
    theta = water_level(lam, float(bits))
    rates = np.where(lam > 0, np.maximum(0.0, 0.5 * np.log2(np.maximum(lam, 1e-300) / max(theta, 1e-300))), 0.0)
    running = np.cumsum(rates) * (bits / rates.sum())
    emitted = np.diff(np.concatenate([[0], np.floor(running + 1e-9)])).astype(np.int64)
    emitted[-1] += int(bits) - int(emitted.sum())  # rounding at the end of the running sum
    # A register of L bits holds at most L new bits: move any excess to the strongest axes with room (rare: λ far above the
    # rest). The check above leaves room among the axes of positive variance.
    excess = int(np.maximum(emitted - state_bits, 0).sum())
    emitted = np.minimum(emitted, state_bits)
    for axis in np.flatnonzero(lam > 0):
        room = min(excess, state_bits - int(emitted[axis]))
        emitted[axis] += room
        excess -= room
    return emitted


def viterbi_states(y: np.ndarray, scale: np.ndarray, bits: np.ndarray, codebook: np.ndarray, state_bits: int = STATE_BITS,
                   block: int = ENCODE_BLOCK, threads: int | None = None) -> np.ndarray:
    """The register's state after each axis, for the stream that minimises ``Σ_i (y_i − scale_i · codebook_i[state_i])²``.

    Args:
        y: ``(n, r)`` the rotated vectors, axes in the order the decoder reads them.
        scale: ``(r,)``; bits: ``(r,)`` bits shifted in at each axis; codebook: ``(r, 2^L)``.
        block: rows searched together; threads: blocks searched at once (default :func:`~embedtune.runtime.thread_budget`;
            numpy releases the GIL in each step, and the states do not depend on it).

    Returns:
        ``(n, r)`` int64 states (the register starts at 0; after axis ``i`` it is ``(state << k_i | new bits) mod 2^L``).
    """
    y = np.asarray(y, dtype=np.float32)
    n, r = y.shape
    values = (np.asarray(scale, dtype=np.float32)[:, None] * np.asarray(codebook, dtype=np.float32)).astype(np.float32)
    bits = np.asarray(bits, dtype=np.int64)
    states = np.empty((n, r), dtype=np.int64)
    # States by rows, vectors along the columns: every step below then runs over long contiguous rows (a state's cost for
    # the block's vectors), where vectors by rows would leave 2^k-long inner loops.
    by_axis = np.ascontiguousarray(y.T)
    # About 5,000 vectors a second at 32 B: a bar from a few thousand rows on (it appears only once the job has run a while).
    bar = progress_bar(n, "klt-tcq: Viterbi encoding", unit="vector", leave=False)

    def search(start: int) -> int:
        states[start : start + block] = _viterbi_block(by_axis[:, start : start + block], values, bits, state_bits)
        return min(block, n - start)

    starts = range(0, n, block)
    states_count = 1 << state_bits
    block_bytes = block * (sum(states_count >> int(k) for k in bits if k) + 8 * states_count)  # back-pointers, two cost rows
    workers = min(thread_budget() if threads is None else int(threads), len(starts), max(1, ENCODE_BYTES // block_bytes))
    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for done in pool.map(search, starts):
                bar.update(done)
    else:
        for start in starts:
            bar.update(search(start))
    bar.close()
    return states


def _viterbi_block(chunk: np.ndarray, values: np.ndarray, bits: np.ndarray, state_bits: int) -> np.ndarray:
    """:func:`viterbi_states` of one block: ``chunk`` is ``(r, m)``, the block's vectors by axis; returns ``(m, r)``."""
    r, m = chunk.shape
    states_count = 1 << state_bits
    cost = np.full((states_count, m), np.inf, dtype=np.float32)
    cost[0] = 0.0
    error = np.empty((states_count, m), dtype=np.float32)
    back: list[np.ndarray | None] = []
    for axis in range(r):
        np.subtract(values[axis][:, None], chunk[axis][None, :], out=error)
        np.square(error, out=error)
        k = int(bits[axis])
        if k:
            # The states shifting into state s are (u << (L - k)) | (s >> k), u = 0 .. 2^k - 1 (the high bits drop out):
            # the u-th block of rows. Their minimum is a knockout, neighbours paired each round; the lower u wins a tie, so
            # the path is argmin's (its first minimum). Pairwise rounds beat a masked running minimum several times over.
            best = cost.reshape(1 << k, states_count >> k, m)
            choice: np.ndarray | None = None
            for _ in range(k):
                right_wins = best[1::2] < best[0::2]
                if choice is None:
                    choice = right_wins.view(np.uint8) + np.arange(0, 1 << k, 2, dtype=np.uint8)[:, None, None]
                else:
                    choice = np.where(right_wins, choice[1::2], choice[0::2])
                best = np.minimum(best[0::2], best[1::2])
            assert choice is not None
            # New state s reads best[s >> k]: add it to the error in place, 2^k consecutive states at a time.
            error.reshape(states_count >> k, 1 << k, m)[...] += best[0][:, None, :]
            cost, error = error, cost
            back.append(choice[0])
        else:
            cost += error
            back.append(None)
    out = np.empty((m, r), dtype=np.int64)
    state = cost.argmin(axis=0).astype(np.int64)
    columns = np.arange(m)
    for axis in range(r - 1, -1, -1):
        out[:, axis] = state
        chosen = back[axis]
        if chosen is not None:
            k = int(bits[axis])
            high = chosen[state >> k, columns].astype(np.int64)
            state = (high << (state_bits - k)) | (state >> k)
    return out


def _axis_runs(bits: np.ndarray) -> list[tuple[int, int, int]]:
    """``(start, stop, extra)`` runs of consecutive axes, greedily as long as the axes after a run's first shift in at most
    :data:`RUN_EXTRA_BITS` bits together (``extra``): every axis of a run reads its register from one window of the
    stream, the first axis's register and those ``extra`` bits."""
    runs = []
    start = 0
    while start < len(bits):
        stop, extra = start + 1, 0
        while stop < len(bits) and extra + int(bits[stop]) <= RUN_EXTRA_BITS:
            extra += int(bits[stop])
            stop += 1
        runs.append((start, stop, extra))
        start = stop
    return runs


class _Windows:
    """Windows of a code's bit stream, each ending at a fixed bit, read straight from the packed bytes.

    A register (the last ``L`` bits of the stream up to an axis, zeros before the stream starts) or a run's window (the
    register and a few more bits) is a window ending at bit ``end`` of the stream with two zero bytes in front. The three
    bytes ending at that bit hold all of a window of up to 17 bits: one 24-bit word, shifted and masked. Shifting the
    stream in bit by bit, as the decoder is described, gives the same registers several times slower.
    """

    def __init__(self, end: np.ndarray, mask: np.ndarray) -> None:
        word = (np.asarray(end) - 1) // 8 - 2
        self.word = np.maximum(word, 0)
        self.shift = (8 * word + 24 - end).astype(np.uint32)  # bits right of the window in word `word`
        self.mask = np.asarray(mask, dtype=np.uint32)
        self.empty = np.flatnonzero(np.asarray(end) == 16)  # no bit read yet: the register's zero start
        # The code byte each window ends in (padded word j ends in code byte j), -1 for the empty windows.
        self.last_byte = np.where(np.asarray(end) == 16, -1, self.word).astype(np.int64)

    def read(self, codes: np.ndarray) -> np.ndarray:
        """``(n, windows)`` int32 for a few codes (:data:`DECODE_BLOCK` or fewer, so that the work stays in cache)."""
        n, size = codes.shape
        padded = np.zeros((n, size + 2), dtype=np.uint32)
        padded[:, 2:] = codes
        words = (padded[:, :-2] << 16) | (padded[:, 1:-1] << 8) | padded[:, 2:]  # word j: padded bytes j, j + 1, j + 2
        windows = np.take(words, self.word, axis=1)
        windows >>= self.shift
        windows &= self.mask
        windows[:, self.empty] = 0
        return windows.view(np.int32)


@register_rotated_index
class TrellisTransformIndex(RotatedCodeIndex):
    """The ``klt-tcq`` index (the FAISS index interface in numpy; see the module docstring).

    Attributes:
        mean: ``(d,)`` the corpus centre; axes: ``(d, r)`` the coded principal axes, in the order the decoder reads them.
        bits: ``(r,)`` bits shifted in at each axis; scale: ``(r,)``; codebook: ``(r, 2^L)`` the fixed Gaussian tables.
    """

    file_stem: ClassVar[str] = "klt-tcq"

    def __init__(self, mean: np.ndarray, axes: np.ndarray, bits: np.ndarray, scale: np.ndarray, codebook: np.ndarray) -> None:
        self.bits = np.asarray(bits, dtype=np.int64)
        self.scale = np.ascontiguousarray(scale, dtype=np.float32)
        self.codebook = np.ascontiguousarray(codebook, dtype=np.float32)
        self.state_bits = int(self.codebook.shape[1]).bit_length() - 1
        if self.codebook.shape[1] != 1 << self.state_bits or self.codebook.shape[0] != len(self.bits) or len(self.scale) != len(self.bits):
            raise ValueError(f"a trellis codec needs (r,) bits and scales and an (r, 2^L) codebook; got {self.bits.shape}, "
                             f"{self.scale.shape}, {self.codebook.shape}.")
        self._table = np.ascontiguousarray(self.scale[:, None] * self.codebook, dtype=np.float32)  # (r, 2^L): ŷ_i = table[i, state]
        # Where each axis's register sits in the code: the stream after two zero bytes ends the axis at bit `end`
        # (exclusive); see _Windows.
        end = np.cumsum(self.bits) + 16
        self._registers = _Windows(end, np.full(len(end), (1 << self.state_bits) - 1))
        self._table_offset = (np.arange(len(self.bits)) << self.state_bits).astype(np.int32)
        self._runs = _axis_runs(self.bits)
        run_end = end[[stop - 1 for _, stop, _ in self._runs]]
        self._run_windows = _Windows(run_end, np.array([(1 << (self.state_bits + extra)) - 1 for _, _, extra in self._runs]))
        self._run_offset = np.concatenate([[0], np.cumsum(self._run_windows.mask.astype(np.int64) + 1)[:-1]]).astype(np.int32)
        self._axis_lag = np.concatenate([run_end[index] - end[start:stop] for index, (start, stop, _) in enumerate(self._runs)])
        self._norm_tables: np.ndarray | None = None  # the sphere's ‖ŷ‖² + 2 ŷ·centre per run window, made on first use
        super().__init__(mean, axes)

    def sa_code_size(self) -> int:
        return int((self.bits.sum() + 7) // 8)

    def fixed_bytes(self) -> int:
        """Bytes that do not grow with the corpus: the axes, the centre, the scales and the tables (float32)."""
        return int(4 * (self.axes.size + self.mean.size + self.scale.size + self.codebook.size))

    def tensors(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "axes": self.axes, "bits": self.bits, "scale": self.scale, "codebook": self.codebook}

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray]) -> "TrellisTransformIndex":
        return cls(tensors["mean"], tensors["axes"], tensors["bits"], tensors["scale"], tensors["codebook"])

    def sa_encode(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        codes = np.empty((len(x), self.sa_code_size()), dtype=np.uint8)
        for start in range(0, len(x), ENCODE_ROWS):  # the rotated rows and their states (8 bytes an axis) a piece at a time
            y = (x[start : start + ENCODE_ROWS] - self.mean) @ self.axes
            states = viterbi_states(y, self.scale, self.bits, self.codebook, self.state_bits)
            columns = []
            for axis, k in enumerate(self.bits):
                fresh = states[:, axis] & ((1 << int(k)) - 1)
                columns.extend(((fresh >> (int(k) - 1 - j)) & 1).astype(np.uint8) for j in range(int(k)))
            stream = np.stack(columns, axis=1) if columns else np.zeros((len(y), 0), dtype=np.uint8)
            codes[start : start + len(y)] = np.packbits(stream, axis=1)
        return codes

    def states(self, codes: np.ndarray) -> np.ndarray:
        """``(n, r)`` the register after each axis, read back from the packed codes."""
        codes = np.asarray(codes, dtype=np.uint8)
        states = np.empty((len(codes), len(self.bits)), dtype=np.int32)
        for start in range(0, len(codes), DECODE_BLOCK):
            states[start : start + DECODE_BLOCK] = self._registers.read(codes[start : start + DECODE_BLOCK])
        return states.astype(np.int64)

    def _decode_rotated(self, codes: np.ndarray) -> np.ndarray:
        # A gather from the flattened tables, axis i's value for register s at i · 2^L + s, a thousand codes at a
        # time: rows of registers and values stay in cache, and nothing is transposed (3x faster than axis by axis).
        codes = np.asarray(codes, dtype=np.uint8)
        decoded = np.empty((len(codes), len(self.bits)), dtype=np.float32)
        flat = self._table.ravel()
        for start in range(0, len(codes), DECODE_BLOCK):
            flat_index = self._registers.read(codes[start : start + DECODE_BLOCK])
            flat_index += self._table_offset
            np.take(flat, flat_index, out=decoded[start : start + DECODE_BLOCK])
        return decoded

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)`` as :meth:`RotatedCodeIndex.search` returns them; a lone query (or a few) is scored by tables.

        Decoding every code costs about as much for one query as for two hundred. For
        :data:`TABLE_SCAN_QUERIES` queries or fewer, each query's score of every code is instead a sum over runs of axes
        of one table look-up each (:func:`_axis_runs`), a few times fewer look-ups than the decode. The top ``k`` +
        :data:`TABLE_SCAN_MARGIN` codes by those sums are then decoded and scored as the decoding scan scores them, so
        ``I`` is the decoding scan's and ``D`` equal to float32 rounding (as the decoding scan's own scores are between
        batches of different sizes). Where the sums cannot rule out that a code outside them belongs in the top ``k``
        (scores within rounding of each other, as for duplicate codes), the query takes the decoding scan.
        """
        xq = self.checked_queries(xq)
        k = int(k)
        if not 0 < len(xq) <= TABLE_SCAN_QUERIES or k < 1 or self.ntotal <= k + TABLE_SCAN_MARGIN:
            return super().search(xq, k)
        rows = []
        for i in range(len(xq)):
            found = self._table_search(xq[i], k)
            rows.append(found if found is not None else super().search(xq[i : i + 1], k))
        return np.concatenate([d for d, _ in rows]), np.concatenate([i for _, i in rows])

    def _table_search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """One query's ``(D, I)`` by the run tables, or None where the decoding scan must decide."""
        rotated, offset = query @ self.axes, float(query @ self.mean)
        weights = np.ascontiguousarray(rotated[:, None] * self._table, dtype=np.float32)
        tables = self._run_tables(weights)[:, None]
        if self.radius:
            if self._norm_tables is None:
                self._norm_tables = self._run_tables(self._table * self._table + 2.0 * self._centre[:, None] * self._table)
            tables = np.stack([tables[:, 0], self._norm_tables], axis=1)  # one look-up reads both sums' entries
        windows = self._run_windows
        sums = window_sums(self.codes, windows.last_byte, windows.shift, windows.mask, self._run_offset, tables)
        linear = sums[:, 0]
        squared = sums[:, 1] if self.radius else None
        # How far a sum may be from the exact score: float32 rounding over a few hundred terms is below 1e-5 of the largest
        # score a code could reach; 1e-4 of it leaves a wide margin.
        reach = float(np.abs(weights).max(axis=1).sum()) + abs(offset)
        if squared is not None:
            squared += np.float32(self.mean @ self.mean)
            inverse_norm = np.float32(self.radius) / np.sqrt(np.maximum(squared, np.float32(1e-30)))
            approximate = (linear + np.float32(offset)) * inverse_norm
            reach *= float(inverse_norm.max())
        else:
            approximate = linear + np.float32(offset)
        slack = 1e-4 * reach
        fetch = k + TABLE_SCAN_MARGIN
        order = np.argpartition(-approximate, fetch)
        candidates = np.sort(order[:fetch])
        best_outside = float(approximate[order[fetch]])
        sub = self.clone_empty()
        sub.codes = self.codes[candidates]
        D, I = RotatedCodeIndex.search(sub, query[None, :], k)
        if float(D[0, k - 1]) - best_outside <= 2 * slack:
            return None
        return D, candidates[I]

    def _run_tables(self, weights: np.ndarray) -> np.ndarray:
        """Flattened ``Σ_{i in run} weights[i, register_i(window)]`` for every run and every window of it."""
        mask = (1 << self.state_bits) - 1
        tables = []
        axis = 0
        for start, stop, extra in self._runs:
            window = np.arange(1 << (self.state_bits + extra))
            total = np.zeros(len(window), dtype=np.float32)
            for i in range(start, stop):
                total += weights[i][(window >> int(self._axis_lag[axis])) & mask]
                axis += 1
            tables.append(total)
        return np.concatenate(tables)

    def clone_empty(self) -> "TrellisTransformIndex":
        return TrellisTransformIndex(self.mean, self.axes, self.bits, self.scale, self.codebook).on_sphere(self.radius)


@register_codec
class KltTCQ(CodecFamily):
    family = "klt-tcq"
    summary = ("KLT, water-filled bits in one bit-shift trellis code over the axes, Viterbi-encoded "
               "(nearest the rate-distortion bound; served by embedtune's numpy scan)")
    faiss_index: ClassVar[bool] = False
    numpy_scan: ClassVar[bool] = True
    files: ClassVar[tuple[str, ...]] = (TABLES_FILE,)

    #: The register's length this family's name stands for.
    default_state_bits: ClassVar[int] = STATE_BITS

    def __init__(self, code_bytes: int, state_bits: int | None = None) -> None:
        """``state_bits``: the register's length ``L`` (:data:`STATE_BITS` by default, what a plan uses). A longer one is
        nearer the bound and doubles the encoding time per bit (``benchmarks/trellis_gap_at_scale.py``)."""
        super().__init__(code_bytes)
        state_bits = self.default_state_bits if state_bits is None else state_bits
        if isinstance(state_bits, bool) or not isinstance(state_bits, (int, np.integer)) or not 1 <= int(state_bits) <= MAX_STATE_BITS:
            raise ValueError(f"codec {self.name!r}: the register is 1 to {MAX_STATE_BITS} bits (the encoder's back-pointers grow "
                             f"as 2^L); got state_bits={state_bits!r}.")
        self.state_bits = int(state_bits)

    def read_trained(self, directory: Path) -> TrellisTransformIndex:
        index = read_rotated_index(Path(directory) / TABLES_FILE)
        mismatch = self.mismatch(index)
        if mismatch:
            raise ValueError(f"{Path(directory) / TABLES_FILE}: holds {mismatch}, not {self.name!r}'s. "
                             "Write the plan again with `embedtune compress plan`.")
        return index

    def mismatch(self, index: Any) -> str | None:
        """What makes ``index`` another codec's tables than this family's (its type, decode or register), or None."""
        if not isinstance(index, TrellisTransformIndex):
            return f"{type(index).__name__} tables"
        if bool(index.radius) != self.requires_common_norm:
            return f"tables {'on the sphere' if index.radius else 'decoded as they are'}"
        if index.state_bits != self.state_bits:
            return f"tables of a {index.state_bits}-bit register (this family's is {self.state_bits} bits)"
        return None

    def check_dim(self, dim: int) -> None:
        if 8 * self.code_bytes > self.state_bits * dim:
            raise ValueError(f"codec {self.name!r}: {8 * self.code_bytes} bits do not fit {dim} axes of at most "
                             f"{self.state_bits} bits; use a budget of at most {self.state_bits * dim // 8} bytes.")

    def train(self, x: np.ndarray, seed: int = 0) -> Any:
        sample, eigenvalues, axes = sampled_klt(self, x, seed)
        emitted = trellis_bits(eigenvalues, 8 * self.code_bytes, self.state_bits)
        coded = int(np.flatnonzero(eigenvalues > water_level(eigenvalues, 8.0 * self.code_bytes))[-1]) + 1
        coded = max(coded, int(np.flatnonzero(emitted)[-1]) + 1)
        # The decoder reads the weakest axis first: the register starts at 0, and the first few axes, which reach few
        # states, are then those that cost least to code badly.
        order = np.arange(coded)[::-1]
        mean = sample.mean(axis=0)
        rng = np.random.default_rng(seed)
        codebook = rng.standard_normal((coded, 1 << self.state_bits)).astype(np.float32)
        scale = np.sqrt(np.maximum(eigenvalues[order], 1e-30)).astype(np.float32)
        fit_rows = sample if len(sample) <= SCALE_FIT_ROWS else sample[np.sort(rng.choice(len(sample), SCALE_FIT_ROWS, replace=False))]
        rotated = ((fit_rows - mean) @ axes[:, order]).astype(np.float32)
        for _ in range(SCALE_PASSES):
            states = viterbi_states(rotated, scale, emitted[order], codebook, self.state_bits)
            chosen = codebook[np.arange(coded)[None, :], states]
            energy = (chosen.astype(np.float64) ** 2).sum(axis=0)
            scale = np.where(energy > 0, (chosen * rotated).sum(axis=0, dtype=np.float64) / np.maximum(energy, 1e-30), 0.0)
            scale = scale.astype(np.float32)
        return TrellisTransformIndex(mean, axes[:, order], emitted[order], scale, codebook)


@register_codec
class KltTCQSphere(KltTCQ):
    """``klt-tcq-sphere:B``: the trellis code's codes, each document decoded onto the sphere of the corpus's common norm
    (:meth:`~embedtune.index.codecs.textbook.RotatedCodeIndex.on_sphere`). Same codes, same bytes."""

    family = "klt-tcq-sphere"
    summary = ("the trellis code's codes, decoded onto the unit sphere of a cosine model's vectors (no extra byte; served by "
               "embedtune's numpy scan)")
    requires_common_norm = True

    def train(self, x: np.ndarray, seed: int = 0) -> Any:
        radius = common_norm(self.name, x)
        return super().train(x, seed).on_sphere(radius)


@register_codec
class KltTCQ12(KltTCQ):
    """``klt-tcq12:B``: the trellis code with a 12-bit register (4,096 states): 0.1-0.15 dB nearer the bound than the
    10-bit ``klt-tcq`` (within 0.5 dB of it at 32 B once the fit sample is large), for four times the encoding time
    (``benchmarks/trellis_gap_at_scale.py``)."""

    family = "klt-tcq12"
    summary = "the trellis code with a 12-bit register: nearer the bound, four times the encoding time (numpy scan)"
    default_state_bits = MAX_STATE_BITS


@register_codec
class KltTCQ12Sphere(KltTCQSphere):
    """``klt-tcq12-sphere:B``: ``klt-tcq12``'s codes, each document decoded onto the sphere (as ``klt-tcq-sphere``)."""

    family = "klt-tcq12-sphere"
    summary = "the 12-bit-register trellis code's codes, decoded onto the unit sphere (no extra byte; numpy scan)"
    default_state_bits = MAX_STATE_BITS
