"""Embedding compressors: DIVE and the baselines of the DIVE paper, one estimator contract."""

from embedtune.compress.base import Compressor, CompressorConfig, TrainingData
from embedtune.compress.presets import MiningOptions, Preset
from embedtune.compress.registry import (
    available_methods,
    get_compressor_class,
    load_compressor,
    make_compressor,
    register,
    unregister,
    unsupervised_methods,
)

# Importing the method modules fills the registry, in the order `--method` lists them.
from embedtune.compress import methods as _methods  # noqa: E402,F401
from embedtune.compress.dive import ROBUST, DIVECompressor, DIVEConfig  # noqa: E402

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
    "get_compressor_class",
    "load_compressor",
    "make_compressor",
    "register",
    "unregister",
    "unsupervised_methods",
]
