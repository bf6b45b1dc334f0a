"""Embedding-geometry diagnostics of a model (PACE Figure 2a, Figure 4): load, embed, diagnose.

The maths lives in :mod:`embedtune.evaluate.geometry`; this module only samples matched
(query, positive) pairs of a BEIR split and embeds them with a model's *raw* outputs: unnormalised,
and with a trailing ``Normalize`` module stripped, as the paper defines the diagnostics (it colours
cosine embeddings by their original norm). A cosine-trained model saved by ``finetune pace`` ends in
``Normalize``; diagnosed as saved, every norm would be 1 and the coupling undefined.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from embedtune.data.beir import document_text, load_beir
from embedtune.encoders.dataset import encoder_description
from embedtune.encoders.sentence_transformer import SentenceEncoder
from embedtune.evaluate.geometry import GeometryReport, diagnose_embeddings
from embedtune.runtime import progress_bar

logger = logging.getLogger(__name__)

__all__ = ["diagnose_model", "strip_trailing_normalize"]

RAW_OUTPUTS_NOTE = "raw outputs: the model's trailing Normalize module stripped (as the paper colours cosine embeddings by their original norm)"


def _outputs_note(stripped: bool, strip_normalize: bool) -> str:
    if stripped:
        return RAW_OUTPUTS_NOTE
    if strip_normalize:
        return "raw outputs: the model has no trailing Normalize module"
    return "the model's outputs as saved (a trailing Normalize module, if any, kept)"


def strip_trailing_normalize(model) -> bool:
    """Drop ``model``'s last module (in memory; the files are unchanged) if it is a ``Normalize``; True if it was."""
    from sentence_transformers.sentence_transformer.modules import Normalize

    if len(model) > 1 and isinstance(model[-1], Normalize):
        del model[-1]
        return True
    return False


def diagnose_model(
    model: str | Path,
    data: str | Path = "scifact",
    split: str = "train",
    n_pairs: int | None = 1000,
    seed: int = 0,
    max_seq_length: int | None = None,
    batch_size: int = 64,
    out_dir: str | Path | None = None,
    n_random_pairs: int = 10000,
    strip_normalize: bool = True,
) -> GeometryReport:
    """Embed matched (query, positive) pairs of ``data``'s ``split`` qrels with ``model``'s raw
    (unnormalised) outputs and compute :func:`~embedtune.evaluate.geometry.diagnose_embeddings`.

    Args:
        model: alias or s-t folder.
        n_pairs: random sample of pairs (``None``: all). The paper samples training data.
        strip_normalize: diagnose the outputs before a trailing ``Normalize`` module (the paper's
            definition; ``report.meta["normalize_stripped"]`` says whether there was one). False: the
            model as saved (a model ending in ``Normalize`` then has every norm 1 and the coupling
            undefined: NaN).
    """
    start = time.perf_counter()
    dataset = load_beir(data, split)
    pairs = [(qid, did) for qid in dataset.judged_query_ids() for did, rel in sorted(dataset.qrels[qid].items()) if rel > 0]
    if n_pairs is not None and n_pairs < len(pairs):
        rows = np.sort(np.random.default_rng(seed).choice(len(pairs), size=n_pairs, replace=False))
        pairs = [pairs[i] for i in rows]
    encoder = SentenceEncoder(str(model), max_seq_length=max_seq_length, batch_size=batch_size, normalize=False, show_progress=False)
    stripped = strip_trailing_normalize(encoder.model) if strip_normalize else False
    if stripped:
        logger.info("diagnose %s: %s", model, RAW_OUTPUTS_NOTE)
    # One bar over both sides of every pair (the queries, then their positives).
    with progress_bar(2 * len(pairs), f"diagnose, encoding {len(pairs)} (query, positive) pairs", unit="text") as bar:
        xq = encoder.encode([dataset.queries[qid] for qid, _ in pairs], "query", progress=bar.update)
        xp = encoder.encode([document_text(dataset.corpus[did]) for _, did in pairs], "document", progress=bar.update)
    path = Path(str(model))
    label = path.parent.name if path.name == "model" else path.name  # runs/<name>/model -> <name>
    report = diagnose_embeddings(xq, xp, out_dir, n_random_pairs, seed, label=label)
    report.meta = {"model": str(model), "data": str(data), "split": split, "seed": seed, "max_seq_length": max_seq_length, "seconds": time.perf_counter() - start,
                   "normalize_stripped": stripped,
                   "outputs": _outputs_note(stripped, strip_normalize),
                   "dataset": {"name": dataset.name, "source": dataset.source, "split": split, "fingerprints": dataset.fingerprints},
                   "encoder": encoder_description(encoder)}
    logger.debug("diagnose %s: r=%.3f, random-pair cos=%.3f over %d pairs in %.1fs", model, report.coupling_r, report.random_pair_cosine, report.n_pairs, report.meta["seconds"])
    return report
