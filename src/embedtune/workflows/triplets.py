"""The shared training triplets of one split part: mined once, saved, and reused by every method."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from embedtune.compress.presets import MiningOptions
from embedtune.data.triplets import load_triplets, mine_triplets, save_triplets
from embedtune.workflows.experiment import Experiment

logger = logging.getLogger(__name__)

__all__ = ["shared_triplets"]


def shared_triplets(
    experiment: Experiment,
    part: str,
    mining: MiningOptions | None = None,
    seed: int = 2027,
    path: str | Path | None = None,
) -> np.ndarray:
    """Mine (or reload from ``path``) the triplets of one split part; every method gets these.

    Args:
        experiment: the dataset, its embeddings and split.
        part: the split part whose queries are trained on (``train`` or ``train+val``).
        mining: negatives, their number, the false-negative filter and the cap (default: the
            paper's plain top-50 hard negatives).
        seed: the mining seed.
        path: a triplet file to reuse or write. It is reused only if its metadata equals this
            call's; the filter and cap enter the metadata only when they differ from their
            defaults, so files mined before they existed still match a default call, and a file
            mined with other options never does.
    """
    mining = mining if mining is not None else MiningOptions()
    robust = mining.non_default()
    query_ids = experiment.part_ids(part)
    meta = {
        "dataset": experiment.dataset.name,
        "qrels_split": experiment.dataset.split,
        "part": part,
        "split_seed": experiment.split.seed if experiment.split else None,
        "n_negatives": mining.n_negatives,
        "negatives": mining.negatives,
        "seed": seed,
        "source_sha256": experiment.dataset.fingerprints,
        **robust,
    }
    if path is not None and Path(path).is_file():
        stored = load_triplets(path)
        if stored.meta == meta:
            return stored.rows(query_ids, experiment.embeddings.doc_ids)
        logger.info("%s was mined with other settings; mining again", path)
    triplets = mine_triplets(
        query_ids,
        experiment.embeddings.queries(query_ids),
        experiment.embeddings.doc_ids,
        np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32),
        experiment.qrels_for(query_ids),
        n_negatives=mining.n_negatives,
        negatives=mining.negatives,  # type: ignore[arg-type]
        seed=seed,
        **robust,
    )
    if path is not None:
        save_triplets(path, triplets, query_ids, experiment.embeddings.doc_ids, meta)
    return triplets
