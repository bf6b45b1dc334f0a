"""`embedtune search` with query files and TREC/JSONL run files; MTEB-style metric names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.data.errors import DataFormatError
from embedtune.data.query_files import read_query_file
from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.run_files import read_trec_run, write_trec_run
from embedtune.workflows.experiment import load_experiment
from embedtune.workflows.results import mteb_metric_name, mteb_metrics


def test_query_files_jsonl_and_tsv(tmp_path):
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text('{"_id": "q1", "text": "first"}\n\n{"query_id": 7, "text": "second"}\n')
    assert read_query_file(jsonl) == [("q1", "first"), ("7", "second")]
    tsv = tmp_path / "q.tsv"
    tsv.write_text("query-id\ttext\nq1\tfirst query\nq2\tsecond\twith a tab\n")
    assert read_query_file(tsv) == [("q1", "first query"), ("q2", "second\twith a tab")]


@pytest.mark.parametrize("name, content, message", [
    ("q.jsonl", '{"text": "no id"}\n', "q.jsonl:1: field '_id': no query id"),
    ("q.jsonl", '{"_id": "q 1", "text": "x"}\n', "contains whitespace"),
    ("q.jsonl", '{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n', "q.jsonl:2: field '_id': query id 'a' appears twice"),
    ("q.tsv", "q1 only an id\n", "q.tsv:1: expected 'id<TAB>text'"),
    ("q.jsonl", "not json\n", "q.jsonl:1: not valid JSON"),
])
def test_bad_query_files_name_the_line_and_the_fix(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataFormatError, match="Fix:") as error:
        read_query_file(path)
    assert message in str(error.value)


def test_trec_run_reads_back_in_pytrec_eval_with_the_same_scores(tmp_path):
    import pytrec_eval

    hits = {"q1": [{"id": "d1", "score": 0.91000007}, {"id": "d3", "score": 0.91}, {"id": "d2", "score": 0.1}],
            "q2": [{"id": "d2", "score": 0.5}]}
    path = write_trec_run(tmp_path / "run.trec", hits, tag="mine")
    assert path.read_text().splitlines()[:2] == ["q1 Q0 d1 1 0.91000007 mine", "q1 Q0 d3 2 0.91 mine"]
    with open(path) as handle:
        parsed = pytrec_eval.parse_run(handle)
    assert parsed == read_trec_run(path)
    # trec_eval ranks by score (ties by doc id, which would put d3 first): close scores must stay apart.
    assert parsed["q1"]["d1"] > parsed["q1"]["d3"]
    with pytest.raises(ValueError, match="whitespace"):
        write_trec_run(tmp_path / "bad.trec", {"q1": [{"id": "doc 1", "score": 1.0}]})


def test_search_queries_file_writes_trec_and_jsonl_that_score_like_evaluate(toy_beir, tiny_bert_dir, tmp_path, capsys):
    import pytrec_eval

    experiment = load_experiment(data=str(toy_beir), model=str(tiny_bert_dir), split_seed=None)
    emb = experiment.embeddings
    np.save(tmp_path / "docs.npy", np.asarray(emb.doc_embeddings, dtype=np.float32))
    (tmp_path / "ids.txt").write_text("".join(i + "\n" for i in emb.doc_ids))
    assert main(["index", "build", "--embeddings", str(tmp_path / "docs.npy"), "--ids", str(tmp_path / "ids.txt"),
                 "--out", str(tmp_path / "idx"), "--model", str(tiny_bert_dir)]) == 0
    capsys.readouterr()
    queries = toy_beir / "queries.jsonl"  # BEIR's own queries.jsonl is a query file
    assert main(["search", "--index", str(tmp_path / "idx"), "--queries", str(queries), "--top-k", "20", "--out", str(tmp_path / "run")]) == 0
    assert "10 queries, top 20 hits each" in capsys.readouterr().out
    with open(tmp_path / "run" / "run.trec") as handle:
        run = pytrec_eval.parse_run(handle)
    assert len(run) == 10 and all(len(docs) == 20 for docs in run.values())
    # The run file scores as embedtune's own evaluation of the same vectors (exact search over all 20 docs).
    qrels = experiment.qrels_for(experiment.part_ids("all"))
    from_file = evaluate_run(qrels, run)
    direct = experiment.evaluate("all", top_k=20)
    assert from_file["ndcg@10"] == pytest.approx(direct["ndcg@10"], abs=1e-6)
    rows = [json.loads(line) for line in (tmp_path / "run" / "run.jsonl").read_text().splitlines()]
    assert [row["query_id"] for row in rows] == list(experiment.dataset.queries) and rows[0]["hits"][0]["rank"] == 1
    with pytest.raises(ValueError, match="not both"):
        from embedtune.cli import build_parser

        args = build_parser().parse_args(["search", "--index", str(tmp_path / "idx"), "--queries", str(queries), "text"])
        args.handler(args)


def test_metric_names_follow_mteb():
    assert [mteb_metric_name(n) for n in ("ndcg@10", "recall@100", "p@1", "mrr@10", "map@100", "val_ndcg@10", "coupling_r")] == [
        "ndcg_at_10", "recall_at_100", "precision_at_1", "mrr_at_10", "map_at_100", "val_ndcg_at_10", "coupling_r"]
    metrics = mteb_metrics({"ndcg@10": 0.5, "p@1": 0.25})
    assert metrics == {"ndcg_at_10": 0.5, "precision_at_1": 0.25, "main_score": 0.5}
