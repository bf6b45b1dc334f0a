"""Inputs of vision-language embedders and the PACE task instructions (Table 5).

Plain data, no model code: the MMEB loaders in :mod:`embedtune.data.mmeb` build these, and the
encoders in :mod:`embedtune.encoders.vision_language` render and embed them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TASK_INSTRUCTIONS", "TASK_FORMATS", "task_instruction", "VLInput"]

# PACE Table 5: task-level instructions written into the query's user content.
TASK_INSTRUCTIONS: dict[str, str] = {
    "vqa": "Represent the given image to answer the following question.",
    "classification": "Represent the given image to answer the following question.",
    "t2i": "Retrieve an image that best matches the following description.",
    "i2t": "Find the caption that best describes this image.",
    "composed": "Find an image matching the described changes.",
}

# Spellings accepted for the five task formats (dataset fields, CLI flags); normalised first.
TASK_FORMATS: dict[str, str] = {
    **dict.fromkeys(("vqa", "visual_question_answering", "question_answering", "qa"), "vqa"),
    **dict.fromkeys(("classification", "cls", "image_classification"), "classification"),
    **dict.fromkeys(("t2i", "text2image", "text_to_image", "text_image", "text2image_retrieval", "t2i_retrieval"), "t2i"),
    **dict.fromkeys(("i2t", "image2text", "image_to_text", "image_text", "image2text_retrieval", "i2t_retrieval"), "i2t"),
    **dict.fromkeys(("composed", "composed_retrieval", "cir", "composed_image_retrieval"), "composed"),
}


def _normalise_task(task: str) -> str:
    text = task.strip().lower().replace("→", "2").replace("->", "2")
    return re.sub(r"[\s\-]+", "_", text)


def task_instruction(task: str, field_name: str = "task") -> str:
    """The Table 5 instruction of a task format (``"vqa"``, ``"t2i"``, ``"Text→Image"``, ...).

    Raises:
        ValueError: naming ``field_name`` and the accepted formats.
    """
    key = TASK_FORMATS.get(_normalise_task(str(task)))
    if key is None:
        raise ValueError(
            f"{field_name}={task!r} is not a PACE task format; use one of {sorted(TASK_INSTRUCTIONS)} "
            "(or a literal instruction in the 'instruction' field instead)."
        )
    return TASK_INSTRUCTIONS[key]


@dataclass
class VLInput:
    """One instance to embed: text, zero or more images, and an optional task instruction.

    Attributes:
        text: the text part (may be empty for an image-only instance).
        images: PIL images, or zero-argument callables returning one (lazy loading).
        instruction: written before the text in the user content (Table 5); empty for candidates.
    """

    text: str = ""
    images: list[Any] = field(default_factory=list)
    instruction: str = ""
