"""Every config says what each field is, and what it accepts is declared once."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from embedtune.bench.protocol_config import ProtocolConfig
from embedtune.compress import MiningOptions, available_methods, get_compressor_class
from embedtune.constraints import Constraint, Instance, Interval, Options, Text, collected_constraints, validate_constraints
from embedtune.finetune import PACEConfig, StageConfig, VLOptions
from embedtune.workflows.pipeline import PipelineConfig

FINETUNE_CONFIGS = [PACEConfig, StageConfig, VLOptions]
# Configs whose every field's help states its true default, and whose every field is declared or named free-form.
STATING_CONFIGS = [*FINETUNE_CONFIGS, MiningOptions, PipelineConfig, ProtocolConfig]
CONFIGS = sorted({get_compressor_class(m).config_class for m in available_methods()}
                 | {*STATING_CONFIGS}, key=lambda c: c.__name__)
# Configs that declare what their fields accept; each is built from its defaults alone.
DECLARING_CONFIGS = [c for c in CONFIGS if collected_constraints(c)]
CONSTRAINED_FIELDS = [(c, name) for c in DECLARING_CONFIGS for name in collected_constraints(c)]

# Tried in this order, the first that a field's constraints all refuse is its bad value: out of range
# first, then a wrong type, and NaN (which every constraint refuses) last.
_BAD_CANDIDATES: tuple[object, ...] = (-1, 0, 1.5, "no-such-choice", "", None, float("nan"))


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_field_has_help(config_class):
    missing = [f.name for f in dataclasses.fields(config_class) if not str(f.metadata.get("help", "")).strip()]
    assert not missing, f"{config_class.__name__}: fields without help text: {missing}"


@pytest.mark.parametrize("config_class", STATING_CONFIGS, ids=lambda c: c.__name__)
def test_help_states_the_true_default(config_class):
    """Each field's help ends its own text with ``(default: VALUE)``, and VALUE is the field's default."""
    for item in dataclasses.fields(config_class):
        if item.default is dataclasses.MISSING:  # a default_factory (a nested config, a list): described in words
            continue
        stated = stated_default(item.metadata["help"])
        assert stated is not None, f"{config_class.__name__}.{item.name}: help does not state its default ({item.default!r})"
        assert _states(stated, item.default), (
            f"{config_class.__name__}.{item.name}: help says default {stated}, the field's is {item.default!r}")


def stated_default(help_text: str) -> str | None:
    """What a help text gives as the default: the text after its last ``(default: ``, up to ``;``, ``)`` or a
    ``,`` outside brackets; None when it states none."""
    start = help_text.rfind("(default: ")
    if start < 0:
        return None
    text, depth = help_text[start + len("(default: "):], 0
    for end, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char in ";)" or char == "," and not depth:
            return text[:end].strip()
    return text.strip()


def _states(stated: str, default: object) -> bool:
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            return float(stated) == float(default)
        except ValueError:
            return False
    return stated == repr(default)


@pytest.mark.parametrize("config_class", DECLARING_CONFIGS, ids=lambda c: c.__name__)
def test_declared_constraints_name_real_fields_and_accept_the_defaults(config_class):
    constraints = collected_constraints(config_class)
    names = {f.name for f in dataclasses.fields(config_class)}
    assert set(constraints) <= names, f"{config_class.__name__} constrains unknown fields {set(constraints) - names}"
    validate_constraints(config_class())  # the defaults pass their own declarations


# Fields with no declared constraint, and why: paths, model names and module patterns are judged where they
# are read (a missing file, an unknown model), the task formats by the data module, method and study names
# against the registry, and lists, tables and seeds of seeds where they are used.
FREE_FORM_FIELDS = {
    PACEConfig: {"model", "data", "train_split", "output_dir", "lora_target_modules", "lora_exclude_modules", "deepspeed", "preset"},
    StageConfig: set(),
    VLOptions: {"image_root", "task", "instruction"},
    MiningOptions: set(),
    PipelineConfig: {"methods", "seeds"},
    ProtocolConfig: {"datasets", "backbones", "methods", "studies", "fractions", "final_seeds", "selection_seeds", "head_values",
                     "ablations", "lr_candidates", "method_overrides", "variants", "preset_candidates", "source"},
}


@pytest.mark.parametrize("config_class", STATING_CONFIGS, ids=lambda c: c.__name__)
def test_every_field_is_declared_or_named_free_form(config_class):
    """A new field gets a declaration, or a deliberate place in FREE_FORM_FIELDS."""
    undecided = {f.name for f in dataclasses.fields(config_class)} - set(collected_constraints(config_class)) - FREE_FORM_FIELDS[config_class]
    assert not undecided, f"{config_class.__name__}: fields neither constrained nor named free-form: {sorted(undecided)}"


def _accepted(rules: list[Constraint], value: object) -> bool:
    return any(value is None if rule is None else rule.accepts(value) for rule in rules)


@pytest.mark.parametrize("config_class, name", CONSTRAINED_FIELDS, ids=lambda x: getattr(x, "__name__", x))
def test_a_constrained_field_refuses_a_bad_value_naming_the_field(config_class, name):
    rules = collected_constraints(config_class)[name]
    bad = next(value for value in _BAD_CANDIDATES if not _accepted(rules, value))
    with pytest.raises(ValueError) as caught:
        config_class(**{name: bad})
    message = str(caught.value)
    assert message.startswith(f"{name} must be "), message
    as_read = {repr(bad), repr(float(bad))} if isinstance(bad, int) else {repr(bad)}  # an int may be read as its float
    assert any(message.endswith(f"; got {value}.") for value in as_read), message


@pytest.mark.parametrize("rules, good, bad, message", [
    ([Interval(int, 1, None)], [1, 7], [0, -1, 2.0, True, None], "x must be a positive integer; got"),
    ([Interval(int, 2, None), None], [2, None], [1, "2"], "x must be an integer >= 2 or None"),
    ([Interval(float, 0, 1, "neither")], [0.5, 1e-9], [0, 1, float("nan"), "0.5"], "x must be a number in (0, 1)"),
    ([Interval(float, 0, None)], [0, 3.5, 2], [-1e-9, float("inf")], "x must be a finite number >= 0"),
    ([Interval(int, 1, None), Options(("auto",))], [3, "auto"], ["autx", 0], "x must be a positive integer or 'auto'"),
    ([Options((True, False))], [True, False], [1, 0, "true"], "x must be one of [True, False]"),
    ([Text("a device such as 'cpu'")], ["cpu"], ["", 3], "x must be a device such as 'cpu'"),
    ([Interval(int, 1, None), Options((0,), means="skip"), Options((None,), means="the default")], [1, 0, None], [-1, False, 0.5],
     "x must be a positive integer or 0 (skip) or None (the default)"),
    ([Interval(float, 0, 1, "right", means="a share")], [1, 0.5], [0, 1.5], "x must be a number in (0, 1] (a share)"),
    ([Instance(dict, "a dict of settings"), None], [{}, None], [[], "a"], "x must be a dict of settings or None"),
    ([Instance(dict)], [{}], [None], "x must be a dict"),
])
def test_constraints_accept_and_refuse_with_one_message(rules, good, bad, message):
    @dataclasses.dataclass
    class Probe:
        x: object

    for value in good:
        validate_constraints(Probe(value), {"x": rules})
    for value in bad:
        with pytest.raises(ValueError) as caught:
            validate_constraints(Probe(value), {"x": rules})
        assert str(caught.value).startswith(message), str(caught.value)


# The help of every generated flag states the default the command really uses when the flag is left out.

def _subparser(*path: str) -> argparse.ArgumentParser:
    from embedtune.cli import build_parser

    parser = build_parser()
    for name in path:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def _generated_flag_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> help of each flag that leaves nothing in the namespace when left out (the generated ones)."""
    return {a.dest: a.help.replace("%%", "%") for a in parser._actions
            if a.option_strings and a.default is argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)}


# "(DIVE's default: 0.7; presets best, robust: 0.4)": the config's default, then the presets that differ.
_METHOD_NOTE = re.compile(r"\((\w+)'s default: ([^;)]+)((?:; presets? [^:;]+: [^;)]+)*)\)")


def _states_command_default(help_text: str, used: object, preset: str) -> bool:
    """The help states ``used``: as its ``(default: VALUE``, or, in a method's note, as the value its default ``preset``
    sets (``presets ..., robust: VALUE``) or, where that preset leaves the field alone, the config's default."""
    note = _METHOD_NOTE.search(help_text)
    if note is None:
        stated = stated_default(help_text)
        return stated is not None and _states(stated, used)
    by_preset = {name.strip(): value.strip() for names, value in re.findall(r"; presets? ([^:;]+): ([^;)]+)", note.group(3))
                 for name in names.split(",")}
    stated = by_preset.get(preset, note.group(2).strip())
    return _states(stated, used) or stated == str(used)


def _used_without_flags(command: tuple[str, ...], helps: dict[str, str]) -> tuple[dict[str, object], str]:
    """dest -> the value the command uses when none of its generated flags is given, and the preset it starts from."""
    from embedtune.compress.dive.config import DIVEConfig
    from embedtune.compress.pca import PCAConfig

    if command == ("pipeline",):
        from embedtune.cli.pipeline import PIPELINE_FLAG_FIELDS, PIPELINE_PACE_FLAG_FIELDS, configs_from_args

        pace, config = configs_from_args(_subparser(*command).parse_args(["--out", "unused"]))
        used = {**{f"{stage}_steps": getattr(pace, stage).steps for stage in ("stage1", "stage2")},
                **{name: getattr(pace, name) for name in PIPELINE_PACE_FLAG_FIELDS},
                **{name: getattr(config, name) for name in PIPELINE_FLAG_FIELDS}}
        return used, config.dive_preset
    preset = get_compressor_class("dive").get_preset(None)  # the default preset, as `compress train|fit` take it
    dive = DIVEConfig(**preset.settings)
    return {**dataclasses.asdict(PCAConfig()), **dataclasses.asdict(dive), **dataclasses.asdict(preset.mining)}, preset.name


@pytest.mark.parametrize("command", [("compress", "train"), ("compress", "fit"), ("pipeline",)], ids=" ".join)
def test_every_generated_flag_states_the_default_the_command_uses(command):
    helps = _generated_flag_helps(_subparser(*command))
    used, preset = _used_without_flags(command, helps)
    helps.pop("threads", None)  # --threads: `embedtune --threads`, no config field
    assert helps and not set(helps) - set(used), f"flags whose default the test does not know: {sorted(set(helps) - set(used))}"
    wrong = {dest: (help_text, used[dest]) for dest, help_text in helps.items() if not _states_command_default(help_text, used[dest], preset)}
    assert not wrong, f"flags whose help states another default than the command uses: {wrong}"
