"""The safety net for every trained supervised compressor: a PCA-rotated start and best-epoch selection.

DIVE's robust recipe (``tests/test_collapse.py``) does not collapse where the
paper's does because (a) it starts at the corpus PCA projection and (b) it keeps the best epoch
on held-out training queries, epoch 0 included, so it can never end below its start. This module
gives the same two options to the residual-adapter baselines (Matryoshka-Adaptor,
Search-Adaptor, SMEC) through :class:`SelectableTrainingConfig`:

- ``init="pca"``: rotate the unit-normalised input by the corpus PCA basis (uncentred, as
  DIVE's ``init="pca"``; inner products are unchanged) before the identity-initialised adapter,
  so "read the first k coordinates" is the uncentred PCA projection at epoch 0;
- ``epoch_selection="best"``: hold out ``selection_fraction`` of the training queries, score
  nDCG@10 on them before training (epoch 0) and after every epoch, then refit on every training
  query and stop at the selected epoch;
- ``epoch_selection="val"``: select on the ``val`` queries given to ``fit`` and keep those weights
  (no refit): the validation queries are used for selection only.

The defaults (``identity``, ``last``) are the papers' recipes, so the DIVE protocol benchmark is
unchanged; ``compress fit`` and ``compress train`` turn the net on through each method's
default preset (:data:`embedtune.compress.presets.SAFETY_NET_SETTINGS`).

A method supports this by training through :func:`fit_with_selection`: it passes a function
``train_once(data, control)`` that builds fresh modules, assigns them (so ``transform`` works
mid-training), calls ``control.begin()`` once the initial map is in place and hands ``control``
to every :func:`~embedtune.compress.training.run_epochs` call.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from embedtune.compress.base import TrainingData
from embedtune.compress.dive.config import PCA_STARTS
from embedtune.compress.dive.network import centred_start_bias, corpus_pca_rotation
from embedtune.compress.holdout import SELECTION_HOLDOUTS, holdout_split
from embedtune.compress.training import TrainedCompressorConfig
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.evaluate.search import unit_rows

if TYPE_CHECKING:
    from embedtune.compress.base import Compressor

logger = logging.getLogger(__name__)

__all__ = [
    "INIT_KINDS",
    "EPOCH_SELECTIONS",
    "SelectableTrainingConfig",
    "EpochControl",
    "InputRotation",
    "holdout_split",
    "fit_with_selection",
    "holdout_ndcg",
    "pca_start_scores",
    "resolved_pca_start",
]

INIT_KINDS = ("identity", "pca")
EPOCH_SELECTIONS = ("last", "best", "val")


@dataclass
class SelectableTrainingConfig(TrainedCompressorConfig):
    """:class:`TrainedCompressorConfig` plus the safety-net options (defaults: the papers' recipe)."""

    init: str = field(
        default="identity",
        metadata={"help": "'identity' (the paper: the adapter starts as the first k input coordinates) or 'pca' "
                  "(rotate the input by the corpus PCA basis first, so the start is the uncentred PCA projection)."},
    )
    epoch_selection: str = field(
        default="last",
        metadata={"help": "'last' (keep the final epoch), 'best' (select the epoch, 0 included, on held-out training "
                  "queries, then refit on all), or 'val' (select on the val queries given to fit; no refit)."},
    )
    selection_fraction: float = field(
        default=0.2, metadata={"help": "With epoch_selection='best': fraction of training queries held out to select on."}
    )
    selection_holdout: str = field(
        default="disjoint-positives",
        metadata={"help": "With epoch_selection='best': 'disjoint-positives' (hold out whole groups of queries that share "
                  "positives, so selection rewards what carries over to new documents) or 'random-queries' (hash-ranked)."},
    )
    pca_start: str = field(
        default="uncentred",
        metadata={"help": "With init='pca': 'uncentred' (the paper-free default: inner products kept), 'centred' (the pca "
                  "baseline's projection at epoch 0) or 'stronger' (whichever scores higher on the selection queries; "
                  "uncentred without selection)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init not in INIT_KINDS:
            raise ValueError(f"init must be one of {list(INIT_KINDS)}; got {self.init!r}.")
        if self.epoch_selection not in EPOCH_SELECTIONS:
            raise ValueError(f"epoch_selection must be one of {list(EPOCH_SELECTIONS)}; got {self.epoch_selection!r}.")
        if isinstance(self.selection_fraction, bool) or not isinstance(self.selection_fraction, (int, float)) or not 0 < self.selection_fraction < 1:
            raise ValueError(f"selection_fraction must be a number in (0, 1); got {self.selection_fraction!r}.")
        if self.selection_holdout not in SELECTION_HOLDOUTS:
            raise ValueError(f"selection_holdout must be one of {list(SELECTION_HOLDOUTS)}; got {self.selection_holdout!r}.")
        if self.pca_start not in PCA_STARTS:
            raise ValueError(f"pca_start must be one of {list(PCA_STARTS)}; got {self.pca_start!r}.")


class InputRotation:
    """An optional fixed (d, d) rotation applied to unit input rows before a method's adapter.

    With ``offset`` (shape (d,), the centred start's ``−μR``), rows map to ``xR + offset``, so the
    first k coordinates at epoch 0 are the centred PCA projection (the ``pca`` baseline) instead
    of the uncentred one.
    """

    def __init__(self, matrix: np.ndarray | None = None, offset: np.ndarray | None = None) -> None:
        self.matrix = None if matrix is None else torch.as_tensor(np.ascontiguousarray(matrix, dtype=np.float32))
        self.offset = None if offset is None else torch.as_tensor(np.ascontiguousarray(offset, dtype=np.float32))

    @classmethod
    def fit(cls, init: str, doc_embeddings: np.ndarray, start: str = "uncentred") -> "InputRotation":
        """The corpus PCA basis for ``init='pca'`` (see :func:`embedtune.compress.dive.network.corpus_pca_rotation`), else none.

        ``start='centred'`` adds the corpus-mean offset (:func:`~embedtune.compress.dive.network.centred_start_bias`).
        """
        if init != "pca":
            return cls(None)
        rotation = corpus_pca_rotation(doc_embeddings, normalize_input=True)
        offset = centred_start_bias(doc_embeddings, rotation, True) if start == "centred" else None
        return cls(rotation, offset)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.matrix is None:
            return x
        if self.matrix.device != x.device:
            self.matrix = self.matrix.to(x.device)
            self.offset = None if self.offset is None else self.offset.to(x.device)
        return x @ self.matrix if self.offset is None else x @ self.matrix + self.offset

    def state(self) -> dict[str, np.ndarray]:
        if self.matrix is None:
            return {}
        state = {"rotation": self.matrix.detach().cpu().numpy()}
        if self.offset is not None:
            state["rotation_offset"] = self.offset.detach().cpu().numpy()
        return state

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], init: str, dim: int) -> "InputRotation":
        """Read ``rotation`` (and ``rotation_offset`` for a centred start) from saved weights.

        ``rotation`` must be there exactly when ``init == 'pca'``; files without an offset are uncentred starts.
        """
        if ("rotation" in state) != (init == "pca"):
            raise KeyError(f"config says init={init!r} but the weights {'have' if 'rotation' in state else 'lack'} a rotation")
        if "rotation" not in state:
            return cls(None)
        matrix = np.asarray(state["rotation"], dtype=np.float32)
        if matrix.shape != (dim, dim):
            raise ValueError(f"rotation must have shape ({dim}, {dim}); got {matrix.shape}.")
        offset = state.get("rotation_offset")
        if offset is not None:
            offset = np.asarray(offset, dtype=np.float32)
            if offset.shape != (dim,):
                raise ValueError(f"rotation_offset must have shape ({dim},); got {offset.shape}.")
        return cls(matrix, offset)


def resolved_pca_start(compressor: "Compressor") -> str:
    """The PCA start a method builds its :class:`InputRotation` with: the one selection chose, else the config's.

    ``'stronger'`` without a choice (no selection ran) is the uncentred start, as DIVE's.
    """
    chosen = getattr(compressor, "pca_start_", None)
    if chosen:
        return chosen
    configured = getattr(compressor.config, "pca_start", "uncentred")
    return "uncentred" if configured == "stronger" else configured


def pca_start_scores(holdout: TrainingData, doc_embeddings: np.ndarray, dim: int) -> dict[str, float]:
    """Held-out nDCG@10 of the uncentred and the centred PCA-k projections: a method's two possible epoch-0 maps.

    The residual adapters start as "read the first k rotated coordinates", so their epoch-0 map is
    one of these two whatever the method; scoring them here needs no training.
    """
    basis = corpus_pca_rotation(doc_embeddings, normalize_input=True)
    rotation, offset = basis[:, :dim], centred_start_bias(doc_embeddings, basis, True)[:dim]
    queries, docs = unit_rows(holdout.query_embeddings) @ rotation, unit_rows(holdout.doc_embeddings) @ rotation
    scores = {}
    for name, shift in (("uncentred", 0.0), ("centred", offset)):
        metrics = evaluate_embeddings(holdout.query_ids, unit_rows(queries + shift), holdout.doc_ids, unit_rows(docs + shift), holdout.qrels)
        scores[name] = float(metrics.aggregate["ndcg@10"])
    return scores


def _build_rotation(compressor: "Compressor", train: TrainingData) -> None:
    """(Re)build a rotated-adapter method's ``rotation_`` for the PCA start now known (selection may have chosen it)."""
    if hasattr(compressor, "rotation_") and getattr(compressor.config, "init", None) == "pca":
        compressor.rotation_ = InputRotation.fit("pca", train.doc_embeddings, resolved_pca_start(compressor))  # type: ignore[attr-defined]


def _choose_pca_start(compressor: "Compressor", holdout: TrainingData) -> None:
    """Set ``compressor.pca_start_`` for ``pca_start='stronger'`` from the two starts' held-out scores (ties: uncentred)."""
    config = compressor.config
    if getattr(config, "init", None) != "pca" or getattr(config, "pca_start", "uncentred") != "stronger":
        return
    scores = pca_start_scores(holdout, holdout.doc_embeddings, config.dim)
    compressor.pca_start_ = max(scores, key=lambda name: (scores[name], name == "uncentred"))  # type: ignore[attr-defined]
    compressor.pca_start_scores_ = {f"holdout_ndcg@10_{name}_start": value for name, value in scores.items()}  # type: ignore[attr-defined]
    logger.info("%s: %s PCA start (selection nDCG@10: uncentred %.4f, centred %.4f)", compressor.method, compressor.pca_start_,
                scores["uncentred"], scores["centred"])


def holdout_ndcg(compressor: "Compressor", holdout: TrainingData) -> float:
    """nDCG@10 of ``compressor`` (as it is now) on the held-out queries, over their whole corpus."""
    metrics = evaluate_embeddings(
        holdout.query_ids, compressor.transform(holdout.query_embeddings), holdout.doc_ids,
        compressor.transform(holdout.doc_embeddings), holdout.qrels,
    )
    return float(metrics.aggregate["ndcg@10"])


class EpochControl:
    """Counts epochs across ``run_epochs`` calls (a method's stages), scores candidates, stops at a budget.

    Epoch 0 is the state when :meth:`begin` is called (the untrained map); epoch ``n`` is the
    state after the ``n``-th epoch of any stage. With ``score``, every candidate epoch is scored
    and the best weights of ``modules`` are kept (strictly better only: ties keep the earlier,
    simpler map). With ``stop_at``, training stops after that many epochs in all.

    Args:
        score: returns the held-out score of the compressor as it is now (None: no selection).
        stop_at: the total number of epochs to train (None: every stage runs to its end).
    """

    def __init__(self, score: Callable[[], float] | None = None, stop_at: int | None = None) -> None:
        self.score = score
        self.stop_at = stop_at
        self.epoch = 0
        self.best_epoch: int | None = None
        self.best_score = -math.inf
        self.scores: dict[int, float] = {}
        self._modules: dict[str, nn.Module] = {}
        self._best_state: dict[str, dict[str, torch.Tensor]] | None = None
        self._extra: tuple[Callable[[], Any], Callable[[Any], None]] | None = None
        self._best_extra: Any = None
        #: Called before each candidate is scored (a method that must finish its map first, e.g. SMEC's selection).
        self.prepare: Callable[[], None] | None = None

    def begin(self, modules: dict[str, nn.Module], extra_state: tuple[Callable[[], Any], Callable[[Any], None]] | None = None) -> None:
        """Mark epoch 0: ``modules`` hold the initial map; score it when selecting.

        ``extra_state`` is a (get, set) pair for non-module state a candidate also needs (e.g.
        SMEC's selected indices); it is kept with the best weights and set back by :meth:`restore`.
        """
        self._modules, self._extra = modules, extra_state
        self._candidate(0)

    @property
    def exhausted(self) -> bool:
        """True once ``stop_at`` epochs have run."""
        return self.stop_at is not None and self.epoch >= self.stop_at

    def end_epoch(self, record: dict[str, Any], candidate: bool = True) -> None:
        """Count one epoch; score it (when ``candidate``) and add the score to its history ``record``."""
        self.epoch += 1
        record["global_epoch"] = self.epoch
        if candidate:
            score = self._candidate(self.epoch)
            if score is not None:
                record["holdout_ndcg@10"] = score

    def _candidate(self, epoch: int) -> float | None:
        if self.score is None:
            return None
        if self.prepare is not None:
            self.prepare()
        score = float(self.score())
        self.scores[epoch] = score
        if score > self.best_score:
            self.best_epoch, self.best_score = epoch, score
            self._best_state = {name: copy.deepcopy(module.state_dict()) for name, module in self._modules.items()}
            self._best_extra = copy.deepcopy(self._extra[0]()) if self._extra is not None else None
        logger.debug("epoch %d: holdout nDCG@10 %.4f%s", epoch, score, " (best so far)" if self.best_epoch == epoch else "")
        return score

    def restore(self) -> None:
        """Load the best candidate back: its module weights and its extra state."""
        if self._best_state is not None:
            for name, module in self._modules.items():
                module.load_state_dict(self._best_state[name])
            if self._extra is not None:
                self._extra[1](self._best_extra)


def fit_with_selection(
    compressor: "Compressor",
    train: TrainingData,
    val: TrainingData | None,
    train_once: Callable[[TrainingData, EpochControl], None],
) -> int | None:
    """Train ``compressor`` as its config's ``epoch_selection`` says; returns the selected epoch (None: 'last').

    ``train_once(data, control)`` trains fresh modules on ``data`` into ``compressor`` (it is
    called once, or twice with 'best': select, then refit).
    """
    config = compressor.config
    compressor.pca_start_ = None  # type: ignore[attr-defined]  # chosen afresh by every fit
    mode = getattr(config, "epoch_selection", "last")
    if mode == "last" or (mode == "best" and not train.has_queries):  # corpus-only data has no queries to select on
        _build_rotation(compressor, train)
        train_once(train, EpochControl())
        return None
    method = compressor.method
    if mode == "val":
        if val is None or not val.query_ids:
            raise ValueError(f"{method}: epoch_selection='val' selects on the val queries given to fit(train, val); none were given.")
        holdout, fit_part = val, train
    else:
        fit_part, holdout = holdout_split(train, config.selection_fraction, config.seed, method, rule=config.selection_holdout)
    _choose_pca_start(compressor, holdout)
    _build_rotation(compressor, train)
    logger.debug("%s: selecting the epoch (0 = the untrained start) on %d held-out queries", method, len(holdout.query_ids))
    control = EpochControl(score=lambda: holdout_ndcg(compressor, holdout))
    train_once(fit_part, control)
    best = control.best_epoch if control.best_epoch is not None else control.epoch
    if mode == "val":
        control.restore()
        logger.info("%s: kept epoch %d of %d (holdout nDCG@10 %.4f)", method, best, control.epoch, control.best_score)
        return best
    logger.info("%s: best epoch %d of %d (holdout nDCG@10 %.4f); refitting on all %d training queries",
                method, best, control.epoch, control.best_score, len(train.query_ids))
    train_once(train, EpochControl(stop_at=best))
    return best
