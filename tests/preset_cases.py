"""Every preset × backbone × stage-steps combination (and a few overrides) that ``preset_config`` is pinned on.

``tests/fixtures/preset_configs.json`` holds the output of each case as the former if/elif
``preset_config`` (before the preset table) returned it, or the error it raised:
``tests/test_preset_table.py`` checks that the table-driven function still returns exactly those.
Regenerate only on a deliberate change of a preset: ``python tests/preset_cases.py``.
"""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "preset_configs.json"

STEP_VALUES = {"stage1_steps": (None, 40), "stage2_steps": (None, 30), "steps": (None, 50)}
STAGE2_INITS = (None, 0.5, 10, "final")
OVERRIDES: dict[str, dict[str, Any]] = {
    "weighting+gamma": {"weighting": "qp", "gamma": 4.0},
    "learning-rates": {"stage1_learning_rate": 1e-4, "stage2_learning_rate": 3e-6},
    "temperatures-auto": {"stage1_temperature": "auto", "stage2_temperature": "auto"},
    "temperatures-number": {"stage1_temperature": 0.05, "stage2_temperature": "7"},
    "warmup": {"warmup_ratio": 0.0},
    "hardness": {"hardness_mode": "all_negatives", "hardness_strength": 9.0},
    "fields": {"model": "m", "data": "d", "max_seq_length": 64, "seed": 5, "batch_size": 4, "output_dir": "runs/x"},
    "vl-dict": {"vl": {"max_image_pixels": 1000, "task": "vqa"}},
    "no-dot-weighting-none": {"weighting": "none"},
}


def cases(presets: list[str], backbones: tuple[str, ...] = ("text", "vl")) -> list[dict[str, Any]]:
    """Keyword arguments of every pinned call, each with its ``name`` and ``backbone``."""
    out: list[dict[str, Any]] = []
    for name, backbone in itertools.product(presets, backbones):
        for values in itertools.product(*STEP_VALUES.values()):
            steps = {key: value for key, value in zip(STEP_VALUES, values) if value is not None}
            for init in STAGE2_INITS:
                extra = {} if init is None else {"stage2_init": init}
                out.append({"name": name, "backbone": backbone, **steps, **extra})
        for override in OVERRIDES.values():
            out.append({"name": name, "backbone": backbone, "stage1_steps": 40, "stage2_steps": 30, **override})
            out.append({"name": name, "backbone": backbone, "steps": 50, **override})
    return out


def case_key(case: dict[str, Any]) -> str:
    return json.dumps(case, sort_keys=True, separators=(",", ":"))


def outcome(case: dict[str, Any]) -> dict[str, Any]:
    """What ``preset_config(**case)`` gives: the config as a dict, or the error, and the warnings raised."""
    from embedtune.finetune.config import preset_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result: dict[str, Any] = {"config": preset_config(**case).to_dict()}
        except Exception as error:  # noqa: BLE001 - the error is part of the pinned behaviour
            result = {"error": f"{type(error).__name__}: {error}"}
    result["warnings"] = sorted({str(w.message) for w in caught})
    return json.loads(json.dumps(result))  # tuples -> lists, as the fixture holds them


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"stage1": {"steps": 3}}`` -> ``{"stage1.steps": 3}`` (a nested None stays one key)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shadowed(key: str, changed: dict[str, Any]) -> bool:
    """A base key that a changed key replaces: ``stage2.steps`` under ``stage2: None``, ``vl: None`` under ``vl.task``."""
    return any(key.startswith(f"{other}.") or other.startswith(f"{key}.") for other in changed)


def compact(result: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A config outcome as the flat keys where it differs from ``base`` (the fixture's frozen default)."""
    if "config" not in result:
        return result
    flat = flatten(result["config"])
    changed = {key: value for key, value in flat.items() if key not in base or base[key] != value}
    stored = {"config": changed, "warnings": result["warnings"]}
    assert expand(stored, base) == {"config": flat, "warnings": result["warnings"]}, "not representable as a difference"
    return stored


def expand(stored: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`compact`: the outcome with the whole flat config."""
    if "config" not in stored:
        return stored
    changed = stored["config"]
    flat = {key: value for key, value in base.items() if not _shadowed(key, changed)}
    return {"config": {**flat, **changed}, "warnings": stored["warnings"]}


def generate() -> dict[str, Any]:
    """Distinct outputs once (``outputs``, as differences from ``base``), each case naming its output's index."""
    from embedtune.finetune.config import PRESETS, PACEConfig

    base = flatten(json.loads(json.dumps(PACEConfig().to_dict())))
    outputs: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    table: dict[str, int] = {}
    for case in cases(sorted(PRESETS)):
        text = json.dumps(compact(outcome(case), base), sort_keys=True)
        if text not in index:
            index[text] = len(outputs)
            outputs.append(json.loads(text))
        table[case_key(case)] = index[text]
    return {"presets": sorted(PRESETS), "base": base, "cases": table, "outputs": outputs}


if __name__ == "__main__":
    data = generate()
    lines = ["{", f'"presets": {json.dumps(data["presets"])},', f'"base": {json.dumps(data["base"], sort_keys=True)},', '"cases": {']
    lines += [f"{json.dumps(key)}: {value}{',' if i < len(data['cases']) - 1 else ''}" for i, (key, value) in enumerate(data["cases"].items())]
    lines += ["},", '"outputs": [']
    lines += [f"{json.dumps(item, sort_keys=True, separators=(',', ':'))}{',' if i < len(data['outputs']) - 1 else ''}" for i, item in enumerate(data["outputs"])]
    lines += ["]", "}"]
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text("\n".join(lines) + "\n")
    print(f"{FIXTURE}: {len(data['cases'])} cases, {len(data['outputs'])} distinct outcomes")
