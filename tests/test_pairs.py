"""Labels without a BEIR folder (data.pairs) and precomputed vectors as first-class input."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from embedtune.data.errors import DataFormatError
from embedtune.data.pairs import labelled_dataset, read_labels, read_pairs
from embedtune.encoders.precomputed import load_embeddings, require_ids, vector_fingerprints


def test_jsonl_and_tsv_pairs_read_the_same(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"query_id": "q1", "doc_id": "d1"}\n\n{"query_id": "q1", "doc_id": "d2", "relevance": 2}\n'
                                      '{"query_id": 7, "doc_id": "d1"}\n{"query_id": "q1", "doc_id": "d1"}\n')
    (tmp_path / "p.tsv").write_text("query_id\tdoc_id\nq1\td1\nq1\td2\t2\n7\td1\n")
    expected = {"q1": {"d1": 1, "d2": 2}, "7": {"d1": 1}}
    assert read_pairs(tmp_path / "p.jsonl") == expected  # a repeated pair is kept once
    assert read_pairs(tmp_path / "p.tsv") == expected
    assert read_labels(tmp_path / "p.tsv") == expected


def test_a_beir_qrels_file_is_read_as_qrels(tmp_path):
    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t0\n")
    assert read_labels(tmp_path / "q.tsv") == {"q1": {"d1": 1}, "q2": {"d3": 0}}


@pytest.mark.parametrize(
    ("name", "text", "where", "message"),
    [
        ("p.jsonl", '{"query_id": "q1", "doc_id": "d1"}\n{"query_id": "q2"\n', "p.jsonl:2", "malformed JSON"),
        ("p.jsonl", '{"query_id": "q1"}\n', "p.jsonl:1: field 'doc_id'", "missing required field"),
        ("p.jsonl", '{"query_id": "q1", "doc_id": "d1", "relevance": "high"}\n', "p.jsonl:1: field 'relevance'", "not an integer"),
        ("p.jsonl", '["q1", "d1"]\n', "p.jsonl:1", "not a JSON object"),
        ("p.tsv", "q1\td1\nq2 d2\n", "p.tsv:2", "expected 2 or 3 tab-separated columns"),
        ("p.tsv", "q1\td1\t1\nq1\td1\t2\n", "p.tsv:2", "relevance 2 here but 1 on line 1"),
        ("p.tsv", "q1\td1\t0\n", "p.tsv", "no relevant"),
    ],
)
def test_bad_pairs_name_the_file_and_line(tmp_path, name, text, where, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataFormatError, match=message) as error:
        read_pairs(tmp_path / name)
    assert where in str(error.value) and "Fix:" in str(error.value)


def test_labelled_dataset_needs_a_vector_for_every_labelled_id(tmp_path):
    labels = {"q1": {"d1": 1}, "q2": {"d9": 1}}
    (tmp_path / "p.tsv").write_text("q1\td1\nq2\td9\n")
    with pytest.raises(DataFormatError, match=r"p.tsv: field 'doc_id': document 'd9' \(query 'q2'\) has no vector in docs.txt"):
        labelled_dataset(["d1", "d2"], ["q1", "q2"], labels, tmp_path / "p.tsv", "docs.txt", "queries.txt")
    with pytest.raises(DataFormatError, match="query 'q2' has no vector in queries.txt"):
        labelled_dataset(["d1", "d9"], ["q1"], labels, tmp_path / "p.tsv", "docs.txt", "queries.txt")
    dataset = labelled_dataset(["d1", "d9", "d3"], ["q1", "q2"], labels, tmp_path / "p.tsv", "docs.txt", "queries.txt")
    assert dataset.judged_query_ids() == ["q1", "q2"] and dataset.doc_ids == ["d1", "d9", "d3"]
    assert set(dataset.fingerprints) == {"p.tsv"} and all(doc["text"] == "" for doc in dataset.corpus.values())


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_float64_and_float16_vectors_are_cast_with_a_note(tmp_path, rng, caplog, dtype):
    vectors = rng.normal(size=(4, 3)).astype(dtype)
    np.save(tmp_path / "v.npy", vectors)
    (tmp_path / "ids.txt").write_text("a\nb\nc\nd\n")
    with caplog.at_level(logging.INFO, logger="embedtune.encoders.precomputed"):
        ids, loaded = load_embeddings(tmp_path / "v.npy", tmp_path / "ids.txt")
    assert loaded.dtype == np.float32 and np.array_equal(loaded, vectors.astype(np.float32))
    notes = [r.getMessage() for r in caplog.records if "cast to float32" in r.getMessage()]
    assert len(notes) == 1 and np.dtype(dtype).name in notes[0] and "v.npy" in notes[0]


def test_duplicate_ids_and_missing_vectors_name_the_file_and_id(tmp_path, rng):
    np.save(tmp_path / "v.npy", rng.normal(size=(3, 2)).astype(np.float32))
    (tmp_path / "ids.txt").write_text("a\nb\na\n")
    with pytest.raises(DataFormatError, match=r"ids.txt: duplicate id 'a' \(rows 0 and 2\)"):
        load_embeddings(tmp_path / "v.npy", tmp_path / "ids.txt", unique=True)
    with pytest.raises(DataFormatError, match="ids.txt: no vector for query 'q9', which qrels.tsv uses"):
        require_ids(["q1"], ["q1", "q9"], "ids.txt", "qrels.tsv", "query")
    prints = vector_fingerprints(tmp_path / "v.npy", tmp_path / "ids.txt", None)
    assert set(prints) == {"v.npy", "ids.txt"} and all(len(value) == 64 for value in prints.values())


@pytest.mark.parametrize("name, text", [
    ("pairs.tsv", "query_id\tdoc_id\nq1\td1\n"),
    ("pairs.jsonl", '{"query_id": "q1", "doc_id": "d1"}\n'),
    ("qrels.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n"),
])
def test_a_byte_order_mark_in_a_pairs_or_qrels_file_is_accepted(tmp_path, name, text):
    """The defect: a leading byte order mark was refused with a wrong fix (an integer grade, one JSON object per line)."""
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert read_labels(path) == {"q1": {"d1": 1}}
