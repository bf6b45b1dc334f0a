"""The config flags are generated from the config fields: help, choices and types, and presets left in place."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pytest

from embedtune.cli import build_parser, main
from embedtune.cli.compress.flags import DIVE_FLAG_ALIASES, DIVE_FLAG_FIELDS, PCA_FLAG_FIELDS, method_settings
from embedtune.cli.config_flags import add_config_flags, config_overrides, field_choices, flag_name
from embedtune.compress import get_compressor_class, load_compressor
from embedtune.compress.dive.config import DIVEConfig
from embedtune.compress.pca import PCAConfig
from embedtune.constraints import Options, collected_constraints
from embedtune.finetune import StageConfig
from embedtune.workflows.fit_and_score import build_config


def _subparser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.dest: action for action in parser._actions if action.option_strings}


def _declared_options(config_cls: type, name: str) -> list[object] | None:
    rules = collected_constraints(config_cls).get(name, [])
    if not rules or not all(rule is None or isinstance(rule, Options) for rule in rules):
        return None
    return [value for rule in rules if rule is not None for value in rule.values] + ([None] if None in rules else [])


def _help(config_cls: type, name: str) -> str:
    return {f.name: f for f in dataclasses.fields(config_cls)}[name].metadata["help"]


def test_each_generated_flag_has_the_fields_help_choices_and_name():
    parser = argparse.ArgumentParser()
    actions = add_config_flags(parser, DIVEConfig)
    assert [action.dest for action in actions] == [f.name for f in dataclasses.fields(DIVEConfig)]
    for action in actions:
        assert action.option_strings[0] == "--" + action.dest.replace("_", "-")
        assert action.help.replace("%%", "%") == _help(DIVEConfig, action.dest)
        assert action.default is argparse.SUPPRESS
        if action.choices is not None or _declared_options(DIVEConfig, action.dest) is not None:
            assert list(action.choices) == _declared_options(DIVEConfig, action.dest), action.dest
    assert isinstance(_actions(parser)["normalize_input"], argparse.BooleanOptionalAction)
    assert _actions(parser)["heads"].choices is None  # an integer or 'auto': the config checks it, not argparse


def test_literal_annotations_give_the_choices_and_a_prefix_keeps_two_configs_apart():
    parser = argparse.ArgumentParser()
    add_config_flags(parser, StageConfig, ["weighting", "learning_rate"], prefix="stage1-")
    add_config_flags(parser, StageConfig, ["weighting", "learning_rate"], prefix="stage2-")
    actions = _actions(parser)
    assert list(actions["stage1_weighting"].choices) == field_choices(StageConfig, "weighting") is not None
    args = parser.parse_args(["--stage1-weighting", actions["stage1_weighting"].choices[0], "--stage2-learning-rate", "1e-6"])
    assert config_overrides(args, StageConfig, ["weighting", "learning_rate"], prefix="stage2-") == {"learning_rate": 1e-6}
    assert set(config_overrides(args, StageConfig, ["weighting", "learning_rate"], prefix="stage1-")) == {"weighting"}


@pytest.mark.parametrize("command", [("compress", "train"), ("compress", "fit")])
def test_compress_commands_take_each_dive_and_pca_field_as_its_flag(command):
    actions = _actions(_subparser(*command))
    for config_cls, fields in ((DIVEConfig, DIVE_FLAG_FIELDS), (PCAConfig, PCA_FLAG_FIELDS)):
        for name in fields:
            action = actions[name]
            assert action.option_strings[0] == flag_name(name)
            assert set(DIVE_FLAG_ALIASES.get(name, ())) <= set(action.option_strings)
            # The field's own help, then the default it states (tests/test_help_tells_the_truth.py checks the value).
            assert action.help.replace("%%", "%").startswith(_help(config_cls, name) + " ("), name
            if action.choices is not None:
                assert list(action.choices) == _declared_options(config_cls, name)
    assert {"hidden_dim", "geometry_weight", "heads", "epochs", "learning_rate", "fit_sample"} <= set(actions)


def _settings(*argv: str) -> dict[str, object]:
    args = build_parser().parse_args(["compress", "train", *argv])
    return method_settings(args, args.method)


def test_a_flag_given_overrides_the_preset_and_a_flag_not_given_keeps_it():
    robust = get_compressor_class("dive").get_preset("robust").settings
    assert robust["geometry_weight"] != DIVEConfig().geometry_weight  # the preset differs from the dataclass

    def config(*argv: str) -> DIVEConfig:
        return build_config("dive", 8, 0, {**robust, **_settings("--method", "dive", *argv)})

    assert config().geometry_weight == robust["geometry_weight"]
    assert config("--geometry-weight", "3").geometry_weight == 3.0
    given = config("--hidden-dim", "16", "--no-normalize-input", "--lr", "1e-3", "--init", "identity", "--heads", "2")
    assert (given.hidden_dim, given.normalize_input, given.learning_rate, given.init, given.heads) == (16, False, 1e-3, "identity", 2)
    assert given.margin == robust["margin"]
    # 'none' sets a field to None on purpose, over a preset's value (None cannot mean "not given").
    unsupervised = get_compressor_class("dive").get_preset("unsupervised").settings
    assert build_config("dive", 8, 0, {**unsupervised, **_settings()}).patience == unsupervised["patience"]
    assert build_config("dive", 8, 0, {**unsupervised, **_settings("--patience", "none")}).patience is None
    # The flags win over --set, as the hand-written ones did.
    assert _settings("--set", "epochs=3", "--epochs", "5")["epochs"] == 5
    assert _settings("--method", "pca", "--fit-sample", "all") == {"fit_sample": 0}


def test_flags_reach_the_fitted_compressor(toy40, tiny_bert_dir, tmp_path, capsys):
    common = ["compress", "train", "--method", "dive", "--model", str(tiny_bert_dir), "--data", str(toy40), "--dim", "8",
              "--epochs", "1", "--set", "batch_size=8", "--compare", "", "--false-negative-margin", "none", "--json"]
    assert main([*common, "--geometry-weight", "3", "--hidden-dim", "4", "--out", str(tmp_path / "given")]) == 0
    assert main([*common, "--out", str(tmp_path / "preset")]) == 0
    capsys.readouterr()
    given, preset = load_compressor(tmp_path / "given").config, load_compressor(tmp_path / "preset").config
    assert (given.geometry_weight, given.hidden_dim, given.epochs) == (3.0, 4, 1)
    assert preset.geometry_weight == DIVEConfig.PRESETS["robust"]["geometry_weight"] and preset.hidden_dim is None
    recorded = json.loads((tmp_path / "given" / "results.json").read_text())["config"]
    assert recorded["geometry_weight"] == 3.0 and "margin" not in recorded  # what was given, not the flags left out


@pytest.mark.parametrize(("argv", "message"), [
    (["--margin", "nan"], "margin must be a finite number; got nan."),
    (["--epochs", "-1"], "epochs must be an integer >= 0; got -1."),
    (["--selection-fraction", "1.5"], "selection_fraction must be a number in (0, 1); got 1.5."),
    (["--heads", "many"], "heads must be a positive integer or 'auto'; got 'many'."),
    (["--set", "max_heads=0"], "max_heads must be a positive integer; got 0."),
])
def test_a_bad_value_gets_the_configs_error_naming_the_field(argv, message, toy40, tmp_path, capsys):
    with pytest.raises(ValueError) as caught:
        _settings("--method", "dive", *argv)
    assert str(caught.value) == message
    # Through the command: refused before any encoding (a model that does not exist is never reached), exit 2.
    assert main(["compress", "train", "--method", "dive", "--data", str(toy40), "--model", str(tmp_path / "no-model"),
                 "--compare", "", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_flag_for_a_field_the_method_lacks_names_the_flag(capsys):
    with pytest.raises(ValueError, match="--geometry-weight sets the config field 'geometry_weight', which pca does not have"):
        _settings("--method", "pca", "--geometry-weight", "3")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compress", "train", "--epochs", "many"])  # not a number: argparse names the flag
    assert "--epochs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compress", "train", "--init", "random"])
    assert "invalid choice: 'random'" in capsys.readouterr().err


def _pace(*argv: str, command: str = "pace"):
    from embedtune.cli.finetune import config_from_args

    return config_from_args(build_parser().parse_args(["finetune", command, "--out", "unused", *argv]))


def test_pace_stage_flags_come_from_the_stage_config_and_keep_the_preset():
    from embedtune.cli.finetune import EVERY_STAGE_FLAG_FIELDS, PACE_FLAG_FIELDS, STAGE_FLAG_FIELDS, TEXT_FLAG_FIELDS
    from embedtune.finetune import PACEConfig, preset_config

    def without_stated_default(config_cls: type, name: str) -> str:
        # A fine-tuning field's help ends with "(default: VALUE)"; the flag states the preset's value instead.
        return re.sub(r"\s*\(default: [^()]*\)$", "", _help(config_cls, name))

    actions = _actions(_subparser("finetune", "pace"))
    for stage in ("stage1", "stage2"):
        for name in STAGE_FLAG_FIELDS:
            assert actions[f"{stage}_{name}"].help.replace("%%", "%").startswith(without_stated_default(StageConfig, name))
    for config_cls, fields in ((StageConfig, EVERY_STAGE_FLAG_FIELDS), (PACEConfig, PACE_FLAG_FIELDS + TEXT_FLAG_FIELDS)):
        for name in fields:
            assert actions[name].help.replace("%%", "%").startswith(without_stated_default(config_cls, name))
            assert "(default:" not in actions[name].help  # one default stated: the preset's
            if actions[name].choices is not None:
                assert list(actions[name].choices) == field_choices(config_cls, name)
    # The pace preset's Stage II temperature ('auto') differs from StageConfig's default (0.1): a flag not given keeps it.
    assert StageConfig().temperature != preset_config("pace").stage2.temperature == "auto"
    assert _pace("--preset", "pace").stage2.temperature == "auto"
    given = _pace("--preset", "pace", "--stage2-temperature", "0.05", "--stage1-lr", "3e-5", "--weighting", "none", "--stage2-init", "2000",
                  "--normalize", "local", "--stop-stage1-at-init")
    assert (given.stage2.temperature, given.stage1.learning_rate, given.stage2_init, given.normalize) == (0.05, 3e-5, 2000, "local")
    assert given.stage1.weighting == given.stage2.weighting == "none" and given.stop_stage1_at_init
    assert given.stage2.learning_rate == preset_config("pace").stage2.learning_rate
    # The VL preset's seed (0) differs from PACEConfig's (2027); --task-format still names the task field.
    vl = ["--model", "tiny-qwen2-vl", "--data", "train.jsonl"]
    assert _pace(*vl, command="pace-vl").seed == 0 and _pace(*vl, "--seed", "5", command="pace-vl").seed == 5
    assert _pace(*vl, "--task-format", "vqa", command="pace-vl").vl.task == "vqa"


def test_a_bad_pace_value_gets_the_configs_error_naming_the_field():
    with pytest.raises(ValueError, match=r"^learning_rate must be a finite number > 0; got -1.0.$"):
        _pace("--stage2-lr", "-1")
    with pytest.raises(ValueError, match=r"^lora_rank must be a positive integer; got 0.$"):
        _pace("--lora-rank", "0")


@pytest.mark.parametrize("command", [("compress", "train"), ("compress", "fit")])
def test_compress_mining_flags_come_from_mining_options(command):
    from embedtune.cli.compress.flags import MINING_FLAG_FIELDS
    from embedtune.compress.presets import MiningOptions

    actions = _actions(_subparser(*command))
    assert MINING_FLAG_FIELDS == tuple(f.name for f in dataclasses.fields(MiningOptions))
    for name in MINING_FLAG_FIELDS:
        action = actions[name]
        assert action.option_strings == [flag_name(name)] and action.default is argparse.SUPPRESS
        # The field's help less its dataclass default, then the default the command uses (test_config_declarations checks it).
        assert action.help.startswith(re.sub(r" \(default: [^()]*\)$", " (default: ", _help(MiningOptions, name))), name
        assert action.choices is None or list(action.choices) == field_choices(MiningOptions, name)


def _mining(command: tuple[str, ...], preset: str, *argv: str):
    from embedtune.cli.compress.flags import mining_overrides

    extra = ["--out", "unused"] if command[-1] == "fit" else []
    args = build_parser().parse_args([*command, *extra, "--preset", preset, *argv])
    # What fit_compressor and fit_on_all do with the flags given: the preset's mining, changed by them.
    return get_compressor_class("dive").get_preset(preset).mining.replace(**mining_overrides(args))


@pytest.mark.parametrize("command", [("compress", "train"), ("compress", "fit")])
def test_a_mining_flag_given_overrides_the_preset_and_one_left_out_keeps_it(command):
    robust, paper = (get_compressor_class("dive").get_preset(name).mining for name in ("robust", "paper"))
    assert robust != paper
    assert _mining(command, "robust") == robust and _mining(command, "paper") == paper
    given = _mining(command, "paper", "--max-triplets-per-query", "5", "--false-negative-reference", "query-min", "--n-negatives", "2")
    assert (given.max_triplets_per_query, given.false_negative_reference, given.n_negatives) == (5, "query-min", 2)
    assert (given.skip_top, given.false_negative_margin, given.negatives) == (paper.skip_top, paper.false_negative_margin, paper.negatives)
    # 'none' turns the preset's filter off on purpose (None cannot mean "not given").
    off = _mining(command, "robust", "--false-negative-margin", "none")
    assert off.false_negative_margin is None and off.max_triplets_per_query == robust.max_triplets_per_query
    with pytest.raises(ValueError, match=r"^n_negatives must be a positive integer; got 0\.$"):
        _mining(command, "robust", "--n-negatives", "0")


def test_pipeline_flags_come_from_the_pipeline_and_pace_configs():
    from embedtune.cli.pipeline import PIPELINE_FLAG_ALIASES, PIPELINE_FLAG_FIELDS, PIPELINE_PACE_FLAG_FIELDS
    from embedtune.finetune import PACEConfig
    from embedtune.workflows.pipeline import PipelineConfig

    actions = _actions(_subparser("pipeline"))
    for config_cls, fields in ((PipelineConfig, PIPELINE_FLAG_FIELDS), (PACEConfig, PIPELINE_PACE_FLAG_FIELDS)):
        for name in fields:
            action = actions[name]
            assert action.option_strings[0] == flag_name(name) and action.default is argparse.SUPPRESS
            assert set(PIPELINE_FLAG_ALIASES.get(name, ())) <= set(action.option_strings)
            assert action.help.replace("%%", "%").startswith(re.sub(r"\s*\(default: [^()]*\)$", "", _help(config_cls, name))), name
            assert action.choices is None or list(action.choices) == field_choices(config_cls, name)
    assert {"stage1_steps", "stage2_steps"} <= set(actions) and "--no-base" in actions["compare_base"].option_strings


def _pipeline(*argv: str):
    from embedtune.cli.pipeline import configs_from_args

    return configs_from_args(build_parser().parse_args(["pipeline", "--out", "unused", *argv]))


def test_a_pipeline_flag_given_overrides_the_preset_and_one_left_out_keeps_it():
    from embedtune.finetune import preset_config
    from embedtune.workflows.pipeline import PipelineConfig

    # Fine-tuning: the --preset's value (here pace, the paper's two stages) unless a flag is given.
    preset = preset_config("pace")
    pace, config = _pipeline("--preset", "pace")
    assert (pace.batch_size, pace.stage2_init, pace.seed, pace.stage1.steps) == (preset.batch_size, preset.stage2_init, preset.seed, None)
    assert config == PipelineConfig(split_seed=preset.seed)  # no compression flag: every field's default
    pace, config = _pipeline("--preset", "pace", "--batch-size", "8", "--stage2-init", "final", "--stage1-steps", "3", "--seed", "5",
                             "--no-stop-stage1-at-init", "--dim", "16", "--methods", "dive,pca", "--seeds", "1", "2",
                             "--dive-preset", "paper", "--val-fraction", "0.3", "--no-base", "--norm-preserving")
    assert (pace.batch_size, pace.stage2_init, pace.stage1.steps, pace.seed, pace.stop_stage1_at_init) == (8, "final", 3, 5, False)
    assert pace.stage2.learning_rate == preset.stage2.learning_rate and pace.train_split == preset.train_split
    assert (config.dim, config.methods, config.seeds, config.dive_preset, config.val_fraction) == (16, ["dive", "pca"], [1, 2], "paper", 0.3)
    assert config.split_seed == 5 and config.compare_base is False and config.test_split == "test"
    assert config.variants == {"norm-preserving": {"method": "dive", "output_norm": "input"}}
    assert _pipeline("--compare-base")[1].compare_base is True


@pytest.mark.parametrize(("argv", "message"), [
    (["--dim", "0"], "dim must be a positive integer; got 0."),
    (["--val-fraction", "1"], "val_fraction must be a number in (0, 1); got 1.0."),
    (["--batch-size", "0"], "batch_size must be a positive integer; got 0."),
])
def test_a_bad_pipeline_value_gets_the_configs_error_before_any_work(argv, message, tmp_path, capsys):
    with pytest.raises(ValueError) as caught:
        _pipeline(*argv)
    assert str(caught.value) == message
    # Through the command: refused before the model (which does not exist) is read, and before --out is made.
    assert main(["pipeline", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "run"), *argv]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "run").exists()
