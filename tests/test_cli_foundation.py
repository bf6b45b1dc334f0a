import json

import numpy as np

from embedtune.cli import build_parser, main


def test_help_reads_well(capsys):
    parser = build_parser()
    text = parser.format_help()
    for command in ("embed", "split", "evaluate"):
        assert command in text


def test_split_command_writes_manifest(toy_beir, tmp_path, capsys):
    out = tmp_path / "manifest.json"
    assert main(["split", "--data", str(toy_beir), "--out", str(out)]) == 0
    manifest = json.loads(out.read_text())
    assert manifest["counts"] == {"train": 6, "val": 2, "test": 2}


def test_split_command_writes_positive_disjoint_folds(toy_beir, tmp_path, capsys):
    out = tmp_path / "folds.json"
    assert main(["split", "--data", str(toy_beir), "--folds", "5", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["protocol"] == "positive-disjoint folds" and written["n_folds"] == 5
    tested = [q for fold in written["folds"] for q in fold["query_ids"]["test"]]
    assert len(tested) == len(set(tested)) == 10  # every judged query of toy_beir, once
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [counts["test"] for counts in printed["counts"]] == [len(fold["query_ids"]["test"]) for fold in written["folds"]]
    assert [fold["fold"] for fold in written["folds"]] == [0, 1, 2, 3, 4]
    assert main(["split", "--data", str(toy_beir), "--folds", "11", "--out", str(tmp_path / "too-many.json")]) == 2
    assert "at most" in capsys.readouterr().err and not (tmp_path / "too-many.json").exists()


def test_evaluate_precomputed_json(toy_beir, tmp_path, capsys):
    # Docs are one-hot on their own id; each query points at its two relevant docs.
    docs = np.eye(20, dtype=np.float32)
    queries = np.zeros((10, 20), dtype=np.float32)
    for i in range(10):
        queries[i, i], queries[i, i + 10] = 1.0, 0.9
    np.save(tmp_path / "d.npy", docs)
    np.save(tmp_path / "q.npy", queries)
    (tmp_path / "d.txt").write_text("\n".join(f"d{i}" for i in range(20)))
    (tmp_path / "q.txt").write_text("\n".join(f"q{i}" for i in range(10)))
    code = main(["evaluate", "--data", str(toy_beir), "--doc-embeddings", str(tmp_path / "d.npy"), "--doc-ids", str(tmp_path / "d.txt"),
                 "--query-embeddings", str(tmp_path / "q.npy"), "--query-ids", str(tmp_path / "q.txt"), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_queries"] == 10 and result["recall@10"] == 1.0 and result["ndcg@10"] < 1.0


def test_bad_input_exits_2_with_message(toy_beir, tmp_path, capsys):
    (toy_beir / "queries.jsonl").write_text('{"_id": "q0"}\n')
    code = main(["split", "--data", str(toy_beir), "--out", str(tmp_path / "m.json")])
    assert code == 2
    assert "queries.jsonl:1: field 'text'" in capsys.readouterr().err
