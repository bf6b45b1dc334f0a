"""Embedding compressors: DIVE and the baselines of the DIVE paper, one estimator contract."""

from embedtune.compress.base import Compressor, CompressorConfig, TrainingData
from embedtune.compress.registry import (
    available_methods,
    describe_method,
    get_compressor_class,
    load_compressor,
    make_compressor,
    register,
    unregister,
    unsupervised_methods,
)

# The method modules (torch with most of them) are imported when a class is first asked for, not here:
# `compress apply` on a PCA, `index build` and `--help` never import torch.
# Nor the presets (they import the triplet miner): applying a fitted compressor never reads one.
_LAZY = {"DIVECompressor": "embedtune.compress.dive", "DIVEConfig": "embedtune.compress.dive", "ROBUST": "embedtune.compress.dive",
         "MiningOptions": "embedtune.compress.presets", "Preset": "embedtune.compress.presets"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DIVECompressor",
    "DIVEConfig",
    "ROBUST",
    "Compressor",
    "CompressorConfig",
    "MiningOptions",
    "Preset",
    "TrainingData",
    "available_methods",
    "describe_method",
    "get_compressor_class",
    "load_compressor",
    "make_compressor",
    "register",
    "unregister",
    "unsupervised_methods",
]
