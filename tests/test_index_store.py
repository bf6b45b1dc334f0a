"""Index folders: build (streamed, through an adapter) -> load -> search round-trips ids."""

import argparse
import json
import re

import numpy as np
import pytest

from embedtune.compress import TrainingData, make_compressor
from embedtune.evaluate.search import exact_search
from embedtune.index import build_index, load_index


@pytest.fixture
def corpus(rng, tmp_path):
    xb = rng.normal(size=(300, 32)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    ids = [f"doc-{i:03d}" for i in range(300)]
    np.save(tmp_path / "docs.npy", xb)
    (tmp_path / "ids.txt").write_text("".join(i + "\n" for i in ids))
    return xb, ids


@pytest.fixture
def pca(corpus, tmp_path):
    xb, ids = corpus
    compressor = make_compressor("pca", dim=8).fit(TrainingData(ids[:1], xb[:1], ids, xb, {}))
    compressor.save(tmp_path / "pca")
    return compressor


def test_flat_round_trip_ids_and_exact_results(corpus, tmp_path):
    xb, ids = corpus
    out = build_index(tmp_path / "docs.npy", tmp_path / "index", ids=tmp_path / "ids.txt", chunk_size=64,
                      titles={i: f"title of {i}" for i in ids}, model="minilm")
    index = load_index(out)
    assert index.ids == ids and index.titles[5] == "title of doc-005"
    manifest = index.manifest
    assert manifest["kind"] == "flat" and manifest["exact"] and manifest["ntotal"] == 300 and manifest["dim"] == 32
    assert manifest["bytes_per_vector"] == 128 and manifest["model"] == "minilm" and manifest["adapter"] is None
    D, I = index.search(xb[:20], k=5)
    assert [index.ids[row] for row in I[:, 0]] == ids[:20]  # each doc finds itself first
    D_ref, I_ref = exact_search(xb[:20], xb, 5)
    np.testing.assert_array_equal(I, I_ref)
    np.testing.assert_array_equal(D, D_ref)
    hits = index.hits(D, I)
    assert hits[3][0] == {"rank": 1, "id": "doc-003", "score": pytest.approx(1.0, abs=1e-5), "title": "title of doc-003"}
    assert not list(out.glob(".*.tmp"))


def test_adapter_is_applied_in_chunks(corpus, pca, tmp_path):
    xb, ids = corpus
    out = build_index(tmp_path / "docs.npy", tmp_path / "index", ids=ids, adapter=tmp_path / "pca", chunk_size=50)
    index = load_index(out)
    assert index.manifest["dim"] == 8 and index.manifest["input_dim"] == 32
    adapter = index.manifest["adapter"]
    assert adapter["method"] == "pca" and set(adapter["sha256"]) == {"config.json", "model.safetensors"}
    stored = np.array(index.faiss_index.reconstruct_n(0, 300))
    from embedtune.compress.streaming import transform_rows

    np.testing.assert_array_equal(stored, transform_rows(pca, xb))
    with pytest.raises(ValueError, match="8-d"):
        index.search(xb[:2], 3)


@pytest.mark.parametrize("kind", ["sq8", "binary", "IVF4,Flat", "HNSW8"])
def test_other_kinds_round_trip(kind, corpus, tmp_path):
    xb, ids = corpus
    out = build_index(tmp_path / "docs.npy", tmp_path / kind.replace(",", "_"), ids=tmp_path / "ids.txt", kind=kind, chunk_size=128)
    index = load_index(out)
    assert index.ids == ids and index.faiss_index.ntotal == 300
    _, I = index.search(xb[:30], k=3)
    top1 = np.mean([index.ids[row] == ids[i] for i, row in enumerate(I[:, 0])])
    assert top1 >= 0.9, (kind, top1)
    if kind == "binary":
        assert index.vectors is not None and index.manifest["bytes_per_vector"] == 4
        D, I = index.search(xb[:30], k=3, rescore_with="float")
        assert [index.ids[row] for row in I[:, 0]] == ids[:30]


def test_parquet_input_with_id_column(corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    xb, ids = corpus
    table = pa.table({"doc": ids, "vec": pa.array(list(xb), type=pa.list_(pa.float32()))})
    pq.write_table(table, tmp_path / "docs.parquet", row_group_size=70)
    out = build_index(tmp_path / "docs.parquet", tmp_path / "pindex", id_column="doc", vector_column="vec", chunk_size=32, kind="sq8")
    assert load_index(out).ids == ids


def test_build_errors(corpus, tmp_path):
    xb, ids = corpus
    with pytest.raises(ValueError, match="no ids"):
        build_index(tmp_path / "docs.npy", tmp_path / "x")
    with pytest.raises(ValueError, match="300 rows but 2 ids"):
        build_index(tmp_path / "docs.npy", tmp_path / "x", ids=["a", "b"])
    for broken in ("two\nlines", "carriage\rreturn", "ends\n"):
        bad = [*ids[:150], broken, *ids[151:]]
        with pytest.raises(ValueError, match=re.escape(f"id {broken!r} contains a line break")):
            build_index(tmp_path / "docs.npy", tmp_path / "x", ids=bad)
        assert not (tmp_path / "x").exists()  # refused before anything was moved into place
    with pytest.raises(FileNotFoundError):
        load_index(tmp_path / "nowhere")


def test_cli_build_and_search(toy_beir, tiny_bert_dir, tmp_path, capsys):
    from embedtune.cli import index as cli_index
    from embedtune.workflows.experiment import load_experiment

    experiment = load_experiment(data=str(toy_beir), model=str(tiny_bert_dir), split_seed=None)
    emb = experiment.embeddings
    np.save(tmp_path / "docs.npy", np.asarray(emb.doc_embeddings, dtype=np.float32))
    (tmp_path / "ids.txt").write_text("".join(i + "\n" for i in emb.doc_ids))
    train = TrainingData(emb.query_ids, emb.query_embeddings, emb.doc_ids, emb.doc_embeddings, {})
    make_compressor("pca", dim=8).fit(train).save(tmp_path / "pca")

    parser = argparse.ArgumentParser()
    cli_index.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["index", "build", "--embeddings", str(tmp_path / "docs.npy"), "--ids", str(tmp_path / "ids.txt"),
                              "--adapter", str(tmp_path / "pca"), "--out", str(tmp_path / "idx"), "--data", str(toy_beir),
                              "--model", str(tiny_bert_dir), "--json"])
    assert args.handler(args) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["dim"] == 8 and manifest["ntotal"] == 20

    args = parser.parse_args(["search", "--index", str(tmp_path / "idx"), "--top-k", "3", "--json", "document number 7 about topic 2"])
    assert args.handler(args) == 0
    hits = json.loads(capsys.readouterr().out)["queries"][0]["hits"]
    assert [h["rank"] for h in hits] == [1, 2, 3] and all(h["id"].startswith("d") for h in hits)
    # The same hits as encoding + adapter + exact search by hand.
    from embedtune.compress import load_compressor
    from embedtune.encoders import SentenceEncoder

    query = load_compressor(tmp_path / "pca").transform(SentenceEncoder(str(tiny_bert_dir), show_progress=False).encode(["document number 7 about topic 2"], kind="query"))
    _, I = exact_search(query, load_compressor(tmp_path / "pca").transform(emb.doc_embeddings), 3)
    assert [h["id"] for h in hits] == [emb.doc_ids[row] for row in I[0]]
    assert hits[0]["title"] == experiment.dataset.corpus[hits[0]["id"]]["title"]

    args = parser.parse_args(["search", "--index", str(tmp_path / "idx"), "--no-adapter", "anything"])
    with pytest.raises(ValueError, match="wrong or missing --adapter"):
        args.handler(args)
    args = parser.parse_args(["search", "--index", str(tmp_path / "idx"), "document number 7"])
    assert args.handler(args) == 0
    assert "rank" in capsys.readouterr().out


def test_index_build_takes_titles_from_a_bare_corpus_file(tmp_path):
    from embedtune.cli import main

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"_id": "a", "title": "Alpha", "text": "x"}\n{"_id": "b", "title": "Beta", "text": "y"}\n', encoding="utf-8")
    np.save(tmp_path / "v.npy", np.eye(2, 4, dtype=np.float32))
    (tmp_path / "ids.txt").write_text("a\nb\n")
    assert main(["index", "build", "--embeddings", str(tmp_path / "v.npy"), "--ids", str(tmp_path / "ids.txt"),
                 "--data", str(corpus), "--out", str(tmp_path / "index")]) == 0
    assert json.loads((tmp_path / "index" / "titles.json").read_text()) == ["Alpha", "Beta"]


@pytest.mark.parametrize("dim", [1, 7, 8, 33])
@pytest.mark.parametrize("kind", ["flat", "sq8", "binary"])
def test_the_manifests_bytes_per_vector_is_the_precision_tables(kind, dim, rng, tmp_path):
    """The manifest takes FAISS's own code size for a built-in kind (the build never loads the codecs for a flat
    index); it must be the figure the precision table gives."""
    from embedtune.index.codecs import bytes_per_vector

    np.save(tmp_path / "docs.npy", rng.normal(size=(20, dim)).astype(np.float32))
    out = build_index(tmp_path / "docs.npy", tmp_path / "index", ids=[f"d{i}" for i in range(20)], kind=kind)
    assert load_index(out).manifest["bytes_per_vector"] == bytes_per_vector(kind, dim)
