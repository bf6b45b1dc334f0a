"""Typed configs of the PACE recipe, saved next to the trained model (PEFT-config style).

A :class:`PACEConfig` holds the shared settings (model, data, batch, LoRA, distribution) and one
:class:`StageConfig` per stage. :func:`preset_config` builds the paper's recipe, the two baselines
and every ablation of Table 2 and Figures 5-6 as flags of the same recipe.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from embedtune import __version__
from embedtune.finetune.losses.focal_embedding import NORMALIZATIONS, SIMILARITIES, WEIGHTINGS
from embedtune.io import atomic_write_json

logger = logging.getLogger(__name__)

__all__ = ["StageConfig", "PACEConfig", "PRESETS", "preset_config", "PARAMETER_MODES"]

PARAMETER_MODES = ("lora", "full")
LOSSES = ("focal", "mnrl")
HARDNESS_MODES = (None, "in_batch_negatives", "hard_negatives", "all_negatives")
CONFIG_FILE = "pace_config.json"


@dataclass
class StageConfig:
    """One training stage: what is trained, with which similarity, loss and schedule."""

    similarity: Literal["cosine", "dot"] = field(default="cosine", metadata={"help": "training similarity s_t: cosine (Eq. 1) or dot (Eq. 2)"})
    parameters: Literal["lora", "full"] = field(default="lora", metadata={"help": "train a LoRA adapter or every language-model parameter"})
    steps: int | None = field(default=None, metadata={"help": "optimizer steps of this stage's schedule; None = one epoch"})
    learning_rate: float = field(default=2e-5, metadata={"help": "peak AdamW learning rate (paper: 2e-5 Stage I, 2e-6 Stage II)"})
    warmup_ratio: float = field(default=0.05, metadata={"help": "linear warmup, as a fraction of the stage's steps"})
    temperature: Union[float, str] = field(
        default=0.1,
        metadata={
            "help": "τ of the logits s/τ. A number, or 'auto' (dot only): τ = base_temperature × median(‖q‖·‖c‖) "
            "measured at the start of the stage, so the first logits match Stage I's scale. The paper's "
            "literal Stage II value is 100 (for a Qwen backbone's norms)."
        },
    )
    base_temperature: float = field(default=0.1, metadata={"help": "τ_1 that 'auto' scales (Stage I's temperature)"})
    weighting: Literal["focal", "random", "qp", "qn", "none"] = field(
        default="focal", metadata={"help": "focal (PACE), random / qp / qn (Figure 6b controls) or none (InfoNCE)"}
    )
    gamma: float = field(default=2.0, metadata={"help": "focal parameter γ (Table 7: 0.5, 2, 4)"})
    loss: Literal["focal", "mnrl"] = field(
        default="focal",
        metadata={"help": "focal: embedtune's Focal Embedding Loss (weighting picks focal/InfoNCE/...); mnrl: "
                          "sentence-transformers' MultipleNegativesRankingLoss with its hardness weighting (a baseline)"},
    )
    hardness_mode: str | None = field(
        default=None, metadata={"help": "mnrl only: None, 'in_batch_negatives', 'hard_negatives' or 'all_negatives'"}
    )
    hardness_strength: float = field(default=0.0, metadata={"help": "mnrl only: hardness_strength α (Lan et al. 9, EmbeddingGemma 5)"})

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {list(LOSSES)}; got {self.loss!r}.")
        if self.hardness_mode not in HARDNESS_MODES:
            raise ValueError(f"hardness_mode must be one of {list(HARDNESS_MODES)}; got {self.hardness_mode!r}.")
        if self.hardness_strength < 0:
            raise ValueError(f"hardness_strength must be >= 0; got {self.hardness_strength}.")
        if self.loss == "focal" and self.hardness_mode is not None:
            raise ValueError("hardness_mode is a setting of loss='mnrl' (sentence-transformers' MNRL); set loss='mnrl' or drop it.")
        if self.loss == "mnrl" and self.similarity != "cosine":
            raise ValueError("loss='mnrl' is the cosine baseline; use similarity='cosine'.")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {list(SIMILARITIES)}; got {self.similarity!r}.")
        if self.parameters not in PARAMETER_MODES:
            raise ValueError(f"parameters must be one of {list(PARAMETER_MODES)}; got {self.parameters!r}.")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {list(WEIGHTINGS)}; got {self.weighting!r}.")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1 or None (one epoch); got {self.steps}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0; got {self.learning_rate}.")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1); got {self.warmup_ratio}.")
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0; got {self.gamma}.")
        if not self.base_temperature > 0:
            raise ValueError(f"base_temperature must be > 0; got {self.base_temperature}.")
        if isinstance(self.temperature, str):
            if self.temperature != "auto":
                try:
                    self.temperature = float(self.temperature)
                except ValueError:
                    raise ValueError(f"temperature must be a number > 0 or 'auto'; got {self.temperature!r}.") from None
        if isinstance(self.temperature, (int, float)):
            self.temperature = float(self.temperature)
            if not self.temperature > 0:
                raise ValueError(f"temperature must be > 0; got {self.temperature}.")
        if self.temperature == "auto" and self.similarity == "cosine":
            warnings.warn("temperature='auto' is meant for the dot product; with cosine it resolves to base_temperature.", stacklevel=2)


@dataclass
class PACEConfig:
    """The whole recipe: Stage I, then (optionally) Stage II from an intermediate Stage I checkpoint."""

    model: str = field(default="minilm", metadata={"help": "base model: 'minilm', 'mpnet' or a sentence-transformers folder"})
    data: str = field(default="scifact", metadata={"help": "BEIR folder, .zip or bundled name"})
    train_split: str = field(default="train", metadata={"help": "qrels split that supplies (query, positive) pairs"})
    output_dir: str = field(default="runs/pace", metadata={"help": "where stages, checkpoints and the final model go"})
    stage1: StageConfig = field(default_factory=StageConfig, metadata={"help": "Stage I (paper: cosine, LoRA r=32, lr 2e-5)"})
    stage2: StageConfig | None = field(
        default_factory=lambda: StageConfig(similarity="dot", parameters="full", learning_rate=2e-6, temperature="auto"),
        metadata={"help": "Stage II (paper: dot, full fine-tuning, lr 2e-6); None trains one stage only"},
    )
    stage2_init: Union[float, int, str] = field(
        default=0.25,
        metadata={
            "help": "Stage I checkpoint that Stage II starts from: a fraction of Stage I's steps (float in (0, 1]), "
            "a step (int >= 1), or 'final' (paper: step 2,000 of 7,847 ≈ 0.25)"
        },
    )
    stop_stage1_at_init: bool = field(
        default=False,
        metadata={"help": "end Stage I at the Stage II init checkpoint (same weights as the full run, less compute)"},
    )
    save_steps: int = field(default=500, metadata={"help": "save a Stage I checkpoint every N steps (the init step is always saved)"})
    batch_size: int = field(default=32, metadata={"help": "queries per batch and process (paper: 32)"})
    mini_batch_size: int | None = field(default=None, metadata={"help": "GradCache mini-batch size; None = no caching"})
    n_negatives: int = field(default=5, metadata={"help": "hard negatives per query (paper: 5)"})
    hard_pool: int = field(default=50, metadata={"help": "negatives are drawn from the frozen model's top-N non-relevant docs"})
    max_seq_length: int | None = field(default=None, metadata={"help": "cap on tokens per text; None keeps the model's"})
    weight_temperature: float = field(default=0.1, metadata={"help": "τ_w of the cosine focal confidence p_i (Eq. 4)"})
    normalize: Literal["global", "local"] = field(default="global", metadata={"help": "unit-mean focal weights over the global batch or per process"})
    lora_rank: int = field(default=32, metadata={"help": "LoRA rank r (paper: 32)"})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha; None = 2 × rank"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "PEFT target_modules ('all-linear': every linear layer of the transformer)"})
    lora_exclude_modules: str | None = field(
        default=r".*pooler.*", metadata={"help": "regex of linear layers left without LoRA (BERT's pooler is never used by mean pooling)"}
    )
    seed: int = field(default=2027, metadata={"help": "seed of training (data order, init, random weights) and mining"})
    logging_steps: int = field(default=1, metadata={"help": "log loss components every N steps"})
    deepspeed: str | None = field(default=None, metadata={"help": "DeepSpeed JSON config (GPU), e.g. configs/deepspeed_zero2.json"})
    precision: Literal["auto", "bf16", "fp32"] = field(default="auto", metadata={"help": "auto: bf16 on a GPU that supports it, else fp32"})
    auto_temperature_samples: int = field(default=32, metadata={"help": "training examples embedded to measure median(‖q‖·‖c‖)"})
    preset: str = field(default="pace", metadata={"help": "name of the preset this config came from (informational)"})

    def __post_init__(self) -> None:
        if isinstance(self.stage1, dict):
            self.stage1 = StageConfig(**self.stage1)
        if isinstance(self.stage2, dict):
            self.stage2 = StageConfig(**self.stage2)
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {list(NORMALIZATIONS)}; got {self.normalize!r}.")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be one of ['auto', 'bf16', 'fp32']; got {self.precision!r}.")
        for name in ("batch_size", "n_negatives", "hard_pool", "lora_rank", "save_steps", "logging_steps", "auto_temperature_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}.")
        if self.hard_pool < self.n_negatives:
            raise ValueError(f"hard_pool ({self.hard_pool}) must be >= n_negatives ({self.n_negatives}).")
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be >= 1 or None; got {self.mini_batch_size}.")
        if self.mini_batch_size is not None and self.deepspeed:
            from embedtune.finetune.losses.cached_focal_embedding import DEEPSPEED_GRADCACHE_MESSAGE  # heavy optional dependency: sentence-transformers

            raise ValueError(DEEPSPEED_GRADCACHE_MESSAGE)
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise FileNotFoundError(f"{self.deepspeed}: DeepSpeed config not found (the shipped one is configs/deepspeed_zero2.json).")
        if not self.weight_temperature > 0:
            raise ValueError(f"weight_temperature must be > 0; got {self.weight_temperature}.")
        self.stage2_init = _parse_init(self.stage2_init)
        if self.stage1.temperature == "auto" and self.stage1.similarity == "cosine":
            self.stage1.temperature = self.stage1.base_temperature
        if self.stage2 is not None and self.stage2.temperature == "auto" and self.stage2.similarity == "cosine":
            self.stage2.temperature = self.stage2.base_temperature
        if self.stage2 is None:
            if self.stop_stage1_at_init:
                warnings.warn("stop_stage1_at_init is ignored without a Stage II.", stacklevel=2)
                self.stop_stage1_at_init = False
        elif self.stop_stage1_at_init and self.stage2_init == "final":
            self.stop_stage1_at_init = False
        if self.stage1.weighting == "none" and (self.stage2 is None or self.stage2.weighting == "none") and self.normalize == "local":
            logger.debug("normalize has no effect with weighting='none'.")

    @property
    def resolved_lora_alpha(self) -> float:
        return float(self.lora_alpha) if self.lora_alpha is not None else 2.0 * self.lora_rank

    def stage2_init_step(self, stage1_steps: int) -> int:
        """The Stage I step whose checkpoint initialises Stage II."""
        return resolve_stage2_init_step(self.stage2_init, stage1_steps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, directory: str | Path) -> Path:
        """Write ``pace_config.json`` (indent 2, sorted keys, embedtune version stamped)."""
        return atomic_write_json(Path(directory) / CONFIG_FILE, {**self.to_dict(), "embedtune_version": __version__})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PACEConfig:
        """Build from a dict; keys this version does not know (e.g. from a newer one) are dropped with a warning."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = dict(values)
        values.pop("embedtune_version", None)
        unknown = sorted(set(values) - known)
        if unknown:
            warnings.warn(f"ignoring unknown PACE config keys {unknown} (written by another embedtune version?)", stacklevel=2)
        stage_known = {f.name for f in dataclasses.fields(StageConfig)}
        for stage in ("stage1", "stage2"):
            if isinstance(values.get(stage), dict):
                values[stage] = StageConfig(**{k: v for k, v in values[stage].items() if k in stage_known})
        return cls(**{k: v for k, v in values.items() if k in known})

    @classmethod
    def load(cls, path: str | Path) -> PACEConfig:
        path = Path(path)
        if path.is_dir():
            path = path / CONFIG_FILE
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


def resolve_stage2_init_step(stage2_init: Union[float, int, str], stage1_steps: int) -> int:
    """The Stage I step that ``stage2_init`` (a fraction, a step or ``"final"``) names, for text and VL recipes."""
    if stage2_init == "final":
        return stage1_steps
    if isinstance(stage2_init, float):
        return max(1, min(stage1_steps, round(stage2_init * stage1_steps)))
    if stage2_init > stage1_steps:
        raise ValueError(f"stage2_init={stage2_init} is beyond Stage I's {stage1_steps} steps; lower it or use a fraction.")
    return int(stage2_init)


def _parse_init(value: Union[float, int, str]) -> Union[float, int, str]:
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "final":
            return "final"
        try:
            value = int(text) if text.isdigit() else float(text)
        except ValueError:
            raise ValueError(f"stage2_init must be a fraction in (0, 1], a step >= 1, or 'final'; got {value!r}.") from None
    if isinstance(value, bool):
        raise ValueError("stage2_init must be a fraction, a step or 'final', not a bool.")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"stage2_init as a step must be >= 1; got {value}.")
        return value
    if isinstance(value, float):
        if value.is_integer() and value > 1:
            return int(value)
        if not 0 < value <= 1:
            raise ValueError(f"stage2_init as a fraction must be in (0, 1]; got {value}.")
        return value
    raise ValueError(f"stage2_init must be a fraction, a step or 'final'; got {value!r}.")


# Each preset changes only what its row of Table 2 / Figures 5-6 names.
PRESETS: dict[str, str] = {
    "pace": "Stage I cosine+LoRA (focal, lr 2e-5) → Stage II dot+full (focal, lr 2e-6) from 25% of Stage I",
    "infonce-lora": "baseline: one stage, cosine+LoRA, InfoNCE, lr 2e-5 (the VLM2Vec recipe)",
    "direct-dot-full": "baseline: one stage, dot+full, InfoNCE, lr 2e-5 (the paper's motivating failure)",
    "no-focal": "PACE w/o focal: InfoNCE in both stages",
    "no-dot": "PACE w/o dot: cosine in Stage II",
    "s2-lora": "PACE w/ S2 LoRA: Stage II trains a fresh LoRA adapter (on the merged Stage I weights) instead of all parameters",
    "dot-to-cos": "reversed similarity order: Stage I dot, Stage II cosine",
    "full-to-lora": "reversed parameter order: Stage I full, Stage II LoRA",
    "s2-from-final": "Stage II from the final Stage I checkpoint",
    "stage1-only": "Stage I alone (cosine+LoRA, focal): the setting of the focal-variant and γ ablations",
    "st-hardness": "baseline: one stage, cosine+LoRA, sentence-transformers' MNRL with hardness weighting "
                   "(hard_negatives, α=5 unless overridden), lr 2e-5",
}


def preset_config(
    name: str = "pace",
    *,
    stage1_steps: int | None = None,
    stage2_steps: int | None = None,
    steps: int | None = None,
    weighting: str | None = None,
    gamma: float | None = None,
    stage2_temperature: float | str | None = None,
    **overrides: Any,
) -> PACEConfig:
    """A :class:`PACEConfig` for a named recipe.

    Args:
        name: one of :data:`PRESETS`.
        stage1_steps, stage2_steps: the two stages' schedules (two-stage presets).
        steps: steps of a one-stage preset. By default, the optimizer updates on PACE's path to its
            final model: ``stage2_init_step(stage1_steps) + stage2_steps`` ("the same total steps").
        weighting, gamma: override every stage's loss weighting / ``γ``.
        stage2_temperature: Stage II ``τ`` (a number, e.g. the paper's literal 100, or ``"auto"``).
        overrides: any other :class:`PACEConfig` field.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
    stage1 = StageConfig(similarity="cosine", parameters="lora", steps=stage1_steps, learning_rate=2e-5, temperature=0.1)
    stage2: StageConfig | None = StageConfig(
        similarity="dot", parameters="full", steps=stage2_steps, learning_rate=2e-6, temperature="auto"
    )
    init = overrides.pop("stage2_init", 0.25)
    hardness_mode = overrides.pop("hardness_mode", "hard_negatives")
    hardness_strength = overrides.pop("hardness_strength", 5.0)
    if name in ("infonce-lora", "direct-dot-full", "stage1-only", "st-hardness"):
        if steps is None and name != "stage1-only":
            if stage1_steps is None or stage2_steps is None:
                raise ValueError(f"preset {name!r} needs steps=, or stage1_steps= and stage2_steps= to match PACE's total.")
            probe = PACEConfig(stage2_init=init, stage2=None)
            steps = probe.stage2_init_step(stage1_steps) + stage2_steps
        elif steps is None:
            steps = stage1_steps
        if name == "infonce-lora":
            stage1 = StageConfig(similarity="cosine", parameters="lora", steps=steps, learning_rate=2e-5, temperature=0.1, weighting="none")
        elif name == "st-hardness":
            stage1 = StageConfig(similarity="cosine", parameters="lora", steps=steps, learning_rate=2e-5, temperature=0.1,
                                 weighting="none", loss="mnrl", hardness_mode=hardness_mode, hardness_strength=hardness_strength)
        elif name == "direct-dot-full":
            stage1 = StageConfig(similarity="dot", parameters="full", steps=steps, learning_rate=2e-5, temperature="auto", weighting="none")
        else:
            stage1.steps = steps
        stage2 = None
    elif name == "no-focal":
        stage1.weighting = stage2.weighting = "none"
    elif name == "no-dot":
        stage2.similarity, stage2.temperature = "cosine", 0.1
    elif name == "s2-lora":
        stage2.parameters = "lora"
    elif name == "dot-to-cos":
        stage1.similarity, stage1.temperature = "dot", "auto"
        stage2.similarity, stage2.temperature = "cosine", 0.1
    elif name == "full-to-lora":
        stage1.parameters, stage2.parameters = "full", "lora"
    elif name == "s2-from-final":
        init = "final"
    for stage in (stage1, stage2):
        if stage is None:
            continue
        if weighting is not None:
            stage.weighting = weighting
        if gamma is not None:
            stage.gamma = gamma
    if stage2 is not None and stage2_temperature is not None:
        stage2.temperature = stage2_temperature
    stage1.__post_init__()
    if stage2 is not None:
        stage2.__post_init__()
    return PACEConfig(stage1=stage1, stage2=stage2, stage2_init=init, preset=name, **overrides)


def steps_per_epoch(n_examples: int, batch_size: int, world_size: int = 1) -> int:
    return max(1, math.ceil(n_examples / (batch_size * world_size)))
