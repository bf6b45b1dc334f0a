"""Every registered compressor exports as a sentence-transformers folder equal to ``compress apply``.

For each method, on a base that normalises and one that does not: ``SentenceTransformer(out)``
loads without ``trust_remote_code`` (only built-in module types are written) and its
``encode(texts)`` equals the saved compressor's ``transform(base.encode(texts))`` (what
``compress apply`` runs) to 1e-5. The pyproject's sentence-transformers range must admit the
version that wrote the folder and no other major version.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from embedtune.compress import Compressor, TrainingData, available_methods, get_compressor_class, load_compressor
from embedtune.compress.export_layers import apply_layers
from embedtune.compress.st_export import COMPRESSOR_SUBFOLDER, export_sentence_transformer

torch.set_num_threads(1)  # tiny tensors on a busy machine

TEXTS = ["document number 3 about topic", "what title", "topic 12", "number about what document 7", "title"]
K = 8
# Small fits that still move every trained map well away from its start (so export mistakes show).
FAST_SETTINGS = {"dim": K, "epochs": 3, "unsupervised_epochs": 1, "batch_size": 16, "learning_rate": 5e-2,
                 "selection_learning_rate": 5e-2, "progress": False, "device": "cpu", "seed": 3}
# Library methods only: a test may register a toy method of its own. csr: a top-k sparse code has no
# Dense/Normalize form, and its export is not built yet; it is scored as a peer, not exported.
METHODS = [m for m in available_methods() if get_compressor_class(m).__module__.startswith("embedtune.") and m != "csr"]
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture(scope="module")
def bases(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    plain = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    normalized = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    normalized.append(Normalize())
    return {False: plain, True: normalized}


def _train(base) -> TrainingData:
    """Base embeddings of 60 texts, spread by noise so every direction has variance; 2 triplets per query."""
    rng = np.random.default_rng(0)
    texts = [f"document number {i} about topic" for i in range(40)] + [f"what title {i}" for i in range(20)]
    X = base.encode(texts)
    X = X + 0.5 * np.std(X) * rng.standard_normal(X.shape).astype(np.float32)
    docs, queries = X[:40], X[40:]
    triplets = np.array([(q, 2 * q, (2 * q + o) % 40) for q in range(20) for o in (1, 13)], dtype=np.int64)
    ids = [f"d{i}" for i in range(40)]
    qids = [f"q{i}" for i in range(20)]
    return TrainingData(qids, queries, ids, docs, {q: {f"d{2 * i}": 1} for i, q in enumerate(qids)}, triplets)


def _fit(method: str, train: TrainingData, **overrides) -> Compressor:
    cls = get_compressor_class(method)
    known = {field.name for field in dataclasses.fields(cls.config_class)}
    settings = {name: value for name, value in {**FAST_SETTINGS, **overrides}.items() if name in known}
    return cls(cls.config_class(**settings)).fit(train)


@pytest.mark.parametrize("base_normalizes", [False, True], ids=["base-unnormalised", "base-normalised"])
@pytest.mark.parametrize("method", METHODS)
def test_export_equals_compress_apply_without_trust_remote_code(method, base_normalizes, bases, tmp_path):
    from sentence_transformers import SentenceTransformer

    base = bases[base_normalizes]
    train = _train(base)
    known = {field.name for field in dataclasses.fields(get_compressor_class(method).config_class)}
    # The PCA-rotated start (the safety net's) on one base, the papers' identity start on the other.
    compressor = _fit(method, train, **({"init": "pca"} if "init" in known and not base_normalizes else {}))
    layers = compressor.export_layers()
    assert layers is not None, f"{method} has no built-in export"
    # The layers are the transform (checked without sentence-transformers, in float64).
    np.testing.assert_allclose(apply_layers(layers, train.doc_embeddings), compressor.transform(train.doc_embeddings), atol=1e-5)

    out = export_sentence_transformer(compressor, base, tmp_path / "exported")
    types = [entry["type"] for entry in json.loads((out / "modules.json").read_text())]
    assert all(t.startswith("sentence_transformers.") for t in types), types
    exported = SentenceTransformer(str(out), device="cpu")  # no trust_remote_code
    applied = load_compressor(out / COMPRESSOR_SUBFOLDER).transform(base.encode(TEXTS))  # what `compress apply` runs
    assert exported.get_embedding_dimension() == applied.shape[1]
    np.testing.assert_allclose(exported.encode(TEXTS), applied, atol=1e-5, rtol=0)


def test_dive_scaled_by_input_norm_falls_back_to_the_embedtune_module(bases, tmp_path):
    from sentence_transformers import SentenceTransformer

    base = bases[False]
    compressor = _fit("dive", _train(base), output_norm="input")
    assert compressor.export_layers() is None
    out = export_sentence_transformer(compressor, base, tmp_path / "exported")
    types = [entry["type"] for entry in json.loads((out / "modules.json").read_text())]
    assert types[-1] == "embedtune.compress.st_module.CompressorModule"
    exported = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    np.testing.assert_allclose(exported.encode(TEXTS), compressor.transform(base.encode(TEXTS)), atol=1e-5, rtol=0)


def test_sentence_transformers_range_matches_what_export_writes(bases, tmp_path):
    import sentence_transformers
    from packaging.requirements import Requirement
    from packaging.version import Version

    requirements = [Requirement(line) for line in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]]
    (requirement,) = [r for r in requirements if r.name == "sentence-transformers"]
    out = export_sentence_transformer(_fit("pca", _train(bases[True])), bases[True], tmp_path / "exported")
    written = Version(json.loads((out / "config_sentence_transformers.json").read_text())["__version__"]["sentence_transformers"])
    assert written == Version(sentence_transformers.__version__)
    assert requirement.specifier.contains(written), f"pyproject allows {requirement.specifier}, the export was written by {written}"
    # The module types written (sentence_transformers.sentence_transformer.modules.*) load on this
    # major version only: the range must exclude the previous major and the next one.
    types = [entry["type"] for entry in json.loads((out / "modules.json").read_text())]
    assert any(t.startswith("sentence_transformers.sentence_transformer.") for t in types)
    assert not requirement.specifier.contains(f"{written.major - 1}.99.0")
    assert not requirement.specifier.contains(f"{written.major + 1}.0.0")
