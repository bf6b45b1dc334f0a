"""Streaming apply: .npy and parquet in, .npy and parquet out, equal to in-memory, bounded memory."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedtune.compress import TrainingData, load_compressor, make_compressor
from embedtune.compress.streaming import (
    apply_compressor_streaming,
    embedding_file_shape,
    ids_path_for,
    iter_embedding_blocks,
    TILE_ROWS,
    transform_rows,
)
from embedtune.encoders.precomputed import load_embeddings, read_ids


@pytest.fixture
def fitted(rng):
    X = rng.normal(size=(500, 48)).astype(np.float32)
    ids = [f"d{i}" for i in range(500)]
    return make_compressor("pca", dim=12).fit(TrainingData(ids[:1], X[:1], ids, X, {}))


@pytest.fixture
def vectors(rng):
    return rng.normal(size=(1000, 48)).astype(np.float32), [f"doc/{i}" for i in range(1000)]


def write_parquet(path, ids, X, row_group_size=300, fixed=False):
    values = pa.array(X.ravel(), pa.float32())
    column = pa.FixedSizeListArray.from_arrays(values, X.shape[1]) if fixed else pa.array(list(X), pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": ids, "embedding": column}), path, row_group_size=row_group_size)


@pytest.mark.parametrize("chunk_size", [64, 256, 5000])
def test_transform_rows_ignores_tile_aligned_block_boundaries(fitted, vectors, chunk_size):
    X, _ = vectors
    whole = transform_rows(fitted, X, tile=64)
    parts = np.concatenate([transform_rows(fitted, X[s : s + chunk_size], tile=64) for s in range(0, len(X), chunk_size)])
    np.testing.assert_array_equal(parts, whole)
    np.testing.assert_allclose(whole, fitted.transform(X), atol=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 37])
def test_transform_rows_unaligned_blocks_agree_to_rounding(fitted, vectors, chunk_size):
    # A row's bits depend on its position inside the tile: BLAS kernels handle a tile's last rows
    # with a remainder kernel on some CPUs (seen on OpenBLAS Haswell kernels: rows 60-63 of 64).
    # Unaligned blocks therefore agree to float32 rounding, not bit for bit.
    X, _ = vectors
    whole = transform_rows(fitted, X, tile=64)
    parts = np.concatenate([transform_rows(fitted, X[s : s + chunk_size], tile=64) for s in range(0, len(X), chunk_size)])
    np.testing.assert_allclose(parts, whole, rtol=1e-5, atol=1e-5)
    parts = np.concatenate([transform_rows(fitted, X[s : s + chunk_size]) for s in range(0, len(X), chunk_size)])
    np.testing.assert_allclose(parts, transform_rows(fitted, X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_npy_to_npy_and_parquet(fitted, vectors, tmp_path, dtype):
    X, _ = vectors
    np.save(tmp_path / "in.npy", X.astype(dtype))
    expected = transform_rows(fitted, X.astype(dtype).astype(np.float32))
    out = apply_compressor_streaming(fitted, tmp_path / "in.npy", tmp_path / "out.npy", chunk_size=333)
    result = np.load(out)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, expected)
    out = apply_compressor_streaming(fitted, tmp_path / "in.npy", tmp_path / "out.parquet", chunk_size=333)
    ids, vecs = load_embeddings(out)
    assert ids == [str(i) for i in range(1000)]
    np.testing.assert_array_equal(vecs, expected)


@pytest.mark.parametrize("fixed", [False, True])
def test_parquet_with_ids_to_parquet_and_npy(fitted, vectors, tmp_path, fixed):
    X, ids = vectors
    write_parquet(tmp_path / "in.parquet", ids, X, fixed=fixed)
    assert embedding_file_shape(tmp_path / "in.parquet") == (1000, 48)
    expected = transform_rows(fitted, X)
    out = apply_compressor_streaming(fitted, tmp_path / "in.parquet", tmp_path / "out.parquet", chunk_size=128)
    got_ids, got = load_embeddings(out)
    assert got_ids == ids
    np.testing.assert_array_equal(got, expected)
    assert pq.ParquetFile(out).metadata.num_row_groups == 8  # one row group per chunk
    out = apply_compressor_streaming(fitted, tmp_path / "in.parquet", tmp_path / "out.npy", chunk_size=128)
    np.testing.assert_array_equal(np.load(out), expected)
    assert read_ids(ids_path_for(out)) == ids


def test_blocks_reader(vectors, tmp_path):
    X, ids = vectors
    np.save(tmp_path / "in.npy", X)
    blocks = list(iter_embedding_blocks(tmp_path / "in.npy", 300))
    assert [b[0] for b in blocks] == [0, 300, 600, 900] and blocks[0][1] is None
    np.testing.assert_array_equal(np.concatenate([b[2] for b in blocks]), X)
    reused = [(start, block.copy()) for start, _, block in iter_embedding_blocks(tmp_path / "in.npy", 300, reuse_buffer=True)]
    np.testing.assert_array_equal(np.concatenate([b for _, b in reused]), X)
    write_parquet(tmp_path / "in.parquet", ids, X)
    blocks = list(iter_embedding_blocks(tmp_path / "in.parquet", 250))
    assert sum((b[1] for b in blocks), []) == ids


def test_errors(fitted, vectors, tmp_path):
    X, ids = vectors
    write_parquet(tmp_path / "in.parquet", ids, X)
    with pytest.raises(ValueError, match="no column 'vec'"):
        apply_compressor_streaming(fitted, tmp_path / "in.parquet", tmp_path / "o.npy", vector_column="vec")
    with pytest.raises(ValueError, match="extension"):
        apply_compressor_streaming(fitted, tmp_path / "in.parquet", tmp_path / "o.csv")
    ragged = pa.table({"id": ["a", "b"], "embedding": pa.array([[1.0] * 48, [1.0] * 47], pa.list_(pa.float32()))})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    with pytest.raises(ValueError, match="different lengths"):
        apply_compressor_streaming(fitted, tmp_path / "ragged.parquet", tmp_path / "o.npy")
    bad = pa.table({"id": ["a\nb"], "embedding": pa.array([[1.0] * 48], pa.list_(pa.float32()))})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="line breaks"):
        apply_compressor_streaming(fitted, tmp_path / "bad.parquet", tmp_path / "o.npy")
    assert not (tmp_path / "o.npy").exists() and not list(tmp_path.glob(".*.tmp"))


RSS_SCRIPT = r"""
import json, sys
import numpy as np
from embedtune.compress import load_compressor
from embedtune.compress.streaming import apply_compressor_streaming

def status(key):
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith(key))

compressor = load_compressor(sys.argv[1])
compressor.transform(np.zeros((256, compressor.input_dim_), np.float32))  # BLAS buffers before the baseline
before = status("VmRSS:")
apply_compressor_streaming(compressor, sys.argv[2], sys.argv[3], chunk_size=4096)
print(json.dumps({"before": before, "peak": status("VmHWM:")}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_streaming_memory_stays_bounded(fitted, tmp_path):
    n, d = 200_000, 48  # 38 MB of float32 input, 9.6 MB of output
    rng = np.random.default_rng(1)
    X = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float32, shape=(n, d))
    for start in range(0, n, 50_000):
        X[start : start + 50_000] = rng.normal(size=(50_000, d))
    X.flush()
    del X
    fitted.save(tmp_path / "pca")

    def run(mode):
        out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(tmp_path / "pca"), str(tmp_path / "big.npy"), str(tmp_path / f"{mode}.npy")],
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    stream = run("stream")
    input_bytes = n * d * 4
    # A few 4096-row blocks (0.8 MB each), far below the 38 MB input an in-memory apply holds.
    assert stream["peak"] - stream["before"] < min(12 << 20, input_bytes // 3), stream
    # Equal up to float32 rounding: with more than one BLAS thread, a chunk's matmul may sum in another order than the whole array's.
    np.testing.assert_allclose(np.load(tmp_path / "stream.npy"), transform_rows(load_compressor(tmp_path / "pca"), np.load(tmp_path / "big.npy")),
                               rtol=0, atol=1e-6)


def test_streaming_bits_do_not_depend_on_chunk_size_at_wide_dims(tmp_path, rng):
    # 384 -> 128 is a shape where some BLAS kernels round a row by its position inside a tile,
    # so this fails unless the stream is re-cut into tile-aligned pieces.
    X = rng.normal(size=(TILE_ROWS + 700, 384)).astype(np.float32)
    pca = make_compressor("pca", dim=128).fit(TrainingData([], X[:0], [str(i) for i in range(1000)], X[:1000], {}))
    np.save(tmp_path / "in.npy", X)
    expected = transform_rows(pca, X)
    for chunk in (333, 4000):
        out = apply_compressor_streaming(pca, tmp_path / "in.npy", tmp_path / f"out{chunk}.npy", chunk_size=chunk)
        np.testing.assert_array_equal(np.load(out), expected)


def test_whole_tile_chunks_reuse_output_buffers_without_mixing_blocks(fitted, tmp_path, rng):
    # Chunks that are whole tiles take the fast path: two alternating output buffers, the write of
    # one block overlapping the transform of the next. Every block must land in its own rows.
    X = rng.normal(size=(3 * TILE_ROWS + 700, 48)).astype(np.float32)
    np.save(tmp_path / "in.npy", X)
    out = apply_compressor_streaming(fitted, tmp_path / "in.npy", tmp_path / "out.npy", chunk_size=TILE_ROWS)
    expected = transform_rows(fitted, X)
    np.testing.assert_array_equal(np.load(out), expected)
    np.testing.assert_allclose(expected, fitted.transform(X), rtol=0, atol=1e-6)


def test_transform_rows_into_a_given_array(fitted, vectors):
    X = vectors[0]
    target = np.full((len(X), fitted.output_dim), np.nan, dtype=np.float32)
    result = transform_rows(fitted, X, tile=64, out=target, validated=True)
    assert result is target
    np.testing.assert_array_equal(target, transform_rows(fitted, X, tile=64))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        transform_rows(fitted, X, out=np.zeros((len(X), fitted.output_dim), np.float64))


def test_the_bits_do_not_depend_on_the_thread_count(tmp_path, rng):
    """``compress apply`` and ``index build --adapter`` write the same bytes with one thread or two. A tile left
    to the process's BLAS threads (the last, partial one of a file) summed in another order with two, so the
    output's last bit followed ``--threads``, and a Ray actor's (one thread) differed from a local apply."""
    from embedtune.cli import main

    n = 3 * TILE_ROWS + 1234
    X = rng.normal(size=(n, 40)).astype(np.float32)
    np.save(tmp_path / "in.npy", X)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(n)), encoding="utf-8")
    ids = [f"d{i}" for i in range(n)]
    make_compressor("pca", dim=16).fit(TrainingData(ids[:1], X[:1], ids, X, {})).save(tmp_path / "adapter")
    for threads in ("1", "2"):
        assert main(["--threads", threads, "--quiet", "compress", "apply", "--adapter", str(tmp_path / "adapter"),
                     "--input", str(tmp_path / "in.npy"), "--out", str(tmp_path / f"out-{threads}.npy")]) == 0
        assert main(["--threads", threads, "--quiet", "index", "build", "--adapter", str(tmp_path / "adapter"),
                     "--embeddings", str(tmp_path / "in.npy"), "--ids", str(tmp_path / "ids.txt"),
                     "--out", str(tmp_path / f"index-{threads}")]) == 0
    assert (tmp_path / "out-1.npy").read_bytes() == (tmp_path / "out-2.npy").read_bytes()
    assert (tmp_path / "index-1" / "index.faiss").read_bytes() == (tmp_path / "index-2" / "index.faiss").read_bytes()
