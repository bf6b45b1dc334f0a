"""MMEB-style multimodal data: training tuples and evaluation sets (JSONL or parquet), images loaded lazily.

Training record (MMEB-train / VLM2Vec field names)::

    {"qry": "...", "qry_image_path": "img/1.jpg", "pos_text": "...", "pos_image_path": "",
     "neg_text": ["...", ...], "neg_image_path": ["", ...]}

Evaluation record (MMEB-eval field names), ground truth at candidate index 0::

    {"qry_text": "...", "qry_img_path": "img/1.jpg", "tgt_text": ["gt", "c1", ...], "tgt_img_path": ["", "", ...]}

Task instructions (PACE Table 5) go into the *query's* user content, never the candidates'. Per row:
an ``instruction`` field (literal text) or a ``task`` / ``task_type`` / ``task_format`` field
(``vqa``, ``classification``, ``t2i``, ``i2t``, ``composed`` or a spelling such as ``"Text→Image"``).
Per file: the loaders' ``instruction=`` or ``task=`` argument; ``task="auto"`` picks the format from
the dataset name (:data:`DATASET_TASK_FORMATS`: the file stem, or a row's ``dataset`` field). A row's
own field wins over the file-level default. MMEB's released files often carry an instruction inline in
``qry``; it stays in the text, so pass no ``task`` for those unless you strip it.

Empty or missing image paths mean "no image". MMEB's own Phi-3-style placeholder ``<|image_1|>`` is
removed from the text, since :func:`embedtune.encoders.vision_language.render_prompt` inserts the
backbone's placeholder. Image paths are resolved against ``image_root`` (default: the file's folder)
and opened only when an input is embedded.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedtune.data.errors import DataFormatError
from embedtune.data.vl_inputs import TASK_INSTRUCTIONS, VLInput, task_instruction

__all__ = [
    "DATASET_TASK_FORMATS",
    "LazyImage",
    "MMEBTrainExample",
    "MMEBEvalExample",
    "MMEBEvalSet",
    "dataset_task_format",
    "default_instruction",
    "load_mmeb_train",
    "load_mmeb_eval",
    "read_records",
]

_MMEB_PLACEHOLDER = re.compile(r"<\|image_\d+\|>\s*")

_TASK_FIELDS = ("task", "task_type", "task_format")

# Table 5 format of each MMEB dataset, by what the query and the candidates are (text -> image is
# t2i, image -> text is i2t, image + modification text -> image is composed). Grounding sets and
# NIGHTS (image -> image) match none of the five formats and get no instruction from task="auto".
DATASET_TASK_FORMATS: dict[str, str] = {
    **dict.fromkeys(("ImageNet-1K", "N24News", "HatefulMemes", "VOC2007", "SUN397", "Place365", "ImageNet-A",
                     "ImageNet-R", "ObjectNet", "Country211"), "classification"),
    **dict.fromkeys(("OK-VQA", "A-OKVQA", "DocVQA", "InfographicsVQA", "ChartQA", "Visual7W", "ScienceQA", "VizWiz",
                     "GQA", "TextVQA"), "vqa"),
    **dict.fromkeys(("VisDial", "VisualNews_t2i", "MSCOCO_t2i", "WebQA", "Wiki-SS-NQ", "EDIS"), "t2i"),
    **dict.fromkeys(("VisualNews_i2t", "MSCOCO_i2t", "OVEN"), "i2t"),
    **dict.fromkeys(("CIRR", "FashionIQ"), "composed"),
}
_DATASET_ALIASES = {"Country-211": "Country211", "Wiki-S-NQ": "Wiki-SS-NQ"}


def dataset_task_format(name: str) -> str | None:
    """The Table 5 format of an MMEB dataset name, or ``None`` when none applies."""
    return DATASET_TASK_FORMATS.get(_DATASET_ALIASES.get(name, name))


def default_instruction(instruction: str = "", task: str | None = None, dataset: str = "") -> str:
    """The file-level instruction from the loader arguments (see the module docstring).

    Args:
        instruction: literal instruction text.
        task: a task format, ``"auto"`` (by ``dataset`` name) or ``None`` / ``"none"`` (no instruction).
        dataset: the dataset name that ``task="auto"`` looks up.
    """
    if instruction and task not in (None, "none"):
        raise ValueError(f"give instruction= or task=, not both (got instruction={instruction!r}, task={task!r}).")
    if instruction:
        return instruction
    if task in (None, "none"):
        return ""
    if task == "auto":
        fmt = dataset_task_format(dataset)
        return TASK_INSTRUCTIONS[fmt] if fmt else ""
    return task_instruction(task)


def _row_instruction(record: dict[str, Any], path: Path, line: int, default: str, task_auto: bool) -> str:
    """A row's own ``instruction`` / ``task`` field, else ``default``."""
    if record.get("instruction"):
        return str(record["instruction"]).strip()
    for name in _TASK_FIELDS:
        if record.get(name):
            try:
                return task_instruction(str(record[name]), field_name=name)
            except ValueError as error:
                raise DataFormatError(str(path), str(error).split(";")[0], f"use one of {sorted(TASK_INSTRUCTIONS)} "
                                      "or a literal 'instruction' field", line=line, field=name) from None
    if task_auto and record.get("dataset"):
        fmt = dataset_task_format(str(record["dataset"]))
        return TASK_INSTRUCTIONS[fmt] if fmt else ""
    return default


@dataclass(frozen=True)
class LazyImage:
    """A path that opens as an RGB PIL image when called."""

    path: Path

    def __call__(self):
        from PIL import Image

        with Image.open(self.path) as image:
            return image.convert("RGB")


@dataclass
class MMEBTrainExample:
    query: VLInput
    positive: VLInput
    negatives: list[VLInput] = field(default_factory=list)


@dataclass
class MMEBEvalExample:
    query: VLInput
    candidates: list[VLInput]  # ground truth first


@dataclass
class MMEBEvalSet:
    """One MMEB evaluation dataset (``name`` is matched against the Table 1 grouping)."""

    name: str
    examples: list[MMEBEvalExample]


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` or ``.parquet`` file as dicts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise DataFormatError(str(path), f"invalid JSON ({error.msg})", "write one JSON object per line", line=line_number) from error
    return records


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return [value]


def _input(text: Any, image_path: Any, image_root: Path, instruction: str = "") -> VLInput:
    images = [LazyImage(image_root / str(image_path))] if image_path else []
    return VLInput(text=_MMEB_PLACEHOLDER.sub("", str(text or "")).strip(), images=images, instruction=instruction)


def _field(record: dict[str, Any], names: tuple[str, ...], path: Path, line: int, required: bool = True) -> Any:
    for name in names:
        if name in record:
            return record[name]
    if required:
        raise DataFormatError(str(path), "missing field", f"add one of {list(names)}", line=line, field=names[0])
    return None


def load_mmeb_train(path: str | os.PathLike, image_root: str | os.PathLike | None = None, instruction: str = "",
                    task: str | None = None) -> list[MMEBTrainExample]:
    """MMEB-train-style tuples; the Table 5 instruction goes into each query's user content.

    Args:
        instruction, task: the file-level default (a row's ``instruction`` / ``task`` field wins);
            ``task="auto"`` uses a row's ``dataset`` field, else the file stem.
    """
    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    file_default = default_instruction(instruction, task, path.stem)
    examples = []
    for line, record in enumerate(read_records(path), start=1):
        query_instruction = _row_instruction(record, path, line, file_default, task == "auto")
        negative_texts = _as_list(_field(record, ("neg_text",), path, line, required=False))
        negative_images = _as_list(_field(record, ("neg_image_path",), path, line, required=False))
        count = max(len(negative_texts), len(negative_images))
        negative_texts += [""] * (count - len(negative_texts))
        negative_images += [""] * (count - len(negative_images))
        examples.append(MMEBTrainExample(
            query=_input(_field(record, ("qry", "qry_text"), path, line), record.get("qry_image_path") or record.get("qry_img_path"), root,
                         query_instruction),
            positive=_input(_field(record, ("pos_text",), path, line), record.get("pos_image_path"), root),
            negatives=[_input(text, image, root) for text, image in zip(negative_texts, negative_images)],
        ))
    return examples


def load_mmeb_eval(path: str | os.PathLike, name: str | None = None, image_root: str | os.PathLike | None = None,
                   instruction: str = "", task: str | None = None) -> MMEBEvalSet:
    """An MMEB-eval-style set; ``name`` defaults to the file stem (e.g. ``ImageNet-1K``).

    Args:
        instruction, task: the file-level default for the queries (a row's field wins);
            ``task="auto"`` looks ``name`` up in :data:`DATASET_TASK_FORMATS`.
    """
    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    name = name or path.stem
    file_default = default_instruction(instruction, task, name)
    examples = []
    for line, record in enumerate(read_records(path), start=1):
        query_instruction = _row_instruction(record, path, line, file_default, task == "auto")
        texts = _as_list(_field(record, ("tgt_text",), path, line))
        images = _as_list(_field(record, ("tgt_img_path",), path, line, required=False))
        if not texts and not images:
            raise DataFormatError(str(path), "empty candidate list", "give the ground truth at index 0 and the distractors after it", line=line, field="tgt_text")
        count = max(len(texts), len(images))
        texts += [""] * (count - len(texts))
        images += [""] * (count - len(images))
        examples.append(MMEBEvalExample(
            query=_input(_field(record, ("qry_text", "qry"), path, line), record.get("qry_img_path") or record.get("qry_image_path"), root,
                         query_instruction),
            candidates=[_input(text, image, root) for text, image in zip(texts, images)],
        ))
    return MMEBEvalSet(name=name, examples=examples)
