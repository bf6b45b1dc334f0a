"""Typed, validated configs of the vision-language PACE recipe, saved as ``vl_pace_config.json``.

Mirrors :mod:`embedtune.finetune.config` (the text recipe) for the plain single-process VL loop of
:mod:`embedtune.finetune.vl_recipe`. :func:`vl_preset_config` builds the paper's setting (Appendix A,
Table 3) and its baselines (Table 4) as flags of one config; the JSON saved next to the weights
records exactly what was run, and :meth:`VLPACEConfig.load` reads it back.

Paper settings (Table 3) and how they map here:

=====================  ======================  ==========================================
Setting                Paper                   Field
=====================  ======================  ==========================================
Stage I                cosine, LoRA r=32,      ``stage1`` (similarity, lora, learning_rate,
                       lr 2e-5, τ 0.1          temperature), ``lora_rank``
Stage II               dot, full LM, lr 2e-6,  ``stage2``
                       τ 100
Stage II init          Stage I step 2,000      ``stage2_init`` = 0.25 (2,000 / 7,847 steps)
Epochs / warmup        1 per stage / 0.05      ``steps=None`` (one epoch), ``warmup_ratio``
Batch / negatives      32 / 5                  ``batch_size``, ``n_negatives``
Loss                   focal, γ 2, global      ``weighting``, ``gamma`` (weights normalised
                                               over the batch)
Max seq / image px     8,192 / 1,605,632       ``max_seq_length``, ``max_image_pixels``
Precision              bf16                    ``precision`` ("auto": bf16 autocast on GPU)
Frozen                 vision encoder,         always (not configurable)
                       projector
=====================  ======================  ==========================================

The paper's batch of 32 is per GPU on 8 GPUs; this loop is one process, so ``batch_size`` is the
whole in-batch-negative pool of a step.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from embedtune import __version__
from embedtune.data.vl_inputs import task_instruction
from embedtune.finetune.config import _parse_init, resolve_stage2_init_step
from embedtune.finetune.losses.focal_embedding import SIMILARITIES, WEIGHTINGS
from embedtune.io import atomic_write_json

__all__ = ["VL_CONFIG_FILE", "VL_PRESETS", "VLStageConfig", "VLPACEConfig", "vl_preset_config", "TINY_MODELS"]

VL_CONFIG_FILE = "vl_pace_config.json"

# ``model`` names that build a tiny random backbone offline (tests, smoke runs), by family.
TINY_MODELS = {"tiny-qwen2-vl": "qwen2_vl", "tiny-qwen2.5-vl": "qwen2_5_vl", "tiny-qwen3-vl": "qwen3_vl", "tiny-qwen3.5": "qwen3_5"}

PAPER_MAX_IMAGE_PIXELS = 1_605_632
PAPER_MAX_SEQ_LENGTH = 8_192


@dataclass
class VLStageConfig:
    """One stage of the VL recipe."""

    steps: int | None = field(default=10, metadata={"help": "optimiser steps; None = one epoch over the training set"})
    learning_rate: float = field(default=1e-4, metadata={"help": "peak AdamW learning rate (paper: 2e-5 Stage I, 2e-6 Stage II)"})
    similarity: Literal["cosine", "dot"] = field(default="cosine", metadata={"help": "training similarity s_t"})
    temperature: float = field(default=0.02, metadata={"help": "τ_t of the contrastive logits (paper: 0.1 Stage I, 100 Stage II)"})
    lora: bool = field(default=True, metadata={"help": "LoRA on the language model (Stage I) or full LM training (Stage II)"})
    warmup_ratio: float = field(default=0.0, metadata={"help": "linear warmup as a fraction of the stage's steps (paper: 0.05)"})
    scheduler: Literal["linear", "constant"] = field(default="linear", metadata={"help": "linear decay to 0 after warmup, or constant"})
    weighting: Literal["focal", "random", "qp", "qn", "none"] = field(default="focal", metadata={"help": "focal (PACE) or none (InfoNCE)"})

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {list(SIMILARITIES)}; got {self.similarity!r}.")
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 0):
            raise ValueError(f"steps must be >= 0, or None for one epoch; got {self.steps!r}.")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0; got {self.temperature}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0; got {self.learning_rate}.")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1); got {self.warmup_ratio}.")
        if self.scheduler not in ("linear", "constant"):
            raise ValueError(f"scheduler must be 'linear' or 'constant'; got {self.scheduler!r}.")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {list(WEIGHTINGS)}; got {self.weighting!r}.")


def _stage(value: Any, name: str) -> VLStageConfig | None:
    if value is None or isinstance(value, VLStageConfig):
        return value
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(VLStageConfig)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{name} has unknown keys {unknown}; valid keys are {sorted(known)}.")
        return VLStageConfig(**value)
    raise ValueError(f"{name} must be a VLStageConfig, a dict or None; got {type(value).__name__}.")


@dataclass
class VLPACEConfig:
    """The whole VL recipe: model, data, both stages, loss, batching and precision."""

    stage1: VLStageConfig = field(default_factory=lambda: VLStageConfig(similarity="cosine", lora=True), metadata={"help": "Stage I"})
    stage2: VLStageConfig | None = field(
        default_factory=lambda: VLStageConfig(similarity="dot", lora=False, learning_rate=1e-5),
        metadata={"help": "Stage II (must train the full LM: lora=False); None trains Stage I only"},
    )
    batch_size: int = field(default=4, metadata={"help": "queries per step (in-batch negatives)"})
    gamma: float = field(default=2.0, metadata={"help": "focal γ"})
    weight_temperature: float = field(default=0.1, metadata={"help": "τ_w of the cosine confidence p_i"})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank (paper: 32)"})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha; default 2 * rank"})
    seed: int = field(default=0, metadata={"help": "seed of the data order and of tiny random backbones"})
    model: str = field(default="tiny-qwen2-vl", metadata={"help": f"checkpoint folder / hub id, or one of {sorted(TINY_MODELS)}"})
    train_data: str | None = field(default=None, metadata={"help": "MMEB-train-style .jsonl or .parquet"})
    image_root: str | None = field(default=None, metadata={"help": "folder image paths are relative to (default: the data file's)"})
    task: str | None = field(default=None, metadata={"help": "file-level Table 5 task format or 'auto' (rows' own fields win)"})
    instruction: str = field(default="", metadata={"help": "file-level literal instruction (instead of task)"})
    output_dir: str = field(default="runs/pace-vl", metadata={"help": "where stage checkpoints, model/ and result.json go"})
    stage2_init: Union[float, int, str] = field(
        default="final", metadata={"help": "Stage I checkpoint for Stage II: fraction of Stage I steps, a step, or 'final' (paper: 0.25)"}
    )
    stop_stage1_at_init: bool = field(default=False, metadata={"help": "end Stage I at the Stage II init step (same final model, less compute)"})
    n_negatives: int | None = field(default=None, metadata={"help": "hard negatives per query (first N of each row); None = all (paper: 5)"})
    max_seq_length: int | None = field(default=None, metadata={"help": "refuse longer inputs (paper: 8192)"})
    max_image_pixels: int | None = field(default=None, metadata={"help": "resize images to at most this many pixels (paper: 1605632)"})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "gradient clipping; None = off"})
    precision: Literal["auto", "bf16", "fp32"] = field(default="auto", metadata={"help": "auto: bf16 autocast on a GPU that supports it"})
    preset: str = field(default="custom", metadata={"help": "the preset this config came from (informational)"})

    def __post_init__(self) -> None:
        self.stage1 = _stage(self.stage1, "stage1")
        self.stage2 = _stage(self.stage2, "stage2")
        if self.stage1 is None:
            raise ValueError("stage1 is required; give a VLStageConfig (or dict) for Stage I.")
        if self.stage2 is not None and self.stage2.lora:
            raise ValueError("stage2.lora=True is not supported: PACE Stage II trains the full language model; set stage2.lora=False.")
        for name in ("batch_size", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}.")
        for name in ("n_negatives",):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None (all); got {value}.")
        for name in ("max_seq_length", "max_image_pixels"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None (no limit); got {value}.")
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0; got {self.gamma}.")
        if not self.weight_temperature > 0:
            raise ValueError(f"weight_temperature must be > 0; got {self.weight_temperature}.")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None; got {self.max_grad_norm}.")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be one of ['auto', 'bf16', 'fp32']; got {self.precision!r}.")
        if self.instruction and self.task not in (None, "none"):
            raise ValueError(f"give instruction or task, not both (instruction={self.instruction!r}, task={self.task!r}).")
        if self.task not in (None, "none", "auto"):
            task_instruction(self.task)  # raises naming the accepted formats
        self.stage2_init = _parse_init(self.stage2_init)
        if self.stage2 is None and self.stop_stage1_at_init:
            warnings.warn("stop_stage1_at_init is ignored without a Stage II.", stacklevel=2)
            self.stop_stage1_at_init = False

    @property
    def resolved_lora_alpha(self) -> float:
        return float(self.lora_alpha) if self.lora_alpha is not None else 2.0 * self.lora_rank

    def stage2_init_step(self, stage1_steps: int) -> int:
        """The Stage I step whose weights initialise Stage II."""
        return resolve_stage2_init_step(self.stage2_init, stage1_steps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, directory: str | Path) -> Path:
        """Write ``vl_pace_config.json`` (sorted keys, embedtune version stamped)."""
        return atomic_write_json(Path(directory) / VL_CONFIG_FILE, {**self.to_dict(), "embedtune_version": __version__})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> VLPACEConfig:
        """Build from a dict; unknown top-level keys (another embedtune version) are dropped with a warning."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in values.items() if key != "embedtune_version"}
        unknown = sorted(set(values) - known)
        if unknown:
            warnings.warn(f"ignoring unknown VL PACE config keys {unknown} (written by another embedtune version?)", stacklevel=2)
        return cls(**{key: value for key, value in values.items() if key in known})

    @classmethod
    def load(cls, path: str | Path) -> VLPACEConfig:
        """From ``vl_pace_config.json`` or the folder holding it."""
        path = Path(path)
        if path.is_dir():
            path = path / VL_CONFIG_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no VL PACE config (written by `embedtune finetune pace-vl` as {VL_CONFIG_FILE}).")
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


VL_PRESETS: dict[str, str] = {
    "pace": "paper (Table 3): Stage I cosine+LoRA r32 (focal γ2, lr 2e-5, τ 0.1) → Stage II dot+full LM (lr 2e-6, τ 100) from 25% of Stage I",
    "vlm2vec": "baseline (Table 4): one stage, cosine+LoRA r32, InfoNCE, lr 2e-5, τ 0.1",
    "no-focal": "PACE with InfoNCE in both stages (Table 2, w/o focal)",
    "stage1-only": "PACE Stage I alone (cosine+LoRA, focal)",
}


def vl_preset_config(name: str = "pace", *, stage1_steps: int | None = None, stage2_steps: int | None = None,
                     stage1_learning_rate: float | None = None, stage2_learning_rate: float | None = None,
                     stage1_temperature: float | None = None, stage2_temperature: float | None = None,
                     warmup_ratio: float | None = None, **overrides: Any) -> VLPACEConfig:
    """A :class:`VLPACEConfig` for a named recipe, with the paper's Appendix A values.

    Args:
        name: one of :data:`VL_PRESETS`.
        stage1_steps, stage2_steps: schedule lengths (None: one epoch each, as in the paper).
        stage1_learning_rate, stage2_learning_rate, stage1_temperature, stage2_temperature, warmup_ratio:
            per-stage overrides.
        overrides: any other :class:`VLPACEConfig` field (``model``, ``train_data``, ``batch_size``, ...).
    """
    if name not in VL_PRESETS:
        raise ValueError(f"preset={name!r} is unknown; choose one of {sorted(VL_PRESETS)}.")
    warmup = 0.05 if warmup_ratio is None else warmup_ratio
    stage1 = dict(steps=stage1_steps, learning_rate=2e-5, similarity="cosine", temperature=0.1, lora=True, warmup_ratio=warmup)
    stage2: dict[str, Any] | None = dict(steps=stage2_steps, learning_rate=2e-6, similarity="dot", temperature=100.0, lora=False, warmup_ratio=warmup)
    if name == "vlm2vec":
        stage1["weighting"], stage2 = "none", None
    elif name == "no-focal":
        stage1["weighting"] = stage2["weighting"] = "none"
    elif name == "stage1-only":
        stage2 = None
    for stage, learning_rate, temperature in ((stage1, stage1_learning_rate, stage1_temperature), (stage2, stage2_learning_rate, stage2_temperature)):
        if stage is None:
            continue
        if learning_rate is not None:
            stage["learning_rate"] = learning_rate
        if temperature is not None:
            stage["temperature"] = temperature
    values: dict[str, Any] = dict(
        stage1=VLStageConfig(**stage1), stage2=VLStageConfig(**stage2) if stage2 else None, batch_size=32, gamma=2.0,
        weight_temperature=0.1, lora_rank=32, stage2_init=0.25, n_negatives=5, max_seq_length=PAPER_MAX_SEQ_LENGTH,
        max_image_pixels=PAPER_MAX_IMAGE_PIXELS, precision="auto", preset=name,
    )
    values.update(overrides)
    return VLPACEConfig(**values)
