"""The preset table returns exactly what the former if/elif ``preset_config`` did.

``tests/fixtures/preset_configs.json`` was written by the former function (commit 68d7bda) for every
preset × backbone × stage-steps combination, four ``stage2_init`` values and a set of overrides; see
``tests/preset_cases.py``.
"""

from __future__ import annotations

import json
import typing

import pytest

from preset_cases import FIXTURE, case_key, cases, expand, flatten, outcome


@pytest.fixture(scope="module")
def frozen() -> dict:
    return json.loads(FIXTURE.read_text())


def test_every_preset_is_pinned(frozen):
    from embedtune.finetune.config import PRESETS

    assert sorted(PRESETS) == frozen["presets"]
    assert set(frozen["cases"]) == {case_key(case) for case in cases(frozen["presets"])}


def test_preset_table_matches_the_former_if_elif_chain(frozen):
    base = frozen["base"]
    mismatches = []
    for case in cases(frozen["presets"]):
        expected = expand(frozen["outputs"][frozen["cases"][case_key(case)]], base)
        got = outcome(case)
        if "config" in got:
            got = {"config": flatten(got["config"]), "warnings": got["warnings"]}
        if got != expected and not _refuses_what_was_dropped(case, expected, got, base):
            mismatches.append((case, expected, got))
    assert not mismatches, f"{len(mismatches)} of {len(frozen['cases'])} cases differ; first: {mismatches[0]}"


def _refuses_what_was_dropped(case: dict, expected: dict, got: dict, base: dict) -> bool:
    """True when the only change is a refusal of a setting the former function ignored: without that
    setting, today's function gives exactly the former outcome (so the setting had no effect)."""
    if "error" not in got or "ignored" not in got["error"] and "two stages" not in got["error"]:
        return False
    dropped = ("steps",) if "two stages" in got["error"] else ("stage2_learning_rate", "stage2_temperature")
    reduced = {key: value for key, value in case.items() if key not in dropped}
    if reduced == case:
        return False
    again = outcome(reduced)
    if "config" in again:
        again = {"config": flatten(again["config"]), "warnings": again["warnings"]}
    return again == expected  # the same config, or the same other error the case also had


def test_presets_are_data():
    """Each preset is one row of the table; the function that applies them holds no per-name branch."""
    import inspect

    from embedtune.finetune import presets

    assert set(presets.PRESET_TABLE) == set(presets.PRESETS)
    for name, row in presets.PRESET_TABLE.items():
        assert row.description == presets.PRESETS[name]
    body = inspect.getsource(presets.preset_config).split('"""')[2]  # after the signature (default "pace") and docstring
    body += inspect.getsource(presets._one_stage_steps)
    for name in presets.PRESETS:
        assert f'"{name}"' not in body, f"preset_config still names {name!r}"


def test_focal_weighting_choices_are_declared_once():
    from embedtune.finetune.config import StageConfig
    from embedtune.finetune.losses import cached_focal_embedding, focal_embedding

    choices = focal_embedding.WEIGHTINGS
    assert typing.get_args(focal_embedding.Weighting) == choices
    hints = typing.get_type_hints(StageConfig)
    assert hints["weighting"] == focal_embedding.Weighting
    for function in (focal_embedding.focal_embedding_loss, focal_embedding.focal_weights, focal_embedding.FocalEmbeddingLoss.__init__,
                     cached_focal_embedding.CachedFocalEmbeddingLoss.__init__):
        assert typing.get_type_hints(function)["weighting"] == focal_embedding.Weighting, function


@pytest.mark.parametrize("similarity, temperature, measured, expected", [
    ("dot", 0.5, None, (0.5, None)),
    ("dot", "auto", 40.0, (0.1 * 40.0, 40.0)),
    ("cosine", "auto", None, (0.1, None)),  # cosine: 'auto' is τ_1 and nothing is measured
])
def test_auto_temperature_resolves_in_one_place(similarity, temperature, measured, expected):
    """StageConfig.resolve_temperature is the one rule; the config, run_stages and the text run_stage all call it."""
    import inspect
    import warnings

    from embedtune.finetune import schema, stages
    from embedtune.finetune.backbones import text

    from embedtune.finetune.config import StageConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stage = StageConfig(similarity=similarity, temperature=temperature)
    calls = []

    def measure() -> float:
        calls.append(1)
        return measured

    assert stage.resolve_temperature(measure) == pytest.approx(expected)
    assert len(calls) == (1 if measured is not None else 0)
    for module in (stages, text, schema):
        source = inspect.getsource(module)
        assert "base_temperature *" not in source.replace("self.base_temperature * median", ""), module.__name__
        assert ".resolve_temperature(" in source, module.__name__


def test_public_names_still_import():
    import embedtune.finetune as finetune
    from embedtune.finetune import config

    for name in config.__all__:
        assert hasattr(config, name), name
    for name in ("PRESETS", "PACEConfig", "StageConfig", "VLOptions", "preset_config", "VLPACEConfig", "VLStageConfig", "vl_preset_config"):
        assert getattr(finetune, name) is getattr(config, name)
    from embedtune.finetune.config import (  # noqa: F401 - the names other modules and users import
        BACKBONE_PRESET_VALUES,
        DEFAULT_PRESETS,
        ONE_STAGE_DEFAULT_EPOCHS,
        ONE_STAGE_PRESETS,
        VL_PRESETS,
        stage_steps,
    )

    assert DEFAULT_PRESETS == {"text": "no-dot", "vl": "pace"}
