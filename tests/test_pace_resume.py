"""A killed PACE run resumes from its latest checkpoints and ends with the weights of an uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

from embedtune.finetune import preset_config, train_pace
from embedtune.finetune.backbones.text import latest_resumable_checkpoint
from embedtune.finetune.modeling import load_base_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Killed(RuntimeError):
    """Stands in for SIGKILL: the run stops between two optimizer steps, after its last checkpoint."""


class KillAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Killed(f"killed after step {self.step}")
        return control


def _config(tiny_bert_dir, toy_beir, output_dir):
    return preset_config("pace", stage1_steps=4, stage2_steps=4, stage2_init=0.5, model=str(tiny_bert_dir), data=str(toy_beir),
                         train_split="test", output_dir=str(output_dir), batch_size=4, n_negatives=2, hard_pool=5, save_steps=2,
                         lora_rank=4, auto_temperature_samples=4)


def _kill(stage: str, step: int):
    return lambda name, offset, similarity: [KillAt(step)] if name == stage else []


def _weights(model_dir) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in load_base_model(model_dir).named_parameters()}


def test_a_run_killed_in_each_stage_resumes_to_the_uninterrupted_weights(tiny_bert_dir, toy_beir, tmp_path):
    reference = train_pace(_config(tiny_bert_dir, toy_beir, tmp_path / "straight"))

    config = _config(tiny_bert_dir, toy_beir, tmp_path / "killed")
    with pytest.raises(Killed):
        train_pace(config, stage_callbacks=_kill("stage1", 3))  # Stage I checkpoint-2 is on disk, step 3 is lost
    assert latest_resumable_checkpoint(tmp_path / "killed" / "stage1").name == "checkpoint-2"
    with pytest.raises(Killed):
        train_pace(config, stage_callbacks=_kill("stage2", 3))  # Stage I resumes and ends; Stage II dies after step 3
    assert latest_resumable_checkpoint(tmp_path / "killed" / "stage2").name == "checkpoint-2"
    resumed = train_pace(config)

    assert [stage.steps_run for stage in resumed.stages] == [stage.steps_run for stage in reference.stages] == [4, 4]
    assert resumed.stages[1].temperature == pytest.approx(reference.stages[1].temperature, rel=1e-6)
    expected = _weights(reference.model_dir)
    for name, value in _weights(resumed.model_dir).items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6, msg=name)


def test_validation_curves_mnrl_hardness_and_filtered_mining_run_through_the_recipe(tiny_bert_dir, toy_beir, tmp_path):
    """The recent PACE features keep working on the shared recipe: a ValidationCallback per stage,
    the st-hardness (MNRL) baseline, and tuples mined with the false-negative filter."""
    import json

    from embedtune.data import load_beir
    from embedtune.encoders import SentenceEncoder
    from embedtune.finetune import mine_training_tuples
    from embedtune.finetune.validation import ValidationCallback, build_validation_set

    dataset = load_beir(str(toy_beir), "test")
    encoder = SentenceEncoder(str(tiny_bert_dir), show_progress=False)
    tuples = mine_training_tuples(dataset, encoder, n_negatives=2, hard_pool=5, false_negative_margin=0.0)
    assert tuples.n_negatives == 2 and len(tuples) == 20
    ids = dataset.judged_query_ids()[:4]
    doc_ids = list(dataset.corpus)
    validation = build_validation_set(dataset, ids, encoder.encode([dataset.queries[q] for q in ids]), doc_ids,
                                      encoder.encode([dataset.corpus[d]["text"] for d in doc_ids]), pool_size=5)
    curve = tmp_path / "curve.jsonl"

    def callbacks(stage, offset, similarity):
        return [ValidationCallback(validation, curve, eval_steps=2, similarity=similarity, stage=stage, update_offset=offset)]

    config = _config(tiny_bert_dir, toy_beir, tmp_path / "pace")
    result = train_pace(config, tuples=tuples, stage_callbacks=callbacks)
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    assert {(row["stage"], row["update"]) for row in rows} >= {("stage1", 0), ("stage1", 2), ("stage2", 2), ("stage2", 6)}
    assert result.stage2_init_step == 2

    baseline = preset_config("st-hardness", steps=2, hardness_strength=9.0, model=str(tiny_bert_dir), data=str(toy_beir), train_split="test",
                             output_dir=str(tmp_path / "mnrl"), batch_size=4, n_negatives=2, hard_pool=5, lora_rank=4)
    outcome = train_pace(baseline, tuples=tuples)
    assert outcome.stages[0].steps_run == 2 and (baseline.stage1.loss, baseline.stage1.hardness_mode) == ("mnrl", "hard_negatives")
