"""The safety net is the default of every supervised method, and it holds them at PCA.

On ``tests/test_collapse.py``'s synthetic set (many relevant documents per query, most unjudged)
the paper recipes of DIVE, Matryoshka-Adaptor and Search-Adaptor collapse far below PCA. With
their default preset, ``robust`` (false-negative filter, per-query cap, PCA-rotated start and
best-epoch selection with epoch 0 as a candidate), every supervised method must end at or above
PCA. Measured on this set (seed 0, nDCG@10 judged / complete truth, k=16): PCA 0.142 / 0.927;
robust DIVE 0.139 / 0.924, Matryoshka-Adaptor 0.144 / 0.929, Search-Adaptor 0.150 / 0.959, SMEC
0.145 / 0.926 (paper recipes: 0.028 / 0.185, 0.054 / 0.300, 0.059 / 0.319, 0.146 / 0.759).

The DIVE protocol benchmark keeps the papers' recipes: its configs never build the safety net.
"""

from __future__ import annotations

import dataclasses
import glob
from pathlib import Path

import numpy as np
import pytest
import torch

from embedtune.bench.dive_protocol import plan_phase_one
from embedtune.bench.protocol_config import DatasetSpec, load_protocol_config
from embedtune.compress import TrainingData, available_methods, get_compressor_class
from embedtune.compress.pca import PCACompressor, PCAConfig
from embedtune.compress.presets import SAFETY_NET_MINING, SAFETY_NET_SETTINGS
from embedtune.compress.selection import EpochControl
from embedtune.data.synthetic import make_false_negative_dataset
from embedtune.data.triplets import mine_triplets
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.workflows.fit_and_score import build_config

K = 16
DATASET = dict(n_queries=80, n_docs=8000, dim=128, n_topics=8, topic_spread=0.5, query_shift=0.5, seed=0)
SUPERVISED = [m for m in available_methods() if get_compressor_class(m).supervised]


def test_every_supervised_method_defaults_to_the_safety_net():
    assert set(SUPERVISED) >= {"dive", "mrl-adaptor", "search-adaptor", "smec"}
    for method in SUPERVISED:
        preset = get_compressor_class(method).get_preset(None)
        assert preset.mining == SAFETY_NET_MINING, method
        assert {key: preset.settings[key] for key in SAFETY_NET_SETTINGS} == dict(SAFETY_NET_SETTINGS), method
        # The dataclass defaults stay the papers' recipes (what the protocol benchmark builds).
        config = get_compressor_class(method).config_class()
        assert (config.init, config.epoch_selection) == ("identity", "last"), method


def test_the_protocol_benchmark_keeps_the_papers_recipes():
    """The recipes, not the data: on a machine without the real datasets (``../shared``) the bundled scifact stands in."""
    for path in sorted(glob.glob("benchmarks/*.toml")):
        protocol = load_protocol_config(path)
        if any(not Path(spec.path).exists() for spec in protocol.datasets):
            protocol = dataclasses.replace(protocol, datasets=[DatasetSpec("scifact", "scifact")])
        for spec in plan_phase_one(protocol):
            if spec.method in ("mrl-adaptor", "search-adaptor", "smec"):
                config = build_config(spec.method, spec.dim, spec.seed, spec.overrides_dict)
                assert (config.init, config.epoch_selection) == ("identity", "last"), (path, spec.key)
        if path.endswith(("dive_paper.toml", "dive_beir_train.toml", "dive_beyond.toml", "dive_paper_smec_total.toml")):
            assert protocol.mining().false_negative_margin is None and protocol.mining().max_triplets_per_query is None, path


def test_epoch_control_counts_across_stages_and_stops():
    scores = iter([0.5, 0.4, 0.7, 0.6])
    control = EpochControl(score=lambda: next(scores))
    weights = torch.nn.Linear(2, 2)
    control.begin({"w": weights})
    for epoch in range(3):
        with torch.no_grad():
            weights.weight.fill_(float(epoch + 1))
        control.end_epoch({}, candidate=True)
    assert control.best_epoch == 2 and control.scores == {0: 0.5, 1: 0.4, 2: 0.7, 3: 0.6}
    control.restore()
    assert float(weights.weight.detach()[0, 0]) == 2.0  # the best epoch's weights are back
    stopper = EpochControl(stop_at=2)
    assert not stopper.exhausted
    stopper.end_epoch({})
    stopper.end_epoch({})
    assert stopper.exhausted and stopper.best_epoch is None


class World:
    def __init__(self) -> None:
        self.dataset = make_false_negative_dataset(**DATASET)
        query_ids, queries, self.doc_ids, self.docs, qrels = self.dataset
        half = len(query_ids) // 2
        self.train_ids, self.test_ids = query_ids[:half], query_ids[half:]
        self.train_queries, self.test_queries = queries[:half], queries[half:]
        self.train_qrels = {query_id: qrels[query_id] for query_id in self.train_ids}
        self.pca = self.score(PCACompressor(PCAConfig(dim=K)).fit(
            TrainingData(self.train_ids, self.train_queries, self.doc_ids, self.docs, self.train_qrels)))

    def score(self, compressor) -> tuple[float, float]:
        test_queries, docs = compressor.transform(self.test_queries), compressor.transform(self.docs)
        return tuple(
            float(evaluate_embeddings(self.test_ids, test_queries, self.doc_ids, docs, {q: truth[q] for q in self.test_ids}).aggregate["ndcg@10"])
            for truth in (self.dataset.qrels, self.dataset.true_qrels)
        )

    def fit_default(self, method: str):
        """``method`` with its default preset: the preset's settings and its triplet mining."""
        cls = get_compressor_class(method)
        preset = cls.get_preset(None)
        triplets = mine_triplets(self.train_ids, self.train_queries, self.doc_ids, self.docs, self.train_qrels,
                                 n_negatives=preset.mining.n_negatives, hard_pool=50, seed=2027, **preset.mining.filter_options())
        train = TrainingData(self.train_ids, self.train_queries, self.doc_ids, self.docs, self.train_qrels, triplets)
        return cls(cls.config_class(dim=K, device="cpu", progress=False, **preset.settings)).fit(train)


@pytest.fixture(scope="module")
def world(one_torch_thread_module) -> World:
    return World()


@pytest.fixture(scope="module")
def one_torch_thread_module():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors on a busy machine; also keeps the runs bit-for-bit reproducible
    yield
    torch.set_num_threads(previous)


@pytest.mark.slow
@pytest.mark.parametrize("method", SUPERVISED)
def test_every_supervised_method_with_the_safety_net_stays_at_pca(world, method):
    pca_judged, pca_true = world.pca
    compressor = world.fit_default(method)
    judged, true = world.score(compressor)
    assert compressor.selected_epoch_ is not None  # best-epoch selection ran, epoch 0 a candidate
    # At or above PCA, up to DIVE's tolerance in test_collapse.py (seed 0: DIVE 0.139 vs 0.142, 0.924 vs 0.927).
    assert judged >= pca_judged - 0.02 and true >= pca_true - 0.03, (method, (judged, true), world.pca)
    assert np.isfinite([judged, true]).all()
