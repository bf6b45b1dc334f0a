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
