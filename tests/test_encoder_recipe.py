"""The encoder recipe travels from encoding to search, and nothing drops its backend on the way."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.encoders import SentenceEncoder
from embedtune.encoders.recipe import EncoderRecipe, recipe_for_vectors, write_recipe
from embedtune.errors import EmbedtuneError
from embedtune.workflows.label_free import encode_unlabelled_queries, load_corpus_experiment
from embedtune.workflows.pseudo_queries import build_pseudo_queries


def test_a_recipe_round_trips_and_reads_older_descriptions():
    recipe = EncoderRecipe(model="minilm", model_sha256="ab" * 32, backend="onnx-int8", max_seq_length=128,
                           query_prompt="query: ", document_prompt="passage: ", normalize=False)
    data = recipe.to_dict()
    assert data["precision"] == "int8"
    assert EncoderRecipe.from_dict(json.loads(json.dumps(data))) == recipe
    old = {"name": "minilm", "path": "/x", "fingerprint": "cd" * 32, "max_seq_length": 256, "normalize": True,
           "query_prompt": "", "document_prompt": ""}  # a description written before recipes: no backend is torch
    assert EncoderRecipe.from_dict(old) == EncoderRecipe(model="minilm", model_sha256="cd" * 32, max_seq_length=256)


@pytest.mark.parametrize("bad, field", [({"model": "m", "backend": "tensorrt"}, "backend"), ({"backend": "torch"}, "model"),
                                        ({"model": "m", "max_seq_length": 0}, "max_seq_length")])
def test_a_bad_recipe_names_the_file_and_field(bad, field):
    with pytest.raises(EmbedtuneError, match=rf"somewhere\.json.*{field}"):
        EncoderRecipe.from_dict(bad, "somewhere.json")


def test_differences_name_each_field_that_changes_the_vectors():
    a = EncoderRecipe(model="minilm", model_sha256="a" * 64)
    assert a.differences(EncoderRecipe(model="/models/minilm", model_sha256="a" * 64)) == []  # same files, other spelling
    diff = a.differences(EncoderRecipe(model="minilm", model_sha256="a" * 64, backend="onnx-int8", query_prompt="q: "))
    assert [d.split(":")[0] for d in diff] == ["backend", "query_prompt"]
    with pytest.raises(EmbedtuneError, match="backend: 'torch' != 'onnx-int8'.*--backend torch"):
        a.check_same(EncoderRecipe(model="minilm", backend="onnx-int8"), here="the index", there="the queries")


def test_the_encoder_a_recipe_builds_has_exactly_its_recipe(tiny_bert_dir):
    recipe = EncoderRecipe(model=str(tiny_bert_dir), backend="onnx", max_seq_length=32, query_prompt="q: ", normalize=False)
    encoder = recipe.encoder(batch_size=8)
    assert encoder.backend == "onnx" and encoder.batch_size == 8
    assert EncoderRecipe.of(encoder) == EncoderRecipe(**{**recipe.__dict__, "model_sha256": encoder.fingerprint})
    with pytest.raises(TypeError, match="backend"):
        recipe.encoder(backend="torch")


@pytest.fixture
def fake_encoding(monkeypatch):
    """Encode by hashing the text, and record the backend of every encoder that encodes anything."""
    used: list[tuple[str, str]] = []

    def encode(self, texts, kind="document", progress=None):
        used.append((self.backend, kind))
        rows = [np.frombuffer(hashlib.sha256((self.backend + t).encode()).digest(), dtype=np.uint8)[:16].astype(np.float32) for t in texts]
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), 16) + 1.0
        if progress is not None:
            progress(len(texts))
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    monkeypatch.setattr(SentenceEncoder, "encode", encode)
    return used


def test_pseudo_and_unlabelled_queries_use_the_documents_backend(fake_encoding, tiny_bert_dir, toy_beir, tmp_path):
    experiment = load_corpus_experiment(toy_beir, str(tiny_bert_dir), {"backend": "onnx-int8", "show_progress": False}, cache=False)
    assert EncoderRecipe.from_dict(experiment.embeddings.model).backend == "onnx-int8"
    queries = tmp_path / "log.jsonl"
    queries.write_text('{"_id": "u1", "text": "topic 3"}\n{"_id": "u2", "text": "number 7"}\n')
    encode_unlabelled_queries(experiment, queries, cache=False)
    build_pseudo_queries(experiment, cache=False, mine=False)
    assert fake_encoding and {backend for backend, _ in fake_encoding} == {"onnx-int8"}, fake_encoding
    assert {kind for _, kind in fake_encoding} == {"document", "query"}


def test_the_backend_travels_from_embed_to_index_to_search(fake_encoding, tiny_bert_dir, toy_beir, tmp_path, capsys):
    vectors, index = tmp_path / "vectors", tmp_path / "index"
    assert main(["embed", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--backend", "onnx", "--no-cache",
                 "--out", str(vectors)]) == 0
    assert EncoderRecipe.from_dict(json.loads((vectors / "encoder.json").read_text())).backend == "onnx"
    assert main(["index", "build", "--embeddings", str(vectors / "doc_embeddings.npy"), "--ids", str(vectors / "doc_ids.json"),
                 "--out", str(index)]) == 0
    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["encoder"]["backend"] == "onnx" and manifest["model"] == str(tiny_bert_dir)
    fake_encoding.clear()
    capsys.readouterr()
    assert main(["search", "--index", str(index), "--json", "topic 3"]) == 0
    assert fake_encoding == [("onnx", "query")]  # the index's backend, not the flag's default
    # Another backend than the documents' is refused, naming both.
    assert main(["search", "--index", str(index), "--backend", "torch", "topic 3"]) != 0
    assert "backend: 'onnx' != 'torch'" in capsys.readouterr().err


def test_index_build_refuses_flags_that_contradict_the_recorded_recipe(tmp_path):
    folder = tmp_path / "v"
    folder.mkdir()
    np.save(folder / "doc_embeddings.npy", np.eye(4, dtype=np.float32))
    write_recipe(folder, EncoderRecipe(model="some-model", model_sha256="e" * 64, backend="onnx"))
    assert recipe_for_vectors(folder / "doc_embeddings.npy").backend == "onnx"
    with pytest.raises(EmbedtuneError, match="--backend onnx"):
        recipe_for_vectors(folder / "doc_embeddings.npy", backend="torch")
    with pytest.raises(EmbedtuneError, match="--model some-model"):
        recipe_for_vectors(folder / "doc_embeddings.npy", model="another-model")
    (folder / "encoder.json").write_text((folder / "encoder.json").read_text().replace("onnx", "torch"))
    with pytest.raises(EmbedtuneError, match="encoder.json"):  # edited: its digest no longer matches
        recipe_for_vectors(folder / "doc_embeddings.npy")


def test_embed_corpus_encodes_a_query_log_as_queries_with_the_query_prompt(tiny_bert_dir, tmp_path):
    from embedtune.encoders.ray_encode import read_shards
    from embedtune.encoders.recipe import recipe_beside

    log = tmp_path / "log.tsv"
    log.write_text("u1\twhat is topic 3\nu2\tnumber 7 please\n", encoding="utf-8")
    out = tmp_path / "queries"
    assert main(["embed-corpus", "--data", str(log), "--kind", "query", "--prompt", "query: ", "--model", str(tiny_bert_dir),
                 "--out", str(out)]) == 0
    ids, vectors = read_shards(out)
    assert list(ids) == ["u1", "u2"]
    expected = SentenceEncoder(str(tiny_bert_dir), query_prompt="query: ", show_progress=False).encode(
        ["what is topic 3", "number 7 please"], "query")
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    recipe = recipe_beside(out / "shard-00000.npy")
    assert recipe is not None and recipe.query_prompt == "query: " and recipe.document_prompt is None  # a query log says nothing of documents


def test_an_exported_model_searches_without_the_adapter_whatever_the_recorded_recipe(fake_encoding, tiny_bert_dir, toy_beir,
                                                                                     tmp_path):
    import shutil

    vectors, index, exported = tmp_path / "vectors", tmp_path / "index", tmp_path / "exported"
    assert main(["embed", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--backend", "onnx", "--no-cache", "--out", str(vectors)]) == 0
    assert main(["index", "build", "--embeddings", str(vectors / "doc_embeddings.npy"), "--ids", str(vectors / "doc_ids.json"),
                 "--out", str(index)]) == 0
    shutil.copytree(tiny_bert_dir, exported)
    (exported / "extra.txt").write_text("another model")  # another sha256: the recorded model is not this one
    fake_encoding.clear()
    assert main(["search", "--index", str(index), "--model", str(exported), "--no-adapter", "topic 3"]) == 0
    assert fake_encoding == [("torch", "query")]
    # With the index's adapter path, the same other model is refused: its vectors are not the documents' space.
    assert main(["search", "--index", str(index), "--model", str(exported), "topic 3"]) != 0
