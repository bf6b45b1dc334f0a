"""One bar per long job (embed-corpus, with Ray too; diagnose; every phase of
compress plan), FAISS's and Ray's chatter only with -v, and -q quiet.

FAISS writes its ``WARNING clustering`` lines to the stderr file descriptor from C++, so those
tests read fd 2 (``capfd``); what a terminal would show is rebuilt as in test_terminal_output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main
from test_terminal_output import BAR, visible_lines

TEXTS = [f"document number {i} about topic {i % 5}" for i in range(37)]


@pytest.fixture(autouse=True)
def immediate_bars(monkeypatch):
    monkeypatch.setenv("EMBEDTUNE_PROGRESS_DELAY", "0")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    return path


def _bars(lines: list[str]) -> list[str]:
    return [line for line in lines if "%|" in line]


def test_embed_corpus_draws_one_bar_over_all_shards(corpus, tiny_bert_dir, tmp_path, capsys):
    assert main(["embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "v"),
                 "--shard-size", "10", "--batch-size", "8"]) == 0
    bars = _bars(visible_lines(capsys.readouterr().err))
    assert bars and all(line.startswith("encoding 37 documents: ") and BAR.match(line) for line in bars), bars
    assert bars[-1].startswith("encoding 37 documents: 100%") and "37/37" in bars[-1]
    # A resumed run counts the complete shards as done.
    (tmp_path / "v" / "shard-00003.json").unlink()
    assert main(["embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "v"),
                 "--shard-size", "10"]) == 0
    bars = _bars(visible_lines(capsys.readouterr().err))
    assert bars and "37/37" in bars[-1] and not any("0/37" in line.split("|")[-1] for line in bars)


def test_embed_corpus_quiet_prints_only_the_result(corpus, tiny_bert_dir, tmp_path, capfd):
    assert main(["-q", "embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "v")]) == 0
    captured = capfd.readouterr()
    assert captured.err == "" and json.loads(captured.out)["rows"] == 37


@pytest.mark.slow
def test_embed_corpus_on_ray_draws_the_bar_and_no_ray_start_up_lines(corpus, tiny_bert_dir, tmp_path, capfd):
    pytest.importorskip("ray")
    assert main(["embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "v"),
                 "--shard-size", "10", "--ray-actors", "1", "--cpus-per-actor", "0.5", "--threads-per-actor", "1"]) == 0
    captured = capfd.readouterr()
    lines = visible_lines(captured.err)
    assert json.loads(captured.out)["last_run"]["backend"] == "ray (1 actors)"
    bars = _bars(lines)
    assert bars and all(line.startswith("encoding 37 documents on 1 Ray actors: ") for line in bars), lines
    others = [line for line in lines if "%|" not in line]
    assert others == [], others  # no "Started a local Ray instance", no Ray Data execution lines


def test_diagnose_draws_one_bar(toy40, tiny_bert_dir, capsys):
    assert main(["diagnose", "--model", str(tiny_bert_dir), "--data", str(toy40), "--split", "test", "--batch-size", "4"]) == 0
    bars = _bars(visible_lines(capsys.readouterr().err))
    assert bars and all(line.startswith("diagnose, encoding 20 (query, positive) pairs: ") and BAR.match(line) for line in bars), bars
    assert "40/40" in bars[-1]


@pytest.fixture
def vectors(tmp_path):
    """300 docs, 60 queries, 24-d unit vectors on disk (as test_plan's toy, larger for FAISS PQ)."""
    from conftest import write_beir

    rng = np.random.default_rng(0)
    docs = rng.standard_normal((300, 24)).astype(np.float32)
    targets = rng.permutation(300)[:60]
    queries = docs[targets] + 0.6 * rng.standard_normal((60, 24)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    doc_ids, query_ids = [f"d{i}" for i in range(300)], [f"q{i}" for i in range(60)]
    root = write_beir(tmp_path / "toy", [{"_id": i, "text": i} for i in doc_ids], [{"_id": q, "text": q} for q in query_ids],
                      [(q, doc_ids[t], 1) for q, t in zip(query_ids, targets)])
    for name, ids, array in (("doc", doc_ids, docs), ("query", query_ids, queries)):
        np.save(tmp_path / f"{name}.npy", array)
        (tmp_path / f"{name}.txt").write_text("".join(i + "\n" for i in ids))
    return ["--data", str(root), "--doc-embeddings", str(tmp_path / "doc.npy"), "--doc-ids", str(tmp_path / "doc.txt"),
            "--query-embeddings", str(tmp_path / "query.npy"), "--query-ids", str(tmp_path / "query.txt")]


PLAN = ["--target-retention", "0.9", "--methods", "truncate", "pca", "--dims", "12", "--precisions", "float32", "int8",
        "--peers", "pq"]


def test_compress_plan_draws_a_bar_per_phase_and_hides_faiss_chatter(vectors, tmp_path, capfd, monkeypatch):
    import embedtune.workflows.plan as plan

    monkeypatch.setattr(plan, "peer_factories", lambda *a, **k: ["PQ2x8"])  # one small 8-bit PQ: FAISS warns on 300 points
    assert main(["compress", "plan", *vectors, *PLAN, "--out", str(tmp_path / "plan")]) == 0
    lines = visible_lines(capfd.readouterr().err)
    bars = _bars(lines)
    assert any(line.startswith("plan 1/3, frozen vectors, fast-scan peers and codecs: 100%") for line in bars), lines
    assert any(line.startswith("plan 2/3, fitting and scoring the sweep: 100%") for line in bars), lines
    assert any(line.startswith("plan 2/3, 8-bit FAISS PQ/OPQ peers: 100%") for line in bars), lines
    assert any(line.startswith("plan 3/3, ") for line in lines), lines
    assert all(BAR.match(line) for line in bars), bars
    assert not any("WARNING clustering" in line for line in lines)
    # -q: nothing on stderr at all (FAISS's lines included); -v: FAISS's own lines come back.
    assert main(["-q", "compress", "plan", *vectors, *PLAN, "--out", str(tmp_path / "plan2"), "--work", str(tmp_path / "w2")]) == 0
    quiet = capfd.readouterr()
    assert "WARNING clustering" not in quiet.err and "%|" not in quiet.err and "chosen:" in quiet.out
    assert [line for line in quiet.err.splitlines() if not line.startswith("warning:")] == []
    assert main(["-v", "compress", "plan", *vectors, *PLAN, "--out", str(tmp_path / "plan3"), "--work", str(tmp_path / "w3")]) == 0
    assert "WARNING clustering 300 points to 256 centroids" in capfd.readouterr().err


def test_faiss_chatter_filter_keeps_other_native_lines(capfd):
    import os

    from embedtune.runtime import native_chatter_filtered

    with native_chatter_filtered():
        os.write(2, b"WARNING clustering 300 points to 256 centroids: please provide at least 9984 training points\n")
        os.write(2, b"a real FAISS error line\n")
    err = capfd.readouterr().err
    assert "WARNING clustering" not in err and "a real FAISS error line" in err


def test_finetune_draws_no_widget_examples_bar(toy40, tiny_bert_dir, tmp_path, capsys):
    """sentence-transformers' "Computing widget examples" bar (a Hub model-card widget) is not drawn in a fine-tune."""
    assert main(["finetune", "pace", "--model", str(tiny_bert_dir), "--data", str(toy40), "--train-split", "test",
                 "--stage1-steps", "2", "--stage2-steps", "1", "--stage2-init", "1", "--batch-size", "4", "--n-negatives", "2",
                 "--hard-pool", "5", "--save-steps", "1", "--lora-rank", "4", "--out", str(tmp_path / "pace")]) == 0
    err = capsys.readouterr().err
    assert "PACE stage1" in err and "Computing widget examples" not in err
