"""A new compressor is one class and nothing else: register it here and run it end to end.

The toy method (a seeded Gaussian random projection) is defined and registered in this file only,
then runs through ``compress train``, ``benchmark dive`` (a tiny TOML config) and
``compress export``, with no change to any other file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from embedtune.cli import main
from embedtune.compress import Compressor, CompressorConfig, TrainingData, load_compressor, register, unregister
from embedtune.compress.presets import presets_from_config


@dataclass
class RandomProjectionConfig(CompressorConfig):
    """A Gaussian random projection ``d -> k``."""

    scale: float = field(default=1.0, metadata={"help": "Multiplies the projection (the output is normalised anyway)."})
    PRESETS = {"double": {"scale": 2.0}}


class RandomProjectionCompressor(Compressor):
    """``x R`` with ``R`` of shape (d, k) drawn from the seed; nothing is learned from the data.

    Attributes:
        projection_ : ndarray of shape (d, k), float32.
    """

    method = "toy-random-projection"
    config_class = RandomProjectionConfig
    help = "a seeded Gaussian random projection (test toy)"
    presets = presets_from_config(RandomProjectionConfig)
    config: RandomProjectionConfig

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        rng = np.random.default_rng(self.config.seed)
        self.projection_ = (self.config.scale * rng.standard_normal((train.dim, self.config.dim))).astype(np.float32)

    def _transform(self, X: np.ndarray) -> np.ndarray:
        return X @ self.projection_

    def _state_dict(self) -> dict[str, np.ndarray]:
        return {"projection_": self.projection_}

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.projection_ = np.asarray(state["projection_"], dtype=np.float32)

    def torch_module(self) -> torch.nn.Module:
        return _UnitProjection(torch.from_numpy(self.projection_)).eval()


class _UnitProjection(torch.nn.Module):
    """``normalize(x R)``: the whole of ``transform`` as a torch forward (for export)."""

    def __init__(self, projection: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("projection", projection)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x @ self.projection, dim=1)


@pytest.fixture
def toy_method():
    register(RandomProjectionCompressor)
    yield RandomProjectionCompressor.method
    unregister(RandomProjectionCompressor.method)


@pytest.mark.slow
def test_toy_method_trains_benchmarks_and_exports(toy_method, toy40, tiny_bert_dir, tmp_path, capsys):
    # compress train: two seeds, so one folder per seed (the method is seed-dependent).
    out = tmp_path / "run"
    assert main(["compress", "train", "--method", toy_method, "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
                 "--preset", "double", "--seeds", "1", "2", "--compare", "pca", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["preset"] == "double" and report["results"][toy_method]["summary"]["seeds"] == [1, 2]
    assert "triplets" not in report  # unsupervised methods need no mining
    fitted = load_compressor(out / toy_method / "seed-1")
    assert isinstance(fitted, RandomProjectionCompressor) and fitted.config.scale == 2.0

    # benchmark dive with a tiny config: the toy method is a registered method like any other.
    config = tmp_path / "toy.toml"
    config.write_text(
        f'[protocol]\nmethods = ["{toy_method}", "frozen"]\nstudies = ["main"]\nfinal_seeds = [1, 2]\n'
        f'results_dir = "{tmp_path / "grid"}"\n\n'
        f'[[datasets]]\nname = "toy40"\npath = "{toy40}"\n\n'
        f'[[backbones]]\nname = "tiny"\nmodel = "{tiny_bert_dir}"\ndims = [8]\n'
    )
    assert main(["benchmark", "dive", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "3 runs finished" in printed  # the toy method at both seeds, frozen once
    assert toy_method in (tmp_path / "grid" / "REPORT.md").read_text()
    assert main(["benchmark", "dive", "--config", str(config), "--no-report"]) == 0
    assert "3 runs finished" in capsys.readouterr().out

    # compress export: through the generic CompressorModule (no built-in form).
    assert main(["compress", "export", "--adapter", str(out / toy_method / "seed-2"), "--model", str(tiny_bert_dir),
                 "--out", str(tmp_path / "st")]) == 0
    from sentence_transformers import SentenceTransformer

    exported = SentenceTransformer(str(tmp_path / "st"), device="cpu", trust_remote_code=True)
    base = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    texts = ["document number 3", "topic 2"]
    expected = load_compressor(out / toy_method / "seed-2").transform(base.encode(texts))
    np.testing.assert_allclose(exported.encode(texts), expected, atol=1e-5)


def test_toy_method_traits_reach_the_registry_lists(toy_method):
    from embedtune.bench.protocol_config import BackboneSpec, DatasetSpec, ProtocolConfig
    from embedtune.cli.compress import method_help, preset_help

    assert f"{toy_method}: a seeded Gaussian random projection" in method_help()
    assert f"{toy_method}: double" in preset_help()
    config = ProtocolConfig(datasets=[DatasetSpec("a", "x")], backbones=[BackboneSpec("b", "m", (8,))])
    assert toy_method in config.methods and toy_method not in config.lr_candidates


@pytest.mark.parametrize("traits", [
    {"unsupervised_text_preset": "double"},  # nothing to fall back on where the text gives no pseudo-query
    {"supports_unsupervised": True, "unsupervised_preset": "double", "unsupervised_text_preset": "missing"},
])
def test_a_text_preset_needs_a_plain_one_to_fall_back_on_and_must_exist(traits):
    toy = type("TextPresetToy", (RandomProjectionCompressor,), {"method": "toy-text-preset", **traits})
    with pytest.raises(ValueError, match="unsupervised_text_preset .* needs an unsupervised_preset to fall back on"):
        register(toy)
    unregister("toy-text-preset")
