"""The own-vectors walkthrough of the docs, from a fresh folder, with no BEIR texts.

The how-tos docs/own-vectors.md, docs/export.md and docs/deployment.md ("A FAISS index, searched
with text") run in this order:

    compress fit --doc-embeddings docs.npy --doc-ids docs.txt --query-embeddings queries.npy
                 --query-ids queries.txt --pairs pairs.jsonl --out my-dive
    compress export --adapter my-dive --model MODEL --out model-dive
    index build --embeddings docs.npy --ids docs.txt --adapter my-dive --out my-index
    search "QUERY" --index my-index --model MODEL

The vectors are the tiny test BERT's (export appends the compressor to the model they came from);
the folder holds only ``.npy`` vectors, id lists and a pairs file: no corpus.jsonl, no queries.jsonl.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main

DOCS = [f"document number {i} about topic {i % 5}" for i in range(40)]
QUERIES = [f"what about topic {i % 5} number {i}" for i in range(20)]


@pytest.fixture
def own_vectors(tmp_path, tiny_bert_dir):
    """Vectors, ids and a pairs file in a fresh folder (the texts stay in this test)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    folder = tmp_path / "mine"
    folder.mkdir()
    np.save(folder / "docs.npy", model.encode(DOCS).astype(np.float64))  # float64 from "an API": cast with a note
    np.save(folder / "queries.npy", model.encode(QUERIES).astype(np.float32))
    (folder / "docs.txt").write_text("".join(f"d{i}\n" for i in range(len(DOCS))))
    (folder / "queries.txt").write_text("".join(f"q{i}\n" for i in range(len(QUERIES))))
    pairs = [{"query_id": f"q{i}", "doc_id": f"d{i}"} for i in range(len(QUERIES))] + [
        {"query_id": f"q{i}", "doc_id": f"d{i + 20}"} for i in range(len(QUERIES))]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    return folder


def test_readme_walkthrough_own_vectors_fit_export_index_search(own_vectors, tiny_bert_dir, monkeypatch, capsys, one_torch_thread):
    monkeypatch.chdir(own_vectors)
    assert not any(own_vectors.glob("*.jsonl")) or [p.name for p in own_vectors.glob("*.jsonl")] == ["pairs.jsonl"]
    vectors = ["--doc-embeddings", "docs.npy", "--doc-ids", "docs.txt", "--query-embeddings", "queries.npy", "--query-ids", "queries.txt"]

    # 1. compress fit: all 20 labelled queries, the supervised path, the safety net by default. The one
    # flag the how-to lacks: the random tiny BERT maps every text to nearly the same vector, so the
    # false-negative filter would (rightly) drop every candidate negative; the cap and epoch selection stay.
    assert main(["compress", "fit", "--method", "dive", "--dim", "8", *vectors, "--pairs", "pairs.jsonl", "--out", "my-dive",
                 "--false-negative-margin", "none", "--epochs", "3", "--set", "batch_size=16"]) == 0
    printed = capsys.readouterr().out
    assert "supervised path" in printed and "saved to my-dive" in printed
    info = json.loads((own_vectors / "my-dive" / "fit.json").read_text())
    assert info["path"] == "supervised" and info["labels"]["queries"] == 20 and info["labels"]["train_queries"] == 20
    assert info["provenance"]["model"] == "precomputed" and set(info["provenance"]["vectors"]) == {
        "docs.npy", "docs.txt", "queries.npy", "queries.txt"}
    assert info["triplets"]["max_triplets_per_query"] == 32 and info["selected_epoch"] is not None
    assert (own_vectors / "my-dive" / "config.json").is_file()  # OUT holds the compressor itself

    # 2. compress export: the base model + the compressor, built-in modules.
    assert main(["compress", "export", "--adapter", "my-dive", "--model", str(tiny_bert_dir), "--out", "model-dive"]) == 0
    capsys.readouterr()
    from sentence_transformers import SentenceTransformer

    from embedtune.compress import load_compressor

    exported = SentenceTransformer(str(own_vectors / "model-dive"), device="cpu")
    compressor = load_compressor(own_vectors / "my-dive")
    np.testing.assert_allclose(exported.encode(DOCS[:5]), compressor.transform(np.load("docs.npy")[:5]), atol=1e-5)

    # 3. index build, compressing the vectors on the way in; 4. search with the base model + the index's adapter.
    assert main(["index", "build", "--embeddings", "docs.npy", "--ids", "docs.txt", "--adapter", "my-dive", "--out", "my-index"]) == 0
    capsys.readouterr()
    assert main(["search", QUERIES[3], "--index", "my-index", "--model", str(tiny_bert_dir), "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["queries"][0]["hits"]
    assert len(hits) == 10 and all(hit["id"] in {f"d{i}" for i in range(40)} for hit in hits)
    # The same search through the exported model (no adapter: the model compresses) finds the same documents.
    assert main(["search", QUERIES[3], "--index", "my-index", "--model", "model-dive", "--no-adapter", "--json"]) == 0
    assert [hit["id"] for hit in json.loads(capsys.readouterr().out)["queries"][0]["hits"]] == [hit["id"] for hit in hits]
    assert not (own_vectors / "corpus.jsonl").exists() and not (own_vectors / "queries.jsonl").exists()
