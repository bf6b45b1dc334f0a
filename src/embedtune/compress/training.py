"""The small torch training loop shared by the learned baselines.

Every learned baseline (autoencoder, Matryoshka-Adaptor, Search-Adaptor, SMEC) trains the same
way in the DIVE paper (§4.1): AdamW, batch size 128, 50 epochs. This module holds that loop once:

- :class:`TrainedCompressorConfig`: the shared config fields (epochs, batch size, learning
  rate, hidden width, device, progress bar) and the ``PRESETS`` / :meth:`preset` mechanism;
- :func:`seeded`: build modules under a seed without touching the global RNG;
- :func:`minibatches`: a seeded permutation per epoch, so two fits with one seed see the same
  batches in the same order;
- :func:`run_epochs`: AdamW over a step function that returns named loss terms, with a tqdm
  bar (``progress=False`` hides it) and a per-epoch history of mean terms.

Learned baselines L2-normalise their input rows first (:func:`unit_rows`): every evaluation in
the paper uses cosine similarity, and unit inputs make the L1 regularisers of Yoon et al.
comparable across backbones whose raw embedding norms differ.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embedtune.compress.base import CompressorConfig, check_output_dim  # noqa: F401  (re-exported; defined in base, torch-free)
from embedtune.compress.residual_mlp import ACTIVATIONS
from embedtune.runtime import progress_bar

if TYPE_CHECKING:
    from embedtune.compress.selection import EpochControl

logger = logging.getLogger(__name__)

__all__ = [
    "TrainedCompressorConfig",
    "check_output_dim",
    "minibatches",
    "module_state",
    "load_module_state",
    "resolve_device",
    "run_epochs",
    "seeded",
    "transform_in_batches",
    "unit_rows",
]

StepFn = Callable[[torch.Tensor, int], dict[str, torch.Tensor]]


@dataclass
class TrainedCompressorConfig(CompressorConfig):
    """Fields shared by every compressor trained with the loop in this module.

    Subclasses override defaults (``learning_rate``) and declare ``PRESETS``: a dict from preset
    name to field overrides; :meth:`preset` builds a config from one.
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    #: The smallest valid ``epochs`` (Matryoshka-Adaptor allows 0: its corpus stage alone).
    MIN_EPOCHS: ClassVar[int] = 1

    epochs: int = field(default=50, metadata={"help": "Passes over the training items per training stage."})
    batch_size: int = field(default=128, metadata={"help": "Training items (or triplets) per step."})
    learning_rate: float = field(default=2e-4, metadata={"help": "AdamW learning rate."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (PyTorch's default)."})
    hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden width of the MLP; None means d // 2, as in DIVE's adapter."}
    )
    activation: str = field(default="gelu", metadata={"help": f"Hidden activation: one of {sorted(ACTIVATIONS)}."})
    device: str = field(default="auto", metadata={"help": "Torch device for training and transform; 'auto' picks CUDA if present."})
    progress: bool = field(default=True, metadata={"help": "Show a tqdm progress bar over epochs."})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, least in (("epochs", self.MIN_EPOCHS), ("batch_size", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}; got {value!r}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive; got {self.learning_rate!r}.")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be non-negative; got {self.weight_decay!r}.")
        if self.hidden_dim is not None and (not isinstance(self.hidden_dim, int) or self.hidden_dim < 1):
            raise ValueError(f"hidden_dim must be a positive integer or None; got {self.hidden_dim!r}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}; got {self.activation!r}.")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as error:
                raise ValueError(
                    f"device must be 'auto' or a torch device string such as 'cpu' or 'cuda:0'; got {self.device!r}."
                ) from error

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "TrainedCompressorConfig":
        """Build a config from a named preset (``"dive-paper"``, ``"own-paper"``) plus overrides."""
        if name not in cls.PRESETS:
            raise ValueError(f"{cls.__name__}: unknown preset {name!r}; choose one of: {', '.join(cls.PRESETS)}.")
        return cls(**{**cls.PRESETS[name], **overrides})

    def hidden_width(self, input_dim: int) -> int:
        return self.hidden_dim if self.hidden_dim is not None else max(1, input_dim // 2)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block under ``torch.manual_seed(seed)``, restoring the global CPU RNG after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def unit_rows(X: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Float32 CPU tensor with L2-normalised rows."""
    # np.require copies read-only input (a memory map), which torch cannot wrap safely.
    tensor = torch.as_tensor(np.require(X, dtype=np.float32, requirements=["C", "W"])) if isinstance(X, np.ndarray) else X.float()
    return F.normalize(tensor, p=2, dim=-1)


def minibatches(n_items: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Index batches of one epoch, in a random order drawn from ``generator``."""
    order = torch.randperm(n_items, generator=generator)
    for start in range(0, n_items, batch_size):
        yield order[start : start + batch_size]


def run_epochs(
    parameters: Iterable[nn.Parameter] | Iterable[dict[str, Any]],
    step: StepFn,
    n_items: int,
    config: TrainedCompressorConfig,
    *,
    stage: str,
    epochs: int | None = None,
    seed_offset: int = 0,
    learning_rate: float | None = None,
    on_step: Callable[[], None] | None = None,
    control: "EpochControl | None" = None,
    candidate: bool = True,
) -> list[dict[str, Any]]:
    """Train with AdamW: for each epoch, call ``step(batch_indices, epoch)`` on every batch.

    ``step`` returns named scalar terms; ``"loss"`` is the one minimised. ``on_step`` runs after
    each optimiser step (e.g. a temperature schedule). Returns one record per epoch:
    ``{"stage", "epoch", "loss", <other terms>}``, each term averaged over the epoch's batches.

    ``control`` (:class:`embedtune.compress.selection.EpochControl`) counts epochs across
    stages, scores each one when ``candidate`` (best-epoch selection), and stops the loop once
    its ``stop_at`` budget is spent; the schedule (``epochs``) is unchanged by an early stop.
    """
    epochs = config.epochs if epochs is None else epochs
    optimizer = torch.optim.AdamW(
        parameters, lr=config.learning_rate if learning_rate is None else learning_rate, weight_decay=config.weight_decay
    )
    generator = torch.Generator().manual_seed(config.seed + seed_offset)
    history: list[dict[str, Any]] = []
    start = time.perf_counter()
    bar = progress_bar(epochs, stage, unit="epoch", enabled=config.progress)
    for epoch in range(epochs):
        if control is not None and control.exhausted:
            break
        totals: dict[str, float] = {}
        n_batches = 0
        for batch in minibatches(n_items, config.batch_size, generator):
            terms = step(batch, epoch)
            optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            optimizer.step()
            if on_step is not None:
                on_step()
            for name, value in terms.items():
                totals[name] = totals.get(name, 0.0) + float(value.detach())
            n_batches += 1
        record: dict[str, Any] = {"stage": stage, "epoch": epoch + 1}
        record.update({name: total / max(n_batches, 1) for name, total in totals.items()})
        if control is not None:
            control.end_epoch(record, candidate)
        history.append(record)
        bar.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}", refresh=False)
        bar.update(1)
    bar.close()
    logger.debug("%s: %d epochs over %d items in %.1fs", stage, epochs, n_items, time.perf_counter() - start)
    return history


@torch.no_grad()
def transform_in_batches(
    fn: Callable[[torch.Tensor], torch.Tensor], X: np.ndarray, device: torch.device, batch_size: int = 8192
) -> np.ndarray:
    """Apply ``fn`` to unit-normalised rows of ``X`` in batches; float32 numpy out."""
    parts = []
    for start in range(0, len(X), batch_size):
        batch = unit_rows(X[start : start + batch_size]).to(device)
        parts.append(fn(batch).float().cpu().numpy())
    if not parts:
        width = fn(torch.zeros(1, X.shape[1], device=device)).shape[1]
        return np.zeros((0, width), dtype=np.float32)
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def module_state(prefix: str, module: nn.Module) -> dict[str, np.ndarray]:
    """A module's parameters as numpy arrays named ``prefix.<name>``."""
    return {f"{prefix}.{name}": value.detach().cpu().numpy() for name, value in module.state_dict().items()}


def load_module_state(prefix: str, module: nn.Module, state: dict[str, np.ndarray]) -> None:
    """Load ``prefix.<name>`` arrays into ``module``; a missing or misshapen one raises KeyError/RuntimeError."""
    own = {name: torch.from_numpy(np.array(state[f"{prefix}.{name}"])) for name in module.state_dict()}
    module.load_state_dict(own, strict=True)
