"""Geometry diagnostics against brute-force references, and `embedtune diagnose` on a tiny model."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from embedtune.evaluate.geometry import (
    angular_norm_coupling,
    diagnose_embeddings,
    norm_percentiles,
    pca_2d,
    plot_norm_pca,
    random_pair_cosine,
)


def coupled_pairs(rng, n=400, d=16, coupling=1.0):
    """Pairs whose cosine falls as the norm product grows (coupling=1) or is independent of it (0)."""
    direction = rng.normal(size=(n, d))
    noise = rng.normal(size=(n, d))
    mix = rng.uniform(0.1, 0.9, size=n)
    xq = direction
    xp = (1 - mix)[:, None] * direction + mix[:, None] * noise
    unit_p = xp / np.linalg.norm(xp, axis=1, keepdims=True)
    scale = np.exp(coupling * 3 * mix + (1 - coupling) * rng.uniform(0, 3, size=n))
    xq = xq / np.linalg.norm(xq, axis=1, keepdims=True) * np.sqrt(scale)[:, None]
    return xq.astype(np.float32), (unit_p * np.sqrt(scale)[:, None]).astype(np.float32)


def test_coupling_matches_brute_force_pearson(rng):
    xq, xp = coupled_pairs(rng)
    r, z, cos = angular_norm_coupling(xq, xp)
    log_product = [np.log(np.linalg.norm(a)) + np.log(np.linalg.norm(b)) for a, b in zip(xq, xp)]
    cosines = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(xq, xp)]
    from scipy.stats import pearsonr

    assert r == pytest.approx(pearsonr(log_product, cosines)[0], abs=1e-6)  # standardising leaves r unchanged
    np.testing.assert_allclose(cos, cosines, atol=1e-6)
    assert z.mean() == pytest.approx(0, abs=1e-9) and z.std() == pytest.approx(1)
    assert r < -0.8
    independent_r, _, _ = angular_norm_coupling(*coupled_pairs(rng, coupling=0.0))
    assert abs(independent_r) < 0.2


def test_coupling_is_nan_for_unit_norm_embeddings(rng):
    x = rng.normal(size=(10, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert np.isnan(angular_norm_coupling(x, x[::-1].copy())[0])


def test_random_pair_cosine_matches_loop(rng):
    xq, xc = rng.normal(size=(30, 8)), rng.normal(size=(40, 8)) + 2.0
    mean, values = random_pair_cosine(xq, xc, n_pairs=500, seed=3)
    pick = np.random.default_rng(3)
    qi, ci = pick.integers(30, size=500), pick.integers(40, size=500)
    expected = [xq[i] @ xc[j] / (np.linalg.norm(xq[i]) * np.linalg.norm(xc[j])) for i, j in zip(qi, ci)]
    np.testing.assert_allclose(values, expected, atol=1e-5)
    assert mean == pytest.approx(float(np.mean(expected)), abs=1e-5)
    assert mean > random_pair_cosine(xq, xc - 2.0, n_pairs=500, seed=3)[0]  # a shared offset = anisotropy


def test_pca_matches_covariance_eigenvectors_and_percentiles(rng):
    x = rng.normal(size=(200, 5)) * np.array([5.0, 2.0, 1.0, 0.5, 0.1])
    projected, ratio = pca_2d(x)
    centred = x - x.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(centred.T))
    top = vectors[:, ::-1][:, :2]
    for k in range(2):
        reference = centred @ top[:, k]
        assert abs(np.corrcoef(projected[:, k], reference)[0, 1]) == pytest.approx(1.0, abs=1e-5)
    assert ratio[0] == pytest.approx(values[-1] / values.sum(), rel=1e-4)
    percentiles = norm_percentiles(np.array([[3.0, 0], [1.0, 0], [2.0, 0]]))
    np.testing.assert_allclose(percentiles, [100, 0, 50])


def test_png_and_report(tmp_path, rng):
    xq, xp = coupled_pairs(rng, n=60)
    path = plot_norm_pca(xq, xp, tmp_path / "pca.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = diagnose_embeddings(xq, xp, tmp_path / "figs", n_random_pairs=200)
    assert report.n_pairs == 60 and set(report.figures) == {"pca", "coupling"}
    json.dumps(report.to_dict())


def test_diagnose_cli_on_tiny_model(tiny_bert_dir, toy_beir, tmp_path, capsys):
    from embedtune.cli import diagnose

    parser = argparse.ArgumentParser()
    diagnose.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diagnose", "--model", str(tiny_bert_dir), "--data", str(toy_beir), "--split", "test",
                              "--n-pairs", "0", "--random-pairs", "100", "--out", str(tmp_path / "diag"), "--json"])
    assert args.handler(args) == 0
    printed = json.loads(capsys.readouterr().out)
    # A random 1-layer BERT can give (near-)constant norms, where r is undefined (None).
    assert printed["n_pairs"] == 20 and (printed["coupling_r"] is None or -1 <= printed["coupling_r"] <= 1)
    assert -1 <= printed["random_pair_cosine"] <= 1
    assert (tmp_path / "diag" / "pca_norm_percentile.png").is_file() and (tmp_path / "diag" / "results.json").is_file()



@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A tiny random BERT whose outputs vary with the text (its tokenizer knows the toy words), saved twice:
    as is (Transformer, Pooling) and as a cosine model (…, Normalize), as ``finetune pace`` saves one."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    root = tmp_path_factory.mktemp("tiny-varied")
    words = sorted({w for i in range(40) for w in f"document number {i} about topic title what".split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    tokenizer = BertTokenizerFast(vocab={word: i for i, word in enumerate(vocab)})
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                        max_position_embeddings=64)
    bert = BertModel(config)
    with torch.no_grad():
        bert.embeddings.word_embeddings.weight.normal_(0, 1.0)  # texts differ in direction and in norm
    bert.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    transformer = Transformer(str(root / "hf"), max_seq_length=32)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean")]
    SentenceTransformer(modules=modules, device="cpu").save(str(root / "raw"))
    SentenceTransformer(modules=[*modules, Normalize()], device="cpu").save(str(root / "cosine"))
    return root / "raw", root / "cosine"


def _diagnose_json(model_dir, data_dir, capsys, *extra: str) -> dict:
    from embedtune.cli import diagnose

    parser = argparse.ArgumentParser()
    diagnose.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diagnose", "--model", str(model_dir), "--data", str(data_dir), "--split", "test",
                              "--n-pairs", "0", "--random-pairs", "100", "--json", *extra])
    assert args.handler(args) == 0
    return json.loads(capsys.readouterr().out)


def test_diagnose_strips_a_trailing_normalize(tiny_models, toy_beir, capsys):
    """A cosine model saved with Normalize is diagnosed on its raw outputs: the numbers of the
    same model without Normalize, and said so in the JSON; --keep-normalize diagnoses it as saved."""
    from sentence_transformers import SentenceTransformer

    raw_dir, cosine_dir = tiny_models
    without = _diagnose_json(raw_dir, toy_beir, capsys)
    stripped = _diagnose_json(cosine_dir, toy_beir, capsys)
    as_saved = _diagnose_json(cosine_dir, toy_beir, capsys, "--keep-normalize")

    assert without["normalize_stripped"] is False and stripped["normalize_stripped"] is True
    assert "Normalize module stripped" in stripped["outputs"] and stripped["meta"]["normalize_stripped"] is True
    assert stripped["coupling_r"] is not None and -1 <= stripped["coupling_r"] <= 1  # defined: the norms vary
    for key in ("coupling_r", "query_norm_mean", "query_norm_std", "candidate_norm_mean", "positive_cosine", "random_pair_cosine"):
        assert stripped[key] == pytest.approx(without[key], abs=1e-5), key
    assert stripped["query_norm_std"] > 1e-3
    assert as_saved["normalize_stripped"] is False and as_saved["coupling_r"] is None  # unit norms: undefined
    assert as_saved["query_norm_mean"] == pytest.approx(1.0, abs=1e-5)
    assert len(SentenceTransformer(str(cosine_dir), device="cpu")) == 3  # the files keep their Normalize


def test_diagnose_table_and_results_say_what_was_diagnosed(tiny_models, toy_beir, tmp_path, capsys):
    from embedtune.cli import diagnose

    parser = argparse.ArgumentParser()
    diagnose.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "diag"
    args = parser.parse_args(["diagnose", "--model", str(tiny_models[1]), "--data", str(toy_beir), "--split", "test",
                              "--n-pairs", "0", "--random-pairs", "100", "--out", str(out)])
    assert args.handler(args) == 0
    assert "diagnosed: raw outputs: the model's trailing Normalize module stripped" in capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())
    assert saved["model"]["normalize_stripped"] is True and "Normalize module stripped" in saved["rows"][0]["outputs"]
    assert saved["details"]["normalize_stripped"] is True and not (out / "report.json").exists()
