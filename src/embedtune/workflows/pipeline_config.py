"""What ``run_pipeline`` compresses after fine-tuning, and how it evaluates it: :class:`PipelineConfig`.

Apart from :mod:`embedtune.workflows.pipeline` (which imports the fine-tuning stack), so that the
``pipeline`` command builds its flags from the fields, and checks the values given, without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from embedtune.compress import describe_method, get_compressor_class
from embedtune.compress.presets import MiningOptions
from embedtune.constraints import Constraint, Instance, Interval, Options, Text, validate_constraints

__all__ = ["PipelineConfig"]

_DIVE_PRESETS = describe_method("dive")  # the catalogue's: no torch import to read the presets' names


@dataclass
class PipelineConfig:
    """What to compress after fine-tuning, and how to evaluate it.

    Every DIVE run (in ``methods`` or a variant) starts from the ``dive_preset`` settings, under
    ``compressor_overrides["dive"]`` and the variant's own; the shared triplets are mined with
    ``mining``, or the preset's mining when it is None. What each field accepts is declared once, in
    ``_parameter_constraints``; the method names are checked against the registry.
    """

    methods: list[str] = field(default_factory=lambda: ["dive"], metadata={
        "help": "Compressors fitted on the fine-tuned model's vectors, registered names (default: ['dive'])."})
    dim: int = field(default=128, metadata={"help": "Output dimension k of every compressor (default: 128)."})
    seeds: list[int] = field(default_factory=lambda: [2027], metadata={
        "help": "Compressor training seeds; mean and spread are reported over them (default: [2027])."})
    dive_preset: str = field(default=_DIVE_PRESETS.default_preset, metadata={
        "help": "The DIVE preset every DIVE run starts from: its settings and, unless mining is given, its triplet mining "
                f"(default: {_DIVE_PRESETS.default_preset!r})."})
    compressor_overrides: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": "Config overrides per method: {method: {field: value}} (default: none)."})
    variants: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": "Named extra compressor runs: {name: {'method': ..., field: value}} (default: none)."})
    test_split: str = field(default="test", metadata={"help": "The qrels split scored as held-out test (default: 'test')."})
    val_fraction: float = field(default=0.2, metadata={
        "help": "Share of the training queries held out for validation, epoch and preset selection (default: 0.2)."})
    split_seed: int = field(default=2027, metadata={"help": "Seed of the validation split and of the triplet mining (default: 2027)."})
    mining: MiningOptions | None = field(default=None, metadata={
        "help": "Triplet mining of the shared triplets; None: the dive_preset's own mining (default: None)."})
    compare_base: bool = field(default=True, metadata={
        "help": "Also compress the base model's vectors, to compare with the fine-tuned model's (default: True)."})

    _parameter_constraints: ClassVar[dict[str, list[Constraint]]] = {
        "dim": [Interval(int, 1, None)],
        "dive_preset": [Options(_DIVE_PRESETS.presets)],
        "compressor_overrides": [Instance(dict, "a dict {method: {field: value}}")],
        "variants": [Instance(dict, "a dict {name: {'method': ..., field: value}}")],
        "test_split": [Text("a qrels split name such as 'test'")],
        "val_fraction": [Interval(float, 0, 1, "neither")],
        "split_seed": [Interval(int, None, None)],
        "mining": [Instance(MiningOptions), Options((None,), means="the preset's mining")],
        "compare_base": [Options((True, False))],
    }

    def __post_init__(self) -> None:
        validate_constraints(self)
        if not self.methods and not self.variants:
            raise ValueError("pipeline: give at least one compressor method (e.g. methods=['dive']).")
        for method in self.methods:
            get_compressor_class(method)
        for name, overrides in self.variants.items():
            get_compressor_class(overrides.get("method", "dive"))
        if not self.seeds:
            raise ValueError("pipeline: give at least one seed.")
