"""Training-only pseudo-queries from the documents' own text."""

from __future__ import annotations

import numpy as np
import pytest

from embedtune.compress.base import PseudoQueries, TrainingData
from embedtune.compress.dive import DIVECompressor, DIVEConfig
from embedtune.compress.holdout import holdout_split
from embedtune.data.beir import BeirDataset
from embedtune.data.pseudo_queries import PSEUDO_PREFIX, pseudo_query_texts
from embedtune.data.triplets import mine_triplets
from embedtune.encoders.dataset import DatasetEmbeddings
from embedtune.errors import EmbedtuneError
from embedtune.workflows.experiment import Experiment
from embedtune.workflows.pseudo_queries import build_pseudo_queries


def test_titles_unless_empty_shared_or_short():
    corpus = {
        "a": {"title": "Vitamin D and bone density", "text": "Ignored. Second."},
        "b": {"title": "Shared debate title", "text": "First sentence of b is here. Then more."},
        "c": {"title": "Shared debate title", "text": "C opens with this sentence! Rest."},
        "d": {"title": "", "text": "No title, so this sentence. Rest of d."},
        "e": {"title": "", "text": "Tiny."},
    }
    ids, docs, texts = pseudo_query_texts(corpus, list(corpus), "title")
    assert docs == ["a", "b", "c", "d"] and ids == [PSEUDO_PREFIX + d for d in docs]  # e's text is too short
    assert texts == ["Vitamin D and bone density", "First sentence of b is here.", "C opens with this sentence!",
                     "No title, so this sentence."]
    _, _, first = pseudo_query_texts(corpus, ["a"], "first-sentence")
    assert first == []  # its first sentence, 'Ignored.', is under 12 characters: no pseudo-query
    _, _, first = pseudo_query_texts(corpus, ["b"], "first-sentence")
    assert first == ["First sentence of b is here."]
    with pytest.raises(ValueError, match="source must be one of"):
        pseudo_query_texts(corpus, ["a"], "abstract")


def _toy(seed: int = 0, n_docs: int = 60, dim: int = 16) -> tuple[TrainingData, PseudoQueries]:
    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n_docs, dim)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    doc_ids = [f"d{i}" for i in range(n_docs)]
    queries = docs[:20] + 0.3 * rng.normal(size=(20, dim)).astype(np.float32)
    query_ids = [f"q{i}" for i in range(20)]
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(20)}
    triplets = mine_triplets(query_ids, queries, doc_ids, docs, qrels, n_negatives=2, seed=1)
    pseudo_vecs = docs + 0.2 * rng.normal(size=docs.shape).astype(np.float32)
    pseudo_ids = [PSEUDO_PREFIX + d for d in doc_ids]
    pseudo_triplets = mine_triplets(pseudo_ids, pseudo_vecs, doc_ids, docs, {p: {d: 1} for p, d in zip(pseudo_ids, doc_ids)},
                                    n_negatives=2, seed=1)
    pseudo = PseudoQueries(pseudo_ids, pseudo_vecs, pseudo_triplets)
    return TrainingData(query_ids, queries, doc_ids, docs, qrels, triplets, pseudo), pseudo


def test_training_data_checks_the_pseudo_queries():
    train, pseudo = _toy()
    with pytest.raises(ValueError, match="pseudo-query vectors are 8-d"):
        TrainingData(train.query_ids, train.query_embeddings, train.doc_ids, train.doc_embeddings, train.qrels, train.triplets,
                     PseudoQueries(pseudo.ids, pseudo.embeddings[:, :8], pseudo.triplets))
    with pytest.raises(ValueError, match="pseudo-query row that does not exist"):
        PseudoQueries(pseudo.ids[:3], pseudo.embeddings[:3], pseudo.triplets)


def test_selection_never_holds_out_a_pseudo_query():
    train, pseudo = _toy()
    fit_part, holdout = holdout_split(train, 0.5, seed=3)
    assert fit_part.pseudo_queries is pseudo
    assert holdout.pseudo_queries is None and not any(q.startswith(PSEUDO_PREFIX) for q in holdout.query_ids)


def test_dive_trains_on_pseudo_queries_only_when_weighted():
    train, _ = _toy()
    settings = dict(dim=8, heads=2, epochs=3, progress=False, batch_size=16)
    weighted = DIVECompressor(DIVEConfig(**settings, pseudo_query_weight=1.0)).fit(train)
    again = DIVECompressor(DIVEConfig(**settings, pseudo_query_weight=1.0)).fit(train)
    plain = DIVECompressor(DIVEConfig(**settings)).fit(train)
    assert all(row["loss_pseudo"] >= 0 for row in weighted.history_)
    assert not any("loss_pseudo" in row for row in plain.history_)
    x = train.doc_embeddings[:5]
    np.testing.assert_array_equal(weighted.transform(x), again.transform(x))  # deterministic, pseudo batches included
    assert not np.allclose(weighted.transform(x), plain.transform(x))
    with pytest.raises(ValueError, match="pseudo_query_weight must be a finite number >= 0"):
        DIVEConfig(pseudo_query_weight=-1.0)


class _FakeEncoder:
    """Stands in for SentenceEncoder: deterministic vectors from the text's bytes, no model."""

    fingerprint = "fake"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def recipe(self, kind):
        return {"kind": kind}

    def encode(self, texts, kind="query"):
        self.calls.append(list(texts))
        rows = np.array([[sum(t.encode()) % 7 + 1, len(t), t.count("e") + 1, 1.0] for t in texts], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _experiment(model: str) -> Experiment:
    corpus = {f"d{i}": {"title": f"Title number {i} e{'e' * i}", "text": "Body text."} for i in range(6)}
    dataset = BeirDataset("toy", corpus, {"q": "query"}, {"q": {"d1": 1}}, "test", {"corpus.jsonl": "abc"}, "toy")
    docs = np.eye(6, 4, dtype=np.float32) + 0.1
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    embeddings = DatasetEmbeddings(list(corpus), docs, ["q"], docs[:1], {}, {})
    return Experiment(dataset, embeddings, None, "cosine", {"model": model})


def test_build_pseudo_queries_mines_each_documents_own_positive():
    encoder = _FakeEncoder()
    pseudo = build_pseudo_queries(_experiment("minilm"), "title", seed=5, encoder=encoder, cache=False)
    assert pseudo.ids == [f"{PSEUDO_PREFIX}d{i}" for i in range(6)] and encoder.calls[0][0] == "Title number 0 e"
    rows = pseudo.triplets
    assert len(rows) == 6 * 4 and (rows[:, 1] == rows[:, 0]).all()  # the positive of pseudo-query i is document i
    assert (rows[:, 2] != rows[:, 1]).all()
    with pytest.raises(EmbedtuneError, match="precomputed"):
        build_pseudo_queries(_experiment("precomputed"), cache=False)



def test_the_recipe_decides_unless_the_user_does(monkeypatch):
    import embedtune.workflows.pseudo_queries as module
    from embedtune.workflows.pseudo_queries import recipe_pseudo_queries

    built = []
    monkeypatch.setattr(module, "build_pseudo_queries", lambda experiment, source, mining, seed: built.append(source) or "built")
    encoded = _experiment("minilm")
    assert recipe_pseudo_queries(encoded, "dive", None, None, None, 1) == (None, None)
    assert recipe_pseudo_queries(encoded, "dive", None, "title", None, 1) == ("built", None)
    assert recipe_pseudo_queries(encoded, "dive", "first-sentence", "title", None, 1) == ("built", None)
    assert built == ["title", "first-sentence"]
    assert recipe_pseudo_queries(encoded, "dive", "none", "title", None, 1) == (None, None)
    # A recipe's own pseudo-queries are skipped, with a note, where there is no text to make them from.
    given = _experiment("precomputed")
    pseudo, note = recipe_pseudo_queries(given, "dive", None, "title", None, 1)
    assert pseudo is None and "trains on the labelled queries alone" in note
    with pytest.raises(EmbedtuneError, match="given without either"):
        recipe_pseudo_queries(given, "dive", "title", None, None, 1)
    assert recipe_pseudo_queries(encoded, "mrl-adaptor", None, "title", None, 1) == (None, None)
    with pytest.raises(ValueError, match="pseudo-queries train DIVE only"):
        recipe_pseudo_queries(encoded, "mrl-adaptor", "title", None, None, 1)


def test_a_smaller_corpus_gets_its_own_cache_entry(tmp_path):
    from embedtune.encoders.cache import EmbeddingCache

    cache = EmbeddingCache(tmp_path, use_bundled=False)
    whole = _experiment("minilm")
    first = build_pseudo_queries(whole, "title", seed=5, encoder=_FakeEncoder(), cache=cache)
    part = _experiment("minilm")
    keep = 4
    part.embeddings = DatasetEmbeddings(whole.embeddings.doc_ids[:keep], whole.embeddings.doc_embeddings[:keep], ["q"],
                                        whole.embeddings.query_embeddings, {}, {})
    encoder = _FakeEncoder()
    second = build_pseudo_queries(part, "title", seed=5, encoder=encoder, cache=cache)
    assert len(second.ids) == keep and encoder.calls  # encoded, not a clash with the whole corpus's entry
    again = _FakeEncoder()
    assert build_pseudo_queries(whole, "title", seed=5, encoder=again, cache=cache).ids == first.ids and not again.calls  # still cached


def test_the_default_encoder_is_the_experiments_own_recipe(monkeypatch):
    import embedtune.encoders.recipe as module

    seen = {}

    class Recorder(_FakeEncoder):
        def __init__(self, model, **options):
            super().__init__()
            seen.update(model=model, **options)

    monkeypatch.setattr(module, "SentenceEncoder", Recorder)
    experiment = _experiment("minilm")
    experiment.embeddings.model = {"backend": "onnx-int8", "max_seq_length": 128, "query_prompt": "query: "}
    build_pseudo_queries(experiment, cache=False)
    assert seen["model"] == "minilm" and seen["backend"] == "onnx-int8" and seen["max_seq_length"] == 128
    assert seen["query_prompt"] == "query: " and seen["normalize"] is True
