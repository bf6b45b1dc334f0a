"""Unsupervised DIVE's selection signal: agreement with the frozen space, or pseudo-queries that can prefer better."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from conftest import write_beir
from embedtune.compress.base import PseudoQueries, TrainingData
from embedtune.compress.dive import DIVECompressor, DIVEConfig
from embedtune.data.pseudo_queries import PSEUDO_PREFIX, pseudo_query_texts
from embedtune.errors import EmbedtuneError
from embedtune.evaluate.retrieval import evaluate_embeddings
from embedtune.workflows.fit import fit_on_all

N_DOCS, DIM, CONTENT_DIMS, K = 1200, 48, 12, 12


def shared_mean_corpus(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """Documents = a large shared mean direction, of a magnitude that varies by document, plus their content.

    The content (topic and the document's own part) lies in ``CONTENT_DIMS`` directions orthogonal
    to the mean, a little noise in the rest. Queries are a document's content without the mean. In
    the frozen (unit-row) space a document's content then shrinks as its share of the mean grows,
    so every query prefers documents with little of it, whatever they are about; centring removes
    that. Uncentred PCA keeps the mean as its top axis (the frozen space's neighbourhoods, so the
    rank KL prefers it) and has one content axis less.
    """
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(DIM, DIM)))[0]
    mean_direction, content_axes, rest = basis[:, 0], basis[:, 1 : 1 + CONTENT_DIMS].T, basis[:, 1 + CONTENT_DIMS :]
    topics = rng.integers(CONTENT_DIMS, size=N_DOCS)
    content = content_axes[topics] + 0.5 * rng.normal(size=(N_DOCS, CONTENT_DIMS)) @ content_axes
    content += 0.03 * rng.normal(size=(N_DOCS, rest.shape[1])) @ rest.T
    share_of_mean = rng.uniform(1.5, 6.0, size=N_DOCS)
    return share_of_mean[:, None] * mean_direction + content, content, rng


def queries_for(content: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A query (or a pseudo-query) for each document of ``rows``: its content without the mean, plus noise."""
    return content[rows] + 0.05 * rng.normal(size=(len(rows), DIM))


@pytest.fixture(scope="module")
def synthetic():
    docs, content, rng = shared_mean_corpus()
    doc_ids = [f"d{i}" for i in range(N_DOCS)]
    pseudo = PseudoQueries([PSEUDO_PREFIX + d for d in doc_ids], queries_for(content, np.arange(N_DOCS), rng), np.zeros((0, 3)))
    test_rows = rng.choice(N_DOCS, 200, replace=False)
    query_ids = [f"q{i}" for i in range(len(test_rows))]
    qrels = {q: {doc_ids[row]: 1} for q, row in zip(query_ids, test_rows)}
    corpus = dataclasses.replace(TrainingData.corpus_only(docs, doc_ids), pseudo_queries=pseudo)
    return corpus, query_ids, queries_for(content, test_rows, rng), qrels


def fit(corpus: TrainingData, signal: str, seed: int = 3) -> DIVECompressor:
    config = DIVEConfig.preset("unsupervised", dim=K, epochs=2, progress=False, device="cpu", seed=seed, selection_signal=signal)
    return DIVECompressor(config).fit_unsupervised(corpus)


def test_pseudo_queries_pick_the_centred_start_that_agreement_with_the_frozen_space_cannot(synthetic, one_torch_thread):
    corpus, query_ids, queries, qrels = synthetic

    def ndcg(compressor: DIVECompressor | None) -> float:
        docs = corpus.doc_embeddings if compressor is None else compressor.transform(corpus.doc_embeddings)
        found = queries if compressor is None else compressor.transform(queries)
        return evaluate_embeddings(query_ids, found, corpus.doc_ids, docs, qrels).aggregate["ndcg@10"]

    by_rank_kl, by_pseudo_queries = fit(corpus, "rank-kl"), fit(corpus, "pseudo-queries")
    agreement, pseudo = by_rank_kl.history_[0], by_pseudo_queries.history_[0]
    # Agreement with the frozen space prefers the uncentred start, the pseudo-queries the centred one.
    assert agreement["start"] == "uncentred" and agreement["holdout_rank_kl_uncentred_start"] < agreement["holdout_rank_kl_centred_start"]
    assert pseudo["start"] == "centred"
    assert pseudo["holdout_pseudo_query_ndcg@10_centred_start"] > pseudo["holdout_pseudo_query_ndcg@10_uncentred_start"] + 0.05
    # Both signals saw the same two starts: the rank KL is logged beside the pseudo-queries' score.
    assert pseudo["holdout_rank_kl_centred_start"] == pytest.approx(agreement["holdout_rank_kl_centred_start"])
    assert by_pseudo_queries.fit_details()["start"] == "centred PCA"
    # And the centred choice retrieves the real queries better, better even than the frozen space.
    assert ndcg(by_pseudo_queries) > ndcg(by_rank_kl) + 0.1 and ndcg(by_pseudo_queries) > ndcg(None) + 0.1
    # The same seed makes the same choice and the same map.
    again = fit(corpus, "pseudo-queries")
    assert again.history_[0]["start"] == "centred" and again.selected_epoch_ == by_pseudo_queries.selected_epoch_
    np.testing.assert_array_equal(again.transform(queries), by_pseudo_queries.transform(queries))


def test_pseudo_query_selection_reads_only_held_out_documents_and_says_the_fix_without_them(synthetic):
    corpus, *_ = synthetic
    dive = DIVECompressor(DIVEConfig.preset("unsupervised", dim=K, epochs=0, progress=False, device="cpu", selection_signal="pseudo-queries"))
    held = dive.selection_documents(N_DOCS)
    assert len(held) == N_DOCS // 10 and np.array_equal(held, np.sort(held))
    with pytest.raises(ValueError, match="none were given.*build_pseudo_queries.*selection_signal='rank-kl'"):
        dive.fit_unsupervised(TrainingData.corpus_only(corpus.doc_embeddings, corpus.doc_ids))
    trained_on = np.setdiff1d(np.arange(N_DOCS), held)
    only_training_documents = PseudoQueries([PSEUDO_PREFIX + corpus.doc_ids[r] for r in trained_on[:50]],
                                            corpus.pseudo_queries.embeddings[trained_on[:50]], np.zeros((0, 3)))
    with pytest.raises(ValueError, match="none of the 50 pseudo-queries given is of a held-out document"):
        dive.fit_unsupervised(dataclasses.replace(corpus, pseudo_queries=only_training_documents))
    with pytest.raises(ValueError, match="selection_signal must be one of"):
        DIVEConfig(selection_signal="agreement")


def test_a_pseudo_query_that_is_the_whole_document_is_skipped_for_selection():
    corpus = {"titled": {"title": "Statins lower cholesterol", "text": "A trial of statins. It ran for years."},
              "title only": {"title": "Only a title, nothing else", "text": ""},
              "one sentence": {"title": "", "text": "a text with no sentence end at all"}}
    ids = list(corpus)
    assert pseudo_query_texts(corpus, ids, "title")[1] == ids  # as before: the training pseudo-queries keep them
    assert pseudo_query_texts(corpus, ids, "title", skip_whole_documents=True)[1] == ["titled"]
    assert pseudo_query_texts(corpus, ids, "first-sentence", skip_whole_documents=True)[2] == ["A trial of statins."]
    # Without titles or sentence ends (NPL's texts), the first 12 words of a document at least twice as long.
    words = [f"w{i}" for i in range(30)]
    unpunctuated = {"long": {"title": "", "text": " ".join(words)}, "short": {"title": "", "text": " ".join(words[:23])}}
    assert pseudo_query_texts(unpunctuated, ["long", "short"], "first-words", skip_whole_documents=True)[1:] == (
        ["long"], [" ".join(words[:12])])


@pytest.fixture
def sentences(tmp_path):
    """A BEIR corpus whose documents have two sentences each, and no labels."""
    corpus = [{"_id": f"d{i}", "text": f"document number {i} about topic {i % 5}. what about topic {i % 5} number {i}"}
              for i in range(40)]
    folder = write_beir(tmp_path / "sentences", corpus, [{"_id": "q0", "text": "topic 1"}], [("q0", "d1", 1)])
    return folder


def test_compress_fit_builds_the_held_out_pseudo_queries_from_the_corpus(sentences, tiny_bert_dir, tmp_path, one_torch_thread):
    out = tmp_path / "dive"
    settings = {"selection_signal": "pseudo-queries", "epochs": 1, "heads": 2, "progress": False}
    result = fit_on_all("dive", 8, data=sentences, model=str(tiny_bert_dir), unsupervised=True, preset="unsupervised",
                        settings=settings, pseudo_queries="first-sentence", out=out)
    info = json.loads((out / "fit.json").read_text())
    assert info["selection_pseudo_queries"] == {"source": "first-sentence", "n_queries": 4, "held_out_documents": 4}
    assert "holdout_pseudo_query_ndcg@10_uncentred_start" in result.compressor.history_[0]
    with pytest.raises(ValueError, match="drop --pseudo-queries none"):
        fit_on_all("dive", 8, data=sentences, model=str(tiny_bert_dir), unsupervised=True, preset="unsupervised", settings=settings,
                   pseudo_queries="none")


def test_compress_fit_on_given_vectors_names_the_fix(tmp_path):
    docs = np.random.default_rng(0).normal(size=(60, 16)).astype(np.float32)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(60)))
    with pytest.raises(EmbedtuneError, match="given without either.*--data CORPUS --model MODEL.*selection_signal=rank-kl"):
        fit_on_all("dive", 4, doc_embeddings=tmp_path / "docs.npy", doc_ids=tmp_path / "docs.txt",
                   settings={"selection_signal": "pseudo-queries", "epochs": 1, "progress": False})


def test_compress_fit_says_when_no_held_out_document_gives_a_pseudo_query(toy40, tiny_bert_dir):
    """toy40's documents are one sentence and no title: every pseudo-query would be its whole document."""
    with pytest.raises(EmbedtuneError, match="nothing to select on. Try --pseudo-queries first-sentence or --pseudo-queries first-words"):
        fit_on_all("dive", 8, data=toy40, model=str(tiny_bert_dir), unsupervised=True,
                   settings={"selection_signal": "pseudo-queries", "epochs": 1, "heads": 2, "progress": False})


def test_pseudo_query_anchors_train_on_training_documents_only_and_need_pseudo_queries(synthetic, one_torch_thread):
    from embedtune.compress.dive.unsupervised import _training_pseudo_queries, holdout_documents

    corpus, *_ = synthetic
    config = DIVEConfig.preset("unsupervised", dim=K, epochs=2, progress=False, device="cpu", seed=3, pseudo_query_weight=1.0)
    held, fit_rows = holdout_documents(N_DOCS, config)
    rows, anchors = _training_pseudo_queries(corpus.pseudo_queries, corpus.doc_ids, fit_rows)
    documents = {corpus.pseudo_queries.ids[row][len(PSEUDO_PREFIX):] for row in rows}
    assert documents == {corpus.doc_ids[row] for row in fit_rows}  # every training document's, no held-out one's
    assert [corpus.doc_ids[fit_rows[a]] for a in anchors] == [corpus.pseudo_queries.ids[r][len(PSEUDO_PREFIX):] for r in rows]

    fitted = DIVECompressor(config).fit_unsupervised(corpus)
    assert all(row["loss_pseudo_rank"] > 0 for row in fitted.history_[1:])
    again = DIVECompressor(config).fit_unsupervised(corpus)
    np.testing.assert_array_equal(again.transform(corpus.doc_embeddings), fitted.transform(corpus.doc_embeddings))
    plain = DIVECompressor(dataclasses.replace(config, pseudo_query_weight=0.0)).fit_unsupervised(corpus)
    assert all("loss_pseudo_rank" not in row for row in plain.history_[1:])

    with pytest.raises(ValueError, match="pseudo_query_weight > 0 distils .* none were given.*pseudo_query_weight=0"):
        DIVECompressor(config).fit_unsupervised(TrainingData.corpus_only(corpus.doc_embeddings, corpus.doc_ids))
    only_held = PseudoQueries([PSEUDO_PREFIX + corpus.doc_ids[row] for row in held], corpus.pseudo_queries.embeddings[held], np.zeros((0, 3)))
    with pytest.raises(ValueError, match="none of the .* is of a training document"):
        DIVECompressor(config).fit_unsupervised(dataclasses.replace(corpus, pseudo_queries=only_held))


def fit_from_the_cli(corpus, model, out, *flags: str) -> dict:
    """``compress fit --method dive --dim 8 --unsupervised`` on ``corpus`` with first-sentence pseudo-queries; its fit.json."""
    from embedtune.cli import main

    assert main(["--quiet", "compress", "fit", "--method", "dive", "--dim", "8", "--unsupervised", "--data", str(corpus), "--model",
                 str(model), "--pseudo-queries", "first-sentence", *flags, "--set", "heads=2", "--out", str(out)]) == 0
    return json.loads((out / "fit.json").read_text())


def test_compress_fit_trains_on_the_documents_pseudo_queries_with_the_weight(sentences, tiny_bert_dir, tmp_path, one_torch_thread):
    """The command of docs/no-labels.md, on a tiny model."""
    out = tmp_path / "dive-anchors"
    info = fit_from_the_cli(sentences, tiny_bert_dir, out, "--set", "pseudo_query_weight=1", "--set", "epochs=1")
    assert info["pseudo_queries"]["source"] == "first-sentence"
    assert info["pseudo_queries"]["n_queries"] > info["pseudo_queries"]["held_out_documents"]  # every document's, not the held-out ones'
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert log[-1]["loss_pseudo_rank"] >= 0  # trained on (a random tiny model's near-identical documents give a loss near 0)


def test_the_training_guard_falls_back_on_the_centred_start_where_training_and_agreement_prefer_the_uncentred(synthetic, one_torch_thread):
    """Distilling the frozen space teaches the mean direction the queries lack; the held-out pseudo-queries say so.

    With the default selection (agreement with the frozen space), the fit starts uncentred and
    trains; the guard finds neither that training nor the uncentred start retrieve the
    pseudo-queries as well as the centred start, and keeps the centred start, which retrieves the
    real queries better too.
    """
    corpus, query_ids, queries, qrels = synthetic

    def ndcg(compressor: DIVECompressor) -> float:
        found = evaluate_embeddings(query_ids, compressor.transform(queries), corpus.doc_ids, compressor.transform(corpus.doc_embeddings), qrels)
        return found.aggregate["ndcg@10"]

    config = DIVEConfig.preset("unsupervised", dim=K, epochs=4, progress=False, device="cpu", seed=3, training_guard="pseudo-queries")
    guarded = DIVECompressor(config).fit_unsupervised(corpus)
    verdict = guarded.fit_details()["training_guard"]
    assert guarded.history_[0]["start"] == "uncentred"  # what agreement trained from
    assert verdict["kept"] == "start" and verdict["start"] == "centred" and guarded.fit_details()["start"] == "centred PCA"
    assert verdict["selected_epoch"] > 0 and guarded.selected_epoch_ == 0 and verdict["n_pseudo_queries"] == N_DOCS // 10
    assert verdict["pseudo_query_ndcg@10_centred_start"] > verdict["pseudo_query_ndcg@10_uncentred_start"] + 0.1
    assert verdict["pseudo_query_ndcg@10_trained"] < verdict["pseudo_query_ndcg@10_centred_start"] and verdict["p_one_sided"] > 0.5
    # It is the untrained centred start, exactly (as the pseudo-queries' selection picks it before any training).
    untrained = DIVECompressor(dataclasses.replace(config, epochs=0, training_guard="none", selection_signal="pseudo-queries"))
    untrained.fit_unsupervised(corpus)
    assert untrained.fit_details()["start"] == "centred PCA"
    np.testing.assert_array_equal(guarded.transform(queries), untrained.transform(queries))
    # The same seed and data give the same verdict and the same map.
    again = DIVECompressor(config).fit_unsupervised(corpus)
    assert again.fit_details()["training_guard"] == verdict
    np.testing.assert_array_equal(again.transform(queries), guarded.transform(queries))
    # Without the guard the same fit keeps its trained epoch, which retrieves the real queries far worse.
    unguarded = DIVECompressor(dataclasses.replace(config, training_guard="none")).fit_unsupervised(corpus)
    assert unguarded.selected_epoch_ == verdict["selected_epoch"] and "training_guard" not in unguarded.fit_details()
    assert ndcg(guarded) > ndcg(unguarded) + 0.1


def test_the_training_guard_keeps_training_only_on_a_significant_gain_over_the_preferred_start():
    dive = DIVECompressor(DIVEConfig.preset("unsupervised", dim=K, progress=False, device="cpu", training_guard="pseudo-queries"))
    rng = np.random.default_rng(0)
    start = rng.uniform(0.3, 0.7, size=400)
    starts = {"uncentred": start, "centred": start - 0.01}
    clear_gain = dive._guard_verdict(starts, "uncentred", start + rng.uniform(0.0, 0.1, size=400), epoch=5)
    assert clear_gain["kept"] == "trained" and clear_gain["start"] == "uncentred" and clear_gain["p_one_sided"] < 0.01
    # A gain on a handful of pseudo-queries, with as many losses, is chance: the start stays.
    noisy = start.copy()
    noisy[:6] += np.array([0.3, 0.3, 0.3, -0.2, -0.2, -0.2])
    assert dive._guard_verdict(starts, "uncentred", noisy, epoch=5)["kept"] == "start"
    assert dive._guard_verdict(starts, "uncentred", start - 0.05, epoch=5)["kept"] == "start"
    # Training is measured against the start the pseudo-queries prefer, whichever one it began from.
    better_centred = {"uncentred": start, "centred": start + 0.05}
    beats_its_start_only = dive._guard_verdict(better_centred, "uncentred", start + 0.03, epoch=5)
    assert beats_its_start_only["kept"] == "start" and beats_its_start_only["start"] == "centred"
    assert beats_its_start_only["mean_difference"] == pytest.approx(-0.02)
    # Where selection kept the start, the guard still picks between the starts; ties keep the one selection chose.
    assert dive._guard_verdict(better_centred, "uncentred", None, epoch=0)["start"] == "centred"
    assert dive._guard_verdict({"uncentred": start, "centred": start.copy()}, "centred", None, epoch=0)["start"] == "centred"
    # A preference for the other start that a few pseudo-queries make is not evidence: selection's start stays.
    assert dive._guard_verdict({"uncentred": start, "centred": noisy}, "uncentred", None, epoch=0)["start"] == "uncentred"
    strict = DIVECompressor(DIVEConfig.preset("unsupervised", dim=K, progress=False, device="cpu", training_guard="pseudo-queries",
                                              training_guard_p=1e-6))
    assert strict._guard_verdict(starts, "uncentred", start + rng.uniform(0.0, 0.1, size=400), epoch=5)["kept"] == "start"  # p >= 1e-4


def test_the_training_guard_needs_held_out_pseudo_queries_and_says_the_fix(synthetic):
    corpus, *_ = synthetic
    config = DIVEConfig.preset("unsupervised", dim=K, epochs=1, progress=False, device="cpu", training_guard="pseudo-queries")
    with pytest.raises(ValueError, match="training_guard='pseudo-queries' scores the held-out documents' pseudo-queries, but none "
                                         "were given.*use training_guard='none'"):
        DIVECompressor(config).fit_unsupervised(TrainingData.corpus_only(corpus.doc_embeddings, corpus.doc_ids))
    with pytest.raises(ValueError, match="needs epoch_selection='best'.*training_guard='none'"):
        DIVECompressor(dataclasses.replace(config, epoch_selection="last")).fit(corpus)  # fit_unsupervised would select
    with pytest.raises(ValueError, match="training_guard must be one of"):
        DIVEConfig(training_guard="always")


def test_compress_fit_guards_the_training_with_the_held_out_pseudo_queries(sentences, tiny_bert_dir, tmp_path, one_torch_thread):
    info = fit_from_the_cli(sentences, tiny_bert_dir, tmp_path / "dive-guarded", "--preset", "unsupervised", "--training-guard",
                            "pseudo-queries", "--set", "epochs=2")
    assert info["selection_pseudo_queries"] == {"source": "first-sentence", "n_queries": 4, "held_out_documents": 4}
    assert info["config"]["training_guard"] == "pseudo-queries"
    with pytest.raises(EmbedtuneError, match="training_guard='pseudo-queries'.*given without either.*training_guard=none"):
        docs = np.random.default_rng(0).normal(size=(60, 16)).astype(np.float32)
        np.save(tmp_path / "docs.npy", docs)
        (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(60)))
        fit_on_all("dive", 4, doc_embeddings=tmp_path / "docs.npy", doc_ids=tmp_path / "docs.txt", unsupervised=True,
                   settings={"training_guard": "pseudo-queries", "epochs": 1, "progress": False})


def test_the_guarded_preset_is_the_unsupervised_one_with_anchors_and_the_guard(sentences, tiny_bert_dir, tmp_path, one_torch_thread):
    guarded, plain = DIVEConfig.preset("unsupervised-guarded"), DIVEConfig.preset("unsupervised")
    assert guarded.training_guard == "pseudo-queries" and guarded.pseudo_query_weight == 1.0
    assert dataclasses.replace(guarded, training_guard="none", pseudo_query_weight=0.0) == plain
    info = fit_from_the_cli(sentences, tiny_bert_dir, tmp_path / "dive-preset", "--preset", "unsupervised-guarded", "--set", "epochs=1")
    assert info["config"]["training_guard"] == "pseudo-queries" and info["pseudo_queries"]["source"] == "first-sentence"


DEFAULT_FIT = {"epochs": 1, "heads": 2, "progress": False}


def test_a_label_free_fit_from_text_takes_the_guarded_preset_by_default(sentences, tiny_bert_dir, tmp_path, one_torch_thread):
    result = fit_on_all("dive", 8, data=sentences, model=str(tiny_bert_dir), unsupervised=True, settings=DEFAULT_FIT,
                        out=tmp_path / "default")
    assert result.info["preset"] == "unsupervised-guarded"
    assert result.info["config"]["training_guard"] == "pseudo-queries" and result.info["config"]["pseudo_query_weight"] == 1.0
    # No titles here: each document's first sentence stands in for it (the title source's own fallback).
    assert result.info["pseudo_queries"] == {"source": "title", "n_queries": 40, "held_out_documents": 4}
    assert result.compressor.fit_details()["training_guard"]["kept"] in ("start", "trained")
    # Asking for no pseudo-queries takes the plain preset, and says so.
    plain = fit_on_all("dive", 8, data=sentences, model=str(tiny_bert_dir), unsupervised=True, settings=DEFAULT_FIT,
                       pseudo_queries="none")
    assert plain.info["preset"] == "unsupervised" and plain.info["config"]["training_guard"] == "none"
    assert any("--pseudo-queries none asks for none" in note for note in plain.notes)


def test_a_label_free_fit_on_given_vectors_takes_the_plain_preset_and_says_why(tmp_path, one_torch_thread):
    docs = np.random.default_rng(0).normal(size=(60, 16)).astype(np.float32)
    np.save(tmp_path / "docs.npy", docs)
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(60)))
    result = fit_on_all("dive", 4, doc_embeddings=tmp_path / "docs.npy", doc_ids=tmp_path / "docs.txt", unsupervised=True,
                        settings=DEFAULT_FIT)
    assert result.info["preset"] == "unsupervised" and result.info["config"]["training_guard"] == "none"
    assert any("'unsupervised-guarded', the default where the documents' text is at hand" in note and "given without it" in note
               for note in result.notes)


def test_a_default_fit_on_texts_without_titles_or_sentence_ends_reads_their_first_words(tiny_bert_dir, tmp_path, one_torch_thread):
    corpus = [{"_id": f"d{i}", "text": " ".join(f"word{(i * 7 + j) % 50} topic{i % 5}" for j in range(15))} for i in range(40)]
    folder = write_beir(tmp_path / "unpunctuated", corpus, [{"_id": "q0", "text": "topic1"}], [("q0", "d1", 1)])
    result = fit_on_all("dive", 8, data=folder, model=str(tiny_bert_dir), unsupervised=True, settings=DEFAULT_FIT)
    assert result.info["preset"] == "unsupervised-guarded" and result.info["pseudo_queries"]["source"] == "first-words"


def test_a_default_fit_on_texts_that_give_no_pseudo_query_takes_the_plain_preset(toy40, tiny_bert_dir, one_torch_thread):
    """toy40's documents are one short sentence and no title: no source gives a pseudo-query shorter than the document."""
    result = fit_on_all("dive", 8, data=toy40, model=str(tiny_bert_dir), unsupervised=True, settings=DEFAULT_FIT)
    assert result.info["preset"] == "unsupervised" and result.info["config"]["training_guard"] == "none"
    assert "pseudo_queries" not in result.info
    assert any("tried title and first-words" in note for note in result.notes)


def test_a_fit_whose_guard_sets_training_aside_says_so_and_not_that_no_epoch_beat_the_start():
    from embedtune.workflows.fit import training_guard_note

    # The verdict of MED at k = 64, seed 2027 (compress fit --unsupervised from its text).
    verdict = {"kept": "start", "start": "uncentred", "selected_epoch": 7, "n_pseudo_queries": 76, "p_threshold": 0.05,
               "mean_difference": 0.0059, "p_one_sided": 0.127}
    assert training_guard_note("dive", {"training_guard": verdict}) == (
        "dive: the training guard kept the uncentred PCA start: the held-out documents' pseudo-queries scored epoch 7 "
        "+0.0059 nDCG@10 above it, one-sided p 0.127 over 76, not below 0.05.")
    assert training_guard_note("dive", {"training_guard": {**verdict, "kept": "trained"}}) is None
    # Selection itself kept the start: nothing trained for the guard to set aside.
    untrained = {key: value for key, value in verdict.items() if key not in ("mean_difference", "p_one_sided")}
    assert training_guard_note("dive", {"training_guard": untrained}) is None
    assert training_guard_note("pca", {"rows": 10}) is None


def test_the_anchors_read_pseudo_queries_of_the_training_sample_and_the_held_out_documents_only(sentences, tiny_bert_dir, tmp_path,
                                                                                               one_torch_thread):
    # 40 documents, 4 held out, a training sample of 20: pseudo-queries for those 24, not for all 40.
    result = fit_on_all("dive", 8, data=sentences, model=str(tiny_bert_dir), unsupervised=True,
                        settings={**DEFAULT_FIT, "max_train_docs": 20})
    compressor = result.compressor
    wanted = set(compressor.selection_documents(40)) | set(compressor.training_documents(40))
    assert len(wanted) == 24 and result.info["pseudo_queries"]["n_queries"] == 24
    assert result.info["pseudo_queries"]["held_out_documents"] == 4


def test_a_label_free_plan_fits_dive_as_compress_fit_does_from_text(sentences, tiny_bert_dir, tmp_path, one_torch_thread):
    """A plan's DIVE candidate takes the text preset where the corpus's text is at hand, the plain one on vectors alone."""
    from embedtune.workflows.experiment import load_corpus_experiment
    from embedtune.workflows.label_free import fit_label_free
    from embedtune.workflows.plan import Candidate

    experiment = load_corpus_experiment(sentences, str(tiny_bert_dir), cache=False)
    ids, docs = list(experiment.embeddings.doc_ids), experiment.embeddings.doc_embeddings
    candidate = Candidate("dive", 8, settings=tuple(sorted(DEFAULT_FIT.items())))
    guarded, _ = fit_label_free(candidate, ids, docs, seed=3, work=tmp_path / "work", text=experiment, cache=False)
    assert guarded.config.training_guard == "pseudo-queries" and guarded.config.pseudo_query_weight == 1.0
    assert guarded.fit_details()["training_guard"]["n_pseudo_queries"] == 4
    # The same call with the same text is the cached fit; without the text it is another fit, of the plain preset.
    again, _ = fit_label_free(candidate, ids, docs, seed=3, work=tmp_path / "work", text=experiment, cache=False)
    assert again.state_sha256() == guarded.state_sha256()
    plain, _ = fit_label_free(candidate, ids, docs, seed=3, work=tmp_path / "work")
    assert plain.config.training_guard == "none" and plain.config.pseudo_query_weight == 0


def test_a_label_free_plan_makes_the_text_preset_s_pseudo_queries_from_the_source_asked(sentences, tiny_bert_dir, tmp_path,
                                                                                         one_torch_thread):
    """``compress plan --pseudo-query-source`` reaches DIVE's text preset: the fit reads that source's pseudo-queries only."""
    from embedtune.workflows.experiment import load_corpus_experiment
    from embedtune.workflows.label_free import fit_label_free
    from embedtune.workflows.plan import Candidate

    experiment = load_corpus_experiment(sentences, str(tiny_bert_dir), cache=False)
    ids, docs = list(experiment.embeddings.doc_ids), experiment.embeddings.doc_embeddings
    candidate = Candidate("dive", 8, settings=tuple(sorted(DEFAULT_FIT.items())))
    read = {}
    for source in (None, "first-sentence"):
        work = tmp_path / str(source)
        fitted, _ = fit_label_free(candidate, ids, docs, seed=3, work=work, text=experiment, cache=False, pseudo_query_source=source)
        assert fitted.config.training_guard == "pseudo-queries"
        read[source] = json.loads(next(work.rglob("key.json")).read_text())["pseudo_queries"]["source"]
    assert read == {None: "title", "first-sentence": "first-sentence"}


def test_a_label_free_plan_on_texts_without_pseudo_queries_fits_the_plain_preset(toy40, tiny_bert_dir, tmp_path, one_torch_thread):
    from embedtune.workflows.experiment import load_corpus_experiment
    from embedtune.workflows.label_free import fit_label_free
    from embedtune.workflows.plan import Candidate

    # toy40's documents are one short sentence each, with no title: no source gives a pseudo-query shorter than them.
    experiment = load_corpus_experiment(toy40, str(tiny_bert_dir), cache=False)
    candidate = Candidate("dive", 8, settings=tuple(sorted(DEFAULT_FIT.items())))
    fitted, _ = fit_label_free(candidate, list(experiment.embeddings.doc_ids), experiment.embeddings.doc_embeddings, seed=3,
                               text=experiment, cache=False)
    assert fitted.config.training_guard == "none" and fitted.config.pseudo_query_weight == 0
