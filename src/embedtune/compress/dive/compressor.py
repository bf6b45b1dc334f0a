"""DIVE as a registered compressor: :class:`DIVECompressor` (fit, head-1 transform, export,
save/load with its training log) and its presets, :data:`ROBUST` the default.

The training algorithms are the mixins of :mod:`embedtune.compress.dive.supervised` and
:mod:`embedtune.compress.dive.unsupervised`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedtune.compress.base import Compressor, TrainingData
from embedtune.compress.dive.config import DIVEConfig, resolve_heads
from embedtune.compress.dive.network import DIVEAdapter, DIVEEncoder, centred_start_bias, corpus_pca_rotation, pca_start_rows
from embedtune.compress.dive.supervised import SupervisedTraining
from embedtune.compress.dive.unsupervised import UnsupervisedTraining, holdout_documents
from embedtune.compress.export_layers import ExportLayer, residual_mlp_layers
from embedtune.compress.presets import MiningOptions, Preset
from embedtune.compress.quantization_aware import deployed_view
from embedtune.compress.registry import register
from embedtune.compress.training import resolve_device
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.io import atomic_write_bytes

__all__ = ["DIVECompressor", "ROBUST", "PRESETS", "TRAINING_LOG_NAME"]

TRAINING_LOG_NAME = "training_log.jsonl"
# Rows per forward pass in transform(); bounds the activation memory, not the result.
_TRANSFORM_BATCH = 8192


# The default recipe of `compress train`, `pipeline` and fit_compressor: DIVEConfig.PRESETS["robust"]
# plus triplets without likely false negatives (score above the query's lowest positive - 0.05)
# and at most 32 per query (benchmarks/RESULTS.md, "Beyond the paper").
ROBUST = Preset(
    "robust",
    DIVEConfig.PRESETS["robust"],
    MiningOptions(false_negative_margin=0.05, false_negative_reference="query-min", max_triplets_per_query=32),
    help="'best' plus the stronger PCA start and the epoch, both selected on training queries whose positives the fit "
         "never sees, false-negative-filtered and capped triplets (the default)",
)
#: The robust recipe from before positive-disjoint selection, by name: it learns this corpus's popular documents.
STATIC_CORPUS = Preset(
    "static-corpus",
    DIVEConfig.PRESETS["static-corpus"],
    ROBUST.mining,
    help="for a corpus that will not change: selected on queries that share the fit's positives, so it learns which "
         "documents are popular; documents added later rank below them (benchmarks/RESULTS.md, 'Seen and unseen')",
)
#: What compress fit/train say when static-corpus runs: its measured trade-off and what it costs later.
STATIC_CORPUS_WARNING = (
    "static-corpus learns which of this corpus's documents are popular. Measured against the default on SciFact "
    "(MiniLM, k=128, 3 seeds, benchmarks/RESULTS.md 'Seen and unseen'): seen queries +0.060 nDCG@10, unseen queries −0.022, "
    "documents added after the fit −0.024. Documents added later rank below the ones it learned: use it only for a "
    "corpus and queries that will not change."
)
PRESETS = {
    "paper": Preset("paper", DIVEConfig.PRESETS["paper"], help="the DIVE paper's settings (Table 2, §4.1)"),
    "best": Preset("best", DIVEConfig.PRESETS["best"], help="PCA-rotated init and margin 0.4, selected on validation queries"),
    "robust": ROBUST,
    "static-corpus": STATIC_CORPUS,
    "unsupervised": Preset("unsupervised", DIVEConfig.PRESETS["unsupervised"],
                           help="no labels: neighbour-rank distillation on the corpus, selected on held-out documents"),
    "unsupervised-guarded": Preset("unsupervised-guarded", DIVEConfig.PRESETS["unsupervised-guarded"],
                                   help="no labels, with the corpus text (--data, --model): 'unsupervised' plus the documents' "
                                        "pseudo-queries as anchors, and training kept only where held-out documents' pseudo-queries "
                                        "show it retrieves better than PCA"),
}


@register
class DIVECompressor(SupervisedTraining, UnsupervisedTraining, Compressor):
    """DIVE compressor: ``fit`` on triplets, ``transform`` with head 1 only.

    Attributes:
        adapter_ : DIVEAdapter, the trained residual adapter (weights ``up`` of shape (r, d),
            ``down`` of shape (d, r)).
        heads_ : int, the resolved number of heads H.
        history_ : list of dict, one diagnostics row per epoch (active ratio ρ(t), each loss
            term unweighted and weighted, total, ``val_ndcg@10`` when validating, seconds).
    """

    method = "dive"
    non_finite_input_reaches_output = True
    config_class = DIVEConfig
    supervised = True
    supports_unsupervised = True
    unsupervised_preset = "unsupervised"
    # With the documents' text: training kept only where held-out documents' pseudo-queries show that it pays
    # (at or above the stronger PCA in 8 of 10 label-free cells, against the plain preset's 5).
    unsupervised_text_preset = "unsupervised-guarded"
    # k-d heads need k * heads <= d: above d/2 one head fits, and the view loss needs two.
    wide_output_settings = {"heads": 1, "view_weight": 0.0}
    help = "DIVE: multi-head residual adapter with self-limiting updates (the default)"
    presets = PRESETS
    default_preset = "robust"
    config: DIVEConfig

    def __init__(self, config: DIVEConfig | None = None) -> None:
        super().__init__(config)
        self.adapter_: DIVEAdapter | None = None
        self.heads_: int | None = None
        self.selected_epoch_: int | None = None
        #: 'uncentred' or 'centred': the PCA start the adapter began from (None before a fit, or without init='pca').
        self.pca_start_: str | None = None
        self.pca_start_scores_: dict[str, float] = {}
        self.history_: list[dict[str, Any]] = []
        #: Rows of the corpus the PCA start was estimated from, and the documents the unsupervised mode trained on,
        #: where those were samples of a larger corpus (else None: every row).
        self.pca_rows_: int | None = None
        self.train_docs_: int | None = None
        self.training_guard_: dict[str, Any] | None = None
        self._log_path: Path | None = None
        # During a fit with init='pca': the adapter output bias of the centred start (centred_start_bias).
        self._centring: np.ndarray | None = None

    # -- public API -------------------------------------------------------------------------
    def fit(self, train: TrainingData, val: TrainingData | None = None, log_path: str | Path | None = None) -> "DIVECompressor":
        """Train on ``train.triplets`` and return ``self``.

        Args:
            train: embeddings and triplets (see :func:`embedtune.data.triplets.mine_triplets`).
            val: when given, its queries and whole corpus are transformed after every epoch and
                ``val_ndcg@10`` is recorded; on a large corpus this dominates the epoch time.
            log_path: when given, each epoch's diagnostics row is appended to this JSONL file.
        """
        self.input_dim_, self.adapter_, self.heads_, self.history_, self.selected_epoch_ = None, None, None, [], None
        self.pca_start_, self.pca_start_scores_, self.pca_rows_, self.train_docs_ = None, {}, None, None
        self.training_guard_ = None
        self._log_path = Path(log_path) if log_path is not None else None
        try:
            return super().fit(train, val)
        except BaseException:
            self.input_dim_ = None  # a failed fit must not look fitted
            raise
        finally:
            self._log_path, self._centring = None, None

    def torch_module(self) -> DIVEEncoder:
        """A CPU copy of the inference path as an ``nn.Module`` (for export), in eval mode."""
        self._check_fitted()
        return DIVEEncoder(copy.deepcopy(self.adapter_).cpu(), self.config.output_norm == "input").eval()

    def export_layers(self) -> list[ExportLayer] | None:
        """Head 1 as ``[Normalize]``, two ``Dense`` and ``Normalize`` (see :mod:`embedtune.compress.dive_export`).

        None with ``output_norm='input'``: scaling by the input norm has no built-in module.
        """
        self._check_fitted()
        if self.config.output_norm != "unit":
            return None
        adapter = self.adapter_
        return residual_mlp_layers(adapter.mlp, self.config.activation, np.arange(adapter.dim), adapter.rotation, adapter.normalize_input)

    def fit_details(self) -> dict[str, Any]:
        """The resolved head count H (with heads='auto' it depends on the input dimension); the unsupervised mode's start;
        on a corpus larger than a sample, the rows the PCA start and the unsupervised training read (``pca_rows``, ``train_docs``);
        with ``training_guard``, its verdict (whether the trained adapter or the PCA start was kept, and on what figures)."""
        details: dict[str, Any] = {"heads": int(self.heads_)} if self.heads_ is not None else {}
        if self.pca_rows_ is not None:
            details["pca_rows"] = int(self.pca_rows_)
        if self.train_docs_ is not None:
            details["train_docs"] = int(self.train_docs_)
        start = next((row["start"] for row in self.history_ if row.get("epoch") == 0 and "start" in row), None)
        if start is None and self.pca_start_scores_:  # the supervised mode chose between the two PCA starts
            start = self.pca_start_
        if start is not None:
            details["start"] = f"{start} PCA"
        if self.training_guard_ is not None:
            details["training_guard"] = dict(self.training_guard_)
            details["start"] = f"{self.training_guard_['start']} PCA"  # the guard may fall back on the other start
        return details

    def save(self, directory: str | Path) -> Path:
        directory = super().save(directory)
        log = directory / TRAINING_LOG_NAME
        if self.history_:
            text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in self.history_)
            atomic_write_bytes(log, text.encode("utf-8"))
        else:
            log.unlink(missing_ok=True)  # a log from an earlier save would describe other weights
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "DIVECompressor":
        estimator = super().load(directory)
        log = Path(directory) / TRAINING_LOG_NAME
        if log.is_file():
            estimator.history_ = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        return estimator

    # -- hooks ------------------------------------------------------------------------------
    @classmethod
    def unsupervised_config(cls, config: DIVEConfig) -> DIVEConfig:  # type: ignore[override]
        """``config`` in the unsupervised mode: PCA start and selection on held-out documents.

        Other settings (learning rate, epochs, the loss weights) are kept; the ``unsupervised``
        preset sets those too. For another start or selection, build
        ``DIVEConfig(mode="unsupervised", ...)`` and call :meth:`fit` on corpus-only data.
        """
        return dataclasses.replace(config, mode="unsupervised", init="pca", epoch_selection="best")

    def selection_documents(self, n_docs: int) -> np.ndarray:
        """Rows of an ``n_docs`` corpus that :meth:`fit_unsupervised` will hold out to select on (sorted).

        What pseudo-query selection (``selection_signal='pseudo-queries'``) needs pseudo-queries for;
        they depend only on ``n_docs`` and the config (its seed), so they are known before the fit.
        """
        return holdout_documents(n_docs, self.unsupervised_config(self.config))[0]

    def training_documents(self, n_docs: int) -> np.ndarray:
        """Rows of an ``n_docs`` corpus that :meth:`fit_unsupervised` will train on (sorted): the seeded sample of at most
        ``max_train_docs`` besides the held-out ones. What the pseudo-query anchors (``pseudo_query_weight > 0``) need
        pseudo-queries for; known before the fit, as :meth:`selection_documents` is."""
        return np.sort(holdout_documents(n_docs, self.unsupervised_config(self.config))[1])

    @property
    def is_unsupervised(self) -> bool:
        """True in the unsupervised mode (``mode='unsupervised'``): the fit reads corpus embeddings only."""
        return self.config.mode == "unsupervised"

    def _fit(self, train: TrainingData, val: TrainingData | None) -> None:
        config = self.config
        heads = resolve_heads(config.heads, config.max_heads, config.dim, train.dim, config.view_weight)
        if config.mode == "supervised":
            train.require_triplets(self.method)
        hidden_dim = config.hidden_dim or max(1, train.dim // 2)
        device = resolve_device(config.device)
        rotation = None
        if config.init == "pca":
            # Estimated on a sample of a large corpus (pca_start_rows): only those rows are read and normalised.
            rows = pca_start_rows(train.doc_embeddings, config.seed)
            rotation = corpus_pca_rotation(rows, config.normalize_input)
            self._centring = centred_start_bias(rows, rotation, config.normalize_input)
            self.pca_rows_ = len(rows) if len(rows) < len(train.doc_embeddings) else None
            del rows
        self.heads_ = heads
        self.selected_epoch_ = None
        if config.mode == "unsupervised":
            self.selected_epoch_ = self._fit_corpus(train, val, heads, hidden_dim, rotation, device)
            return
        self._fit_supervised(train, val, heads, hidden_dim, rotation, device)

    def _validate(self, val: TrainingData) -> float:
        # Score what is deployed: with quantization_aware, the documents at that precision.
        queries, docs = deployed_view(self.config.quantization_aware, self.transform(val.query_embeddings), self.transform(val.doc_embeddings))
        metrics = evaluate_embeddings(val.query_ids, queries, val.doc_ids, docs, val.qrels)
        return float(metrics.aggregate["ndcg@10"])

    def _append_log(self, row: dict[str, Any]) -> None:
        if self._log_path is None:
            return
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")

    def _transform(self, X: np.ndarray) -> np.ndarray:
        adapter = self.adapter_
        device = next(adapter.parameters()).device
        was_training = adapter.training
        adapter.eval()
        parts = []
        with torch.no_grad():
            for lo in range(0, len(X), _TRANSFORM_BATCH):
                # np.require copies read-only blocks (e.g. from a memory map), which torch cannot wrap safely.
                batch = torch.from_numpy(np.require(X[lo : lo + _TRANSFORM_BATCH], requirements="W")).to(device)
                # The base class L2-normalises once, so an identity adapter returns normalize(X[:, :k]) bit for bit.
                parts.append(adapter.head_one(batch, normalize=False).cpu().numpy())
        adapter.train(was_training)
        return np.concatenate(parts) if parts else np.zeros((0, self.config.dim), np.float32)

    def transform_validated(self, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Head 1 of ``X``: unit rows, or with ``output_norm='input'`` rows of the input's norm."""
        result = super().transform_validated(X, out=out)
        if self.config.output_norm == "input":
            norms = np.linalg.norm(X, axis=1, keepdims=True)
            np.multiply(result, norms, out=result)
        return result

    def _state_dict(self) -> dict[str, np.ndarray]:
        state = {f"adapter.{name}": tensor.detach().cpu().numpy() for name, tensor in self.adapter_.state_dict().items()}
        state["heads_"] = np.array([self.heads_], dtype=np.int64)
        if self.selected_epoch_ is not None:
            state["selected_epoch_"] = np.array([self.selected_epoch_], dtype=np.int64)
        return state

    def _load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        required = {"heads_", "adapter.mlp.up.weight", "adapter.mlp.up.bias", "adapter.mlp.down.weight", "adapter.mlp.down.bias"}
        optional = {"adapter.rotation", "selected_epoch_"}
        if not required <= set(state) or set(state) - required - optional:
            raise KeyError(f"expected tensors {sorted(required)} (optionally {sorted(optional)}), found {sorted(state)}")
        if ("adapter.rotation" in state) != (self.config.init == "pca"):
            raise KeyError(f"config.json says init={self.config.init!r} but the weights {'have' if 'adapter.rotation' in state else 'lack'} a rotation")
        heads = int(np.asarray(state["heads_"]).reshape(-1)[0])
        hidden_dim, input_dim = state["adapter.mlp.up.weight"].shape
        if input_dim != self.input_dim_:
            raise ValueError(f"the adapter takes {input_dim}-d input but config.json says input_dim={self.input_dim_}")
        if heads < 1 or self.config.dim * heads > input_dim:
            raise ValueError(f"heads_={heads} does not fit dim={self.config.dim} in {input_dim}-d input")
        adapter = DIVEAdapter(input_dim, self.config.dim, heads, hidden_dim, self.config.activation, self.config.normalize_input)
        if "adapter.rotation" in state:
            adapter.set_rotation(state["adapter.rotation"])
        adapter.load_state_dict(
            {name.removeprefix("adapter."): torch.from_numpy(np.array(value)) for name, value in state.items() if name.startswith("adapter.")}
        )
        self.adapter_ = adapter.to(resolve_device(self.config.device)).eval()
        self.heads_ = heads
        self.selected_epoch_ = int(np.asarray(state["selected_epoch_"]).reshape(-1)[0]) if "selected_epoch_" in state else None

    def _check_fitted(self) -> None:
        super()._check_fitted()
        if self.adapter_ is None:
            raise RuntimeError("This DIVECompressor is not fitted yet; call fit(train) first.")
