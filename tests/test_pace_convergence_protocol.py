"""The PACE study's step arithmetic under both compute protocols.

``matched`` (the earlier study's, the default): every arm has T updates on its path, so Stage II runs
T - 0.25 T. ``paper``: Stage II runs T on top of Stage I's 0.25 T, and ``direct-dot-full@x1.25`` is its
compute match. The paper protocol's results go to a folder of their own.
"""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "pace_convergence.py"


@pytest.fixture(scope="module")
def study(monkeypatch_module):
    spec = importlib.util.spec_from_file_location("pace_convergence_protocol_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    for key in ("PACE_PROTOCOL", "PACE_MODEL", "PACE_MODEL_LABEL", "PACE_UPDATES"):
        mp.delenv(key, raising=False)
    yield mp
    mp.undo()


def test_matched_protocol_is_the_default_and_keeps_the_earlier_arithmetic(study):
    assert study.PROTOCOL == "matched"
    assert study.two_stage_steps(300) == (300, 225)  # the committed study: Stage II from step 75 for 225
    assert study.two_stage_steps(100) == (100, 75)


def test_paper_protocol_runs_stage_two_for_t_on_top(study):
    stage1, stage2 = study.two_stage_steps(100, protocol="paper")
    assert (stage1, stage2) == (100, 100)  # Stage I on the T schedule (stopped at 25), then T
    init = max(1, round(study.STAGE2_INIT * stage1))
    assert init + stage2 == study.one_stage_steps("x1.25", 100) == 125  # D is compute-matched to C
    assert study.two_stage_steps(4, protocol="paper") == (4, 4)
    with pytest.raises(ValueError):
        study.two_stage_steps(100, protocol="epoch")


def test_one_stage_step_variants(study):
    assert study.one_stage_steps("", 100) == 100
    assert study.one_stage_steps("x1.25", 300) == 375
    assert study.one_stage_steps("x0.001", 100) == 1
    for bad in ("xabc", "x-1"):
        with pytest.raises(SystemExit):
            study.one_stage_steps(bad, 100)


def test_config_for_applies_the_protocol(study, tmp_path, monkeypatch):
    monkeypatch.setattr(study, "PROTOCOL", "paper")
    monkeypatch.setattr(study, "UPDATES", 100)
    pace = study.config_for("pace", tmp_path / "pace")
    assert (pace.stage1.steps, pace.stage2.steps, pace.stage2_init_step(pace.stage1.steps)) == (100, 100, 25)
    direct = study.config_for("direct-dot-full@x1.25", tmp_path / "d")
    assert direct.stage2 is None and direct.stage1.steps == 125
    assert study.config_for("direct-dot-full", tmp_path / "b").stage1.steps == 100
    monkeypatch.setattr(study, "PROTOCOL", "matched")
    assert study.config_for("pace", tmp_path / "p2").stage2.steps == 75


def test_paper_results_never_share_the_earlier_folders(study):
    assert study.results_label("minilm", None, "matched") == ""
    assert study.results_label("runs/minilm-lasttoken", None, "matched") == "minilm-lasttoken"
    assert study.results_label("runs/minilm-lasttoken", None, "paper") == "minilm-lasttoken-paper"
    assert study.results_label("minilm", None, "paper") == "minilm-paper"
    assert study.results_label("x", "mine-paper", "paper") == "mine-paper"
    assert study.results_label("x", "mine", "paper") == "mine-paper"
