"""MMEB-style multimodal data: training tuples and evaluation sets (JSONL or parquet), images loaded lazily.

Training record (MMEB-train / VLM2Vec field names)::

    {"qry": "...", "qry_image_path": "img/1.jpg", "pos_text": "...", "pos_image_path": "",
     "neg_text": ["...", ...], "neg_image_path": ["", ...]}

Evaluation record (MMEB-eval field names), ground truth at candidate index 0::

    {"qry_text": "...", "qry_img_path": "img/1.jpg", "tgt_text": ["gt", "c1", ...], "tgt_img_path": ["", "", ...]}

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
from embedtune.encoders.vision_language import VLInput

__all__ = ["LazyImage", "MMEBTrainExample", "MMEBEvalExample", "MMEBEvalSet", "load_mmeb_train", "load_mmeb_eval", "read_records"]

_MMEB_PLACEHOLDER = re.compile(r"<\|image_\d+\|>\s*")


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


def load_mmeb_train(path: str | os.PathLike, image_root: str | os.PathLike | None = None, instruction: str = "") -> list[MMEBTrainExample]:
    """MMEB-train-style tuples; ``instruction`` (Table 5) is written into every query."""
    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    examples = []
    for line, record in enumerate(read_records(path), start=1):
        negative_texts = _as_list(_field(record, ("neg_text",), path, line, required=False))
        negative_images = _as_list(_field(record, ("neg_image_path",), path, line, required=False))
        count = max(len(negative_texts), len(negative_images))
        negative_texts += [""] * (count - len(negative_texts))
        negative_images += [""] * (count - len(negative_images))
        examples.append(MMEBTrainExample(
            query=_input(_field(record, ("qry", "qry_text"), path, line), record.get("qry_image_path") or record.get("qry_img_path"), root, instruction),
            positive=_input(_field(record, ("pos_text",), path, line), record.get("pos_image_path"), root),
            negatives=[_input(text, image, root) for text, image in zip(negative_texts, negative_images)],
        ))
    return examples


def load_mmeb_eval(path: str | os.PathLike, name: str | None = None, image_root: str | os.PathLike | None = None, instruction: str = "") -> MMEBEvalSet:
    """An MMEB-eval-style set; ``name`` defaults to the file stem (e.g. ``ImageNet-1K``)."""
    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    examples = []
    for line, record in enumerate(read_records(path), start=1):
        texts = _as_list(_field(record, ("tgt_text",), path, line))
        images = _as_list(_field(record, ("tgt_img_path",), path, line, required=False))
        if not texts and not images:
            raise DataFormatError(str(path), "empty candidate list", "give the ground truth at index 0 and the distractors after it", line=line, field="tgt_text")
        count = max(len(texts), len(images))
        texts += [""] * (count - len(texts))
        images += [""] * (count - len(images))
        examples.append(MMEBEvalExample(
            query=_input(_field(record, ("qry_text", "qry"), path, line), record.get("qry_img_path") or record.get("qry_image_path"), root, instruction),
            candidates=[_input(text, image, root) for text, image in zip(texts, images)],
        ))
    return MMEBEvalSet(name=name or path.stem, examples=examples)
