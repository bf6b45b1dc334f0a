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

from embedtune.cli.compress import apply, export, fit, train
from embedtune.cli.compress.apply import run_apply
from embedtune.cli.compress.export import run_export
from embedtune.cli.compress.fit import fit_paths_help, run_fit
from embedtune.cli.compress.flags import ADAPTER_HELP, add_label_flags, method_help, preset_help
from embedtune.cli.compress.train import MINING_FLAGS, run_train
from embedtune.workflows.train_compressor import with_both_pca_variants

__all__ = ["register", "run_train", "run_fit", "run_apply", "run_export", "method_help", "preset_help", "fit_paths_help",
           "add_label_flags", "with_both_pca_variants", "ADAPTER_HELP", "MINING_FLAGS"]


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``compress`` group with ``train``, ``fit``, ``apply`` and ``export``, in that order."""
    compress = commands.add_parser("compress", help="train, apply and export embedding compressors (DIVE and baselines)")
    sub = compress.add_subparsers(dest="compress_command", metavar="ACTION", required=True)
    for module in (train, fit, apply, export):
        module.register(sub)
