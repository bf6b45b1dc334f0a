"""Does the deployed index reproduce the plan? Build it with ``index build --plan`` and score the test queries through it.

    .venv/bin/python benchmarks/plan_deploy_check.py --plan runs/plan-97 --data scifact --model minilm --protocol beir-train

Writes the corpus vectors of the experiment to a temporary ``.npy``, builds the planned index from
them (:func:`embedtune.index.planned.build_planned_index`: the plan's compressor, precision and
saved int8 ranges), loads it, compresses the test queries with the plan's compressor, searches
the index (binary candidates rescored as planned) and scores nDCG@10 and Recall@10, next to what
``compress plan --final`` recorded in plan.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from embedtune.evaluate.metrics import evaluate_run
from embedtune.evaluate.search import run_from_topk
from embedtune.index import load_index
from embedtune.index.plan_format import load_plan
from embedtune.index.planned import build_planned_index
from embedtune.workflows.experiment import load_experiment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--data", default="scifact")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--protocol", default="beir-train")
    parser.add_argument("--part", default="test")
    args = parser.parse_args()
    plan, compressor, precision, _ = load_plan(args.plan)
    experiment = load_experiment(args.data, args.model, protocol=args.protocol, split_seed=plan.get("split_seed") or 2027)
    work = Path(tempfile.mkdtemp(prefix="plan-deploy-"))
    np.save(work / "docs.npy", np.ascontiguousarray(experiment.embeddings.doc_embeddings, dtype=np.float32))
    (work / "docs.txt").write_text("".join(i + "\n" for i in experiment.embeddings.doc_ids), encoding="utf-8")
    index = load_index(build_planned_index(work / "docs.npy", work / "index", args.plan, ids=work / "docs.txt"))
    ids = [q for q in experiment.part_ids(args.part) if experiment.dataset.qrels.get(q)]
    D, I = index.search(compressor.transform(experiment.embeddings.queries(ids)), 101)
    metrics = evaluate_run(experiment.qrels_for(ids), run_from_topk(ids, D, I, index.ids, 100, True), ("ndcg@10", "recall@10"))
    result = {
        "plan": args.plan, "setting": plan["chosen"]["setting"], "precision": precision.name, "index_kind": index.manifest["kind"],
        "index_bytes": index.manifest["index_bytes"], "ntotal": index.manifest["ntotal"],
        "deployed": {"ndcg@10": metrics["ndcg@10"], "recall@10": metrics["recall@10"], "n_queries": metrics.n_queries},
        "plan_test": plan.get("test"), "plan_validation": {"ndcg@10": plan["chosen"]["ndcg@10"], "n_queries": plan["chosen"]["n_queries"]},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
