"""``embedtune compress train|fit|apply|export``: one module per subcommand, each a thin handler over the library.

- :mod:`~embedtune.cli.compress.train`: ``compress train`` (:func:`~embedtune.workflows.train_compressor.fit_compressor`);
- :mod:`~embedtune.cli.compress.fit`: ``compress fit`` (:func:`~embedtune.workflows.fit.fit_on_all`);
- :mod:`~embedtune.cli.compress.apply`: ``compress apply`` (streaming, memory bounded);
- :mod:`~embedtune.cli.compress.export`: ``compress export`` (a sentence-transformers model);
- :mod:`~embedtune.cli.compress.flags`: the flags and help lines they share.

``compress plan`` lives in :mod:`embedtune.cli.plan` and joins this group after :func:`register`.
The policy the handlers apply lives in the library: the similarity in
:func:`~embedtune.workflows.experiment.encoder_settings`, the PCA-variant pairing in
:func:`~embedtune.workflows.train_compressor.with_both_pca_variants`.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import Any

#: The actions in the order ``--help`` lists them (``plan`` joins after, from :mod:`embedtune.cli.plan`).
ACTIONS = ("train", "fit", "apply", "export")

# Re-exported names, each imported from its action's module on first use, so that `compress apply` does not load
# `compress train`'s stack (module __getattr__, PEP 562).
_EXPORTS = {
    "run_train": "train", "MINING_FLAGS": "train", "run_fit": "fit", "fit_paths_help": "fit", "run_apply": "apply",
    "run_export": "export", "ADAPTER_HELP": "flags", "add_label_flags": "flags", "method_help": "flags", "preset_help": "flags",
}

__all__ = ["register", "ACTIONS", "run_train", "run_fit", "run_apply", "run_export", "method_help", "preset_help", "fit_paths_help",
           "add_label_flags", "with_both_pca_variants", "ADAPTER_HELP", "MINING_FLAGS"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"embedtune.cli.compress.{_EXPORTS[name]}"), name)
    if name == "with_both_pca_variants":
        return importlib.import_module("embedtune.workflows.train_compressor").with_both_pca_variants
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(commands: argparse._SubParsersAction, actions: Sequence[str] | None = None) -> None:
    """Add the ``compress`` group with ``train``, ``fit``, ``apply`` and ``export``, in that order.

    ``actions``: only these (the parser of one command: each action's module loads its own stack); None: all.
    """
    compress = commands.add_parser("compress", help="train, apply and export embedding compressors (DIVE and baselines)")
    sub = compress.add_subparsers(dest="compress_command", metavar="ACTION", required=True)
    for name in ACTIONS:
        if actions is None or name in actions:
            importlib.import_module(f"embedtune.cli.compress.{name}").register(sub)
