"""Embedding-geometry diagnostics of a model (PACE Figure 2a, Figure 4): load, embed, diagnose.

The maths lives in :mod:`embedtune.evaluate.geometry`; this module only samples matched
(query, positive) pairs of a BEIR split and embeds them with a model's *unnormalised* outputs.
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

__all__ = ["diagnose_model"]


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
) -> GeometryReport:
    """Embed matched (query, positive) pairs of ``data``'s ``split`` qrels with ``model``'s raw
    (unnormalised) outputs and compute :func:`~embedtune.evaluate.geometry.diagnose_embeddings`.

    Args:
        model: alias or s-t folder. Its own ``Normalize`` module, if any, still applies (then every
            norm is 1 and the coupling is undefined: NaN).
        n_pairs: random sample of pairs (``None``: all). The paper samples training data.
    """
    start = time.perf_counter()
    dataset = load_beir(data, split)
    pairs = [(qid, did) for qid in dataset.judged_query_ids() for did, rel in sorted(dataset.qrels[qid].items()) if rel > 0]
    if n_pairs is not None and n_pairs < len(pairs):
        rows = np.sort(np.random.default_rng(seed).choice(len(pairs), size=n_pairs, replace=False))
        pairs = [pairs[i] for i in rows]
    encoder = SentenceEncoder(str(model), max_seq_length=max_seq_length, batch_size=batch_size, normalize=False, show_progress=False)
    # One bar over both sides of every pair (the queries, then their positives).
    with progress_bar(2 * len(pairs), f"diagnose, encoding {len(pairs)} (query, positive) pairs", unit="text") as bar:
        xq = encoder.encode([dataset.queries[qid] for qid, _ in pairs], "query", progress=bar.update)
        xp = encoder.encode([document_text(dataset.corpus[did]) for _, did in pairs], "document", progress=bar.update)
    path = Path(str(model))
    label = path.parent.name if path.name == "model" else path.name  # runs/<name>/model -> <name>
    report = diagnose_embeddings(xq, xp, out_dir, n_random_pairs, seed, label=label)
    report.meta = {"model": str(model), "data": str(data), "split": split, "seed": seed, "max_seq_length": max_seq_length, "seconds": time.perf_counter() - start,
                   "dataset": {"name": dataset.name, "source": dataset.source, "split": split, "fingerprints": dataset.fingerprints},
                   "encoder": encoder_description(encoder)}
    logger.debug("diagnose %s: r=%.3f, random-pair cos=%.3f over %d pairs in %.1fs", model, report.coupling_r, report.random_pair_cosine, report.n_pairs, report.meta["seconds"])
    return report
