"""The schema of a PACE run: :class:`PACEConfig`, one :class:`StageConfig` per stage, :class:`VLOptions`.

What each field means, how ``"auto"`` temperatures resolve (:meth:`StageConfig.resolve_temperature`,
the one place), how ``stage2_init`` names a Stage I checkpoint and how long a stage's schedule is.
The named recipes built from it live in :mod:`embedtune.finetune.presets`; the overview and the map
of the paper's settings onto these fields is :mod:`embedtune.finetune.config`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args

from embedtune.data.vl_inputs import task_instruction
from embedtune.finetune.loss_choices import NORMALIZATIONS, SIMILARITIES, WEIGHTINGS, Normalization, Similarity, Weighting
from embedtune.io import config_from_dict, load_config, save_config

__all__ = [
    "BACKBONES",
    "CONFIG_FILE",
    "HARDNESS_MODES",
    "LEGACY_VL_CONFIG_FILE",
    "LOSSES",
    "PAPER_MAX_IMAGE_PIXELS",
    "PAPER_MAX_SEQ_LENGTH",
    "PARAMETER_MODES",
    "PRECISIONS",
    "SCHEDULERS",
    "TINY_VL_MODELS",
    "PACEConfig",
    "StageConfig",
    "VLOptions",
    "parse_stage2_init",
    "resolve_stage2_init_step",
    "stage_steps",
    "steps_per_epoch",
]

# Each choice is declared once, as a type; the tuples that validate values are read from it (the
# similarity, weighting and normalisation choices are the loss's: embedtune.finetune.losses.focal_embedding).
BackboneFamily = Literal["text", "vl"]
ParameterMode = Literal["lora", "full"]
LossName = Literal["focal", "mnrl"]
Scheduler = Literal["linear", "constant"]
Precision = Literal["auto", "bf16", "fp32"]
BACKBONES: tuple[str, ...] = get_args(BackboneFamily)
PARAMETER_MODES: tuple[str, ...] = get_args(ParameterMode)
LOSSES: tuple[str, ...] = get_args(LossName)
SCHEDULERS: tuple[str, ...] = get_args(Scheduler)
PRECISIONS: tuple[str, ...] = get_args(Precision)
HARDNESS_MODES = (None, "in_batch_negatives", "hard_negatives", "all_negatives")
CONFIG_FILE = "pace_config.json"
LEGACY_VL_CONFIG_FILE = "vl_pace_config.json"  # written by releases before the two stacks merged

# ``model`` names that build a tiny random vision-language backbone offline (tests, smoke runs), by family.
TINY_VL_MODELS = {"tiny-qwen2-vl": "qwen2_vl", "tiny-qwen2.5-vl": "qwen2_5_vl", "tiny-qwen3-vl": "qwen3_vl", "tiny-qwen3.5": "qwen3_5"}

PAPER_MAX_IMAGE_PIXELS = 1_605_632
PAPER_MAX_SEQ_LENGTH = 8_192


@dataclass
class StageConfig:
    """One training stage: what is trained, with which similarity, loss and schedule."""

    similarity: Similarity = field(default="cosine", metadata={"help": "training similarity s_t: cosine (Eq. 1) or dot (Eq. 2)"})
    parameters: ParameterMode = field(default="lora", metadata={"help": "train a LoRA adapter or every language-model parameter"})
    steps: int | None = field(
        default=None, metadata={"help": "optimizer steps of this stage's schedule; None = `epochs` epochs; 0 = skip the stage (vl only)"}
    )
    epochs: float = field(default=1.0, metadata={"help": "schedule length in passes over the training tuples when steps is None"})
    learning_rate: float = field(default=2e-5, metadata={"help": "peak AdamW learning rate (paper: 2e-5 Stage I, 2e-6 Stage II)"})
    warmup_ratio: float = field(default=0.05, metadata={"help": "linear warmup, as a fraction of the stage's steps"})
    scheduler: Scheduler = field(default="linear", metadata={"help": "after warmup: linear decay to 0, or constant"})
    temperature: Union[float, str] = field(
        default=0.1,
        metadata={
            "help": "τ of the logits s/τ. A number, or 'auto' (dot only): τ = base_temperature × median(‖q‖·‖c‖) "
            "measured at the start of the stage, so the first logits match Stage I's scale. The paper's "
            "literal Stage II value is 100 (for a Qwen backbone's norms)."
        },
    )
    base_temperature: float = field(default=0.1, metadata={"help": "τ_1 that 'auto' scales (Stage I's temperature)"})
    weighting: Weighting = field(
        default="focal", metadata={"help": "focal (PACE), random / qp / qn (Figure 6b controls) or none (InfoNCE)"}
    )
    gamma: float = field(default=2.0, metadata={"help": "focal parameter γ (Table 7: 0.5, 2, 4)"})
    loss: LossName = field(
        default="focal",
        metadata={"help": "focal: embedtune's Focal Embedding Loss (weighting picks focal/InfoNCE/...); mnrl (text only): "
                          "sentence-transformers' MultipleNegativesRankingLoss with its hardness weighting (a baseline)"},
    )
    hardness_mode: str | None = field(
        default=None, metadata={"help": "mnrl only: None, 'in_batch_negatives', 'hard_negatives' or 'all_negatives'"}
    )
    hardness_strength: float = field(default=0.0, metadata={"help": "mnrl only: hardness_strength α (Lan et al. 9, EmbeddingGemma 5)"})

    @classmethod
    def migrate(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Earlier vision-language configs said ``lora: true/false`` for ``parameters``."""
        if "lora" in values and "parameters" not in values:
            values["parameters"] = "lora" if values.pop("lora") else "full"
        return values

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
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {list(SCHEDULERS)}; got {self.scheduler!r}.")
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 0):
            raise ValueError(f"steps must be >= 1, None (`epochs` epochs) or 0 (skip the stage, vl only); got {self.steps!r}.")
        if isinstance(self.epochs, bool) or not self.epochs > 0:
            raise ValueError(f"epochs must be > 0; got {self.epochs!r}.")
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

    @property
    def measures_temperature(self) -> bool:
        """Whether the stage's ``τ`` is measured on the model as the stage starts (``"auto"`` with the dot product)."""
        return self.temperature == "auto" and self.similarity == "dot"

    def resolve_temperature(self, norm_product_median: Callable[[], float] | None = None) -> tuple[float, float | None]:
        """The stage's ``τ``, and the median it was measured from (None when nothing was measured).

        The one rule for ``"auto"``, whichever backbone trains the stage: a number is itself; ``"auto"``
        with cosine is ``base_temperature`` (every norm product is 1); ``"auto"`` with the dot product is
        ``base_temperature × median(‖q‖·‖c‖)``, the median measured by calling ``norm_product_median``
        (on the model as the stage starts), so that the first dot logits sit at Stage I's cosine scale.
        """
        if self.temperature != "auto":
            return float(self.temperature), None
        if not self.measures_temperature:
            return float(self.base_temperature), None
        if norm_product_median is None:
            raise ValueError("temperature='auto' with the dot product is measured on the model; give norm_product_median.")
        median = float(norm_product_median())
        return self.base_temperature * median, median


@dataclass
class VLOptions:
    """Settings only a vision-language backbone has (``PACEConfig.vl``; required shape for ``backbone="vl"``).

    The vision tower and the projector always stay frozen, and LoRA goes on the language model's
    linear layers of the detected family (``lora_target_modules`` does not apply).
    """

    image_root: str | None = field(default=None, metadata={"help": "folder image paths are relative to (default: the data file's)"})
    task: str | None = field(default=None, metadata={"help": "file-level Table 5 task format, or 'auto' by dataset name (rows' own fields win)"})
    instruction: str = field(default="", metadata={"help": "file-level literal instruction (instead of task)"})
    max_image_pixels: int | None = field(default=None, metadata={"help": "resize images to at most this many pixels (paper: 1605632)"})

    def __post_init__(self) -> None:
        if self.instruction and self.task not in (None, "none"):
            raise ValueError(f"give instruction or task, not both (instruction={self.instruction!r}, task={self.task!r}).")
        if self.task not in (None, "none", "auto"):
            task_instruction(self.task)  # raises naming the accepted formats
        if self.max_image_pixels is not None and self.max_image_pixels < 1:
            raise ValueError(f"max_image_pixels must be >= 1 or None (no limit); got {self.max_image_pixels}.")


def _strict(cls: type, value: Any, name: str) -> Any:
    """A nested config given as a dict in code: unknown keys are an error here (a typo), not a warning."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, dict):
        values = cls.migrate(dict(value)) if hasattr(cls, "migrate") else dict(value)
        known = {item.name for item in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{name} has unknown keys {unknown}; valid keys are {sorted(known)}.")
        return cls(**values)
    raise ValueError(f"{name} must be a {cls.__name__}, a dict or None; got {type(value).__name__}.")


@dataclass
class PACEConfig:
    """The whole recipe: Stage I, then (optionally) Stage II from an intermediate Stage I checkpoint."""

    backbone: BackboneFamily = field(
        default="text", metadata={"help": "text: a sentence-transformers model; vl: a Qwen vision-language embedder (Qwen2/2.5/3-VL, Qwen3.5)"}
    )
    model: str = field(
        default="minilm",
        metadata={"help": f"text: 'minilm', 'mpnet' or a sentence-transformers folder; vl: a checkpoint folder, hub id or one of {sorted(TINY_VL_MODELS)}"},
    )
    data: str = field(default="scifact", metadata={"help": "text: BEIR folder, .zip or bundled name; vl: MMEB-train-style .jsonl or .parquet"})
    train_split: str = field(default="train", metadata={"help": "text only: qrels split that supplies (query, positive) pairs"})
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
    save_steps: int = field(default=500, metadata={"help": "text only: save a Stage I checkpoint every N steps (the init step is always saved)"})
    batch_size: int = field(default=32, metadata={"help": "queries per batch and process (paper: 32)"})
    mini_batch_size: int | None = field(default=None, metadata={"help": "text only: GradCache mini-batch size; None = no caching"})
    n_negatives: int | None = field(
        default=5, metadata={"help": "hard negatives per query (paper: 5); vl: the first N of each row, None = all of them"}
    )
    hard_pool: int = field(default=50, metadata={"help": "text only: negatives are drawn from the frozen model's top-N non-relevant docs"})
    max_seq_length: int | None = field(default=None, metadata={"help": "cap on tokens per text (vl: longer inputs are refused); None keeps the model's"})
    weight_temperature: float = field(default=0.1, metadata={"help": "τ_w of the cosine focal confidence p_i (Eq. 4)"})
    normalize: Normalization = field(default="global", metadata={"help": "unit-mean focal weights over the global batch or per process"})
    lora_rank: int = field(default=32, metadata={"help": "LoRA rank r (paper: 32)"})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha; None = 2 × rank"})
    lora_dropout: float = field(default=0.0, metadata={"help": "text only: LoRA dropout"})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "text only: PEFT target_modules ('all-linear': every linear layer of the transformer)"})
    lora_exclude_modules: str | None = field(
        default=r".*pooler.*", metadata={"help": "text only: regex of linear layers left without LoRA (BERT's pooler is never used by mean pooling)"}
    )
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "gradient clipping; None = off"})
    seed: int = field(default=2027, metadata={"help": "seed of training (data order, init, random weights) and mining"})
    logging_steps: int = field(default=1, metadata={"help": "text only: log loss components every N steps"})
    deepspeed: str | None = field(default=None, metadata={"help": "text only: DeepSpeed JSON config (GPU), e.g. configs/deepspeed_zero2.json"})
    precision: Precision = field(default="auto", metadata={"help": "auto: bf16 on a GPU that supports it, else fp32"})
    auto_temperature_samples: int = field(default=32, metadata={"help": "training examples embedded to measure median(‖q‖·‖c‖)"})
    vl: VLOptions | None = field(default=None, metadata={"help": "vision-language settings (images, instructions); set for backbone='vl' only"})
    preset: str = field(default="pace", metadata={"help": "name of the preset this config came from (informational)"})

    @classmethod
    def migrate(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Read the field names of earlier releases' ``vl_pace_config.json`` (its own schema)."""
        if "backbone" in values or not ({"train_data", "max_image_pixels"} & set(values)):
            return values
        values["backbone"] = "vl"
        if "train_data" in values:
            values["data"] = values.pop("train_data")
        values["vl"] = {key: values.pop(key) for key in ("image_root", "task", "instruction", "max_image_pixels") if key in values}
        gamma = values.pop("gamma", None)  # one γ for both stages then
        for name in ("stage1", "stage2"):
            stage = values.get(name)
            if isinstance(stage, dict) and gamma is not None:
                stage.setdefault("gamma", gamma)
        return values

    def __post_init__(self) -> None:
        if self.backbone not in BACKBONES:
            raise ValueError(f"backbone must be one of {list(BACKBONES)}; got {self.backbone!r}.")
        self.stage1 = _strict(StageConfig, self.stage1, "stage1")
        self.stage2 = _strict(StageConfig, self.stage2, "stage2")
        self.vl = _strict(VLOptions, self.vl, "vl")
        if self.stage1 is None:
            raise ValueError("stage1 is required; give a StageConfig (or dict) for Stage I.")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {list(NORMALIZATIONS)}; got {self.normalize!r}.")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}; got {self.precision!r}.")
        for name in ("batch_size", "hard_pool", "lora_rank", "save_steps", "logging_steps", "auto_temperature_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}.")
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be >= 1 or None; got {self.mini_batch_size}.")
        if self.max_seq_length is not None and self.max_seq_length < 1:
            raise ValueError(f"max_seq_length must be >= 1 or None (no limit); got {self.max_seq_length}.")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None; got {self.max_grad_norm}.")
        if not self.weight_temperature > 0:
            raise ValueError(f"weight_temperature must be > 0; got {self.weight_temperature}.")
        if self.backbone == "text":
            self._check_text()
        else:
            self._check_vl()
        self.stage2_init = parse_stage2_init(self.stage2_init)
        for stage in (self.stage1, self.stage2):
            if stage is not None and stage.temperature == "auto" and not stage.measures_temperature:
                stage.temperature, _ = stage.resolve_temperature()  # cosine: known now, nothing to measure
        if self.stage2 is None:
            if self.stop_stage1_at_init:
                warnings.warn("stop_stage1_at_init is ignored without a Stage II.", stacklevel=2)
                self.stop_stage1_at_init = False
        elif self.stop_stage1_at_init and self.stage2_init == "final":
            self.stop_stage1_at_init = False

    def _check_text(self) -> None:
        if self.vl is not None:
            raise ValueError("vl options are for backbone='vl'; drop vl= or set backbone='vl'.")
        if self.n_negatives is None or self.n_negatives < 1:
            raise ValueError(f"n_negatives must be >= 1; got {self.n_negatives}.")
        if self.hard_pool < self.n_negatives:
            raise ValueError(f"hard_pool ({self.hard_pool}) must be >= n_negatives ({self.n_negatives}).")
        for name, stage in (("stage1", self.stage1), ("stage2", self.stage2)):
            if stage is not None and stage.steps == 0:
                raise ValueError(f"{name}.steps must be >= 1 or None (one epoch); got 0.")
        if self.mini_batch_size is not None and self.deepspeed:
            from embedtune.finetune.losses.cached_focal_embedding import DEEPSPEED_GRADCACHE_MESSAGE  # heavy optional dependency: sentence-transformers

            raise ValueError(DEEPSPEED_GRADCACHE_MESSAGE)
        if self.deepspeed and not Path(self.deepspeed).is_file():
            raise FileNotFoundError(f"{self.deepspeed}: DeepSpeed config not found (the shipped one is configs/deepspeed_zero2.json).")

    def _check_vl(self) -> None:
        if self.vl is None:
            self.vl = VLOptions()
        if self.n_negatives is not None and self.n_negatives < 0:
            raise ValueError(f"n_negatives must be >= 0 or None (all); got {self.n_negatives}.")
        if self.stage2 is not None and self.stage2.parameters == "lora":
            raise ValueError("stage2.parameters='lora' is not supported for backbone='vl': PACE Stage II trains the full "
                             "language model; set stage2.parameters='full'.")
        for name, stage in (("stage1", self.stage1), ("stage2", self.stage2)):
            if stage is not None and stage.loss != "focal":
                raise ValueError(f"{name}.loss={stage.loss!r} is a sentence-transformers loss; backbone='vl' trains with loss='focal'.")
        for name in ("mini_batch_size", "deepspeed"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is not supported for backbone='vl' (its loop is single-process, without GradCache); drop it.")

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
        return save_config(self, directory, CONFIG_FILE)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PACEConfig:
        """Build from a saved dict; keys this version does not know (e.g. from a newer one) are dropped with a
        warning, and the field names of earlier releases' VL configs are read."""
        return config_from_dict(cls, values)

    @classmethod
    def load(cls, path: str | Path) -> PACEConfig:
        """From ``pace_config.json`` (or an earlier release's ``vl_pace_config.json``), or the folder holding it."""
        path = Path(path)
        if path.is_dir() and not (path / CONFIG_FILE).is_file() and (path / LEGACY_VL_CONFIG_FILE).is_file():
            path = path / LEGACY_VL_CONFIG_FILE
        return load_config(cls, path, CONFIG_FILE)


def resolve_stage2_init_step(stage2_init: Union[float, int, str], stage1_steps: int) -> int:
    """The Stage I step that ``stage2_init`` (a fraction, a step or ``"final"``) names."""
    if stage2_init == "final":
        return stage1_steps
    if isinstance(stage2_init, float):
        return max(1, min(stage1_steps, round(stage2_init * stage1_steps)))
    if stage2_init > stage1_steps:
        raise ValueError(f"stage2_init={stage2_init} is beyond Stage I's {stage1_steps} steps; lower it or use a fraction.")
    return int(stage2_init)


def parse_stage2_init(value: Union[float, int, str]) -> Union[float, int, str]:
    """``stage2_init`` from a number or a string (the CLI's): a fraction in (0, 1], a step >= 1, or ``"final"``."""
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


def steps_per_epoch(n_examples: int, batch_size: int, world_size: int = 1) -> int:
    return max(1, math.ceil(n_examples / (batch_size * world_size)))


def stage_steps(stage: StageConfig, n_examples: int, batch_size: int, world_size: int = 1) -> int:
    """The stage's schedule length: its ``steps``, or ``epochs`` passes over ``n_examples`` when steps is None."""
    if stage.steps is not None:
        return stage.steps
    return max(1, round(stage.epochs * steps_per_epoch(n_examples, batch_size, world_size)))

