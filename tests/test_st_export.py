"""Export to a sentence-transformers folder: encode(texts) must equal transform(base.encode(texts))."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from embedtune.compress import TrainingData
from embedtune.compress.base import Compressor, CompressorConfig
from embedtune.compress.dive import DIVECompressor, DIVEConfig
from embedtune.compress.st_export import COMPRESSOR_SUBFOLDER, export_sentence_transformer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # tiny tensors: a second thread only adds sync cost on a busy 2-core machine

TEXTS = ["hello world", "the cats sat", "a b c d e", "worlds of hello the", "zebra"]
HIDDEN = 32


@pytest.fixture(scope="module")
def tiny_hf_bert(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz", "hello", "world", "the", "cat", "##s"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    return folder


def _base(tiny_hf_bert, normalize: bool):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(tiny_hf_bert), max_seq_length=32)
    modules = [transformer, Pooling(HIDDEN, "mean")] + ([Normalize()] if normalize else [])
    return SentenceTransformer(modules=modules, device="cpu")


def _fit_dive(base, **overrides) -> DIVECompressor:
    """A DIVE trained far enough from the identity that export mistakes would show."""
    rng = np.random.default_rng(0)
    base_embeddings = base.encode(TEXTS * 4)
    X = base_embeddings + 0.3 * rng.standard_normal(base_embeddings.shape).astype(np.float32)
    ids = [f"x{i}" for i in range(len(X))]
    triplets = np.array([[i, (i + 1) % len(X), (i + 7) % len(X)] for i in range(len(X))], dtype=np.int64)
    values = dict(dim=8, heads=4, epochs=3, batch_size=8, learning_rate=5e-2, device="cpu", progress=False)
    values.update(overrides)
    compressor = DIVECompressor(DIVEConfig(**values)).fit(TrainingData(ids, X, ids, X, {}, triplets))
    assert compressor.adapter_.mlp.down.weight.abs().sum() > 0
    return compressor


@pytest.mark.parametrize(
    "base_normalizes,overrides",
    [
        (False, {}),
        (True, {}),
        (False, {"normalize_input": False, "activation": "tanh"}),
        (True, {"hidden_dim": 24}),  # r + k == d
        (False, {"init": "pca"}),
        (True, {"init": "pca", "normalize_input": False}),
    ],
)
def test_builtin_export_matches_transform_without_trust_remote_code(tiny_hf_bert, tmp_path, base_normalizes, overrides):
    from sentence_transformers import SentenceTransformer

    base = _base(tiny_hf_bert, base_normalizes)
    compressor = _fit_dive(base, **overrides)
    out = export_sentence_transformer(compressor, base, tmp_path / "exported")
    types = [entry["type"] for entry in json.loads((out / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types)
    extra = int(compressor.config.normalize_input and not base_normalizes)  # init="pca": the rotation is folded into the Dense weights
    assert len(types) == len(base) + 3 + extra
    assert len(base) == 2 + base_normalizes  # the caller's model is not modified

    exported = SentenceTransformer(str(out), device="cpu")
    assert exported.get_embedding_dimension() == 8
    expected = compressor.transform(base.encode(TEXTS))
    np.testing.assert_allclose(exported.encode(TEXTS), expected, atol=1e-5, rtol=0)
    assert DIVECompressor.load(out / COMPRESSOR_SUBFOLDER).heads_ == 4


def test_embedtune_module_export_matches_transform(tiny_hf_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    base = _base(tiny_hf_bert, normalize=True)
    compressor = _fit_dive(base)
    out = export_sentence_transformer(compressor, base, tmp_path / "exported", module_format="embedtune")
    types = [entry["type"] for entry in json.loads((out / "modules.json").read_text())]
    assert types[-1] == "embedtune.compress.st_module.CompressorModule"
    # sentence-transformers >= 6 imports classes outside its namespace only when trusted.
    exported = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    np.testing.assert_allclose(exported.encode(TEXTS), compressor.transform(base.encode(TEXTS)), atol=1e-5, rtol=0)


class _NoTorch(Compressor):
    method = "test-no-torch"
    config_class = CompressorConfig

    def _fit(self, train, val):
        pass

    def _transform(self, X):
        return X[:, : self.config.dim]

    def _state_dict(self):
        return {}

    def _load_state_dict(self, state):
        pass


def test_export_errors(tiny_hf_bert, tmp_path):
    base = _base(tiny_hf_bert, normalize=False)
    ids = ["a", "b"]
    X = np.ones((2, HIDDEN), np.float32)
    plain = _NoTorch(CompressorConfig(dim=4)).fit(TrainingData(ids, X, ids, X, {}))
    with pytest.raises(ValueError, match="no built-in sentence-transformers form"):
        export_sentence_transformer(plain, base, tmp_path / "a", module_format="builtin")
    with pytest.raises(NotImplementedError, match="torch_module"):
        export_sentence_transformer(plain, base, tmp_path / "b")

    wrong = np.ones((2, 16), np.float32)
    mismatched = DIVECompressor(DIVEConfig(dim=4, heads=2, epochs=0, device="cpu", progress=False))
    mismatched.fit(TrainingData(ids, wrong, ids, wrong, {}, np.array([[0, 0, 1]])))
    with pytest.raises(ValueError, match="32-d embeddings.*16-d input"):
        export_sentence_transformer(mismatched, base, tmp_path / "c")

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("x")
    compressor = _fit_dive(base)
    with pytest.raises(FileExistsError, match="occupied"):
        export_sentence_transformer(compressor, base, occupied)
    # overwrite replaces only what embedtune wrote: a folder without its marker is refused, untouched.
    with pytest.raises(FileExistsError, match="no .embedtune-output.json"):
        export_sentence_transformer(compressor, base, occupied, overwrite=True)
    assert (occupied / "keep.txt").read_text() == "x"
    exported = tmp_path / "exported"
    export_sentence_transformer(compressor, base, exported)
    (exported / "notes.txt").write_text("mine")
    export_sentence_transformer(compressor, base, exported, overwrite=True)
    assert (exported / "notes.txt").read_text() == "mine" and (exported / "modules.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
