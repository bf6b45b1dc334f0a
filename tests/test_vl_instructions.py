"""Task instructions (PACE Table 5) taken from MMEB-style data: per row, per file, or by dataset name (no model)."""

from __future__ import annotations

import json

import pytest

from embedtune.data.errors import DataFormatError
from embedtune.data.mmeb import DATASET_TASK_FORMATS, default_instruction, load_mmeb_eval, load_mmeb_train
from embedtune.encoders.vision_language import TASK_INSTRUCTIONS, render_prompt, task_instruction
from embedtune.evaluate.mmeb import MMEB_TASKS


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _train_row(**extra):
    return {"qry": "a red cat", "qry_image_path": "", "pos_text": "", "pos_image_path": "cat.png",
            "neg_text": ["a dog"], "neg_image_path": [""], **extra}


def test_task_spellings_resolve_to_table5():
    assert task_instruction("Text→Image") == task_instruction("text2image") == TASK_INSTRUCTIONS["t2i"]
    assert task_instruction("image-to-text") == TASK_INSTRUCTIONS["i2t"]
    assert task_instruction("Composed retrieval") == TASK_INSTRUCTIONS["composed"]
    assert task_instruction("Visual question answering") == TASK_INSTRUCTIONS["vqa"]
    assert task_instruction("CLS") == TASK_INSTRUCTIONS["classification"]
    with pytest.raises(ValueError, match="task_type='grounding' is not a PACE task format"):
        task_instruction("grounding", field_name="task_type")


def test_train_rows_carry_their_own_instruction_or_task(tmp_path):
    rows = [
        _train_row(task="t2i"),
        _train_row(task_type="Image→Text"),
        _train_row(instruction="Find the matching photo."),
        _train_row(),  # falls back to the file-level default
    ]
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    examples = load_mmeb_train(path, task="vqa")
    assert [e.query.instruction for e in examples] == [
        TASK_INSTRUCTIONS["t2i"], TASK_INSTRUCTIONS["i2t"], "Find the matching photo.", TASK_INSTRUCTIONS["vqa"]]
    # Instructions belong to the query only (Appendix A.2).
    assert all(e.positive.instruction == "" and all(n.instruction == "" for n in e.negatives) for e in examples)
    assert [e.query.instruction for e in load_mmeb_train(path)][3] == ""  # no default, no instruction


def test_instruction_is_rendered_in_the_user_content(tmp_path):
    (example,) = load_mmeb_train(_write_jsonl(tmp_path / "t.jsonl", [_train_row(task="t2i")]))
    prompt = render_prompt(example.query.text, len(example.query.images), example.query.instruction)
    user = prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert user == "Retrieve an image that best matches the following description. a red cat"
    assert "Represent the user's input." in prompt.split("<|im_start|>user", 1)[0]  # the system prompt is untouched


def test_task_auto_uses_the_dataset_name(tmp_path):
    rows = [{"qry_text": "what colour is it", "qry_img_path": "x.png", "tgt_text": ["red", "blue"], "tgt_img_path": ["", ""]}]
    for name, fmt in (("OK-VQA", "vqa"), ("MSCOCO_t2i", "t2i"), ("VisualNews_i2t", "i2t"), ("CIRR", "composed"), ("ImageNet-1K", "classification")):
        eval_set = load_mmeb_eval(_write_jsonl(tmp_path / f"{name}.jsonl", rows), task="auto")
        assert eval_set.examples[0].query.instruction == TASK_INSTRUCTIONS[fmt], name
        assert all(c.instruction == "" for c in eval_set.examples[0].candidates)
    # Grounding has no Table 5 format: no instruction.
    assert load_mmeb_eval(_write_jsonl(tmp_path / "RefCOCO.jsonl", rows), task="auto").examples[0].query.instruction == ""
    # A row's dataset field drives task="auto" in a mixed training file.
    mixed = _write_jsonl(tmp_path / "train_mix.jsonl", [_train_row(dataset="CIRR"), _train_row(dataset="MSCOCO_i2t")])
    assert [e.query.instruction for e in load_mmeb_train(mixed, task="auto")] == [TASK_INSTRUCTIONS["composed"], TASK_INSTRUCTIONS["i2t"]]
    # Every mapped name is a real MMEB dataset.
    assert set(DATASET_TASK_FORMATS) <= set(MMEB_TASKS)


def test_bad_task_fields_name_the_field_line_and_fix(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [_train_row(), _train_row(task_format="grounding")])
    with pytest.raises(DataFormatError, match=r"bad.jsonl:2: field 'task_format'.*Fix: use one of"):
        load_mmeb_train(path)
    with pytest.raises(ValueError, match="instruction= or task=, not both"):
        default_instruction("Find it.", "vqa")
    with pytest.raises(ValueError, match="task='bogus'"):
        load_mmeb_train(_write_jsonl(tmp_path / "ok.jsonl", [_train_row()]), task="bogus")
