"""Score a saved vision-language embedder on MMEB-eval-style files (PACE Table 1 / Table 8).

Precision@1 and the paper's grouping live in :mod:`embedtune.evaluate.mmeb`; this module loads
the model folder and the evaluation files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from embedtune.data.mmeb import load_mmeb_eval
from embedtune.evaluate.mmeb import evaluate_mmeb

__all__ = ["evaluate_mmeb_model"]


def evaluate_mmeb_model(model_dir, task_files: Sequence, similarity: Literal["auto", "cosine", "dot"] = "auto",
                        image_root=None, batch_size: int = 8, device: str | None = None, task: str | None = None,
                        instruction: str = "") -> dict[str, object]:
    """Load a folder saved by :meth:`QwenVLEmbedder.save` and score it on MMEB-eval-style files.

    ``similarity="auto"`` uses the one recorded at save time (``dot`` after Stage II). ``task`` /
    ``instruction`` set the queries' Table 5 instruction per file (``task="auto"``: by dataset name);
    see :func:`embedtune.data.mmeb.load_mmeb_eval`.
    """
    from embedtune.encoders.vision_language import QwenVLEmbedder  # heavy optional dependency: the VL stack (torch, transformers)

    embedder, saved_similarity = QwenVLEmbedder.load(model_dir, device=device)
    chosen = saved_similarity if similarity == "auto" else similarity
    eval_sets = [load_mmeb_eval(path, image_root=image_root, task=task, instruction=instruction) for path in task_files]
    return {**evaluate_mmeb(embedder, eval_sets, chosen, batch_size), "similarity": chosen, "model": str(model_dir)}
