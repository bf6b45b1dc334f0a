"""Every supervised method on tests/test_collapse.py's synthetic set: the paper recipe vs the safety net.

The set (``make_false_negative_dataset``, 80 queries, 8,000 documents, 128-d, most relevant
documents unjudged) makes the frozen top-50 hard negatives mostly unjudged positives. Each
supervised method is fitted twice on the 40 training queries, to k=16: with its config defaults
(the papers' recipe, plain top-50 hard negatives) and with its default preset ``robust`` (the
safety net: false-negative filter, 32 triplets per query, PCA-rotated start, best epoch with
epoch 0 a candidate). Printed: nDCG@10 of the 40 other queries against the judged and the
complete qrels, the selected epoch and the fit time, next to PCA and uncentred PCA.

    .venv/bin/python benchmarks/safety_net_collapse.py [METHOD ...]
"""

from __future__ import annotations

import sys
import time

import torch

from embedtune.compress import TrainingData, available_methods, get_compressor_class, make_compressor
from embedtune.data.synthetic import make_false_negative_dataset
from embedtune.data.triplets import mine_triplets
from embedtune.evaluate.retrieval import evaluate_embeddings

K = 16
DATASET = dict(n_queries=80, n_docs=8000, dim=128, n_topics=8, topic_spread=0.5, query_shift=0.5, seed=0)


def main(methods: list[str]) -> None:
    torch.set_num_threads(1)
    data = make_false_negative_dataset(**DATASET)
    query_ids, queries, doc_ids, docs, qrels = data
    half = len(query_ids) // 2
    train_ids, test_ids = query_ids[:half], query_ids[half:]
    train_queries, test_queries = queries[:half], queries[half:]
    train_qrels = {q: qrels[q] for q in train_ids}

    def score(compressor) -> tuple[float, float]:
        q, d = compressor.transform(test_queries), compressor.transform(docs)
        return tuple(float(evaluate_embeddings(test_ids, q, doc_ids, d, {i: truth[i] for i in test_ids}).aggregate["ndcg@10"])
                     for truth in (data.qrels, data.true_qrels))

    print(f"| method | recipe | judged nDCG@10 | complete-truth nDCG@10 | selected epoch | fit s |")
    print("|---|---|---|---|---|---|")
    corpus = TrainingData(train_ids, train_queries, doc_ids, docs, train_qrels)
    for name in ("pca", "pca-uncentred"):
        judged, true = score(make_compressor(name, dim=K).fit(corpus))
        print(f"| {name} | – | {judged:.3f} | {true:.3f} | – | – |")
    for method in methods:
        cls = get_compressor_class(method)
        for recipe in ("paper", "robust"):
            preset = cls.get_preset("robust") if recipe == "robust" else None
            mining = preset.mining.filter_options() if preset else {}
            triplets = mine_triplets(train_ids, train_queries, doc_ids, docs, train_qrels, n_negatives=4, hard_pool=50, seed=2027, **mining)
            compressor = cls(cls.config_class(dim=K, device="cpu", progress=False, **(dict(preset.settings) if preset else {})))
            start = time.perf_counter()
            compressor.fit(TrainingData(train_ids, train_queries, doc_ids, docs, train_qrels, triplets))
            seconds = time.perf_counter() - start
            judged, true = score(compressor)
            epoch = getattr(compressor, "selected_epoch_", None)
            print(f"| {method} | {recipe} | {judged:.3f} | {true:.3f} | {'–' if epoch is None else epoch} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or [m for m in available_methods() if get_compressor_class(m).supervised])
