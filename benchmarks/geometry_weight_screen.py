"""Choose DIVE's geometry weight on selection queries only: one line per (k, γ).

Fits the default DIVE (robust preset, positive-disjoint selection) with ``geometry_weight`` set,
on SciFact `beir-train` (train+val), and prints the best held-out selection nDCG@10 (epoch 0
included): the only figure the choice reads. The test figures (all, seen, unseen) are printed
beside it for the record, never used to choose.

    python benchmarks/geometry_weight_screen.py 128 '{"geometry_weight": 100.0}'

Any DIVE config field can be screened this way (margin, hidden_dim, weight_decay, ...); the key
``pseudo_queries`` (``title`` or ``first-sentence``) is not a config field but the
``fit_compressor`` option that builds the training-only pseudo-queries, weighed by
``pseudo_query_weight``.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from embedtune.workflows import load_experiment  # noqa: E402
from embedtune.workflows.train_compressor import fit_compressor  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    dim, settings = int(sys.argv[1]), json.loads(sys.argv[2])
    config_settings = {name: value for name, value in settings.items() if name != "pseudo_queries"}
    experiment = load_experiment("../shared/data/beir/scifact", "minilm", protocol="beir-train", split_seed=2027)
    result = fit_compressor(experiment, "dive", dim, final=True, settings={"progress": False, **config_settings},
                            pseudo_queries=settings.get("pseudo_queries"))
    dive = result.runs["dive"][0].compressor
    selection = [row["holdout_ndcg@10"] for row in dive.history_ if row.get("phase") == "select"]
    start = dive.pca_start_scores_.get(f"holdout_ndcg@10_{dive.pca_start_}_start", 0.0)
    means = result.subsets["methods"]["dive"]
    print(json.dumps({"dim": dim, "settings": settings, "holdout_best": round(max([start, *selection]), 4),
                      "epoch": dive.selected_epoch_, "start": dive.pca_start_,
                      "test": {name: round(row["ndcg@10"], 4) for name, row in means.items() if name != "mixed"}}), flush=True)


if __name__ == "__main__":
    main()
