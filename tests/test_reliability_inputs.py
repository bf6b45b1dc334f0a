"""Every number comes from finite inputs, and every bad input is one clear error.

One test per defect: each printed a wrong number, ended in a traceback, or named no file before.
Tiny synthetic BEIR folders and random vectors; no quality claims.
"""

import json
import shutil
import warnings

import numpy as np
import pytest

from conftest import write_beir
from embedtune.cli import main
from embedtune.compress import make_compressor
from embedtune.compress.base import TrainingData
from embedtune.compress.streaming import apply_compressor_streaming
from embedtune.data.beir import load_beir
from embedtune.data.errors import DataFormatError
from embedtune.data.triplets import explain_no_triplets
from embedtune.encoders.precomputed import require_ids
from embedtune.encoders.similarity import resolve_similarity
from embedtune.errors import EmbedtuneError, NonFiniteError, NoQueriesError, check_finite
from embedtune.evaluate import evaluate_embeddings
from embedtune.workflows.experiment import load_experiment


# -- helpers -----------------------------------------------------------------------------------
def _dataset(tmp_path, n_docs=60, n_queries=20, name="beir"):
    corpus = [{"_id": f"d{i}", "text": f"document number {i} about topic {i % 5}"} for i in range(n_docs)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"} for i in range(n_queries)]
    return write_beir(tmp_path / name, corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(n_queries)])


def _vectors(tmp_path, n_docs=60, n_queries=20, d=16, seed=0):
    """Docs of very different norms; each query near its relevant doc's direction: dot and cosine rank differently."""
    rng = np.random.default_rng(seed)
    unit = rng.normal(size=(n_docs, d))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    queries = unit[:n_queries] + 0.35 * rng.normal(size=(n_queries, d))
    docs = unit * rng.uniform(0.05, 20.0, size=(n_docs, 1))
    paths = {name: tmp_path / f"{name}.npy" for name in ("docs", "unit", "queries")}
    np.save(paths["docs"], docs.astype(np.float32))
    np.save(paths["unit"], unit.astype(np.float32))
    np.save(paths["queries"], queries.astype(np.float32))
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(n_docs)))
    (tmp_path / "queries.txt").write_text("".join(f"q{i}\n" for i in range(n_queries)))
    return paths


def _evaluate(tmp_path, data, docs, queries=None, *extra):
    return main(["evaluate", "--data", str(data), "--doc-embeddings", str(docs), "--doc-ids", str(tmp_path / "docs.txt"),
                 "--query-embeddings", str(queries or tmp_path / "queries.npy"), "--query-ids", str(tmp_path / "queries.txt"),
                 "--json", *extra])


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# -- row 1: cosine always normalises -------------------------------------------------------------
def test_cosine_normalises_precomputed_vectors_and_says_so(tmp_path, capsys):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    results = {}
    for name, docs, extra in (("raw", paths["docs"], ()), ("unit", paths["unit"], ()), ("dot", paths["docs"], ("--similarity", "dot"))):
        assert _evaluate(tmp_path, data, docs, None, *extra) == 0
        results[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert results["raw"]["similarity"] == "cosine"
    assert results["raw"]["ndcg@10"] == results["unit"]["ndcg@10"]  # before: ranked by raw dot, a much lower number
    assert results["dot"]["similarity"] == "dot" and results["dot"]["ndcg@10"] < results["raw"]["ndcg@10"] - 0.1


def test_evaluate_embeddings_cosine_matches_normalised_input(tmp_path):
    paths = _vectors(tmp_path)
    docs, unit, queries = (np.load(paths[name]) for name in ("docs", "unit", "queries"))
    ids, doc_ids = [f"q{i}" for i in range(20)], [f"d{i}" for i in range(60)]
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(20)}
    cosine = evaluate_embeddings(ids, queries, doc_ids, docs, qrels, similarity="cosine")
    normalised = evaluate_embeddings(ids, queries / np.linalg.norm(queries, axis=1, keepdims=True), doc_ids, unit, qrels)
    assert cosine.aggregate == pytest.approx(normalised.aggregate)


# -- row 2: non-finite values --------------------------------------------------------------------
@pytest.mark.parametrize("which", ["docs", "queries"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_precomputed_vectors_name_file_and_row(tmp_path, capsys, which, value):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    array = np.load(paths[which])
    array[7, 3] = value
    np.save(paths[which], array)
    assert _evaluate(tmp_path, data, paths["docs"], paths["queries"]) == 2
    err = _error(capsys)
    assert f"{paths[which]}: vectors row 7 (0-based) holds {value!r} at column 3" in err


def test_check_finite_counts_and_names_the_first_bad_row():
    array = np.ones((10, 4), np.float32)
    array[[3, 8], 1] = [np.inf, np.nan]
    with pytest.raises(NonFiniteError, match=r"x.npy: vectors row 3 \(0-based\) holds inf at column 1; 2 rows in all"):
        check_finite(array, "x.npy")
    check_finite(np.arange(6).reshape(3, 2), "ints")  # always finite


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_check_finite_sees_through_cancelling_and_overflowing_row_sums(dtype):
    """The fast path sums each row; +inf and -inf in one row sum to NaN, and a row of huge finite values sums to
    infinity without any non-finite value: the first is refused, the second passes, and neither warns."""
    huge = np.finfo(dtype).max
    array = np.ones((6, 5), dtype)
    array[2] = huge  # finite, but its sum overflows
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_finite(array, "huge.npy")
        array[4, [0, 3]] = [np.inf, -np.inf]
        with pytest.raises(NonFiniteError, match=r"row 4 \(0-based\) holds inf at column 0\. Fix"):
            check_finite(array, "mixed.npy")


def test_compressor_output_must_be_finite(rng):
    X = rng.normal(size=(50, 16)).astype(np.float32)
    pca = make_compressor("pca", dim=4).fit(TrainingData.corpus_only(X, [f"d{i}" for i in range(50)]))
    pca.components_[1, 2] = np.nan  # damaged weights
    with pytest.raises(NonFiniteError, match="PCACompressor.transform: output row 0"):
        pca.transform(X)


def test_compress_apply_names_the_file_and_row_of_a_nan(tmp_path, capsys, rng):
    X = rng.normal(size=(300, 16)).astype(np.float32)
    make_compressor("pca", dim=4).fit(TrainingData.corpus_only(X, [f"d{i}" for i in range(300)])).save(tmp_path / "pca")
    X[123, 5] = np.nan
    np.save(tmp_path / "in.npy", X)
    code = main(["compress", "apply", "--adapter", str(tmp_path / "pca"), "--input", str(tmp_path / "in.npy"),
                 "--out", str(tmp_path / "out.npy"), "--chunk-size", "50"])
    assert code == 2
    assert f"{tmp_path / 'in.npy'}: input vectors row 123 (0-based) holds nan at column 5" in _error(capsys)
    assert not (tmp_path / "out.npy").exists()


def test_streaming_apply_of_damaged_weights_names_the_input_row(tmp_path, rng):
    X = rng.normal(size=(300, 16)).astype(np.float32)
    pca = make_compressor("pca", dim=4).fit(TrainingData.corpus_only(X, [f"d{i}" for i in range(300)]))
    np.save(tmp_path / "in.npy", X)
    pca.components_[0, 0] = np.inf
    with pytest.raises(NonFiniteError, match=r"in.npy through the pca adapter: output row 0"):
        apply_compressor_streaming(pca, tmp_path / "in.npy", tmp_path / "out.npy", chunk_size=64)


# -- row 6: metrics over zero queries ----------------------------------------------------------
def test_empty_qrels_say_why_no_query_is_left(tmp_path, capsys):
    data = _dataset(tmp_path)
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    assert main(["split", "--data", str(data), "--out", str(tmp_path / "m.json")]) == 2
    assert "no judged query is left" in (err := _error(capsys)) and "no judgment lines" in err
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tnot-a-doc\t1\n")
    with pytest.raises(NoQueriesError, match="absent from the data files.*'not-a-doc' is not in corpus.jsonl"):
        load_beir(data)
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t0\n")
    with pytest.raises(NoQueriesError, match="positive score"):
        load_beir(data)


def test_a_split_too_small_for_validation_queries_is_an_error(tmp_path, capsys):
    data, _ = _dataset(tmp_path, n_queries=2), _vectors(tmp_path, n_queries=2)
    assert _evaluate(tmp_path, data, tmp_path / "docs.npy", None, "--queries", "val") == 2
    err = _error(capsys)
    assert "leaves 0 validation queries" in err and "at least 3 judged queries" in err


def test_precomputed_doc_ids_matching_no_document_are_an_error(tmp_path, capsys):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    (tmp_path / "docs.txt").write_text("".join(f"doc-{i}\n" for i in range(60)))
    assert _evaluate(tmp_path, data, paths["docs"]) == 2
    assert f"{paths['docs']}: none of its 60 doc ids (e.g. 'doc-0') is a document of" in _error(capsys)


def test_evaluate_embeddings_refuses_zero_queries():
    docs = np.eye(3, dtype=np.float32)
    with pytest.raises(NoQueriesError, match="none of the 1 queries"):
        evaluate_embeddings(["q"], docs[:1], ["a", "b", "c"], docs, {"other": {"a": 1}})
    with pytest.raises(NoQueriesError, match="searched document ids"):
        evaluate_embeddings(["q"], docs[:1], ["a", "b", "c"], docs, {"q": {"z": 1}})
    with pytest.raises(ValueError, match="top_k"):
        evaluate_embeddings(["q"], docs[:1], ["a", "b", "c"], docs, {"q": {"a": 1}}, top_k=0)


def test_an_empty_training_split_is_not_blamed_on_the_false_negative_filter(tmp_path):
    from embedtune.workflows import fit_compressor

    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    experiment = load_experiment(data, fractions=(0.0, 0.5, 0.5), doc_embeddings=paths["docs"], doc_ids=tmp_path / "docs.txt",
                                 query_embeddings=paths["queries"], query_ids=tmp_path / "queries.txt")
    with pytest.raises(NoQueriesError) as error:
        fit_compressor(experiment, "dive", 4, seeds=[2027])
    assert "train queries" in str(error.value) and "false-negative" not in str(error.value)


def test_zero_triplets_name_the_step_that_emptied_them():
    qrels = {"q1": {"d1": 1}}
    assert explain_no_triplets([], ["d1", "d2"], qrels)[0] == "queries"
    assert explain_no_triplets(["q1"], ["d1", "d2"], {"q1": {"d1": 0}})[0] == "judgments"
    assert explain_no_triplets(["q1"], ["d7", "d8"], qrels)[0] == "corpus"
    assert explain_no_triplets(["q1"], ["d1"], qrels)[0] == "corpus"
    step, why = explain_no_triplets(["q1"], ["d1", "d2"], qrels, false_negative_margin=0.05)
    assert step == "false_negative_filter" and "margin 0.05" in why


# -- the model's own similarity ----------------------------------------------------------------
@pytest.fixture
def dot_model(tmp_path, tiny_bert_dir):
    """The tiny model saved as a PACE Stage II model is: ``similarity_fn_name`` = ``dot``."""
    model = tmp_path / "stage2"
    shutil.copytree(tiny_bert_dir, model)
    config_path = model / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config_path.write_text(json.dumps({**config, "similarity_fn_name": "dot"}))
    return model


def test_evaluate_uses_the_models_own_similarity(tmp_path, dot_model, capsys):
    data = _dataset(tmp_path, n_docs=40, n_queries=20)
    base = ["evaluate", "--data", str(data), "--model", str(dot_model), "--json", "--no-cache"]
    assert main(base) == 0
    own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (own["similarity"], own["similarity_source"]) == ("dot", "model")
    assert main([*base, "--similarity", "dot"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ndcg@10"] == own["ndcg@10"]
    assert main([*base, "--similarity", "cosine"]) == 0  # the explicit flag wins, with a warning
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["similarity"] == "cosine"
    assert "ranking by cosine as asked" in captured.err and "ranks by 'dot' (similarity_fn_name)" in captured.err


def test_compress_fit_uses_the_models_own_similarity(tmp_path, dot_model, capsys):
    """The defect: `compress fit` normalised a dot model's vectors (it read only the flag), so the fit saw other rows."""
    data = _dataset(tmp_path, n_docs=40, n_queries=20)
    out = tmp_path / "fit"
    assert main(["compress", "fit", "--method", "pca", "--dim", "4", "--data", str(data), "--model", str(dot_model), "--unsupervised",
                 "--no-cache", "--out", str(out)]) == 0
    assert make_compressor("pca").load(out).input_normalization_ is None  # fitted on the raw dot-product vectors
    assert main(["compress", "fit", "--method", "pca", "--dim", "4", "--data", str(data), "--model", str(dot_model), "--unsupervised",
                 "--no-cache", "--similarity", "cosine", "--out", str(tmp_path / "cos")]) == 0
    assert make_compressor("pca").load(tmp_path / "cos").input_normalization_ == "unit"


def test_resolve_similarity_rules(dot_model, tiny_bert_dir):
    assert resolve_similarity(None, dot_model).name == "dot"
    assert resolve_similarity(None, dot_model, precomputed=True).name == "cosine"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_similarity("dot", dot_model).source == "flag"  # agrees: no warning
    config = dot_model / "config_sentence_transformers.json"
    config.write_text(json.dumps({"similarity_fn_name": "manhattan"}))
    with pytest.raises(EmbedtuneError, match="similarity_fn_name.*manhattan.*--similarity"):
        resolve_similarity(None, dot_model)


# -- errors, not tracebacks ------------------------------------------------------------------------
def test_non_utf8_corpus_names_file_and_line(tmp_path, capsys):
    data = _dataset(tmp_path)
    lines = (data / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"document", b"docum\xe9nt")
    (data / "corpus.jsonl").write_bytes(b"".join(lines))
    assert main(["split", "--data", str(data), "--out", str(tmp_path / "m.json")]) == 2
    assert f"{data / 'corpus.jsonl'}:3: not valid UTF-8 (byte 0xe9" in _error(capsys)


def test_a_utf8_byte_order_mark_is_accepted(tmp_path, capsys):
    data = _dataset(tmp_path)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        (data / name).write_bytes(b"\xef\xbb\xbf" + (data / name).read_bytes())
    assert main(["split", "--data", str(data), "--out", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["counts"]["train"] == 12


def test_object_dtype_npy_names_the_file(tmp_path, capsys):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    np.save(paths["docs"], np.array([[1, "a"]] * 60, dtype=object), allow_pickle=True)
    assert _evaluate(tmp_path, data, paths["docs"]) == 2
    assert f"{paths['docs']}: holds Python objects (dtype object)" in _error(capsys)


def test_a_dim_mismatch_names_both_files_and_dims(tmp_path, capsys):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    np.save(paths["queries"], np.ones((20, 8), np.float32))
    assert _evaluate(tmp_path, data, paths["docs"]) == 2
    assert f"{paths['queries']} holds 8-d vectors but {paths['docs']} holds 16-d vectors" in _error(capsys)


def test_an_empty_corpus_is_named(tmp_path, capsys):
    data = _dataset(tmp_path)
    (data / "corpus.jsonl").write_text("")
    assert main(["split", "--data", str(data), "--out", str(tmp_path / "m.json")]) == 2
    assert f"{data / 'corpus.jsonl'}: holds no documents" in _error(capsys)


@pytest.mark.parametrize("flags", [["--top-k", "0"], ["--top-k", "-3"]])
def test_top_k_below_one_is_refused(tmp_path, capsys, flags):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        _evaluate(tmp_path, data, paths["docs"], None, *flags)
    assert exit_.value.code == 2 and "--top-k: must be an integer >= 1" in _error(capsys)


def test_threads_zero_is_refused_without_a_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--threads", "0", "split", "--data", str(_dataset(tmp_path)), "--out", str(tmp_path / "m.json")])
    assert exit_.value.code == 2 and "--threads: must be an integer >= 1; got 0" in _error(capsys)


def test_duplicate_qrels_pairs_warn_with_count_and_line(tmp_path):
    data = _dataset(tmp_path)
    with open(data / "qrels" / "test.tsv", "a") as handle:
        handle.write("q1\td1\t0\nq2\td2\t1\n")
    with pytest.warns(UserWarning, match=r"2 line\(s\) repeat .* line 22 repeats line 3: 'q1', 'd1'"):
        dataset = load_beir(data)
    assert "q1" not in dataset.judged_query_ids()  # last wins, as warned


def test_an_unexpected_error_is_one_line_and_v_shows_the_trace(tmp_path, capsys, monkeypatch):
    import embedtune.cli.data_commands as commands

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(commands, "run_split", broken)
    argv = ["split", "--data", str(_dataset(tmp_path)), "--out", str(tmp_path / "m.json")]
    assert main(argv) == 1
    assert "embedtune: error: unexpected RuntimeError: boom" in _error(capsys)
    with pytest.raises(RuntimeError, match="boom"):
        main(["-v", *argv])


def test_data_format_errors_are_embedtune_errors():
    assert issubclass(DataFormatError, EmbedtuneError) and issubclass(EmbedtuneError, ValueError)


# -- every judged document needs a vector ---------------------------------------------------------
def test_evaluate_refuses_doc_vectors_that_miss_judged_documents(tmp_path, capsys):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    docs = np.load(paths["docs"])
    keep = [i for i in range(60) if i not in (3, 7, 11)]  # judged documents of q3, q7, q11
    np.save(tmp_path / "part.npy", docs[keep])
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in keep))
    assert _evaluate(tmp_path, data, tmp_path / "part.npy") == 2  # before: exit 0 and a lower nDCG@10
    err = _error(capsys)
    assert f"{tmp_path / 'docs.txt'}: no vector for document 'd3'" in err and "3 documents missing" in err and "Fix:" in err


def test_evaluate_names_ids_that_differ_only_by_trailing_spaces(tmp_path, capsys):
    data, paths = _dataset(tmp_path), _vectors(tmp_path)
    (tmp_path / "docs.txt").write_text("".join(f"d{i}{' ' if i == 4 else ''}\n" for i in range(60)))
    assert _evaluate(tmp_path, data, paths["docs"]) == 2
    err = _error(capsys)
    assert "no vector for document 'd4'" in err and "'d4' and 'd4 ' differ only by surrounding whitespace" in err


def test_a_full_disk_during_compress_apply_names_the_output_and_the_fix(tmp_path):
    """The defect: a full disk showed numpy's "N requested and M written". A file-size limit stands in for the disk."""
    import subprocess
    import sys
    import textwrap

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 16)).astype(np.float32)
    make_compressor("pca", dim=8).fit(TrainingData([f"x{i}" for i in range(200)], X, [f"x{i}" for i in range(200)], X, {})).save(tmp_path / "A")
    np.save(tmp_path / "big.npy", rng.normal(size=(40000, 16)).astype(np.float32))
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from embedtune.cli import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
        sys.exit(main(["compress", "apply", "--adapter", {str(tmp_path / "A")!r}, "--input", {str(tmp_path / "big.npy")!r},
                       "--out", {str(tmp_path / "out.npy")!r}]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr
    assert f"embedtune: error: {tmp_path / 'out.npy'}: could not write the compressed vectors: the disk is full" in done.stderr
    assert "Fix:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out.npy").exists() and not list(tmp_path.glob(".out.npy.*"))


@pytest.mark.parametrize("vectors, message", [
    ([[1.0, 2.0, 3.0], [1.0], [1.0, 2.0, 3.0, 4.0, 5.0]], "vectors have different lengths: row 0 has 3 values, row 1 has 1"),
    ([[1.0, 2.0], None, [3.0, 4.0]], "1 null vectors (first: row 1, 0-based)"),
    ([[1.0, 2.0], [None, 4.0], [3.0, 4.0]], "1 null values inside vectors (first: row 1, 0-based)"),
])
def test_parquet_vectors_for_compress_fit_refuse_ragged_rows_and_nulls(tmp_path, capsys, vectors, message):
    """The defect: ragged rows that happened to total n·d were reshaped into shifted vectors; nulls were dropped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["d0", "d1", "d2"], "embedding": pa.array(vectors, pa.list_(pa.float32()))}), tmp_path / "docs.parquet")
    assert main(["compress", "fit", "--method", "pca", "--dim", "1", "--doc-embeddings", str(tmp_path / "docs.parquet"),
                 "--out", str(tmp_path / "fit")]) == 2
    err = _error(capsys)
    assert f"{tmp_path / 'docs.parquet'}: field 'embedding': {message}" in err and "Fix:" in err


def test_missing_query_vectors_are_counted_in_english():
    with pytest.raises(DataFormatError, match=r"\(2 queries missing\)"):
        require_ids(["q1"], ["q1", "q2", "q3"], "queries.npy", "qrels/test.tsv", "query")
