import json
import zipfile

import pytest

from conftest import shared_dataset, write_beir
from embedtune.data import DataFormatError, document_text, load_beir, resolve_dataset_path


def test_loads_folder(toy_beir):
    ds = load_beir(toy_beir)
    assert len(ds.corpus) == 20 and len(ds.queries) == 10
    assert ds.qrels["q3"] == {"d3": 1, "d13": 2}
    assert ds.judged_query_ids() == [f"q{i}" for i in range(10)]
    assert set(ds.fingerprints) == {"corpus.jsonl", "queries.jsonl", "qrels/test.tsv"}


def test_loads_zip_with_top_folder(toy_beir, tmp_path):
    archive = tmp_path / "toy.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in toy_beir.rglob("*"):
            if f.is_file():
                z.write(f, f"toy/{f.relative_to(toy_beir)}")
    from_zip, from_dir = load_beir(archive), load_beir(toy_beir)
    assert from_zip.corpus == from_dir.corpus and from_zip.qrels == from_dir.qrels
    assert from_zip.fingerprints == from_dir.fingerprints
    assert from_zip.name == "toy"


def test_document_text_is_title_space_text_stripped():
    assert document_text({"title": "", "text": " body "}) == "body"
    assert document_text({"title": "T", "text": "body"}) == "T body"


def test_bundled_scifact_resolves_and_loads():
    path = resolve_dataset_path("scifact")
    assert path.suffix == ".zip" and path.is_file()
    ds = load_beir("scifact")
    assert (len(ds.corpus), len(ds.queries), len(ds.qrels)) == (5183, 1109, 300)
    train = load_beir("scifact", "train")
    assert len(train.qrels) == 809


def test_unknown_dataset_name():
    with pytest.raises(FileNotFoundError, match="bundled name"):
        load_beir("no-such-dataset")


def test_unknown_split_lists_available(toy_beir):
    with pytest.raises(FileNotFoundError, match="available splits: \\['test'\\]"):
        load_beir(toy_beir, "dev")


def _break(path, line_no, new_line):
    lines = path.read_text().splitlines()
    lines[line_no - 1] = new_line
    path.write_text("\n".join(lines) + "\n")


def test_malformed_json_names_file_and_line(toy_beir):
    _break(toy_beir / "corpus.jsonl", 4, '{"_id": "d3", "text": ')
    with pytest.raises(DataFormatError) as info:
        load_beir(toy_beir)
    message = str(info.value)
    assert "corpus.jsonl:4" in message and "malformed JSON" in message and "Fix:" in message


@pytest.mark.parametrize("field", ["_id", "text"])
def test_missing_required_field(toy_beir, field):
    record = {"_id": "q2", "text": "hello"}
    del record[field]
    _break(toy_beir / "queries.jsonl", 3, json.dumps(record))
    with pytest.raises(DataFormatError) as info:
        load_beir(toy_beir)
    assert info.value.line == 3 and info.value.field == field and "queries.jsonl:3" in str(info.value)


def test_duplicate_ids(toy_beir):
    _break(toy_beir / "corpus.jsonl", 7, json.dumps({"_id": "d0", "text": "again"}))
    with pytest.raises(DataFormatError, match=r"corpus.jsonl:7: field '_id': duplicate id 'd0' \(first seen on line 1\)"):
        load_beir(toy_beir)


def test_bad_qrels_header(toy_beir):
    _break(toy_beir / "qrels" / "test.tsv", 1, "qid\tdocid\trel")
    with pytest.raises(DataFormatError, match=r"test.tsv:1: bad qrels header"):
        load_beir(toy_beir)


def test_bad_qrels_score(toy_beir):
    _break(toy_beir / "qrels" / "test.tsv", 5, "q3\td3\thigh")
    with pytest.raises(DataFormatError) as info:
        load_beir(toy_beir)
    assert info.value.line == 5 and info.value.field == "score" and "integer" in str(info.value)


def test_bad_qrels_column_count(toy_beir):
    _break(toy_beir / "qrels" / "test.tsv", 2, "q0 d0 1")
    with pytest.raises(DataFormatError, match="3 tab-separated columns"):
        load_beir(toy_beir)


def test_absent_docs_and_queries_warn_with_count(tmp_path):
    corpus = [{"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"}]
    queries = [{"_id": "q1", "text": "x"}]
    root = write_beir(tmp_path / "m", corpus, queries, [("q1", "d1", 1), ("q1", "ghost", 1), ("q1", "ghost2", 1), ("qghost", "d2", 1)])
    with pytest.warns(UserWarning, match="2 judgment\\(s\\) name documents absent .* 1 query id"):
        ds = load_beir(root)
    assert ds.qrels == {"q1": {"d1": 1}}
    assert ds.dropped_judgments == {"missing_docs": 2, "missing_queries": 1}


@pytest.mark.real
def test_real_arguana_has_five_absent_docs():
    with pytest.warns(UserWarning, match="5 judgment"):
        ds = load_beir(shared_dataset("arguana"))
    assert ds.dropped_judgments["missing_docs"] == 5
    assert len(ds.corpus) == 8782


def test_untitled_corpus_keeps_the_ids_in_order_and_its_texts_read_only():
    from embedtune.data.beir import document_text, untitled_corpus

    corpus = untitled_corpus(["b", "a", "c"])
    assert list(corpus) == ["b", "a", "c"]
    assert document_text(corpus["a"]) == ""
    with pytest.raises(TypeError):
        corpus["a"]["title"] = "shared by every id, so it cannot be written"
