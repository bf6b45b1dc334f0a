"""Shared fixtures: tiny BEIR datasets, a private embedding cache, a tiny random BERT, real data paths."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "beir"


def shared_dataset(name: str) -> Path:
    path = SHARED_DATA / name
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"real dataset {path} is not available on this machine (the real BEIR data lives in ../shared/data/beir; "
                    "tests marked real skip without it)")
    return path


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own embedding cache, so no test sees another's entries."""
    monkeypatch.setenv("EMBEDTUNE_CACHE", str(tmp_path_factory.mktemp("embedtune-cache")))


def write_beir(root: Path, corpus: list[dict], queries: list[dict], qrels: list[tuple[str, str, int]], split: str = "test") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels").mkdir(exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, d, s in qrels]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return root


def write_toy_vectors(tmp_path: Path, doc_text=lambda doc_id: doc_id, dim: int = 24) -> tuple[Path, dict[str, tuple[Path, Path]]]:
    """60 unit-norm ``dim``-d docs and 40 queries, each judged relevant to one doc: a BEIR folder
    ``tmp_path/toy`` and ``{doc,query}.npy`` + ``.txt`` ids. Returns ``(root, {"doc": (npy, ids), "query": (npy, ids)})``."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((60, dim)).astype(np.float32)
    targets = rng.permutation(60)[:40]
    queries = docs[targets] + 0.6 * rng.standard_normal((40, dim)).astype(np.float32)
    # Unit rows, as a cosine model gives them: the experiment normalises what it loads, the index build does not.
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    doc_ids, query_ids = [f"d{i}" for i in range(60)], [f"q{i}" for i in range(40)]
    root = write_beir(tmp_path / "toy", [{"_id": i, "text": doc_text(i)} for i in doc_ids], [{"_id": q, "text": q} for q in query_ids],
                      [(q, doc_ids[t], 1) for q, t in zip(query_ids, targets)])
    files = {}
    for name, ids, vectors in (("doc", doc_ids, docs), ("query", query_ids, queries)):
        np.save(tmp_path / f"{name}.npy", vectors)
        (tmp_path / f"{name}.txt").write_text("".join(i + "\n" for i in ids))
        files[name] = (tmp_path / f"{name}.npy", tmp_path / f"{name}.txt")
    return root, files


@pytest.fixture
def toy_beir(tmp_path) -> Path:
    """20 docs, 10 queries, each query judged relevant to two docs."""
    corpus = [{"_id": f"d{i}", "title": f"title {i}", "text": f"document number {i} about topic {i % 5}"} for i in range(20)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"} for i in range(10)]
    qrels = [(f"q{i}", f"d{i}", 1) for i in range(10)] + [(f"q{i}", f"d{i + 10}", 2) for i in range(10)]
    return write_beir(tmp_path / "toy", corpus, queries, qrels)


@pytest.fixture
def toy40(tmp_path) -> Path:
    """40 docs, 20 queries, one relevant doc each: enough for a 60/20/20 split and a tiny fit."""
    corpus = [{"_id": f"d{i}", "text": f"document number {i} about topic {i % 5}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"} for i in range(20)]
    return write_beir(tmp_path / "toy40", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(20)])


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A randomly initialised 1-layer BERT saved as a sentence-transformers folder (offline)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root = tmp_path_factory.mktemp("tiny-bert")
    hf_dir = root / "hf"
    hf_dir.mkdir()
    words = sorted({w for i in range(40) for w in f"document number {i} about topic title what".split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (hf_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(hf_dir / "vocab.txt"))
    import torch

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, max_position_embeddings=64)
    BertModel(config).save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    transformer = Transformer(str(hf_dir), max_seq_length=32)
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")], device="cpu")
    out = root / "st"
    model.save(str(out))
    return out


@pytest.fixture
def one_torch_thread():
    """Tiny models on a busy 2-core machine: a second torch thread only adds sync cost."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
