"""PCA fits on a sample of a large corpus: the rule, its determinism, and the override."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embedtune.cli import main
from embedtune.compress import load_compressor, make_compressor
from embedtune.compress import pca as pca_module
from embedtune.compress.pca import fit_sample_rows, principal_axes


def corpus(n: int = 1200, d: int = 8, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) * np.linspace(3, 0.5, d)).astype(np.float32)


def test_the_rule():
    assert fit_sample_rows(1000, 384) == 1000  # a corpus up to the sample size: every row
    assert fit_sample_rows(3_000_000, 384) == 65536  # max(65536, 100 * 384)
    assert fit_sample_rows(3_000_000, 1024) == 102_400  # 100 rows per dimension above 655 dimensions
    assert fit_sample_rows(3_000_000, 384, 0) == fit_sample_rows(3_000_000, 384, "all") == 3_000_000
    assert fit_sample_rows(3_000_000, 384, 10_000) == 10_000 and fit_sample_rows(500, 384, 10_000) == 500
    for bad in (-1, "some", 1.5, True):
        with pytest.raises(ValueError, match="fit_sample"):
            fit_sample_rows(10, 4, bad)  # type: ignore[arg-type]


@pytest.fixture
def small_sample_rule(monkeypatch):
    """The rule at a test's scale: min(N, max(200, 1 * d)) rows."""
    monkeypatch.setattr(pca_module, "FIT_SAMPLE_MIN_ROWS", 200)
    monkeypatch.setattr(pca_module, "FIT_SAMPLE_ROWS_PER_DIM", 1)


def test_a_large_corpus_is_fitted_on_a_seeded_sample(small_sample_rule):
    x = corpus()
    fitted = make_compressor("pca", dim=4).fit_unsupervised(x)
    assert fitted.fit_details() == {"fit_rows": 200, "fit_sample": "auto"}
    again = make_compressor("pca", dim=4).fit_unsupervised(x)
    assert np.array_equal(fitted.components_, again.components_) and np.array_equal(fitted.mean_, again.mean_)
    other_seed = make_compressor("pca", dim=4, seed=5).fit_unsupervised(x)
    assert not np.array_equal(fitted.mean_, other_seed.mean_)
    full_mean, _, _ = principal_axes(x, 4)
    assert not np.allclose(fitted.mean_, full_mean.astype(np.float32))  # not every row
    # The sample is 200 distinct rows of the corpus: its mean is the mean of some 200 rows.
    explicit = make_compressor("pca", dim=4, fit_sample=200).fit_unsupervised(x)
    assert np.array_equal(explicit.components_, fitted.components_)


def test_fit_sample_all_fits_every_row(small_sample_rule):
    x = corpus()
    mean, components, _ = principal_axes(x, 4)
    for every in (0, "all"):
        fitted = make_compressor("pca", dim=4, fit_sample=every).fit_unsupervised(x)
        assert fitted.fit_details()["fit_rows"] == len(x) and fitted.config.fit_sample == 0
        assert np.array_equal(fitted.components_, components.astype(np.float32))
        assert np.array_equal(fitted.mean_, mean.astype(np.float32))


def test_a_corpus_within_the_sample_size_is_fitted_as_before():
    x = corpus()
    mean, components, _ = principal_axes(x, 4)
    fitted = make_compressor("pca", dim=4).fit_unsupervised(x)
    assert fitted.fit_details()["fit_rows"] == len(x)
    assert np.array_equal(fitted.components_, components.astype(np.float32))


def test_cli_fit_sample_is_recorded_and_refused_where_it_does_not_apply(tmp_path, capsys):
    x = corpus()
    np.save(tmp_path / "docs.npy", x)
    (tmp_path / "ids.txt").write_text("".join(f"d{i}\n" for i in range(len(x))))
    common = ["compress", "fit", "--doc-embeddings", str(tmp_path / "docs.npy"), "--doc-ids", str(tmp_path / "ids.txt"), "--dim", "4"]
    assert main([*common, "--method", "pca", "--fit-sample", "300", "--out", str(tmp_path / "pca"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["config"]["fit_sample"] == 300 and info["fit_details"]["fit_rows"] == 300
    saved = load_compressor(tmp_path / "pca")
    assert saved.config.fit_sample == 300
    assert json.loads((tmp_path / "pca" / "config.json").read_text())["config"]["fit_sample"] == 300
    assert main([*common, "--method", "truncate", "--fit-sample", "all", "--out", str(tmp_path / "truncate")]) == 2
    assert "--fit-sample" in capsys.readouterr().err and not (tmp_path / "truncate").exists()
