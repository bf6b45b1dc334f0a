"""DIVE's fit on a large corpus: bounded memory on a memory-mapped corpus, and seeded samples."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest
import torch

from embedtune.compress import DIVECompressor, DIVEConfig, TrainingData
from embedtune.compress import pca as pca_module
from embedtune.compress.dive.config import DEFAULT_TRAIN_DOCS
from embedtune.compress.dive.network import pca_start_rows
from embedtune.compress.dive.unsupervised import holdout_documents

torch.set_num_threads(1)

N, D, K = 150_000, 64, 8


@pytest.fixture(scope="module")
def mapped_corpus(tmp_path_factory) -> np.ndarray:
    """A (150,000 × 64) float32 corpus on disk, not unit rows, opened as a read-only memory map (38 MB)."""
    path = tmp_path_factory.mktemp("corpus") / "docs.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(N, D))
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(16, D)) * np.linspace(3, 0.5, D) + 1.0
    for lo in range(0, N, 50_000):
        rows = centres[rng.integers(0, 16, 50_000)] + 0.5 * rng.normal(size=(50_000, D))
        out[lo : lo + 50_000] = rows.astype(np.float32)
    out.flush()
    del out
    return np.load(path, mmap_mode="r")


def _small_sample_rule(monkeypatch) -> None:
    # The pca baseline's sample rule, scaled down so that a test-sized corpus is far above it.
    monkeypatch.setattr(pca_module, "FIT_SAMPLE_MIN_ROWS", 1000)
    monkeypatch.setattr(pca_module, "FIT_SAMPLE_ROWS_PER_DIM", 1)


@pytest.mark.parametrize("mode", ["unsupervised", "supervised"])
def test_a_fit_on_a_memory_mapped_corpus_reads_only_its_samples(mapped_corpus, monkeypatch, mode):
    """No array the size of the corpus is made: Python-side allocations stay far below the corpus's bytes.

    Normalising the whole corpus for the PCA start (or copying it to train on) would allocate at
    least the corpus's bytes again; what may grow with N is 8 bytes a row of row numbers and a
    block-wise finiteness check.
    """
    _small_sample_rule(monkeypatch)
    ids = [str(i) for i in range(N)]
    if mode == "unsupervised":
        train = TrainingData.corpus_only(mapped_corpus, ids)
        config = DIVEConfig.preset("unsupervised", dim=K, epochs=1, batch_size=64, max_train_docs=300, holdout_docs=100,
                                   progress=False, device="cpu", seed=3)
    else:
        rng = np.random.default_rng(1)
        queries = np.ascontiguousarray(mapped_corpus[rng.integers(0, N, 40)]) + 0.1
        triplets = np.stack([np.arange(40), rng.integers(0, N, 40), rng.integers(0, N, 40)], axis=1)
        train = TrainingData([f"q{i}" for i in range(40)], queries, ids, mapped_corpus, {}, triplets)
        config = DIVEConfig(dim=K, epochs=1, batch_size=16, init="pca", progress=False, device="cpu", seed=3)
    assert isinstance(train.doc_embeddings.base, np.memmap) or isinstance(train.doc_embeddings, np.memmap)
    corpus_bytes = mapped_corpus.nbytes
    # A first fit imports what training imports lazily (torch's optimiser pulls in tens of MB of modules).
    DIVECompressor(dataclasses.replace(config, max_train_docs=None)).fit_unsupervised(np.ascontiguousarray(mapped_corpus[:400]))
    tracemalloc.start()
    try:
        dive = DIVECompressor(config)
        if mode == "unsupervised":
            dive.fit_unsupervised(train)
        else:
            dive.fit(train)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * corpus_bytes, f"peak {peak / 2**20:.1f} MiB against a {corpus_bytes / 2**20:.1f} MiB corpus"
    details = dive.fit_details()
    assert details["pca_rows"] == 1000  # the rule, min(N, max(1000, 1·d)) here
    if mode == "unsupervised":
        assert details["train_docs"] == 300
        assert len(dive.history_) == 2


def test_the_same_seed_gives_the_same_samples_and_a_smaller_sample_is_part_of_a_larger(monkeypatch):
    _small_sample_rule(monkeypatch)
    config = DIVEConfig.preset("unsupervised", max_train_docs=500, seed=11)
    held, fit_rows = holdout_documents(20_000, config)
    again_held, again_fit = holdout_documents(20_000, dataclasses.replace(config))
    np.testing.assert_array_equal(held, again_held)
    np.testing.assert_array_equal(fit_rows, again_fit)
    assert len(held) == 1000 and len(fit_rows) == 500 and not set(held) & set(fit_rows)
    _, larger = holdout_documents(20_000, dataclasses.replace(config, max_train_docs=2000))
    assert set(fit_rows) <= set(larger)
    _, other = holdout_documents(20_000, dataclasses.replace(config, seed=12))
    assert not np.array_equal(fit_rows, other)
    # The PCA start's rows: the pca baseline's draw for the same seed, in file order.
    corpus = np.random.default_rng(0).normal(size=(5000, 4)).astype(np.float32)
    rows = pca_start_rows(corpus, seed=11)
    np.testing.assert_array_equal(rows, pca_start_rows(corpus, seed=11))
    assert not np.array_equal(rows, pca_start_rows(corpus, seed=12))
    picked = np.sort(np.random.default_rng(11).choice(5000, size=1000, replace=False))
    np.testing.assert_array_equal(rows, corpus[picked])
    small = corpus[:800]
    assert pca_start_rows(small, seed=11) is small  # a corpus within the sample is used whole, not copied


def test_the_default_training_sample():
    """Unsupervised DIVE trains on at most DEFAULT_TRAIN_DOCS documents; None trains on every one."""
    config = DIVEConfig.preset("unsupervised")
    assert config.max_train_docs == DEFAULT_TRAIN_DOCS
    n = DEFAULT_TRAIN_DOCS * 3
    held, fit_rows = holdout_documents(n, config)
    assert len(fit_rows) == DEFAULT_TRAIN_DOCS and len(held) == min(config.holdout_docs, n // 10)
    small = np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32)
    fitted = DIVECompressor(dataclasses.replace(config, dim=4, epochs=1, progress=False, device="cpu")).fit_unsupervised(small)
    assert "pca_rows" not in fitted.fit_details() and "train_docs" not in fitted.fit_details()  # every row was read
    _, every = holdout_documents(n, dataclasses.replace(config, max_train_docs=None))
    assert len(every) == n - len(held)
