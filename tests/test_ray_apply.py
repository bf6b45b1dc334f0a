"""Ray Data apply equals the single-process streaming apply, bit for bit."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedtune.compress import TrainingData, make_compressor
from embedtune.compress.ray_apply import CompressorBatchFn, compress_dataset
from embedtune.compress.streaming import apply_compressor_streaming
from embedtune.encoders.precomputed import load_embeddings


@pytest.fixture
def fitted(rng):
    X = rng.normal(size=(400, 40)).astype(np.float32)
    ids = [f"d{i}" for i in range(400)]
    return make_compressor("pca", dim=10).fit(TrainingData(ids[:1], X[:1], ids, X, {}))


def test_batch_fn_on_numpy_batches(fitted, rng):
    X = rng.normal(size=(77, 40)).astype(np.float32)
    as_tensor = CompressorBatchFn(fitted)({"id": np.arange(77), "embedding": X})
    ragged_style = np.empty(77, dtype=object)
    ragged_style[:] = list(X)
    as_lists = CompressorBatchFn(fitted, output_column="small")({"id": np.arange(77), "embedding": ragged_style})
    assert as_tensor["embedding"].shape == (77, 10)
    np.testing.assert_array_equal(as_tensor["embedding"], as_lists["small"])
    assert as_lists["embedding"] is ragged_style  # input kept when writing elsewhere
    with pytest.raises(ValueError, match="no column 'vec'"):
        CompressorBatchFn(fitted, vector_column="vec")({"embedding": X})


@pytest.mark.slow
def test_ray_apply_equals_local_apply(fitted, rng, tmp_path):
    ray = pytest.importorskip("ray")
    X = rng.normal(size=(3000, 40)).astype(np.float32)
    ids = [f"doc-{i}" for i in range(3000)]
    pq.write_table(pa.table({"id": ids, "embedding": pa.array(list(X), pa.list_(pa.float32()))}), tmp_path / "in.parquet", row_group_size=700)
    fitted.save(tmp_path / "adapter")
    local = apply_compressor_streaming(fitted, tmp_path / "in.parquet", tmp_path / "local.parquet", chunk_size=1000)
    local_ids, local_vectors = load_embeddings(local)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ds = ray.data.read_parquet(str(tmp_path / "in.parquet")).repartition(4)  # several blocks, both actors busy
        # batch sizes that do not line up with the local chunks; two actors of half a CPU each,
        # so that the read tasks still get a CPU on a 2-CPU cluster
        out = compress_dataset(ds, tmp_path / "adapter", batch_size=333, concurrency=2, num_cpus=0.5)
        rows = out.take_all()
    finally:
        ray.shutdown()
    by_id = {row["id"]: np.asarray(row["embedding"], dtype=np.float32) for row in rows}
    assert sorted(by_id) == sorted(local_ids)
    ray_vectors = np.stack([by_id[i] for i in local_ids])
    # Ray cuts batches inside its own blocks, so a row can sit at another position of its tile than
    # in the local apply; some BLAS kernels round by that position (see compress/streaming.py).
    np.testing.assert_allclose(ray_vectors, local_vectors, rtol=1e-5, atol=1e-6)


def test_row_ranges_start_at_tile_multiples():
    from embedtune.compress.ray_apply import row_ranges

    assert row_ranges(10_000, 5000) == [(0, 8192), (8192, 10_000)]
    assert row_ranges(0, 5000) == []
    ranges = row_ranges(100_001, 65_536)
    assert ranges == [(0, 65_536), (65_536, 100_001)]
    assert all(start % 4096 == 0 for start, _ in row_ranges(50_000, 1))  # never a range inside a tile


def test_batch_fn_on_arrow_batches_equals_numpy_batches(fitted, rng):
    X = rng.normal(size=(77, 40)).astype(np.float32)
    expected = CompressorBatchFn(fitted)({"embedding": X})["embedding"]
    for vectors in (pa.array(list(X), pa.list_(pa.float32())), pa.FixedSizeListArray.from_arrays(pa.array(X.ravel()), 40)):
        table = pa.table({"id": [f"d{i}" for i in range(77)], "embedding": vectors})
        out = CompressorBatchFn(fitted)(table)
        assert out.column_names == ["id", "embedding"] and out.column("embedding").type == pa.list_(pa.float32(), 10)
        np.testing.assert_array_equal(np.stack(out.column("embedding").to_numpy(zero_copy_only=False)), expected)
        assert CompressorBatchFn(fitted, output_column="small")(table).column_names == ["id", "embedding", "small"]
    ragged = pa.table({"embedding": pa.array([[1.0] * 40, [1.0] * 39], pa.list_(pa.float32()))})
    with pytest.raises(ValueError, match="different lengths"):
        CompressorBatchFn(fitted)(ragged)


def _cli(argv: list[str]) -> int:
    from embedtune.cli import main

    return main(argv)


def test_ray_flags_refuse_what_the_ray_apply_cannot_do_before_ray_starts(fitted, rng, tmp_path, capsys):
    fitted.save(tmp_path / "adapter")
    X = rng.normal(size=(50, 40)).astype(np.float32)
    pq.write_table(pa.table({"id": [str(i) for i in range(50)], "embedding": pa.array(list(X), pa.list_(pa.float32()))}), tmp_path / "in.parquet")
    np.save(tmp_path / "in.npy", X)
    np.save(tmp_path / "wide.npy", np.zeros((5, 41), np.float32))
    base = ["compress", "apply", "--adapter", str(tmp_path / "adapter")]
    cases = [
        (["--input", str(tmp_path / "in.parquet"), "--out", str(tmp_path / "o.npy"), "--ray-actors", "2"], "reads a .npy file"),
        (["--input", str(tmp_path / "in.npy"), "--out", str(tmp_path / "o.parquet"), "--ray-actors", "2"], "writes a .npy file"),
        (["--input", str(tmp_path / "wide.npy"), "--out", str(tmp_path / "o.npy"), "--ray-actors", "2"], "41 columns"),
        (["--input", str(tmp_path / "in.npy"), "--out", str(tmp_path / "o.npy"), "--ray-address", "auto"], "--ray-address needs --ray-actors"),
        (["--input", str(tmp_path / "in.npy"), "--out", str(tmp_path / "o.npy"), "--ray-actors", "-1"], "must be 0 (run in this process) or more"),
        (["--input", str(tmp_path / "in.npy"), "--out", str(tmp_path / "o.npy"), "--ray-actors", "1", "--cpus-per-actor", "0"], "--cpus-per-actor"),
    ]
    import socket

    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cases.append((["--input", str(tmp_path / "in.npy"), "--out", str(tmp_path / "o.npy"), "--ray-actors", "1",
                   "--ray-address", f"127.0.0.1:{port}"], f"nothing answers at 127.0.0.1:{port}"))
    for extra, message in cases:
        assert _cli(base + extra) != 0
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "o.parquet").exists()
    # index build checks the same flags before it reads anything (a local run never imports the Ray layer).
    (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in range(50)))
    for extra, message in ((["--ray-address", "auto"], "--ray-address needs --ray-actors"),
                           (["--ray-actors", "-1"], "must be 0 (run in this process) or more")):
        assert _cli(["index", "build", "--embeddings", str(tmp_path / "in.npy"), "--ids", str(tmp_path / "ids.txt"),
                     "--out", str(tmp_path / "index"), *extra]) != 0
        assert message in capsys.readouterr().err
    assert not (tmp_path / "index").exists()
    # embed-corpus shares the flags and the way to the cluster.
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "one"}\n', encoding="utf-8")
    assert _cli(["embed-corpus", "--data", str(tmp_path / "corpus.jsonl"), "--out", str(tmp_path / "shards"), "--ray-actors", "1",
                 "--ray-address", f"127.0.0.1:{port}"]) != 0
    assert f"nothing answers at 127.0.0.1:{port}" in capsys.readouterr().err
    index = ["index", "build", "--embeddings", str(tmp_path / "in.parquet"), "--adapter", str(tmp_path / "adapter"),
             "--out", str(tmp_path / "index"), "--ray-actors", "2"]
    assert _cli(index) != 0
    assert "reads a .npy file" in capsys.readouterr().err and not (tmp_path / "index").exists()


def _index_bytes(folder) -> tuple[bytes, bytes]:
    return (folder / "index.faiss").read_bytes(), (folder / "ids.txt").read_bytes()


@pytest.mark.slow
def test_compress_apply_and_index_build_on_ray_actors_equal_the_local_bits(fitted, rng, tmp_path, capsys):
    """Row ranges start at multiples of 4096 (a --chunk-size of 5000 becomes 8192), so every row sits at its local tile position."""
    ray = pytest.importorskip("ray")
    fitted.save(tmp_path / "adapter")
    n = 3 * 4096 + 1234
    np.save(tmp_path / "in.npy", rng.normal(size=(n, 40)).astype(np.float32))
    np.save(tmp_path / "half.npy", rng.normal(size=(n, 40)).astype(np.float16))
    (tmp_path / "ids.txt").write_text("".join(f"doc-{i}\n" for i in range(n)), encoding="utf-8")
    bad = np.load(tmp_path / "in.npy")
    bad[9000, 3] = np.nan
    np.save(tmp_path / "bad.npy", bad)
    adapter = ["--adapter", str(tmp_path / "adapter")]
    pool = ["--ray-actors", "2", "--cpus-per-actor", "0.5", "--chunk-size", "5000"]
    for name in ("in", "half"):
        assert _cli(["compress", "apply", *adapter, "--input", str(tmp_path / f"{name}.npy"), "--out", str(tmp_path / f"{name}-local.npy")]) == 0
    build = ["index", "build", "--embeddings", str(tmp_path / "in.npy"), "--ids", str(tmp_path / "ids.txt"), *adapter]
    assert _cli([*build, "--out", str(tmp_path / "index-local")]) == 0
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        for name in ("in", "half"):
            assert _cli(["compress", "apply", *adapter, "--input", str(tmp_path / f"{name}.npy"), "--out", str(tmp_path / f"{name}-ray.npy"), *pool]) == 0
        capsys.readouterr()
        assert _cli(["compress", "apply", *adapter, "--input", str(tmp_path / "bad.npy"), "--out", str(tmp_path / "bad-ray.npy"), *pool]) != 0
        error = capsys.readouterr().err
        assert _cli([*build, "--out", str(tmp_path / "index-ray"), *pool]) == 0
    finally:
        ray.shutdown()
    for name in ("in", "half"):
        assert (tmp_path / f"{name}-ray.npy").read_bytes() == (tmp_path / f"{name}-local.npy").read_bytes()
    reported = [line for line in error.splitlines() if line.startswith("embedtune: error:")]
    assert len(reported) == 1 and "bad.npy: input vectors row 9000 (0-based) holds nan" in reported[0]
    assert "unexpected" not in reported[0] and "UDF" not in reported[0]  # the actor's own error, not Ray's wrapper
    assert not (tmp_path / "bad-ray.npy").exists()
    assert _index_bytes(tmp_path / "index-ray") == _index_bytes(tmp_path / "index-local")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder or adapted.npy left


def test_a_non_finite_error_survives_pickling():
    """A Ray actor's error reaches the driver pickled: it must come back whole, not fail to deserialize."""
    import pickle

    from embedtune.errors import NonFiniteError

    error = NonFiniteError("vectors.npy", "input vectors", 9000, 3, float("nan"), 2, "drop the row", partial=True)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is NonFiniteError and str(again) == str(error) and (again.row, again.partial) == (9000, True)
