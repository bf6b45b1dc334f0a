"""``klt-tcq``: the trellis code's encoder finds the best stream, its codes read back, and it is nearer the bound."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from embedtune.index.codecs import Precision, QuantizedIndex, corpus_spectrum, distortion_report
from embedtune.index.codecs.textbook import RotatedCodeIndex
from embedtune.index.codecs.trellis import RUN_EXTRA_BITS, TABLE_SCAN_QUERIES, KltTCQ, TrellisTransformIndex, _Windows, trellis_bits, viterbi_states
from embedtune.index.codecs.window_sums import window_sums
from embedtune.io import IntegrityError


def _states_of_stream(stream: list[int], bits: list[int], state_bits: int) -> list[int]:
    """The register after each axis when the bits of ``stream`` are shifted in, ``bits[i]`` of them at axis ``i``."""
    state, position, out = 0, 0, []
    for k in bits:
        for _ in range(k):
            state = ((state << 1) | stream[position]) & ((1 << state_bits) - 1)
            position += 1
        out.append(state)
    return out


def test_the_viterbi_encoder_finds_the_stream_of_least_error():
    rng = np.random.default_rng(0)
    state_bits, bits = 3, [1, 0, 2, 1, 0, 3]  # up to a whole register's bits at one axis: a three-round knockout
    codebook = rng.standard_normal((len(bits), 1 << state_bits)).astype(np.float32)
    scale = np.array([1.0, 0.5, 2.0, 1.0, 0.3, 1.5], dtype=np.float32)
    y = rng.standard_normal((20, len(bits))).astype(np.float32) * scale
    found = viterbi_states(y, scale, np.array(bits), codebook, state_bits, block=7)
    for row, target in zip(found, y):
        costs = {}
        for stream in itertools.product((0, 1), repeat=sum(bits)):
            states = _states_of_stream(list(stream), bits, state_bits)
            costs[tuple(states)] = float(sum((target[i] - scale[i] * codebook[i, s]) ** 2 for i, s in enumerate(states)))
        best = min(costs.values())
        assert tuple(row.tolist()) in costs, "the encoder returned states no stream reaches"
        assert costs[tuple(row.tolist())] == pytest.approx(best, rel=1e-5, abs=1e-6)


def test_the_viterbi_encoder_gives_the_same_states_on_any_number_of_threads():
    rng = np.random.default_rng(2)
    state_bits, bits = 6, np.array([1, 2, 0, 1, 3, 1, 0, 2])
    codebook = rng.standard_normal((len(bits), 1 << state_bits)).astype(np.float32)
    scale = np.linspace(2.0, 0.5, len(bits)).astype(np.float32)
    y = rng.standard_normal((70, len(bits))).astype(np.float32)
    one = viterbi_states(y, scale, bits, codebook, state_bits, block=8, threads=1)
    assert np.array_equal(viterbi_states(y, scale, bits, codebook, state_bits, block=8, threads=3), one)
    assert np.array_equal(viterbi_states(y, scale, bits, codebook, state_bits, block=70, threads=2), one)


def test_the_viterbi_encoder_breaks_ties_toward_the_lowest_bits_whatever_the_block():
    # Every stream costs the same when each axis's table holds one value: the encoder must return the all-zero stream (the
    # lowest predecessor wins each tie, the lowest final state the last), in blocks of any size.
    state_bits, bits = 4, np.array([2, 1, 0, 3, 1])
    codebook = np.ones((len(bits), 1 << state_bits), dtype=np.float32)
    y = np.random.default_rng(1).standard_normal((9, len(bits))).astype(np.float32)
    for block in (1, 4, 9):
        assert not viterbi_states(y, np.ones(len(bits), np.float32), bits, codebook, state_bits, block=block).any()


def test_trellis_bits_spend_the_budget_on_the_axes_water_filling_gives_a_rate():
    lam = np.geomspace(10.0, 1e-4, 64)
    emitted = trellis_bits(lam, 96, state_bits=10)
    assert emitted.sum() == 96 and emitted.max() <= 10 and emitted.min() >= 0
    assert emitted[0] >= emitted[-1]
    assert emitted[-10:].sum() == 0  # the weakest axes are below the water level: no bits, and no reconstruction
    # Fractional rates: some axes inside the coded range emit no bit of their own.
    coded = int(np.flatnonzero(emitted)[-1]) + 1
    assert (emitted[:coded] == 0).any()
    # A strong axis never takes more than the register holds, even where it alone is above the water level.
    assert trellis_bits(np.array([1e12, 1.0, 1.0]), 24, state_bits=8).max() <= 8
    alone = trellis_bits(np.array([1e30, 1.0, 1.0]), 20, state_bits=8)
    assert alone.sum() == 20 and alone.max() <= 8
    with pytest.raises(ValueError, match="do not fit"):
        trellis_bits(np.array([1.0, 1.0]), 21, state_bits=10)
    with pytest.raises(ValueError, match="do not vary"):
        trellis_bits(np.zeros(4), 8)


@pytest.fixture(scope="module")
def gaussian() -> tuple[np.ndarray, np.ndarray]:
    """Two draws of an anisotropic Gaussian source: one to fit on, one to code."""
    rng = np.random.default_rng(3)
    d = 24
    scales = np.geomspace(1.0, 0.05, d)
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
    fit = (rng.standard_normal((3000, d)) * scales) @ rotation.T
    coded = (rng.standard_normal((3000, d)) * scales) @ rotation.T
    return fit.astype(np.float32), coded.astype(np.float32)


def test_codes_read_back_to_the_encoder_states_and_are_deterministic(gaussian):
    fit, coded = gaussian
    index = KltTCQ(6).train(fit)
    assert index.sa_code_size() == 6
    codes = index.sa_encode(coded[:200])
    y = (coded[:200] - index.mean) @ index.axes
    assert np.array_equal(index.states(codes), viterbi_states(y, index.scale, index.bits, index.codebook, index.state_bits))
    assert np.array_equal(KltTCQ(6).train(fit).sa_encode(coded[:200]), codes)
    decoded = index.sa_decode(codes)
    assert decoded.shape == (200, fit.shape[1]) and decoded.dtype == np.float32


def test_the_trellis_code_is_nearer_the_bound_than_a_scalar_or_product_quantiser(gaussian):
    fit, coded = gaussian
    lam = corpus_spectrum(coded)
    gaps = {}
    for family in ("klt-sq", "klt-pq", "klt-tcq"):
        index = QuantizedIndex.build(coded, Precision(f"{family}:4"), train=fit)
        gaps[family] = distortion_report(coded, index.reconstruct(coded), 32, eigenvalues=lam)["gap_db"]
    # A Gaussian source at 1.3 bits an axis: a scalar quantiser per axis, or 8-bit tables over pairs of axes, sits about
    # 2-2.5 dB above the bound; the trellis shares bits across all 24 axes.
    assert gaps["klt-tcq"] < gaps["klt-sq"] - 0.5, gaps
    assert gaps["klt-tcq"] < gaps["klt-pq"] - 0.3, gaps
    assert gaps["klt-tcq"] < 1.8, gaps


def test_a_tampered_trellis_codec_is_refused(gaussian, tmp_path):
    fit, _ = gaussian
    KltTCQ(6).train(fit).save(tmp_path)
    assert isinstance(TrellisTransformIndex.load(tmp_path), TrellisTransformIndex)
    path = tmp_path / "codec.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        TrellisTransformIndex.load(tmp_path)


def test_a_budget_beyond_the_register_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="at most 30 bytes"):
        KltTCQ(31).check_dim(24)


def test_a_longer_register_is_nearer_the_bound_and_travels_with_the_saved_tables(gaussian, tmp_path):
    fit, coded = gaussian
    lam = corpus_spectrum(coded)
    gaps = {}
    for state_bits in (6, 10):
        index = KltTCQ(4, state_bits=state_bits).train(fit)
        assert index.state_bits == state_bits and index.codebook.shape[1] == 1 << state_bits
        gaps[state_bits] = distortion_report(coded, index.sa_decode(index.sa_encode(coded)), 32, eigenvalues=lam)["gap_db"]
    assert gaps[10] < gaps[6] - 0.1, gaps
    index.save(tmp_path)
    reloaded = TrellisTransformIndex.load(tmp_path)
    assert reloaded.state_bits == 10
    assert np.array_equal(reloaded.sa_encode(coded[:50]), index.sa_encode(coded[:50]))


@pytest.mark.parametrize("state_bits", [0, 13, 2.5, True])
def test_a_register_outside_what_the_encoder_holds_is_refused(state_bits):
    with pytest.raises(ValueError, match="register is 1 to 12 bits"):
        KltTCQ(4, state_bits=state_bits)


@pytest.mark.parametrize("sphere", [False, True])
def test_a_lone_query_scored_by_the_run_tables_finds_the_decoding_scans_top_k(sphere):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1500, 24)).astype(np.float32) * np.linspace(3.0, 0.2, 24, dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = KltTCQ(12).train(x)
    if sphere:
        index.on_sphere(1.0)
    index.add(x)
    queries = rng.standard_normal((12, 24)).astype(np.float32)
    for row in range(len(queries)):
        D, I = index.search(queries[row : row + 1], 10)  # one query: the run tables
        D_scan, I_scan = RotatedCodeIndex.search(index, queries[row : row + 1], 10)  # the decoding scan
        assert np.array_equal(I, I_scan)
        np.testing.assert_allclose(D, D_scan, rtol=1e-6, atol=1e-6)
    few = queries[: TABLE_SCAN_QUERIES]  # a few queries at once take the tables too, each its own row
    D, I = index.search(few, 10)
    D_scan, I_scan = RotatedCodeIndex.search(index, few, 10)
    assert np.array_equal(I, I_scan)
    np.testing.assert_allclose(D, D_scan, rtol=1e-6, atol=1e-6)


def test_duplicate_codes_at_the_cut_send_a_lone_query_to_the_decoding_scan():
    # Every document 60 times: the best document's copies fill the top k and the candidates past it, so the sums cannot
    # rule out a copy outside them, and the decoding scan decides (ties by row).
    rng = np.random.default_rng(4)
    x = rng.standard_normal((400, 16)).astype(np.float32)
    index = KltTCQ(6).train(x)
    index.add(np.tile(x[:20], (60, 1)))
    query = rng.standard_normal((1, 16)).astype(np.float32)
    assert index._table_search(query[0], 10) is None
    assert np.array_equal(index.search(query, 10)[1], RotatedCodeIndex.search(index, query, 10)[1])


def test_the_run_windows_hold_every_axis_register():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 32)).astype(np.float32) * np.geomspace(4.0, 0.05, 32, dtype=np.float32)
    index = KltTCQ(9).train(x)
    runs = index._runs
    assert runs[0][0] == 0 and runs[-1][1] == len(index.bits) and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert all(extra <= RUN_EXTRA_BITS for _, _, extra in runs)
    codes = rng.integers(0, 256, size=(50, index.sa_code_size()), dtype=np.uint8)
    windows = index._run_windows.read(codes)  # each run's window
    states = index.states(codes)
    axis = 0
    for run, (start, stop, _) in enumerate(runs):
        for i in range(start, stop):
            read = (windows[:, run] >> int(index._axis_lag[axis])) & ((1 << index.state_bits) - 1)
            assert np.array_equal(read, states[:, i])
            axis += 1


@pytest.mark.parametrize("rows", [1, 5])  # the run tables, and the decoding scan
def test_a_query_with_nan_is_refused_not_ranked(rows):
    x = np.random.default_rng(6).standard_normal((300, 16)).astype(np.float32)
    index = KltTCQ(6).train(x)
    index.add(x)
    queries = np.zeros((rows, 16), dtype=np.float32)
    queries[-1, 3] = np.nan
    with pytest.raises(ValueError, match="1 of the .* queries hold NaN or infinite values"):
        index.search(queries, 5)
    with pytest.raises(ValueError, match=r"\(n, 16\) rows"):
        index.search(np.zeros((1, 15), dtype=np.float32), 5)


@pytest.mark.parametrize("columns", [1, 2])
@pytest.mark.parametrize("block", [7, 64])
def test_the_window_sums_equal_the_windows_read_and_looked_up_one_by_one(columns, block):
    # Windows ending before the stream (reading zero), in its first two bytes (reading the zeros before it) and further
    # on; more codes than a block, and not a whole number of blocks.
    rng = np.random.default_rng(8)
    end = np.array([16, 19, 24, 27, 33, 40, 57, 66])
    mask = np.array([(1 << bits) - 1 for bits in (10, 3, 8, 11, 13, 12, 9, 10)])
    windows = _Windows(end, mask)
    offset = np.concatenate([[0], np.cumsum(mask + 1)[:-1]])
    tables = rng.standard_normal((int((mask + 1).sum()), columns)).astype(np.float32)
    codes = rng.integers(0, 256, size=(150, 7), dtype=np.uint8)
    sums = window_sums(codes, windows.last_byte, windows.shift, windows.mask, offset, tables, block=block)
    index = windows.read(codes) + offset
    assert np.array_equal(index[:, 0], np.zeros(len(codes)))  # the first window reads nothing
    expected = np.zeros((len(codes), columns), dtype=np.float32)
    for window in range(len(end)):  # in window order, as window_sums adds them
        expected += tables[index[:, window]]
    np.testing.assert_array_equal(sums, expected)


def test_window_sums_refuse_windows_that_do_not_describe_the_codes():
    windows = _Windows(np.array([40]), np.array([255]))  # ends in byte 2
    with pytest.raises(ValueError, match="do not describe codes of 2 bytes"):
        window_sums(np.zeros((3, 2), dtype=np.uint8), windows.last_byte, windows.shift, windows.mask, np.array([0]),
                    np.zeros((256, 1), dtype=np.float32))
