"""The paper recipe collapses far below PCA under incomplete judgements; the robust one does not.

The real failure: on a held-out dataset with many judged documents per query and incomplete
judgements, DIVE trained the paper's way (hard negatives mined from the frozen top-50, 50
epochs, identity initialisation, last epoch kept) scored nDCG@10 0.09 against 0.26 for PCA.

The synthetic stand-in (:func:`make_false_negative_dataset`): 80 queries in 8 shared topics
(siblings are close, so retrieval is fine-grained), 20 truly relevant originals per query of
which 10 are judged, 2 unjudged near-duplicates of each, topical distractors and background in
a 128-d space, and a shared query offset (``query_shift``, the query/document modality gap of
asymmetric encoders). Compression to k=16; 40 training queries, scored on the 40 others, with
the incomplete (``qrels``) and the complete (``true_qrels``) judgements.

What happens (seed 0, nDCG@10 judged / true; frozen 0.186 / 1.000, PCA 0.142 / 0.927):

- the frozen top-50 of a training query is mostly its own unjudged relevant documents: 92 % of
  the mined hard negatives are false negatives, so the hinge is active on every triplet for all
  50 epochs (ρ = 1.00, loss about 0.69 throughout) and gives no usable signal, while the
  geometry-distillation and view terms move the adapter steadily away from its start. The paper
  recipe ends at 0.028 / 0.185, below even its own start (the first 16 coordinates,
  0.057 / 0.303). The false negatives are not the whole story here: with the hinge switched off
  (``margin=-1.9``) the same training ends at 0.033 / 0.202, and with random negatives at
  0.039 / 0.287. Without the query offset (same corpus and judgements) the paper recipe stays
  at 0.135 / 0.736 against PCA's 0.184 / 0.969: below PCA but not collapsed;
- no single robustness ingredient is enough: the false-negative filter alone (query-min,
  margin 0.05) 0.103 / 0.638, ``skip_top=30`` 0.094 / 0.476, the per-query cap 0.042 / 0.260,
  ``init="pca"`` 0.079 / 0.516, best-epoch selection from the identity start 0.067 / 0.494;
- what works is starting at PCA (``init="pca"``: epoch 0 *is* the PCA projection) and keeping
  the best epoch on held-out training queries, epoch 0 included. That selection uses few
  queries with incomplete judgements, so it is noisy: on the default 20 % hold-out (8 queries),
  seed 1 of this dataset picks epoch 50 without the filter (true nDCG 0.570, PCA 0.896) and
  epoch 9 with it (0.812). With a 50 % hold-out and the filter, the recipe tested below is
  within 0.01 of PCA on seeds 0, 1 and 2, and so is it without the cap (with only 10 judged
  positives per query the cap changes little here); without the filter, up to 0.04 below.

Both tests run DIVE on one thread with the paper's batch size, learning rate and losses; the
dataset and every seed are fixed, so the numbers are exact on a given torch build.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pytest
import torch

from embedtune.compress import TrainingData
from embedtune.compress.dive import DIVECompressor, DIVEConfig
from embedtune.compress.pca import PCACompressor, PCAConfig
from embedtune.data.synthetic import make_false_negative_dataset
from embedtune.data.triplets import mine_triplets
from embedtune.evaluate.retrieval import evaluate_embeddings

torch.set_num_threads(1)  # small tensors on a busy machine; also keeps the run bit-for-bit reproducible

pytestmark = pytest.mark.slow

K = 16
DATASET = dict(n_queries=80, n_docs=8000, dim=128, n_topics=8, topic_spread=0.5, query_shift=0.5, seed=0)
ROBUST_MINING = dict(false_negative_margin=0.05, false_negative_reference="query-min", max_triplets_per_query=32)
ROBUST_DIVE = dict(init="pca", epoch_selection="best", selection_fraction=0.5)


class World:
    def __init__(self) -> None:
        self.dataset = make_false_negative_dataset(**DATASET)
        query_ids, queries, self.doc_ids, self.docs, qrels = self.dataset
        half = len(query_ids) // 2  # query q has topic q mod 8, so both halves cover every topic
        self.train_ids, self.test_ids = query_ids[:half], query_ids[half:]
        self.train_queries, self.test_queries = queries[:half], queries[half:]
        self.train_qrels = {query_id: qrels[query_id] for query_id in self.train_ids}
        pca = PCACompressor(PCAConfig(dim=K)).fit(
            TrainingData(self.train_ids, self.train_queries, self.doc_ids, self.docs, self.train_qrels)
        )
        self.pca = self.score(pca)

    @cached_property
    def paper(self) -> tuple[DIVECompressor, np.ndarray, tuple[float, float]]:
        """The paper's defaults: top-50 hard negatives, identity init, hinge, 50 epochs, last epoch kept."""
        compressor, triplets = self.fit_dive({}, {})
        return compressor, triplets, self.score(compressor)

    def score(self, compressor) -> tuple[float, float]:
        """(judged, true) nDCG@10 of the test queries."""
        test_queries, docs = compressor.transform(self.test_queries), compressor.transform(self.docs)
        return tuple(
            float(evaluate_embeddings(self.test_ids, test_queries, self.doc_ids, docs, {q: truth[q] for q in self.test_ids}).aggregate["ndcg@10"])
            for truth in (self.dataset.qrels, self.dataset.true_qrels)
        )

    def fit_dive(self, mining: dict, config: dict) -> tuple[DIVECompressor, np.ndarray]:
        triplets = mine_triplets(
            self.train_ids, self.train_queries, self.doc_ids, self.docs, self.train_qrels, n_negatives=4, hard_pool=50, seed=2027, **mining
        )
        train = TrainingData(self.train_ids, self.train_queries, self.doc_ids, self.docs, self.train_qrels, triplets)
        return DIVECompressor(DIVEConfig(dim=K, heads=4, device="cpu", progress=False, **config)).fit(train), triplets

    def false_negative_rate(self, triplets: np.ndarray) -> float:
        truth = self.dataset.true_qrels
        return float(np.mean([self.doc_ids[negative] in truth[self.train_ids[query]] for query, _, negative in triplets]))


@pytest.fixture(scope="module")
def world() -> World:
    return World()


@pytest.mark.slow
def test_paper_recipe_collapses_far_below_pca(world):
    pca_judged, pca_true = world.pca
    assert pca_true > 0.85 and pca_judged > 0.12  # PCA itself is a sound baseline here

    paper, triplets, (judged, true) = world.paper

    assert world.false_negative_rate(triplets) > 0.8  # the frozen top-50 is mostly unjudged relevant docs
    assert paper.config.epochs == 50 and paper.selected_epoch_ is None
    # Collapse: below half of PCA on both judgements (seed 0: 0.028 vs 0.142, 0.185 vs 0.927).
    assert judged < 0.5 * pca_judged and judged < pca_judged - 0.05
    assert true < 0.5 * pca_true and true < pca_true - 0.3


@pytest.mark.slow
def test_robust_recipe_does_not_collapse(world):
    pca_judged, pca_true = world.pca

    robust, triplets = world.fit_dive(ROBUST_MINING, ROBUST_DIVE)
    judged, true = world.score(robust)

    assert world.false_negative_rate(triplets) < 0.05  # the filter removes the unjudged relevant docs
    assert robust.selected_epoch_ is not None and robust.selected_epoch_ < 50
    # Not below PCA, up to a small tolerance (seed 0: 0.139 vs 0.142, 0.924 vs 0.927) ...
    assert judged >= pca_judged - 0.02 and true >= pca_true - 0.03
    # ... and far above the collapsed paper recipe (0.028 / 0.185).
    _, _, (paper_judged, paper_true) = world.paper
    assert judged > paper_judged + 0.05 and true > paper_true + 0.3
