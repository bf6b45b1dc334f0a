"""The estimator contract, for every registered compression method (DIVE included)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from embedtune.compress import Compressor, TrainingData, available_methods, get_compressor_class, load_compressor

# Tiny tensors: one thread is fastest and stays fast on a busy 2-core machine.
torch.set_num_threads(1)

D, K, N_DOCS, N_QUERIES = 32, 8, 60, 20

# Small-run settings, passed only to configs that have the field.
FAST_SETTINGS = {
    "dim": K,
    "epochs": 2,
    "unsupervised_epochs": 1,
    "batch_size": 16,
    "progress": False,
    "device": "cpu",
    "seed": 11,
}


@pytest.fixture(scope="module")
def train() -> TrainingData:
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(N_DOCS, D))
    # Each query sits near its positive doc 3q; negatives are two other docs.
    queries = docs[np.arange(N_QUERIES) * 3] + 0.3 * rng.normal(size=(N_QUERIES, D))
    triplets = [(q, 3 * q, (3 * q + offset) % N_DOCS) for q in range(N_QUERIES) for offset in (1, 17)]
    return TrainingData(
        [f"q{i}" for i in range(N_QUERIES)],
        queries,
        [f"d{i}" for i in range(N_DOCS)],
        docs,
        {f"q{q}": {f"d{3 * q}": 1} for q in range(N_QUERIES)},
        np.array(triplets, dtype=np.int64),
    )


def build(method: str) -> Compressor:
    cls = get_compressor_class(method)
    known = {field.name for field in dataclasses.fields(cls.config_class)}
    return cls(cls.config_class(**{name: value for name, value in FAST_SETTINGS.items() if name in known}))


@pytest.mark.parametrize("method", available_methods())
def test_compressor_contract(method, train, tmp_path):
    X = train.query_embeddings

    unfitted = build(method)
    with pytest.raises(RuntimeError, match="not fitted"):
        unfitted.transform(X)

    model = build(method)
    assert model.fit(train) is model
    out = model.transform(X)
    expected_dim = D if method == "frozen" else K
    assert model.output_dim == expected_dim
    assert out.shape == (N_QUERIES, expected_dim)
    assert out.dtype == np.float32 and out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="columns"):
        model.transform(X[:, :-1])

    model.save(tmp_path / method)
    for loaded in (load_compressor(tmp_path / method), type(model).load(tmp_path / method)):
        assert type(loaded) is type(model)
        assert loaded.config == model.config
        np.testing.assert_array_equal(loaded.transform(X), out)

    again = build(method).fit(train)
    np.testing.assert_array_equal(again.transform(X), out)

    # What the map holds once beside an index: nothing for a selection or a normalisation, at least a k x d matrix otherwise;
    # its shape is the config's and the dims', whatever the map was fitted on (so one fit measures it for a benchmark).
    held = model.transform_bytes()
    assert isinstance(held, int) and held == loaded.transform_bytes()
    other = dataclasses.replace(train, doc_embeddings=np.flip(train.doc_embeddings, axis=1).copy(),
                                query_embeddings=2.0 * train.query_embeddings[:, ::-1].copy())
    assert build(method).fit(other).transform_bytes() == held
    if method in ("frozen", "truncate"):
        assert held == 0
    elif method == "pca":
        assert held == 4 * (K * D + K)  # the k x d matrix and its bias -W mu
    else:
        assert held >= 4 * K * D


@pytest.mark.parametrize("method", available_methods())
def test_seed_changes_learned_compressors(method, train):
    cls = get_compressor_class(method)
    if "epochs" not in {field.name for field in dataclasses.fields(cls.config_class)}:
        pytest.skip(f"{method} learns nothing random")
    first = build(method).fit(train).transform(train.query_embeddings)
    reseeded = build(method)
    reseeded.config.seed += 1
    assert not np.array_equal(reseeded.fit(train).transform(train.query_embeddings), first)


@pytest.mark.parametrize("method", [m for m in available_methods() if get_compressor_class(m).non_finite_input_reaches_output])
def test_non_finite_input_reaches_the_output_row(method, train):
    # The streaming apply scans only the output of these methods, so a NaN or infinity in any
    # input column must leave its output row non-finite (and no other row).
    compressor = build(method)
    compressor.fit(train) if compressor.supervised else compressor.fit_unsupervised(train.doc_embeddings)
    X = np.array(train.doc_embeddings[:12], dtype=np.float32)
    bad = {2: (0, np.nan), 5: (D - 1, np.inf), 9: (D // 2, -np.inf)}
    for row, (column, value) in bad.items():
        X[row, column] = value
    out = compressor._transform(X)
    row_finite = np.isfinite(out).all(axis=1)
    assert [i for i in range(len(X)) if not row_finite[i]] == sorted(bad)
    # And the tile path names the input, not the weights, for the first bad row.
    from embedtune.compress.streaming import transform_rows
    from embedtune.errors import NonFiniteError

    with pytest.raises(NonFiniteError, match=r"the input vectors: input row 2 \(0-based\) holds nan at column 0"):
        transform_rows(compressor, X, tile=4, workers=2)
