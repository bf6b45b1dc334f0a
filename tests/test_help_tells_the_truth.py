"""Help text that states a default states the real one: checked against the configs and presets it names."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from embedtune.cli import build_parser
from embedtune.compress.dive.config import DIVEConfig
from embedtune.finetune import preset_config
from embedtune.finetune.config import DEFAULT_PRESETS


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {a.dest: a.help or "" for a in parser._actions if a.option_strings}


@pytest.mark.parametrize("command", [("compress", "train"), ("compress", "fit")])
def test_dive_flags_state_the_configs_default(command):
    helps = _helps(_subparser(build_parser(), *command))
    defaults = {f.name: f.default for f in dataclasses.fields(DIVEConfig)}
    assert f"DIVE's default: {defaults['heads']}" in helps["heads"]
    for dest, help_text in helps.items():
        for stated in re.findall(r"DIVE's default: ([^;)]+)", help_text):
            assert stated == str(defaults[dest]), f"--{dest} says DIVE's default is {stated}, the config's is {defaults[dest]}"


# The `finetune pace` flags whose help says "(preset: VALUE)", and where the preset keeps that value.
_PACE_FIELDS = {
    "train_split": "train_split", "hard_pool": "hard_pool", "save_steps": "save_steps", "normalize": "normalize",
    "model": "model", "data": "data", "stage2_init": "stage2_init", "stage1_learning_rate": "stage1.learning_rate",
    "stage2_learning_rate": "stage2.learning_rate", "stage1_temperature": "stage1.temperature", "stage2_temperature": "stage2.temperature",
    "warmup_ratio": "stage1.warmup_ratio", "weighting": "stage1.weighting", "gamma": "stage1.gamma", "batch_size": "batch_size",
    "n_negatives": "n_negatives", "weight_temperature": "weight_temperature", "lora_rank": "lora_rank", "seed": "seed",
    "precision": "precision",
}


def _same(stated: str, actual: object) -> bool:
    if isinstance(actual, (int, float)) and not isinstance(actual, bool):
        try:
            return float(stated) == float(actual)
        except ValueError:
            return False
    return stated == str(actual)


def test_finetune_pace_flags_state_the_default_presets_values():
    """The values a flag states are what runs without --preset: the default preset's, not the paper's recipe's."""
    helps = _helps(_subparser(build_parser(), "finetune", "pace"))
    config = preset_config(DEFAULT_PRESETS["text"]).to_dict()
    checked = 0
    for dest, help_text in helps.items():
        match = re.search(r"\(preset: ([^)]+)\)", help_text)
        if not match or dest not in _PACE_FIELDS:
            continue
        value: object = config
        for part in _PACE_FIELDS[dest].split("."):
            value = value[part]  # type: ignore[index]
        assert _same(match.group(1), value), f"--{dest.replace('_', '-')} says (preset: {match.group(1)}), the preset has {value!r}"
        checked += 1
    assert checked >= 15  # the test reads what it means to read
