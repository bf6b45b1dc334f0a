"""What ``--method`` offers, readable without importing any method's module (nor torch).

Each built-in compressor's registry name, module and the traits the CLI's help and the fit
paths read. The method modules stay the home of the classes; the registry imports a module only
when its class is asked for, and checks on registration that the class agrees with its entry
here, so the two cannot drift apart (``tests/test_startup.py`` loads every method).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MethodEntry", "BUILTIN_METHODS"]


@dataclass(frozen=True)
class MethodEntry:
    """A compressor method's name, module and traits, as the CLI's help and the fit paths read them."""

    method: str
    module: str
    help: str
    supervised: bool
    supports_unsupervised: bool
    presets: tuple[str, ...] = ()
    default_preset: str | None = None


#: The built-in methods, in the order ``--method`` lists them.
BUILTIN_METHODS: tuple[MethodEntry, ...] = (
    MethodEntry("frozen", "embedtune.compress.frozen", "the uncompressed frozen embedding (full d), the reference", False, True),
    MethodEntry("truncate", "embedtune.compress.truncate", "the first k coordinates, renormalised", False, True),
    MethodEntry("pca", "embedtune.compress.pca", "corpus PCA onto the top-k principal axes", False, True),
    MethodEntry("pca-uncentred", "embedtune.compress.pca", "corpus PCA axes without centring (DIVE's PCA-rotated start)", False, True),
    MethodEntry("autoencoder", "embedtune.compress.autoencoder", "an MLP autoencoder trained to reconstruct the corpus", False, True,
                ("dive-paper",)),
    MethodEntry("dive", "embedtune.compress.dive.compressor",
                "DIVE: multi-head residual adapter with self-limiting updates (the default)", True, True,
                ("paper", "best", "robust", "static-corpus", "unsupervised", "unsupervised-guarded"), "robust"),
    MethodEntry("mrl-adaptor", "embedtune.compress.mrl_adaptor", "Matryoshka-Adaptor (Yoon et al. 2024b), read at the prefix k", True,
                True, ("dive-paper", "dive-paper-tuned", "own-paper", "unsupervised", "robust"), "robust"),
    MethodEntry("search-adaptor", "embedtune.compress.search_adaptor", "Search-Adaptor (Yoon et al. 2024a), truncated to k", True, False,
                ("dive-paper", "dive-paper-tuned", "own-paper", "robust"), "robust"),
    MethodEntry("smec", "embedtune.compress.smec",
                "SMEC (Zhang et al. 2025): sequential Matryoshka with adaptive dimension selection", True, False,
                ("dive-paper", "own-paper", "robust"), "robust"),
    MethodEntry("csr", "embedtune.compress.csr",
                "CSR: sentence-transformers' top-k sparse autoencoder; k of dim latents active, k × (index + value) bytes", False, True),
)
