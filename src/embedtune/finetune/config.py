"""One typed config for PACE on every backbone, saved next to the trained model (PEFT-config style).

A :class:`PACEConfig` holds the shared settings (model, data, batch, LoRA, precision) and one
:class:`StageConfig` per stage. ``backbone`` names the family: ``"text"`` (a sentence-transformers
model trained with its trainer) or ``"vl"`` (a Qwen vision-language embedder, paper §3.4, trained by a
plain single-process loop). The few settings only a vision-language backbone has live in
:class:`VLOptions` (``config.vl``); fields marked "text only" are ignored by, or refused for, ``"vl"``.

``temperature`` means one thing everywhere: the ``τ`` of the logits ``s / τ``. ``"auto"`` (dot stages)
resolves at the start of the stage to ``base_temperature × median(‖q‖·‖c‖)`` on a sample of training
pairs, for every backbone.

:func:`preset_config` builds the paper's recipe, its baselines and every ablation of Table 2 and
Figures 5-6 for either backbone; the saved JSON (``pace_config.json``) records exactly what was run
and :meth:`PACEConfig.load` reads it back, including the files of earlier releases
(``vl_pace_config.json`` and its field names).

Paper settings (Appendix A, Table 3) and how they map here:

=====================  ======================  ==========================================
Setting                Paper                   Field
=====================  ======================  ==========================================
Stage I                cosine, LoRA r=32,      ``stage1`` (similarity, parameters,
                       lr 2e-5, τ 0.1          learning_rate, temperature), ``lora_rank``
Stage II               dot, full LM, lr 2e-6,  ``stage2`` (τ: "auto" for text backbones;
                       τ 100                   the literal 100 in the VL presets)
Stage II init          Stage I step 2,000      ``stage2_init`` = 0.25 (2,000 / 7,847 steps)
Epochs / warmup        1 per stage / 0.05      ``steps=None`` (``epochs``, 1), ``warmup_ratio``
Batch / negatives      32 / 5                  ``batch_size``, ``n_negatives``
Loss                   focal, γ 2, global      ``weighting``, ``gamma``, ``normalize``
Max seq / image px     8,192 / 1,605,632       ``max_seq_length``, ``vl.max_image_pixels``
Precision              bf16                    ``precision`` ("auto": bf16 on a GPU)
Frozen (VL)            vision encoder,         always (not configurable)
                       projector
=====================  ======================  ==========================================
"""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from embedtune.data.vl_inputs import task_instruction
from embedtune.finetune.losses.focal_embedding import NORMALIZATIONS, SIMILARITIES, WEIGHTINGS
from embedtune.io import config_from_dict, load_config, save_config

logger = logging.getLogger(__name__)

__all__ = [
    "BACKBONES",
    "CONFIG_FILE",
    "DEFAULT_PRESETS",
    "LEGACY_VL_CONFIG_FILE",
    "PARAMETER_MODES",
    "PRESETS",
    "TINY_VL_MODELS",
    "PACEConfig",
    "StageConfig",
    "VLOptions",
    "parse_stage2_init",
    "preset_config",
    "resolve_stage2_init_step",
    "steps_per_epoch",
    # deprecated aliases of the former vision-language config module
    "VLPACEConfig",
    "VLStageConfig",
    "VL_PRESETS",
    "vl_preset_config",
]

BACKBONES = ("text", "vl")
PARAMETER_MODES = ("lora", "full")
LOSSES = ("focal", "mnrl")
SCHEDULERS = ("linear", "constant")
HARDNESS_MODES = (None, "in_batch_negatives", "hard_negatives", "all_negatives")
PRECISIONS = ("auto", "bf16", "fp32")
CONFIG_FILE = "pace_config.json"
LEGACY_VL_CONFIG_FILE = "vl_pace_config.json"  # written by releases before the two stacks merged

# ``model`` names that build a tiny random vision-language backbone offline (tests, smoke runs), by family.
TINY_VL_MODELS = {"tiny-qwen2-vl": "qwen2_vl", "tiny-qwen2.5-vl": "qwen2_5_vl", "tiny-qwen3-vl": "qwen3_vl", "tiny-qwen3.5": "qwen3_5"}

PAPER_MAX_IMAGE_PIXELS = 1_605_632
PAPER_MAX_SEQ_LENGTH = 8_192


@dataclass
class StageConfig:
    """One training stage: what is trained, with which similarity, loss and schedule."""

    similarity: Literal["cosine", "dot"] = field(default="cosine", metadata={"help": "training similarity s_t: cosine (Eq. 1) or dot (Eq. 2)"})
    parameters: Literal["lora", "full"] = field(default="lora", metadata={"help": "train a LoRA adapter or every language-model parameter"})
    steps: int | None = field(
        default=None, metadata={"help": "optimizer steps of this stage's schedule; None = `epochs` epochs; 0 = skip the stage (vl only)"}
    )
    epochs: float = field(default=1.0, metadata={"help": "schedule length in passes over the training tuples when steps is None"})
    learning_rate: float = field(default=2e-5, metadata={"help": "peak AdamW learning rate (paper: 2e-5 Stage I, 2e-6 Stage II)"})
    warmup_ratio: float = field(default=0.05, metadata={"help": "linear warmup, as a fraction of the stage's steps"})
    scheduler: Literal["linear", "constant"] = field(default="linear", metadata={"help": "after warmup: linear decay to 0, or constant"})
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

    backbone: Literal["text", "vl"] = field(
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
    normalize: Literal["global", "local"] = field(default="global", metadata={"help": "unit-mean focal weights over the global batch or per process"})
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
    precision: Literal["auto", "bf16", "fp32"] = field(default="auto", metadata={"help": "auto: bf16 on a GPU that supports it, else fp32"})
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
            if stage is not None and stage.temperature == "auto" and stage.similarity == "cosine":
                stage.temperature = stage.base_temperature
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


# Each preset changes only what its row of Table 2 / Figures 5-6 names; every preset works for both backbones.
PRESETS: dict[str, str] = {
    "pace": "Stage I cosine+LoRA (focal, lr 2e-5) → Stage II dot+full (focal, lr 2e-6) from 25% of Stage I",
    "infonce-lora": "baseline: one stage, cosine+LoRA, InfoNCE, lr 2e-5 (the VLM2Vec recipe)",
    "vlm2vec": "the same as infonce-lora (Table 4's VLM2Vec baseline)",
    "direct-dot-full": "baseline: one stage, dot+full, InfoNCE, lr 2e-5 (the paper's motivating failure)",
    "no-focal": "PACE w/o focal: InfoNCE in both stages",
    "no-dot": "PACE w/o dot: cosine in Stage II",
    "s2-lora": "PACE w/ S2 LoRA: Stage II trains a fresh LoRA adapter (on the merged Stage I weights) instead of all parameters (text)",
    "dot-to-cos": "reversed similarity order: Stage I dot, Stage II cosine",
    "full-to-lora": "reversed parameter order: Stage I full, Stage II LoRA (text)",
    "s2-from-final": "Stage II from the final Stage I checkpoint",
    "stage1-only": "Stage I alone (cosine+LoRA, focal): the setting of the focal-variant and γ ablations",
    "st-hardness": "baseline: one stage, cosine+LoRA, sentence-transformers' MNRL with hardness weighting "
                   "(hard_negatives, α=5 unless overridden), lr 2e-5 (text)",
}
ONE_STAGE_PRESETS = ("infonce-lora", "vlm2vec", "direct-dot-full", "stage1-only", "st-hardness")

# The preset `finetune pace` and `pipeline` run when none is named. Text: no-dot (PACE's two stages,
# cosine in both). The earlier default, direct-dot-full, was chosen on validation queries that share
# most of their positives with the training queries, which rewards learning where the popular
# documents lie: its whole SciFact gain is on test queries whose positives were training positives
# (seen +0.095 over frozen; unseen −0.011, p 0.59; ArguAna zero-shot −0.198; benchmarks/RESULTS.md,
# "Seen and unseen"). The study kept no per-query validation, so no positive-disjoint validation can
# re-decide among its runs; the stated rule for that case (issue 27 §3) is to keep the backbone's own
# ranking rule (cosine), which the dot switch changes, and the paper's two-stage recipe otherwise.
# Vision-language: the paper's recipe, which no study here has measured against its alternatives.
DEFAULT_PRESETS: dict[str, str] = {"text": "no-dot", "vl": "pace"}

# A text one-stage preset needs its length named (baselines are compared at PACE's total), except a
# preset with a measured schedule of its own: direct-dot-full's validation nDCG@10 rose until about
# 5.4 epochs of SciFact-train tuples in that study (0.7354 at 250 updates of 736 tuples at batch 16).
ONE_STAGE_DEFAULT_EPOCHS: dict[str, float] = {"direct-dot-full": 5.0}

# What the paper states per backbone family, applied on top of PACEConfig's defaults by preset_config:
# the dot-stage τ (text: measured, "auto"; Qwen-VL: Table 3's literal 100) and the VL input limits.
# seed 0 is what VL runs of earlier releases used, kept so that they reproduce.
BACKBONE_PRESET_VALUES: dict[str, dict[str, Any]] = {
    "text": {"dot_temperature": "auto"},
    "vl": {"dot_temperature": 100.0, "max_seq_length": PAPER_MAX_SEQ_LENGTH, "seed": 0, "vl": {"max_image_pixels": PAPER_MAX_IMAGE_PIXELS}},
}


def preset_config(
    name: str = "pace",
    *,
    backbone: str = "text",
    stage1_steps: int | None = None,
    stage2_steps: int | None = None,
    steps: int | None = None,
    weighting: str | None = None,
    gamma: float | None = None,
    stage1_learning_rate: float | None = None,
    stage2_learning_rate: float | None = None,
    stage1_temperature: float | str | None = None,
    stage2_temperature: float | str | None = None,
    warmup_ratio: float | None = None,
    **overrides: Any,
) -> PACEConfig:
    """A :class:`PACEConfig` for a named recipe on a ``"text"`` or ``"vl"`` backbone.

    Args:
        name: one of :data:`PRESETS`.
        backbone: ``"text"`` or ``"vl"``; picks the paper's values that differ by family
            (:data:`BACKBONE_PRESET_VALUES`).
        stage1_steps, stage2_steps: the two stages' schedules (None: one epoch each).
        steps: steps of a one-stage preset. By default, the optimizer updates on PACE's path to its
            final model, ``stage2_init_step(stage1_steps) + stage2_steps`` ("the same total steps"),
            when both are given; otherwise ``stage1_steps``.
        weighting, gamma: override every stage's loss weighting / ``γ``.
        stage1_learning_rate, stage2_learning_rate, stage1_temperature, stage2_temperature, warmup_ratio:
            per-stage overrides (a temperature is a number or ``"auto"``).
        overrides: any other :class:`PACEConfig` field; ``vl`` may be a dict merged into the preset's.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
    if backbone not in BACKBONES:
        raise ValueError(f"backbone must be one of {list(BACKBONES)}; got {backbone!r}.")
    family = dict(BACKBONE_PRESET_VALUES[backbone])
    dot_tau = family.pop("dot_temperature")
    stage1 = StageConfig(similarity="cosine", parameters="lora", steps=stage1_steps, learning_rate=2e-5, temperature=0.1)
    stage2: StageConfig | None = StageConfig(similarity="dot", parameters="full", steps=stage2_steps, learning_rate=2e-6, temperature=dot_tau)
    init = overrides.pop("stage2_init", 0.25)
    hardness_mode = overrides.pop("hardness_mode", "hard_negatives")
    hardness_strength = overrides.pop("hardness_strength", 5.0)
    if name in ONE_STAGE_PRESETS:
        if steps is None and name != "stage1-only":
            if stage1_steps is not None and stage2_steps is not None:
                steps = PACEConfig(stage2_init=init, stage2=None).stage2_init_step(stage1_steps) + stage2_steps
            elif stage2_steps is None and backbone == "text" and name in ONE_STAGE_DEFAULT_EPOCHS:
                steps = stage1_steps  # None: the preset's own number of epochs, below
            elif stage2_steps is not None or backbone == "text":
                raise ValueError(f"preset {name!r} needs steps=, or stage1_steps= and stage2_steps= to match PACE's total.")
            else:
                steps = stage1_steps  # None: one epoch
        elif steps is None:
            steps = stage1_steps
        if name in ("infonce-lora", "vlm2vec"):
            stage1 = StageConfig(similarity="cosine", parameters="lora", steps=steps, learning_rate=2e-5, temperature=0.1, weighting="none")
        elif name == "st-hardness":
            stage1 = StageConfig(similarity="cosine", parameters="lora", steps=steps, learning_rate=2e-5, temperature=0.1,
                                 weighting="none", loss="mnrl", hardness_mode=hardness_mode, hardness_strength=hardness_strength)
        elif name == "direct-dot-full":
            stage1 = StageConfig(similarity="dot", parameters="full", steps=steps, learning_rate=2e-5, temperature=dot_tau, weighting="none",
                                 epochs=ONE_STAGE_DEFAULT_EPOCHS[name] if backbone == "text" else 1.0)
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
        stage1.similarity, stage1.temperature = "dot", dot_tau
        stage2.similarity, stage2.temperature = "cosine", 0.1
    elif name == "full-to-lora":
        stage1.parameters, stage2.parameters = "full", "lora"
    elif name == "s2-from-final":
        init = "final"
    for stage, learning_rate, temperature in ((stage1, stage1_learning_rate, stage1_temperature), (stage2, stage2_learning_rate, stage2_temperature)):
        if stage is None:
            continue
        if weighting is not None:
            stage.weighting = weighting
        if gamma is not None:
            stage.gamma = gamma
        if learning_rate is not None:
            stage.learning_rate = learning_rate
        if temperature is not None:
            stage.temperature = temperature
        if warmup_ratio is not None:
            stage.warmup_ratio = warmup_ratio
        stage.__post_init__()
    vl_values = family.pop("vl", None)
    if backbone == "vl":
        given = overrides.pop("vl", None)
        given = dataclasses.asdict(given) if isinstance(given, VLOptions) else dict(given or {})
        overrides["vl"] = VLOptions(**{**(vl_values or {}), **given})
    values = {**family, **overrides}
    return PACEConfig(backbone=backbone, stage1=stage1, stage2=stage2, stage2_init=init, preset=name, **values)


def steps_per_epoch(n_examples: int, batch_size: int, world_size: int = 1) -> int:
    return max(1, math.ceil(n_examples / (batch_size * world_size)))


def stage_steps(stage: StageConfig, n_examples: int, batch_size: int, world_size: int = 1) -> int:
    """The stage's schedule length: its ``steps``, or ``epochs`` passes over ``n_examples`` when steps is None."""
    if stage.steps is not None:
        return stage.steps
    return max(1, round(stage.epochs * steps_per_epoch(n_examples, batch_size, world_size)))


# -- Deprecated aliases of the former vision-language config module (``finetune/vl_config.py``) ------------
# Kept for one release so that code written against it keeps running with the same numbers: they build
# a PACEConfig(backbone="vl") with that module's defaults and field names.

VL_PRESETS = {name: PRESETS[name] for name in ("pace", "vlm2vec", "no-focal", "stage1-only")}

_VL_STAGE_DEFAULTS = dict(steps=10, learning_rate=1e-4, similarity="cosine", temperature=0.02, warmup_ratio=0.0)


def VLStageConfig(*, lora: bool = True, **values: Any) -> StageConfig:  # noqa: N802 - the former class name
    """Deprecated: ``StageConfig`` with the former VL defaults (10 steps, lr 1e-4, τ 0.02, no warmup) and ``lora=``."""
    warnings.warn("VLStageConfig is deprecated; use StageConfig(parameters='lora'|'full', ...).", DeprecationWarning, stacklevel=2)
    return StageConfig(**{**_VL_STAGE_DEFAULTS, "parameters": "lora" if lora else "full", **values})


def VLPACEConfig(**values: Any) -> PACEConfig:  # noqa: N802 - the former class name
    """Deprecated: ``PACEConfig(backbone="vl", ...)`` with the former VL defaults and field names
    (``train_data``, ``image_root``, ``task``, ``instruction``, ``max_image_pixels``, one ``gamma``)."""
    warnings.warn("VLPACEConfig is deprecated; use PACEConfig(backbone='vl', ...).", DeprecationWarning, stacklevel=2)
    defaults: dict[str, Any] = dict(
        stage1=StageConfig(**{**_VL_STAGE_DEFAULTS, "parameters": "lora"}),
        stage2=StageConfig(**{**_VL_STAGE_DEFAULTS, "similarity": "dot", "parameters": "full", "learning_rate": 1e-5}),
        batch_size=4, lora_rank=8, seed=0, model="tiny-qwen2-vl", output_dir="runs/pace-vl", stage2_init="final",
        n_negatives=None, preset="custom",
    )
    gamma = values.pop("gamma", None)
    values = PACEConfig.migrate({**values, "max_image_pixels": values.get("max_image_pixels")})
    config = PACEConfig(**{**defaults, **values})
    for stage in (config.stage1, config.stage2):
        if stage is not None and gamma is not None:
            stage.gamma = gamma
            stage.__post_init__()
    return config


def vl_preset_config(name: str = "pace", **values: Any) -> PACEConfig:
    """Deprecated: ``preset_config(name, backbone="vl", ...)``."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; choose one of {sorted(VL_PRESETS)}.")
    return preset_config(name, backbone="vl", **values)
