"""A fit on a sample of given ``.npy`` vectors reads only the sample, and equals the fit on the whole file."""

from __future__ import annotations

import codecs
import hashlib
import json

import numpy as np
import pytest
import xxhash

from embedtune.cli import main
from embedtune.compress import make_compressor
from embedtune.data.errors import DataFormatError
from embedtune.errors import NonFiniteError
from embedtune.encoders.precomputed import _ids_of_rows, load_embedding_rows, read_ids
from embedtune.evaluate.search import unit_rows
from embedtune.workflows.fit import fit_on_all


def corpus(n: int = 3000, d: int = 12, seed: int = 4, unit: bool = True) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32) * np.linspace(3, 0.5, d).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x


def files(tmp_path, x: np.ndarray):
    docs, ids = tmp_path / "docs.npy", tmp_path / "ids.txt"
    np.save(docs, x)
    ids.write_text("".join(f"d{i}\n" for i in range(len(x))))
    return docs, ids


@pytest.mark.parametrize("unit", [True, False])
def test_the_sampled_fit_equals_the_fit_on_every_row_in_memory(tmp_path, unit):
    x = corpus(unit=unit)
    docs, ids = files(tmp_path, x)
    result = fit_on_all("pca", 4, doc_embeddings=docs, doc_ids=ids, unsupervised=True, settings={"fit_sample": 500},
                        out=tmp_path / "out")
    whole = make_compressor("pca", dim=4, fit_sample=500)
    whole.fit_unsupervised(unit_rows(x))  # what reading the whole file gave: every row to unit norm, then the sample
    assert np.array_equal(result.compressor.components_, whole.components_)
    assert np.array_equal(result.compressor.mean_, whole.mean_)
    assert result.info["documents"] == 3000 and result.info["fit_details"]["fit_rows"] == 500
    rows = whole.fit_rows(3000, 12)
    record = result.info["provenance"]["vector_rows"]
    assert record["rows_read"] == 500 and record["shape"] == [3000, 12]
    assert record["rows_xxh3_128"] == xxhash.xxh3_128(np.ascontiguousarray(x[rows]).data).hexdigest()
    assert result.info["provenance"]["vectors"] == {"ids.txt": hashlib.sha256(ids.read_bytes()).hexdigest()}
    assert any("sample of 500 of the 3,000 rows" in note for note in result.notes)
    saved = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert saved["provenance"]["vector_rows"]["rows_read"] == 500


def test_a_corpus_within_the_sample_is_read_whole(tmp_path):
    x = corpus(n=400)
    docs, ids = files(tmp_path, x)
    result = fit_on_all("pca", 4, doc_embeddings=docs, doc_ids=ids, unsupervised=True, settings={"fit_sample": 500})
    assert "vector_rows" not in result.info["provenance"]
    assert set(result.info["provenance"]["vectors"]) == {"docs.npy", "ids.txt"}  # the whole files' sha256


def test_only_the_read_rows_are_checked(tmp_path):
    x = corpus()
    fitted = make_compressor("pca", dim=4, fit_sample=500)
    rows = set(fitted.fit_rows(3000, 12).tolist())
    outside = next(r for r in range(3000) if r not in rows)
    inside = sorted(rows)[3]  # not the sample's first row: its row 3 is the file's row `inside`
    y = x.copy()
    y[outside, 0] = np.nan
    docs, ids = files(tmp_path, y)
    fit_on_all("pca", 4, doc_embeddings=docs, doc_ids=ids, unsupervised=True, settings={"fit_sample": 500})  # never read
    y[inside, 0] = np.inf
    docs, ids = files(tmp_path, y)
    with pytest.raises(NonFiniteError, match=rf"docs.npy: vectors row {inside} \(0-based\) holds inf") as error:
        fit_on_all("pca", 4, doc_embeddings=docs, doc_ids=ids, unsupervised=True, settings={"fit_sample": 500})
    assert error.value.row == inside  # the file's row, not the sample's


@pytest.mark.parametrize("text", [
    "a\nb\nc\nd\n",                     # plain
    "a\nb\nc\nd",                       # no final newline
    "a\n\nb\nc\n  \nd\n",               # blank and space-only lines are skipped
    "a\r\nb\r\nc\r\nd\r\n",             # Windows line ends
    codecs.BOM_UTF8.decode() + "a\nb\nc\nd\n",  # a byte-order mark
    "\u00e9\nb\nc x\nd\n",              # non-ASCII ids and an inner space
    "\na\nb\nc\nd\n",                   # a blank first line
    "a\nb\nc\nd\n\n",                   # a blank last line
    "a\tb\nc\nd\ne\n",                  # a tab inside an id
    "a\x0cb\nc\nd\n",                    # a form feed, which splitlines breaks on
    "a\x7fb\nc\nd\ne\n",                # DEL, kept inside its id
])
def test_the_ids_of_some_rows_match_read_ids(tmp_path, text):
    path = tmp_path / "ids.txt"
    path.write_bytes(text.encode("utf-8"))
    every = read_ids(path)
    rows = np.array([0, 2, 3])
    picked, digest = _ids_of_rows(path, len(every), rows)
    assert picked == [every[r] for r in rows] and digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_json_ids_and_a_count_mismatch(tmp_path):
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(["x", "y", "z"]))
    assert _ids_of_rows(path, 3, np.array([1]))[0] == ["y"]
    plain = tmp_path / "ids.txt"
    plain.write_text("a\nb\n")
    for source in (path, plain):
        with pytest.raises(DataFormatError, match=r"ids for 4 rows") as error:
            _ids_of_rows(source, 4, np.array([0]))
        assert source.name in str(error.value)


def test_load_embedding_rows_refuses_what_it_cannot_read(tmp_path):
    bad = tmp_path / "ints.npy"
    np.save(bad, np.zeros((4, 3), dtype=np.int32))
    (tmp_path / "ids.txt").write_text("a\nb\nc\nd\n")
    with pytest.raises(DataFormatError, match="ints.npy"):
        load_embedding_rows(bad, tmp_path / "ids.txt", None)
    with pytest.raises(ValueError, match=".npy"):
        load_embedding_rows(tmp_path / "v.parquet", tmp_path / "ids.txt", None)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("order", ["C", "F"])
def test_load_embedding_rows_reads_exactly_the_rows_asked_for(tmp_path, dtype, order):
    """Rows are read with positioned reads, a run of consecutive rows at a time (a Fortran-ordered file through its
    mapping): single rows, runs, the first and last row, every row and none give what indexing the array gives."""
    x = np.asarray(np.random.default_rng(3).standard_normal((500, 9)).astype(dtype), order=order)
    np.save(tmp_path / "docs.npy", x)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(len(x))))
    picks = [np.array([0, 1, 2, 7, 200, 201, 499]), np.sort(np.random.default_rng(5).choice(500, 137, replace=False)),
             np.arange(500), np.array([], dtype=np.int64)]
    for rows in [None, *picks]:
        ids, vectors, record = load_embedding_rows(tmp_path / "docs.npy", tmp_path / "ids.txt", rows)
        expected = x if rows is None else x[rows]
        assert vectors.dtype == np.float32 and vectors.flags.c_contiguous
        np.testing.assert_array_equal(vectors, expected.astype(np.float32))
        assert ids == [f"d{i}" for i in (range(500) if rows is None else rows)]
        assert record["rows_xxh3_128"] == xxhash.xxh3_128_hexdigest(np.ascontiguousarray(expected).data)


def test_the_cli_says_the_sample_was_read(tmp_path, capsys):
    docs, ids = files(tmp_path, corpus())
    assert main(["compress", "fit", "--method", "pca", "--dim", "4", "--doc-embeddings", str(docs), "--doc-ids", str(ids),
                 "--set", "fit_sample=500", "--out", str(tmp_path / "fit")]) == 0
    assert "only those rows were read" in capsys.readouterr().err + json.loads((tmp_path / "fit" / "fit.json").read_text())["notes"][1]
