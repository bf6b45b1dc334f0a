"""MMEB Precision@1 and the paper's aggregation (PACE Table 1 / Table 8).

Tie rule: a query counts as a hit only when its ground truth (candidate 0) scores strictly higher
than every other candidate. A tie with the ground truth is a miss. This is stricter than the
reference implementation's ``argmax``, which returns the first maximum and therefore credits a
tie to index 0 (the ground truth): a collapsed model that gives every candidate the same score
would score 100% there and 0% here.

Ranking uses the dot product for Stage II (dot-trained) models and cosine otherwise. Loading a saved
model and its evaluation files is :func:`embedtune.workflows.mmeb.evaluate_mmeb_model`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = ["MMEB_TASKS", "META_TASKS", "precision_at_1", "aggregate_mmeb", "evaluate_mmeb_set", "evaluate_mmeb"]

logger = logging.getLogger(__name__)

# dataset -> (meta task, split); "ood" are the starred datasets of PACE Table 8 (20 IND, 16 OOD).
MMEB_TASKS: dict[str, tuple[str, str]] = {
    **{name: ("classification", "ind") for name in ("ImageNet-1K", "N24News", "HatefulMemes", "VOC2007", "SUN397")},
    **{name: ("classification", "ood") for name in ("Place365", "ImageNet-A", "ImageNet-R", "ObjectNet", "Country211")},
    **{name: ("vqa", "ind") for name in ("OK-VQA", "A-OKVQA", "DocVQA", "InfographicsVQA", "ChartQA", "Visual7W", "ScienceQA")},
    **{name: ("vqa", "ood") for name in ("VizWiz", "GQA", "TextVQA")},
    **{name: ("retrieval", "ind") for name in ("VisDial", "CIRR", "VisualNews_t2i", "VisualNews_i2t", "MSCOCO_t2i", "MSCOCO_i2t", "NIGHTS", "WebQA")},
    **{name: ("retrieval", "ood") for name in ("FashionIQ", "Wiki-SS-NQ", "OVEN", "EDIS")},
    **{name: ("grounding", "ood") for name in ("MSCOCO", "RefCOCO", "RefCOCO-Matching", "Visual7W-Pointing")},
}
META_TASKS = ("classification", "vqa", "retrieval", "grounding")

_ALIASES = {"Country-211": "Country211", "Wiki-S-NQ": "Wiki-SS-NQ", "RefCOCO-matching": "RefCOCO-Matching", "Visual7W-pointing": "Visual7W-Pointing"}


def precision_at_1(xq: np.ndarray, xc: np.ndarray, similarity: Literal["cosine", "dot"] = "cosine") -> tuple[float, np.ndarray]:
    """Precision@1 with the ground truth at candidate 0 and ties counted as misses.

    Args:
        xq: queries, shape (n, d).
        xc: candidates, shape (n, k, d); ``xc[i, 0]`` is query ``i``'s ground truth.
        similarity: ``"dot"`` for Stage II models, ``"cosine"`` otherwise.

    Returns:
        ``(precision, hits)``: the mean, and a bool array of shape (n,).
    """
    if similarity not in ("cosine", "dot"):
        raise ValueError(f"similarity must be one of ['cosine', 'dot']; got {similarity!r}.")
    xq = np.ascontiguousarray(xq, dtype=np.float32)
    xc = np.ascontiguousarray(xc, dtype=np.float32)
    assert xq.ndim == 2 and xc.ndim == 3 and xc.shape[0] == xq.shape[0] and xc.shape[2] == xq.shape[1], (xq.shape, xc.shape)
    if similarity == "cosine":
        xq = xq / np.maximum(np.linalg.norm(xq, axis=-1, keepdims=True), 1e-12)
        xc = xc / np.maximum(np.linalg.norm(xc, axis=-1, keepdims=True), 1e-12)
    D = np.einsum("nd,nkd->nk", xq, xc)  # (n, k)
    if D.shape[1] == 1:
        hits = np.ones(len(D), dtype=bool)
    else:
        hits = D[:, 0] > D[:, 1:].max(axis=1)  # strict: a tie is a miss
    return float(hits.mean()) if len(hits) else 0.0, hits


def aggregate_mmeb(scores: dict[str, float]) -> dict[str, float | None]:
    """Meta-task averages and IND/OOD/overall averages (Table 1), over the datasets present.

    Datasets not in :data:`MMEB_TASKS` count toward ``overall`` only. An empty group is ``None``.
    """
    groups: dict[str, list[float]] = {key: [] for key in (*META_TASKS, "ind", "ood", "overall")}
    for name, score in scores.items():
        meta, split = MMEB_TASKS.get(_ALIASES.get(name, name), (None, None))
        if meta is not None:
            groups[meta].append(score)
            groups[split].append(score)
        else:
            logger.warning("dataset %r is not in the MMEB grouping; it counts toward the overall score only", name)
        groups["overall"].append(score)
    return {key: (float(np.mean(values)) if values else None) for key, values in groups.items()}


def evaluate_mmeb_set(embedder, eval_set, similarity: Literal["cosine", "dot"], batch_size: int = 8) -> float:
    """Precision@1 of one :class:`~embedtune.data.mmeb.MMEBEvalSet` (candidate lists of equal length)."""
    examples = eval_set.examples
    lengths = {len(example.candidates) for example in examples}
    if len(lengths) != 1:
        raise ValueError(f"{eval_set.name}: every query needs the same number of candidates; got {sorted(lengths)}.")
    k = lengths.pop()
    start = time.perf_counter()
    xq = embedder.encode([example.query for example in examples], batch_size=batch_size).numpy()
    flat = [candidate for example in examples for candidate in example.candidates]
    xc = embedder.encode(flat, batch_size=batch_size).numpy().reshape(len(examples), k, -1)
    score, _ = precision_at_1(xq, xc, similarity)
    logger.info("%s: P@1=%.4f over %d queries x %d candidates in %.1fs", eval_set.name, score, len(examples), k, time.perf_counter() - start)
    return score


def evaluate_mmeb(embedder, eval_sets: Sequence, similarity: Literal["cosine", "dot"], batch_size: int = 8) -> dict[str, object]:
    """``{"per_dataset": {name: P@1}, **aggregate_mmeb(...)}``."""
    per_dataset = {eval_set.name: evaluate_mmeb_set(embedder, eval_set, similarity, batch_size) for eval_set in eval_sets}
    return {"per_dataset": per_dataset, **aggregate_mmeb(per_dataset)}
