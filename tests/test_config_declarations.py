"""Every config says what each field is, and what it accepts is declared once."""

from __future__ import annotations

import dataclasses

import pytest

from embedtune.bench.protocol_config import ProtocolConfig
from embedtune.compress import available_methods, get_compressor_class
from embedtune.constraints import Interval, Options, Text, collected_constraints, validate_constraints
from embedtune.finetune import PACEConfig, StageConfig, VLOptions
from embedtune.workflows.pipeline import PipelineConfig

CONFIGS = sorted({get_compressor_class(m).config_class for m in available_methods()}
                 | {PACEConfig, StageConfig, VLOptions, ProtocolConfig, PipelineConfig}, key=lambda c: c.__name__)


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_field_has_help(config_class):
    missing = [f.name for f in dataclasses.fields(config_class) if not str(f.metadata.get("help", "")).strip()]
    assert not missing, f"{config_class.__name__}: fields without help text: {missing}"


@pytest.mark.parametrize("method", available_methods())
def test_declared_constraints_name_real_fields_and_accept_the_defaults(method):
    config_class = get_compressor_class(method).config_class
    constraints = collected_constraints(config_class)
    names = {f.name for f in dataclasses.fields(config_class)}
    assert set(constraints) <= names, f"{config_class.__name__} constrains unknown fields {set(constraints) - names}"
    validate_constraints(config_class())  # the defaults pass their own declarations


@pytest.mark.parametrize("rules, good, bad, message", [
    ([Interval(int, 1, None)], [1, 7], [0, -1, 2.0, True, None], "x must be a positive integer; got"),
    ([Interval(int, 2, None), None], [2, None], [1, "2"], "x must be an integer >= 2 or None"),
    ([Interval(float, 0, 1, "neither")], [0.5, 1e-9], [0, 1, float("nan"), "0.5"], "x must be a number in (0, 1)"),
    ([Interval(float, 0, None)], [0, 3.5, 2], [-1e-9, float("inf")], "x must be a finite number >= 0"),
    ([Interval(int, 1, None), Options(("auto",))], [3, "auto"], ["autx", 0], "x must be a positive integer or 'auto'"),
    ([Options((True, False))], [True, False], [1, 0, "true"], "x must be one of [True, False]"),
    ([Text("a device such as 'cpu'")], ["cpu"], ["", 3], "x must be a device such as 'cpu'"),
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
