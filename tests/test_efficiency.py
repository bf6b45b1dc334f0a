"""The efficiency benchmark: latency harness, ANN recall, quantisation table, streaming figures."""

import argparse
import json

import numpy as np
import pytest

from embedtune.bench import efficiency


def test_flat_benchmark_returns_positive_ordered_figures():
    cases = efficiency.synthetic_cases(3000, [96, 32], n_queries=64)
    rows = efficiency.flat_search_benchmark(cases, k=5, batch=32, rounds=2, singles=4, warmup=1)
    assert len(rows) == 4
    assert {r["engine"] for r in rows} == {"faiss IndexFlatIP", "embedtune exact_search"}
    for row in rows:
        assert row["n"] == 3000 and row["memory_bytes"] == 3000 * row["d"] * 4
        assert 0 < row["latency_p50_ms"] <= row["latency_p95_ms"]
        assert row["throughput_qps"] > 0 and row["build_s"] >= 0
        assert row["n_single"] == 8 and row["n_batch"] == 2
        assert row["dim_ratio"] == row["memory_ratio"] == 96 / row["d"]
        assert row["bytes_per_vector"] == 4 * row["d"]
        assert row["latency_ratio"] > 0 and row["throughput_ratio"] > 0
    ours = [r for r in rows if r["engine"].startswith("embedtune")]
    assert all(r["agree@k_with_faiss"] == 1.0 for r in ours)
    full = [r for r in rows if r["d"] == 96]
    assert all(r["latency_ratio"] == r["throughput_ratio"] == 1.0 for r in full)


def test_synthetic_vectors_are_unit_rows_and_seeded():
    a = efficiency.synthetic_vectors(1000, 16, seed=3, block=300)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a, efficiency.synthetic_vectors(1000, 16, seed=3, block=300))


def test_ann_recall_against_exact(rng):
    xb = efficiency.synthetic_vectors(4000, 16)
    xq = efficiency.synthetic_vectors(50, 16, seed=7)
    row = efficiency.ann_benchmark(xb, xq, "IVF1024,Flat", k=10)
    assert row["factory"] == "IVF102,Flat"  # nlist shrunk to >= 39 training points per list
    assert 0.0 < row["recall@10"] <= 1.0 and row["memory_bytes"] > 4000 * 16 * 4
    flat = efficiency.ann_benchmark(xb, xq, "Flat", k=10)
    assert flat["recall@10"] == 1.0


def test_quantization_table(toy_beir, tiny_bert_dir):
    from embedtune.compress import make_compressor
    from embedtune.workflows.experiment import load_experiment, training_data

    experiment = load_experiment(data=str(toy_beir), model=str(tiny_bert_dir))
    compressor = make_compressor("pca", dim=16).fit(training_data(experiment, "train+val"))
    rows = efficiency.quantization_table(experiment, compressor, part="all", top_k=100, candidates=100)
    assert [r["vectors"] for r in rows] == ["frozen"] * 6 + ["pca-16"] * 6
    by = {(r["vectors"], r["quantization"]): r for r in rows}
    assert by[("frozen", "float32")]["bytes_per_vector"] == 4 * 32
    assert by[("pca-16", "int8 (FAISS SQ8)")]["bytes_per_vector"] == 16
    assert by[("pca-16", "binary (Hamming)")]["bytes_per_vector"] == 2
    assert by[("pca-16", "binary + float32 rescore top 100")]["disk_bytes_per_vector"] == 64
    float_frozen = experiment.evaluate("all")["ndcg@10"]
    assert by[("frozen", "float32")]["ndcg@10"] == pytest.approx(float_frozen, abs=1e-9)
    assert all(0.0 <= r["ndcg@10"] <= 1.0 and r["n_queries"] == 10 for r in rows)


@pytest.mark.slow
def test_streaming_benchmark(rng, tmp_path):
    from embedtune.compress import TrainingData, make_compressor

    X = rng.normal(size=(5000, 32)).astype(np.float32)
    ids = [str(i) for i in range(5000)]
    make_compressor("pca", dim=8).fit(TrainingData(ids[:1], X[:1], ids, X, {})).save(tmp_path / "pca")
    np.save(tmp_path / "in.npy", X)
    row = efficiency.streaming_benchmark(str(tmp_path / "pca"), str(tmp_path / "in.npy"), str(tmp_path / "out.npy"), chunk_size=1024)
    assert row["n"] == 5000 and row["apply_vectors_per_s"] > 0 and row["bare_matmul_vectors_per_s"] > 0
    assert row["peak_rss_bytes"] >= row["rss_before_bytes"] > 0


@pytest.mark.slow
def test_cli_benchmark_index_json(tmp_path, capsys):
    from embedtune.cli import bench as cli_bench

    parser = argparse.ArgumentParser()
    cli_bench.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["benchmark", "index", "--data", "", "--synthetic", "2000", "--synthetic-dim", "64", "--dims", "32",
                              "--rounds", "1", "--singles", "3", "--batch", "16", "--out", str(tmp_path / "r.json"), "--json"])
    assert args.handler(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((tmp_path / "r.json").read_text())
    assert [r["d"] for r in result["flat"]] == [64, 64, 32, 32]
    assert "never on what the vectors contain" in result["note"] and result["machine"]["cpus"] >= 1
    args = parser.parse_args(["benchmark", "index", "--data", "", "--synthetic", "2000", "--synthetic-dim", "64", "--dims", "32",
                              "--rounds", "1", "--singles", "2", "--batch", "16", "--engines", "embedtune"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "latency_ratio" in out and "DIVE paper" in out and "faiss IndexFlatIP" not in out
