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
from types import SimpleNamespace
from typing import Any, ClassVar, Literal, Union, get_args

from embedtune.constraints import Constraint, Instance, Interval, Options, validate_constraints
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

# What ``stage2_init`` accepts, declared once for PACEConfig and for parse_stage2_init (the CLI's reader).
STAGE2_INIT_CONSTRAINTS: list[Constraint] = [
    Interval(float, 0, 1, "right", means="a fraction of Stage I's steps"),
    Interval(int, 1, None, means="a Stage I step"),
    Options(("final",)),
]


@dataclass
class StageConfig:
    """One training stage: what is trained, with which similarity, loss and schedule."""

    similarity: Similarity = field(
        default="cosine", metadata={"help": "training similarity s_t: 'cosine' (Eq. 1) or 'dot' (Eq. 2) (default: 'cosine')"}
    )
    parameters: ParameterMode = field(
        default="lora", metadata={"help": "what trains: a LoRA adapter ('lora') or every language-model parameter ('full') (default: 'lora')"}
    )
    steps: int | None = field(
        default=None,
        metadata={"help": "length of this stage's schedule in optimizer steps; None: `epochs` passes; 0: skip the stage (vl only) "
                          "(default: None)"},
    )
    epochs: float = field(
        default=1.0, metadata={"help": "length of the schedule in passes over the training tuples, used when steps is None (default: 1.0)"}
    )
    learning_rate: float = field(
        default=2e-5, metadata={"help": "peak AdamW learning rate (default: 2e-5, the paper's Stage I; its Stage II: 2e-6)"}
    )
    warmup_ratio: float = field(
        default=0.05, metadata={"help": "linear warmup, as a fraction of the stage's steps, in [0, 1) (default: 0.05)"}
    )
    scheduler: Scheduler = field(
        default="linear", metadata={"help": "learning rate after warmup: 'linear' decay to 0, or 'constant' (default: 'linear')"}
    )
    temperature: Union[float, str] = field(
        default=0.1,
        metadata={
            "help": "τ of the logits s/τ (unitless, > 0). A number, or 'auto' (dot only): τ = base_temperature × median(‖q‖·‖c‖) "
            "measured at the start of the stage, so the first logits match Stage I's scale; with cosine 'auto' is "
            "base_temperature. The paper's literal Stage II value is 100 (for a Qwen backbone's norms). (default: 0.1)"
        },
    )
    base_temperature: float = field(
        default=0.1, metadata={"help": "τ_1 that 'auto' scales: Stage I's temperature (default: 0.1)"}
    )
    weighting: Weighting = field(
        default="focal",
        metadata={"help": "per-negative weights: 'focal' (PACE), 'random' / 'qp' / 'qn' (Figure 6b controls) or 'none' (InfoNCE) "
                          "(default: 'focal')"},
    )
    gamma: float = field(default=2.0, metadata={"help": "focal parameter γ, >= 0 (default: 2.0; Table 7 tries 0.5, 2 and 4)"})
    loss: LossName = field(
        default="focal",
        metadata={"help": "'focal': embedtune's Focal Embedding Loss (weighting picks focal/InfoNCE/...); 'mnrl' (text only, cosine): "
                          "sentence-transformers' MultipleNegativesRankingLoss with its hardness weighting, a baseline (default: 'focal')"},
    )
    hardness_mode: str | None = field(
        default=None,
        metadata={"help": "loss='mnrl' only: None, 'in_batch_negatives', 'hard_negatives' or 'all_negatives' (default: None)"},
    )
    hardness_strength: float = field(
        default=0.0,
        metadata={"help": "loss='mnrl' only: hardness strength α, >= 0 (default: 0.0; Lan et al. use 9, EmbeddingGemma 5)"},
    )

    #: What each field accepts (:mod:`embedtune.constraints`); the rules that relate fields are in ``__post_init__``.
    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "similarity": [Options(SIMILARITIES)],
        "parameters": [Options(PARAMETER_MODES)],
        "steps": [Interval(int, 1, None), Options((0,), means="skip the stage, vl only"), Options((None,), means="`epochs` epochs")],
        "epochs": [Interval(float, 0, None, "neither")],
        "learning_rate": [Interval(float, 0, None, "neither")],
        "warmup_ratio": [Interval(float, 0, 1, "left")],
        "scheduler": [Options(SCHEDULERS)],
        "temperature": [Interval(float, 0, None, "neither"), Options(("auto",))],
        "base_temperature": [Interval(float, 0, None, "neither")],
        "weighting": [Options(WEIGHTINGS)],
        "gamma": [Interval(float, 0, None)],
        "loss": [Options(LOSSES)],
        "hardness_mode": [Options(HARDNESS_MODES)],
        "hardness_strength": [Interval(float, 0, None)],
    }

    @classmethod
    def migrate(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Earlier vision-language configs said ``lora: true/false`` for ``parameters``."""
        if "lora" in values and "parameters" not in values:
            values["parameters"] = "lora" if values.pop("lora") else "full"
        return values

    def __post_init__(self) -> None:
        self.temperature = _temperature_value(self.temperature)
        validate_constraints(self)
        if self.loss == "focal" and self.hardness_mode is not None:
            raise ValueError("hardness_mode is a setting of loss='mnrl' (sentence-transformers' MNRL); set loss='mnrl' or drop it.")
        if self.loss == "mnrl" and self.similarity != "cosine":
            raise ValueError("loss='mnrl' is the cosine baseline; use similarity='cosine'.")
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


def _temperature_value(value: Any) -> Any:
    """A temperature written as text (the CLI's, a JSON file's) or as an int, read as the float it names.

    'auto' and text that is no number stay as they are, for the declared constraints to judge.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, str) and value != "auto":
        try:
            return float(value)
        except ValueError:
            return value
    return value


@dataclass
class VLOptions:
    """Settings only a vision-language backbone has (``PACEConfig.vl``; required shape for ``backbone="vl"``).

    The vision tower and the projector always stay frozen, and LoRA goes on the language model's
    linear layers of the detected family (``lora_target_modules`` does not apply).
    """

    image_root: str | None = field(
        default=None, metadata={"help": "folder that relative image paths start from; None: the data file's folder (default: None)"}
    )
    task: str | None = field(
        default=None,
        metadata={"help": "file-level Table 5 task format, 'auto' (by dataset name) or None / 'none'; rows' own fields win (default: None)"},
    )
    instruction: str = field(
        default="", metadata={"help": "file-level literal instruction, instead of task; '' gives none (default: '')"}
    )
    max_image_pixels: int | None = field(
        default=None,
        metadata={"help": "largest image area in pixels (width × height); larger images are resized down; None keeps the "
                          "processor's own limit (default: None; the VL presets and the paper: 1605632)"},
    )

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "max_image_pixels": [Interval(int, 1, None), Options((None,), means="the processor's own limit")],
    }

    def __post_init__(self) -> None:
        validate_constraints(self)
        if self.instruction and self.task not in (None, "none"):
            raise ValueError(f"give instruction or task, not both (instruction={self.instruction!r}, task={self.task!r}).")
        if self.task not in (None, "none", "auto"):
            # The task formats and their spellings (case, arrows) are the data module's; it raises naming them.
            task_instruction(self.task)


def _strict(cls: type, value: Any, name: str) -> Any:
    """A nested config given as a dict (in code, or read from JSON) as its config; unknown keys are an error here
    (a typo), not a warning. Any other value is left as it is, for the declared constraints to judge."""
    if not isinstance(value, dict):
        return value
    values = cls.migrate(dict(value)) if hasattr(cls, "migrate") else dict(value)
    known = {item.name for item in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{name} has unknown keys {unknown}; valid keys are {sorted(known)}.")
    return cls(**values)


@dataclass
class PACEConfig:
    """The whole recipe: Stage I, then (optionally) Stage II from an intermediate Stage I checkpoint."""

    backbone: BackboneFamily = field(
        default="text",
        metadata={"help": "'text': a sentence-transformers model; 'vl': a Qwen vision-language embedder (Qwen2/2.5/3-VL, Qwen3.5) "
                          "(default: 'text')"},
    )
    model: str = field(
        default="minilm",
        metadata={"help": "text: 'minilm', 'mpnet' or a sentence-transformers folder; vl: a checkpoint folder, hub id or one of "
                          f"{sorted(TINY_VL_MODELS)} (default: 'minilm')"},
    )
    data: str = field(
        default="scifact",
        metadata={"help": "text: BEIR folder, .zip or bundled name; vl: MMEB-train-style .jsonl or .parquet (default: 'scifact')"},
    )
    train_split: str = field(
        default="train", metadata={"help": "text only: the qrels split that supplies (query, positive) pairs (default: 'train')"}
    )
    output_dir: str = field(
        default="runs/pace", metadata={"help": "folder the stages, checkpoints and the final model go to (default: 'runs/pace')"}
    )
    stage1: StageConfig = field(
        default_factory=StageConfig,
        metadata={"help": "Stage I, a StageConfig or a dict of its fields (default: StageConfig(): cosine, LoRA, lr 2e-5, τ 0.1, "
                          "as the paper's)"},
    )
    stage2: StageConfig | None = field(
        default_factory=lambda: StageConfig(similarity="dot", parameters="full", learning_rate=2e-6, temperature="auto"),
        metadata={"help": "Stage II, a StageConfig or a dict of its fields; None trains one stage only (default: dot, full "
                          "fine-tuning, lr 2e-6, τ 'auto', as the paper's with a measured τ)"},
    )
    stage2_init: Union[float, int, str] = field(
        default=0.25,
        metadata={
            "help": "Stage I checkpoint that Stage II starts from: a fraction of Stage I's steps (float in (0, 1]), "
            "a step (int >= 1), or 'final' (default: 0.25; the paper's step 2,000 of 7,847)"
        },
    )
    stop_stage1_at_init: bool = field(
        default=False,
        metadata={"help": "end Stage I at the Stage II init checkpoint: the same weights as the full run, less compute (default: False)"},
    )
    save_steps: int = field(
        default=500,
        metadata={"help": "text only: save a Stage I checkpoint every this many optimizer steps; the init step is always saved "
                          "(default: 500)"},
    )
    batch_size: int = field(default=32, metadata={"help": "queries per batch, per process (default: 32, the paper's)"})
    mini_batch_size: int | None = field(
        default=None,
        metadata={"help": "text only: GradCache mini-batch size in queries (exact gradients, constant memory); None: on a CPU, the "
                          "size that keeps a step's activations under 1 GiB when the whole batch would not (MiniLM: 10 texts; a run "
                          "then peaks near 3 GB instead of 20 GB), on a GPU or with DeepSpeed no caching (default: None)"}
    )
    n_negatives: int | None = field(
        default=5,
        metadata={"help": "hard negatives per query, >= 1 for text; vl: the first N of each row, None = all of them (default: 5, "
                          "the paper's)"},
    )
    hard_pool: int = field(
        default=50,
        metadata={"help": "text only: negatives are drawn from this many of the frozen model's top-ranked non-relevant "
                          "documents, >= n_negatives (default: 50)"},
    )
    max_seq_length: int | None = field(
        default=None,
        metadata={"help": "cap on tokens per input (text: longer texts are truncated; vl: longer inputs are refused); None: the "
                          "model's own (default: None; the VL presets: 8192)"},
    )
    weight_temperature: float = field(default=0.1, metadata={"help": "τ_w of the cosine focal confidence p_i (Eq. 4), > 0 (default: 0.1)"})
    normalize: Normalization = field(
        default="global", metadata={"help": "focal weights have unit mean over the 'global' batch or per process ('local') (default: 'global')"}
    )
    lora_rank: int = field(default=32, metadata={"help": "LoRA rank r (default: 32, the paper's)"})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha, > 0; None: 2 × lora_rank (default: None)"})
    lora_dropout: float = field(default=0.0, metadata={"help": "text only: LoRA dropout probability, in [0, 1) (default: 0.0)"})
    lora_target_modules: str = field(
        default="all-linear",
        metadata={"help": "text only: PEFT target_modules; 'all-linear': every linear layer of the transformer (default: 'all-linear')"},
    )
    lora_exclude_modules: str | None = field(
        default=r".*pooler.*",
        metadata={"help": "text only: regex of linear layers left without LoRA; BERT's pooler is never used by mean pooling "
                          "(default: '.*pooler.*')"},
    )
    max_grad_norm: float | None = field(
        default=1.0, metadata={"help": "clip the gradients' global L2 norm to this, > 0; None: no clipping (default: 1.0)"}
    )
    seed: int = field(
        default=2027, metadata={"help": "seed of training (data order, init, random weights) and mining (default: 2027; the VL presets: 0)"}
    )
    logging_steps: int = field(default=1, metadata={"help": "text only: log the loss components every this many optimizer steps (default: 1)"})
    deepspeed: str | None = field(
        default=None, metadata={"help": "text only: DeepSpeed JSON config file (GPU), e.g. configs/deepspeed_zero2.json (default: None)"}
    )
    precision: Precision = field(
        default="auto", metadata={"help": "'auto': bf16 on a GPU that supports it, else fp32; or 'bf16' / 'fp32' (default: 'auto')"}
    )
    auto_temperature_samples: int = field(
        default=32, metadata={"help": "training examples embedded to measure median(‖q‖·‖c‖) for τ 'auto' (default: 32)"}
    )
    vl: VLOptions | None = field(
        default=None,
        metadata={"help": "vision-language settings (images, instructions), a VLOptions or a dict of its fields; backbone='vl' only, "
                          "where None means VLOptions() (default: None)"},
    )
    preset: str = field(default="pace", metadata={"help": "name of the preset this config came from, informational (default: 'pace')"})

    #: What each field accepts (:mod:`embedtune.constraints`); the rules that depend on the backbone or relate
    #: fields are in ``__post_init__``, ``_check_text`` and ``_check_vl``.
    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "backbone": [Options(BACKBONES)],
        "stage1": [Instance(StageConfig, "a StageConfig (or a dict of its fields)")],
        "stage2": [Instance(StageConfig, "a StageConfig (or a dict of its fields)"), Options((None,), means="one stage only")],
        "stage2_init": STAGE2_INIT_CONSTRAINTS,
        "stop_stage1_at_init": [Options((True, False))],
        "save_steps": [Interval(int, 1, None)],
        "batch_size": [Interval(int, 1, None)],
        "mini_batch_size": [Interval(int, 1, None), Options((None,), means="no GradCache")],
        "n_negatives": [Interval(int, 0, None), Options((None,), means="all of each row, vl only")],
        "hard_pool": [Interval(int, 1, None)],
        "max_seq_length": [Interval(int, 1, None), Options((None,), means="the model's own")],
        "weight_temperature": [Interval(float, 0, None, "neither")],
        "normalize": [Options(NORMALIZATIONS)],
        "lora_rank": [Interval(int, 1, None)],
        "lora_alpha": [Interval(float, 0, None, "neither"), Options((None,), means="2 × lora_rank")],
        "lora_dropout": [Interval(float, 0, 1, "left")],
        "max_grad_norm": [Interval(float, 0, None, "neither"), Options((None,), means="no clipping")],
        "seed": [Interval(int, None, None)],
        "logging_steps": [Interval(int, 1, None)],
        "precision": [Options(PRECISIONS)],
        "auto_temperature_samples": [Interval(int, 1, None)],
        "vl": [Instance(VLOptions, "a VLOptions (or a dict of its fields)"), None],
    }

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
        self.stage1 = _strict(StageConfig, self.stage1, "stage1")
        self.stage2 = _strict(StageConfig, self.stage2, "stage2")
        self.vl = _strict(VLOptions, self.vl, "vl")
        self.stage2_init = parse_stage2_init(self.stage2_init)
        validate_constraints(self)  # every field by its declaration, once dicts and text are read as values
        if self.backbone == "text":
            self._check_text()
        else:
            self._check_vl()
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
        if self.n_negatives is None or self.n_negatives < 1:  # None (all of a row's) and 0 are vl's: text mines its own
            raise ValueError(f"n_negatives must be >= 1 for backbone='text' (hard negatives mined per query); got {self.n_negatives}.")
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
    """``stage2_init`` from a number or a string (the CLI's): a fraction in (0, 1], a step >= 1, or ``"final"``.

    A whole number above 1 given as a float (``2.0``) is a step. Raises ``ValueError`` naming the accepted forms.
    """
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            value = text if text == "final" else int(text) if text.isdigit() else float(text)
        except ValueError:
            pass  # refused below, with the accepted forms
    if isinstance(value, float) and value.is_integer() and value > 1:
        value = int(value)
    validate_constraints(SimpleNamespace(stage2_init=value), {"stage2_init": STAGE2_INIT_CONSTRAINTS})
    return value


def steps_per_epoch(n_examples: int, batch_size: int, world_size: int = 1) -> int:
    return max(1, math.ceil(n_examples / (batch_size * world_size)))


def stage_steps(stage: StageConfig, n_examples: int, batch_size: int, world_size: int = 1) -> int:
    """The stage's schedule length: its ``steps``, or ``epochs`` passes over ``n_examples`` when steps is None."""
    if stage.steps is not None:
        return stage.steps
    return max(1, round(stage.epochs * steps_per_epoch(n_examples, batch_size, world_size)))

