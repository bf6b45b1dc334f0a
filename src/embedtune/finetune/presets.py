"""PACE's named recipes as data: the paper's recipe, its baselines and the ablations of Table 2 and Figures 5-6.

Every preset is one row of :data:`PRESET_TABLE`: what it changes in the paper's Stage I and Stage II
(:data:`PAPER_STAGE1`, :data:`PAPER_STAGE2`), whether it has a Stage II at all, and how a one-stage
preset's length defaults. :func:`preset_config` applies a row, the values that differ by backbone
family (:data:`BACKBONE_PRESET_VALUES`) and the caller's overrides, for either backbone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from embedtune.finetune.schema import (
    BACKBONES,
    PAPER_MAX_IMAGE_PIXELS,
    PAPER_MAX_SEQ_LENGTH,
    PACEConfig,
    StageConfig,
    VLOptions,
    parse_stage2_init,
    resolve_stage2_init_step,
)

__all__ = [
    "BACKBONE_PRESET_VALUES",
    "ONE_STAGE_DEFAULT_EPOCHS",
    "ONE_STAGE_PRESETS",
    "PAPER_STAGE1",
    "PAPER_STAGE2",
    "PRESETS",
    "PRESET_TABLE",
    "Preset",
    "preset_config",
]


@dataclass(frozen=True)
class Call:
    """A value of a preset's row that comes from the call: the backbone family's, or an argument of :func:`preset_config`."""

    name: Literal["dot_temperature", "hardness_mode", "hardness_strength"]


DOT_TEMPERATURE = Call("dot_temperature")  # the family's dot-stage τ (BACKBONE_PRESET_VALUES)


def _frozen(values: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return None if values is None else MappingProxyType(dict(values))


@dataclass(frozen=True)
class Preset:
    """One named recipe: the changes it makes to the paper's two stages.

    Attributes:
        description: the one line ``finetune pace --help`` shows.
        stage1, stage2: :class:`StageConfig` fields set on top of :data:`PAPER_STAGE1` / :data:`PAPER_STAGE2`;
            ``stage2=None``: one stage only.
        stage2_init: the Stage I checkpoint Stage II starts from, when the preset fixes it (else the caller's).
        length: a one-stage preset's default schedule when ``steps`` is not given: ``"pace-total"``
            (PACE's updates on its path to the final model, so that baselines compare at equal steps) or
            ``"stage1"`` (``stage1_steps``, or one epoch).
        text_epochs: a one-stage text preset's own measured number of epochs, used when no length is given.
    """

    description: str
    stage1: Mapping[str, Any] = field(default_factory=dict)
    stage2: Mapping[str, Any] | None = field(default_factory=dict)
    stage2_init: float | str | None = None
    length: Literal["pace-total", "stage1"] = "pace-total"
    text_epochs: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage1", _frozen(self.stage1))
        object.__setattr__(self, "stage2", _frozen(self.stage2))

    @property
    def one_stage(self) -> bool:
        return self.stage2 is None


# The paper's two stages (Appendix A, Table 3): what every preset starts from.
PAPER_STAGE1: Mapping[str, Any] = MappingProxyType(dict(similarity="cosine", parameters="lora", learning_rate=2e-5, temperature=0.1))
PAPER_STAGE2: Mapping[str, Any] = MappingProxyType(dict(similarity="dot", parameters="full", learning_rate=2e-6, temperature=DOT_TEMPERATURE))

_COSINE = dict(similarity="cosine", temperature=0.1)
_DOT = dict(similarity="dot", temperature=DOT_TEMPERATURE)

# Each preset changes only what its row of Table 2 / Figures 5-6 names; every preset works for both backbones.
PRESET_TABLE: Mapping[str, Preset] = MappingProxyType({
    "pace": Preset("Stage I cosine+LoRA (focal, lr 2e-5) → Stage II dot+full (focal, lr 2e-6) from 25% of Stage I"),
    "infonce-lora": Preset("baseline: one stage, cosine+LoRA, InfoNCE, lr 2e-5 (the VLM2Vec recipe)",
                           stage1=dict(weighting="none"), stage2=None),
    "vlm2vec": Preset("the same as infonce-lora (Table 4's VLM2Vec baseline)", stage1=dict(weighting="none"), stage2=None),
    # A text one-stage preset needs its length named (baselines are compared at PACE's total), except a
    # preset with a measured schedule of its own: direct-dot-full's validation nDCG@10 rose until about
    # 5.4 epochs of SciFact-train tuples in that study (0.7354 at 250 updates of 736 tuples at batch 16).
    "direct-dot-full": Preset("baseline: one stage, dot+full, InfoNCE, lr 2e-5 (the paper's motivating failure)",
                              stage1=dict(**_DOT, parameters="full", weighting="none"), stage2=None, text_epochs=5.0),
    "no-focal": Preset("PACE w/o focal: InfoNCE in both stages", stage1=dict(weighting="none"), stage2=dict(weighting="none")),
    "no-dot": Preset("PACE w/o dot: cosine in Stage II", stage2=_COSINE),
    "s2-lora": Preset("PACE w/ S2 LoRA: Stage II trains a fresh LoRA adapter (on the merged Stage I weights) instead of all parameters (text)",
                      stage2=dict(parameters="lora")),
    "dot-to-cos": Preset("reversed similarity order: Stage I dot, Stage II cosine", stage1=_DOT, stage2=_COSINE),
    "full-to-lora": Preset("reversed parameter order: Stage I full, Stage II LoRA (text)",
                           stage1=dict(parameters="full"), stage2=dict(parameters="lora")),
    "s2-from-final": Preset("Stage II from the final Stage I checkpoint", stage2_init="final"),
    "stage1-only": Preset("Stage I alone (cosine+LoRA, focal): the setting of the focal-variant and γ ablations",
                          stage2=None, length="stage1"),
    "st-hardness": Preset("baseline: one stage, cosine+LoRA, sentence-transformers' MNRL with hardness weighting "
                          "(hard_negatives, α=5 unless overridden), lr 2e-5 (text)",
                          stage1=dict(weighting="none", loss="mnrl", hardness_mode=Call("hardness_mode"),
                                      hardness_strength=Call("hardness_strength")),
                          stage2=None),
})

PRESETS: dict[str, str] = {name: row.description for name, row in PRESET_TABLE.items()}
ONE_STAGE_PRESETS = tuple(name for name, row in PRESET_TABLE.items() if row.one_stage)
ONE_STAGE_DEFAULT_EPOCHS: dict[str, float] = {name: row.text_epochs for name, row in PRESET_TABLE.items() if row.text_epochs is not None}

# The defaults of the values a row takes from the call (st-hardness: sentence-transformers' hard_negatives, α 5).
CALL_DEFAULTS: Mapping[str, Any] = MappingProxyType({"hardness_mode": "hard_negatives", "hardness_strength": 5.0})
DEFAULT_STAGE2_INIT = 0.25  # the paper's transition: step 2,000 of 7,847

# What the paper states per backbone family, applied on top of PACEConfig's defaults by preset_config:
# the dot-stage τ (text: measured, "auto"; Qwen-VL: Table 3's literal 100) and the VL input limits.
# seed 0 is what VL runs of earlier releases used, kept so that they reproduce.
BACKBONE_PRESET_VALUES: dict[str, dict[str, Any]] = {
    "text": {"dot_temperature": "auto"},
    "vl": {"dot_temperature": 100.0, "max_seq_length": PAPER_MAX_SEQ_LENGTH, "seed": 0, "vl": {"max_image_pixels": PAPER_MAX_IMAGE_PIXELS}},
}


def _stage_values(*layers: Mapping[str, Any], call: Mapping[str, Any]) -> dict[str, Any]:
    """The layers merged in order, each :class:`Call` replaced by the call's value."""
    merged = {key: value for layer in layers for key, value in layer.items()}
    return {key: call[value.name] if isinstance(value, Call) else value for key, value in merged.items()}


def _one_stage_steps(name: str, row: Preset, backbone: str, steps: int | None, stage1_steps: int | None,
                     stage2_steps: int | None, init: Any) -> int | None:
    """A one-stage preset's ``steps``: the given ones, else as its row's ``length`` says (None: ``epochs``)."""
    if steps is not None:
        return steps
    if row.length == "stage1":
        return stage1_steps
    if stage1_steps is not None and stage2_steps is not None:
        return resolve_stage2_init_step(parse_stage2_init(init), stage1_steps) + stage2_steps
    if stage2_steps is None and backbone == "text" and row.text_epochs is not None:
        return stage1_steps  # None: the preset's own number of epochs
    if stage2_steps is not None or backbone == "text":
        raise ValueError(f"preset {name!r} needs steps=, or stage1_steps= and stage2_steps= to match PACE's total.")
    return stage1_steps  # None: one epoch


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
        name: one of :data:`PRESETS` (a row of :data:`PRESET_TABLE`).
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
            ``hardness_mode`` and ``hardness_strength`` go to a row that takes them (st-hardness).
    """
    if name not in PRESET_TABLE:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
    if backbone not in BACKBONES:
        raise ValueError(f"backbone must be one of {list(BACKBONES)}; got {backbone!r}.")
    row = PRESET_TABLE[name]
    family = dict(BACKBONE_PRESET_VALUES[backbone])
    call = {"dot_temperature": family.pop("dot_temperature"),
            **{key: overrides.pop(key, default) for key, default in CALL_DEFAULTS.items()}}
    # The paper's stages with the caller's schedules first: invalid steps are refused whatever the preset.
    stage1 = StageConfig(**_stage_values(PAPER_STAGE1, call=call), steps=stage1_steps)
    stage2: StageConfig | None = StageConfig(**_stage_values(PAPER_STAGE2, call=call), steps=stage2_steps)
    init = overrides.pop("stage2_init", DEFAULT_STAGE2_INIT)
    # A setting the preset has no place for is refused, never dropped: a run that ignores it trains something else.
    if not row.one_stage and steps is not None:
        raise ValueError(f"--steps sets the schedule of a one-stage preset, but preset {name!r} has two stages: use --stage1-steps "
                         f"and --stage2-steps (e.g. --stage1-steps {steps} --stage2-steps {steps}).")
    if row.one_stage:
        ignored = [flag for flag, value in (("--stage2-lr", stage2_learning_rate), ("--stage2-temperature", stage2_temperature))
                   if value is not None]
        if ignored:
            raise ValueError(f"preset {name!r} has one stage, so {' and '.join(ignored)} would be ignored; drop "
                             f"{'them' if len(ignored) > 1 else 'it'}, or use --stage1-lr / --stage1-temperature.")
        length = _one_stage_steps(name, row, backbone, steps, stage1_steps, stage2_steps, init)
        epochs = {"epochs": row.text_epochs} if backbone == "text" and row.text_epochs is not None else {}
        stage1 = StageConfig(**_stage_values(PAPER_STAGE1, row.stage1, call=call), steps=length, **epochs)
        stage2 = None
    else:
        stage1 = dataclasses.replace(stage1, **_stage_values(row.stage1, call=call))
        stage2 = dataclasses.replace(stage2, **_stage_values(row.stage2, call=call))
        if row.stage2_init is not None:
            init = row.stage2_init
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
