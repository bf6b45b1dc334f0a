"""Own data end to end from the command line only: texts, no labels, several shards, no qrels.

texts → document and query vectors (each with its prompt) → a label-free plan → the planned index
(titles from the bare corpus file) → search by text → export. Each step reads the folders the
previous one wrote; nothing is encoded twice and nothing needs Python.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def own_corpus(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"doc-{i}", "title": f"title {i}", "text": f"document number {i} about topic {i % 5}"}) + "\n"
                              for i in range(40)), encoding="utf-8")
    log = tmp_path / "log.tsv"
    log.write_text("".join(f"q{i}\twhat about topic {i % 5} number {i}\n" for i in range(12)), encoding="utf-8")
    return corpus, log


def test_own_texts_to_a_planned_index_and_search_through_the_cli_only(own_corpus, tiny_bert_dir, tmp_path, capsys):
    corpus, log = own_corpus
    model = str(tiny_bert_dir)
    docs, queries, plan, index = (tmp_path / name for name in ("docs", "queries", "plan", "index"))
    assert main(["embed-corpus", "--data", str(corpus), "--model", model, "--shard-size", "15", "--prompt", "passage: ",
                 "--out", str(docs)]) == 0
    assert len(list(docs.glob("shard-*.npy"))) == 3
    assert main(["embed-corpus", "--data", str(log), "--kind", "query", "--prompt", "query: ", "--model", model,
                 "--out", str(queries)]) == 0
    # The plan reads both folders as vectors: no ids files, no model flag, no labels; the queries are the user's log.
    assert main(["compress", "plan", "--label-free", "agreement", "--doc-embeddings", str(docs), "--unlabelled-queries", str(queries),
                 "--methods", "pca", "--dims", "8", "--precisions", "float32", "int8", "--codecs", "none", "--budget-bytes", "32",
                 "--out", str(plan)]) == 0
    chosen = json.loads((plan / "plan.json").read_text())
    assert chosen["ram_bytes"] <= 32
    assert main(["index", "build", "--plan", str(plan), "--embeddings", str(docs), "--data", str(corpus), "--out", str(index)]) == 0
    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["ntotal"] == 40 and manifest["encoder"]["model"] == model and manifest["encoder"]["document_prompt"] == "passage: "
    capsys.readouterr()
    assert main(["search", "--index", str(index), "--query-prompt", "query: ", "--json", "what about topic 3 number 3"]) == 0
    hits = json.loads(capsys.readouterr().out)["queries"][0]["hits"]
    assert len(hits) == 10 and all(hit["id"].startswith("doc-") and hit.get("title", "").startswith("title") for hit in hits)


def test_a_shard_folder_is_read_wherever_vectors_are(own_corpus, tiny_bert_dir, tmp_path):
    from embedtune.compress.streaming import embedding_file_shape, iter_embedding_blocks
    from embedtune.encoders.precomputed import load_embeddings
    from embedtune.encoders.ray_encode import read_shards

    corpus, _ = own_corpus
    docs = tmp_path / "docs"
    assert main(["embed-corpus", "--data", str(corpus), "--model", str(tiny_bert_dir), "--shard-size", "15", "--out", str(docs)]) == 0
    ids, vectors = read_shards(docs)
    assert embedding_file_shape(docs) == vectors.shape
    streamed_ids, blocks = [], []
    for start, block_ids, block in iter_embedding_blocks(docs, chunk_size=7):
        assert start == len(streamed_ids)
        streamed_ids += block_ids
        blocks.append(np.array(block))
    assert streamed_ids == ids and np.array_equal(np.concatenate(blocks), vectors)
    loaded_ids, loaded = load_embeddings(docs)
    assert loaded_ids == ids and np.array_equal(loaded, vectors)
    with pytest.raises(ValueError, match="carries its own ids"):
        load_embeddings(docs, tmp_path / "ids.txt")
