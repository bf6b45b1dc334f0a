"""``embedtune search --query-vectors``: an index built from given vectors, searched with given query vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.compress import load_compressor, make_compressor
from embedtune.evaluate.search import exact_search


@pytest.fixture
def vectors(tmp_path):
    rng = np.random.default_rng(11)
    docs = rng.standard_normal((500, 16)).astype(np.float32)
    docs[7] = docs[3]  # a tie: equal scores rank by ascending row
    queries = rng.standard_normal((9, 16)).astype(np.float32)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(len(docs))))
    np.save(tmp_path / "q.npy", queries)
    (tmp_path / "qids.json").write_text(json.dumps([f"q{i}" for i in range(len(queries))]))
    assert main(["index", "build", "--embeddings", str(tmp_path / "docs.npy"), "--ids", str(tmp_path / "ids.txt"),
                 "--out", str(tmp_path / "flat")]) == 0
    return tmp_path, docs, queries


def read_trec(path):
    run: dict[str, list[tuple[str, int]]] = {}
    for line in path.read_text().splitlines():
        qid, _, doc, rank, _score, tag = line.split()
        assert tag == "embedtune"
        run.setdefault(qid, []).append((doc, int(rank)))
    return run


def test_hits_are_the_exact_ranking_with_ties_by_row(vectors, capsys):
    tmp, docs, queries = vectors
    queries[0] = docs[3]  # ties with rows 3 and 7
    np.save(tmp / "q.npy", queries)
    assert main(["search", "--index", str(tmp / "flat"), "--query-vectors", str(tmp / "q.npy"), "--query-ids", str(tmp / "qids.json"),
                 "--top-k", "10", "--out", str(tmp / "run")]) == 0
    run = read_trec(tmp / "run" / "run.trec")
    scores = queries.astype(np.float64) @ docs.astype(np.float64).T
    for row, qid in enumerate(f"q{i}" for i in range(len(queries))):
        expected = sorted(range(len(docs)), key=lambda doc: (-scores[row, doc], doc))[:10]
        assert [doc for doc, _ in run[qid]] == [f"d{doc}" for doc in expected]
        assert [rank for _, rank in run[qid]] == list(range(1, 11))
    ranked = [doc for doc, _ in run["q0"]]
    assert ranked.index("d7") == ranked.index("d3") + 1  # equal scores: the lower row first
    lines = [json.loads(line) for line in (tmp / "run" / "run.jsonl").read_text().splitlines()]
    assert [line["query_id"] for line in lines] == [f"q{i}" for i in range(len(queries))] and lines[0]["query"] is None
    # The same hits as the tuned kernels embedtune chooses among (the flat index now scans with FAISS's own).
    for kernel in ("auto", "numpy", "torch-prune"):
        _, rows = exact_search(queries, docs, 10, kernel=kernel)
        assert [[f"d{i}" for i in r] for r in rows] == [[doc for doc, _ in run[f"q{q}"]] for q in range(len(queries))]


def test_refuses_nan_and_another_dimension_naming_the_file(vectors, capsys):
    tmp, _, queries = vectors
    bad = queries.copy()
    bad[2, 5] = np.inf
    np.save(tmp / "inf.npy", bad)
    np.save(tmp / "narrow.npy", queries[:, :12])
    for name, says in (("inf.npy", "row 2"), ("narrow.npy", "12-d")):
        code = main(["search", "--index", str(tmp / "flat"), "--query-vectors", str(tmp / name), "--query-ids", str(tmp / "qids.json"),
                     "--out", str(tmp / "run")])
        error = capsys.readouterr().err
        assert code == 2 and str(tmp / name) in error and says in error and "Traceback" not in error
        assert not (tmp / "run").exists()


def test_refuses_a_model_or_texts_with_query_vectors(vectors, capsys):
    tmp, _, _ = vectors
    assert main(["search", "--index", str(tmp / "flat"), "--query-vectors", str(tmp / "q.npy"), "--query-ids", str(tmp / "qids.json"),
                 "--model", "minilm"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp / "flat"), "--query-ids", str(tmp / "qids.json"), "some text"]) == 2
    assert "--query-vectors" in capsys.readouterr().err


def test_query_vectors_go_through_the_index_adapter(vectors, capsys):
    tmp, docs, queries = vectors
    make_compressor("pca", dim=6).fit_unsupervised(docs).save(tmp / "pca")
    assert main(["index", "build", "--embeddings", str(tmp / "docs.npy"), "--ids", str(tmp / "ids.txt"), "--adapter", str(tmp / "pca"),
                 "--out", str(tmp / "pca-index")]) == 0
    capsys.readouterr()
    assert main(["search", "--index", str(tmp / "pca-index"), "--query-vectors", str(tmp / "q.npy"), "--query-ids",
                 str(tmp / "qids.json"), "--top-k", "5", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["queries"]
    pca = load_compressor(tmp / "pca")
    _, rows = exact_search(pca.transform(queries), pca.transform(docs), 5)
    assert [[hit["id"] for hit in query["hits"]] for query in found] == [[f"d{i}" for i in r] for r in rows]


def test_a_hit_with_its_query_id_is_dropped_unless_kept(vectors, capsys):
    tmp, docs, _ = vectors
    np.save(tmp / "self.npy", docs[:4])
    (tmp / "self.txt").write_text("d0\nd1\nd2\nd3\n")
    args = ["search", "--index", str(tmp / "flat"), "--query-vectors", str(tmp / "self.npy"), "--query-ids", str(tmp / "self.txt"),
            "--top-k", "3", "--json"]
    assert main(args) == 0
    dropped = json.loads(capsys.readouterr().out)["queries"]
    assert all(query["query_id"] not in [hit["id"] for hit in query["hits"]] and len(query["hits"]) == 3 for query in dropped)
    assert main([*args, "--keep-identical-ids"]) == 0
    kept = json.loads(capsys.readouterr().out)["queries"]
    assert all(query["query_id"] in [hit["id"] for hit in query["hits"]] for query in kept)
