"""Validation retrieval scores during PACE training: the curve that says when training has flattened.

Re-encoding a whole corpus at every evaluation costs minutes on a CPU, so the validation set is a
*sub-corpus*: the union of the frozen model's top-``pool_size`` documents for every validation query
plus their judged positives. Every validation query searches that whole sub-corpus, so the hard
distractors of all queries compete. Scores are therefore higher than full-corpus scores, but they
rank checkpoints the same way on the same pool, which is all a learning curve needs.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from embedtune.data.beir import BeirDataset, document_text
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.evaluate.search import exact_search

logger = logging.getLogger(__name__)

__all__ = ["ValidationSet", "build_validation_set", "score_model", "ValidationCallback"]


@dataclass
class ValidationSet:
    """Validation queries, the sub-corpus they search, and their qrels."""

    query_ids: list[str]
    query_texts: list[str]
    doc_ids: list[str]
    doc_texts: list[str]
    qrels: dict[str, dict[str, int]]

    def manifest(self) -> dict[str, Any]:
        return {"n_queries": len(self.query_ids), "n_docs": len(self.doc_ids), "query_ids": self.query_ids, "doc_ids": self.doc_ids}


def build_validation_set(
    dataset: BeirDataset,
    query_ids: list[str],
    frozen_query_vectors: np.ndarray,
    frozen_doc_ids: list[str],
    frozen_doc_vectors: np.ndarray,
    pool_size: int = 20,
) -> ValidationSet:
    """The frozen model's top-``pool_size`` docs of every query in ``query_ids``, plus their positives.

    ``frozen_*`` are unit-normalised frozen embeddings (rows aligned with ``query_ids`` and
    ``frozen_doc_ids``); documents keep corpus order so the set is deterministic.
    """
    if not query_ids:
        raise ValueError("build_validation_set: no validation queries.")
    _, neighbours = exact_search(np.ascontiguousarray(frozen_query_vectors, dtype=np.float32),
                                 np.ascontiguousarray(frozen_doc_vectors, dtype=np.float32), pool_size)
    chosen = {frozen_doc_ids[int(j)] for row in neighbours for j in row if j >= 0}
    qrels = {qid: {d: r for d, r in dataset.qrels[qid].items() if d in dataset.corpus} for qid in query_ids}
    for judged in qrels.values():
        chosen.update(d for d, r in judged.items() if r > 0)
    doc_ids = [d for d in dataset.corpus if d in chosen]
    return ValidationSet(
        query_ids=list(query_ids),
        query_texts=[dataset.queries[q] for q in query_ids],
        doc_ids=doc_ids,
        doc_texts=[document_text(dataset.corpus[d]) for d in doc_ids],
        qrels=qrels,
    )


def score_model(model, validation: ValidationSet, similarity: str, batch_size: int = 64) -> dict[str, float]:
    """nDCG@10 and Recall@10 of ``model`` (a SentenceTransformer, possibly mid-training) on ``validation``.

    ``similarity="cosine"`` normalises both sides; ``"dot"`` keeps the norms.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            normalize = similarity == "cosine"
            xq = model.encode(validation.query_texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=normalize, show_progress_bar=False)
            xb = model.encode(validation.doc_texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=normalize, show_progress_bar=False)
    finally:
        if was_training:
            model.train()
    metrics = evaluate_embeddings(validation.query_ids, np.ascontiguousarray(xq, dtype=np.float32), validation.doc_ids,
                                  np.ascontiguousarray(xb, dtype=np.float32), validation.qrels, top_k=100)
    values = metrics.to_dict()
    return {"ndcg@10": float(values["ndcg@10"]), "recall@10": float(values["recall@10"])}


class ValidationCallback(TrainerCallback):
    """Score the model on a :class:`ValidationSet` every ``eval_steps`` optimizer steps (and at step 0).

    Each score is appended to ``log_path`` as one JSON line ``{"stage", "step", "update", "ndcg@10", ...}``,
    where ``update`` counts optimizer updates on the final model's path (``update_offset`` + step), so
    the curves of one- and two-stage recipes share an x axis. A line already in the log (same stage and
    step, e.g. after a resume) is not scored again.
    """

    def __init__(self, validation: ValidationSet, log_path: str | Path, eval_steps: int, similarity: str,
                 stage: str = "stage1", update_offset: int = 0, at_start: bool = True) -> None:
        if eval_steps < 1:
            raise ValueError(f"eval_steps must be >= 1; got {eval_steps}.")
        self.validation = validation
        self.log_path = Path(log_path)
        self.eval_steps = eval_steps
        self.similarity = similarity
        self.stage = stage
        self.update_offset = update_offset
        self.at_start = at_start

    def _done(self) -> set[tuple[str, int]]:
        if not self.log_path.is_file():
            return set()
        rows = [json.loads(line) for line in self.log_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return {(row["stage"], int(row["step"])) for row in rows}

    def _score(self, model, step: int) -> None:
        if (self.stage, step) in self._done():
            return
        start = time.perf_counter()
        scores = score_model(model, self.validation, self.similarity)
        row = {"stage": self.stage, "step": step, "update": self.update_offset + step, **scores,
               "seconds": round(time.perf_counter() - start, 2)}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
        logger.info("validation %s step %d (update %d): nDCG@10 %.4f", self.stage, step, row["update"], scores["ndcg@10"])

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_start and state.is_world_process_zero and state.global_step == 0:
            self._score(model, 0)
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # control.should_training_stop: a stage cut short at the Stage II init checkpoint ends here.
        last = state.global_step == state.max_steps or control.should_training_stop
        if state.is_world_process_zero and (state.global_step % self.eval_steps == 0 or last):
            self._score(model, state.global_step)
        return control
