"""Workflows: the paths that load models and datasets, fit, and score, above compress, finetune and evaluate.

One module per workflow; the names below are imported lazily, so ``import embedtune.workflows``
stays cheap and loading one workflow does not load the others.

- :mod:`~embedtune.workflows.experiment`: ``load_experiment``, ``Experiment``, ``training_data``;
- :mod:`~embedtune.workflows.triplets`: ``shared_triplets``;
- :mod:`~embedtune.workflows.fit_and_score`: ``fit_and_evaluate``, ``summarize``, ``MethodRun``;
- :mod:`~embedtune.workflows.train_compressor`: ``fit_compressor`` (what ``compress train`` runs);
- :mod:`~embedtune.workflows.fit`: ``fit_on_all`` (what ``compress fit`` runs: all the data, no evaluation);
- :mod:`~embedtune.workflows.pipeline`: ``run_pipeline`` (fine-tune, then compress);
- :mod:`~embedtune.workflows.significance`: ``paired_test``, ``align_by_query``;
- :mod:`~embedtune.workflows.diagnose`: ``diagnose_model``;
- :mod:`~embedtune.workflows.mmeb`: ``evaluate_mmeb_model``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Experiment": "experiment",
    "load_experiment": "experiment",
    "training_data": "experiment",
    "evaluate_frozen": "experiment",
    "shared_triplets": "triplets",
    "MethodRun": "fit_and_score",
    "fit_and_evaluate": "fit_and_score",
    "summarize": "fit_and_score",
    "CompressionResult": "train_compressor",
    "fit_compressor": "train_compressor",
    "FitResult": "fit",
    "fit_on_all": "fit",
    "PipelineConfig": "pipeline",
    "run_pipeline": "pipeline",
    "paired_test": "significance",
    "align_by_query": "significance",
    "diagnose_model": "diagnose",
    "evaluate_mmeb_model": "mmeb",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'embedtune.workflows' has no attribute {name!r}")
    return getattr(importlib.import_module(f"embedtune.workflows.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
