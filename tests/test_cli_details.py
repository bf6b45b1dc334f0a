"""Small visible details of the CLI, each with the behaviour it now has.

- `search` on an index that records no model: an error naming the fix (no silent MiniLM).
- `search --out` prints its summary once.
- Shape errors name what the vectors are, never an internal variable ("X has 128 columns").
- `evaluate --json` uses MTEB's metric names, as results.json does (the older keys stay as aliases).
- `pipeline --help` states the preset and the Stage I schedule it really uses.
- `pipeline` saves every fitted compressor under OUT, so the scored combination can be deployed.
- `search --queries` drops a hit whose id is the query's, as `evaluate` (BEIR's ignore_identical_ids) does.
- The MTEB file holds MTEB's retrieval metrics, a string mteb_version and dataset_revision, and
  loads with MTEB's own TaskResult when that is importable.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import write_beir
from embedtune.cli import build_parser, main
from embedtune.workflows.experiment import load_experiment


@pytest.fixture
def index_without_model(toy_beir, tiny_bert_dir, tmp_path, capsys):
    experiment = load_experiment(data=str(toy_beir), model=str(tiny_bert_dir), split_seed=None)
    np.save(tmp_path / "docs.npy", np.asarray(experiment.embeddings.doc_embeddings, dtype=np.float32))
    (tmp_path / "ids.txt").write_text("".join(i + "\n" for i in experiment.embeddings.doc_ids))
    assert main(["index", "build", "--embeddings", str(tmp_path / "docs.npy"), "--ids", str(tmp_path / "ids.txt"),
                 "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    return tmp_path / "idx"


def test_search_without_a_recorded_model_names_the_fix(index_without_model, capsys):
    assert main(["search", "what about topic 1", "--index", str(index_without_model)]) == 2
    err = capsys.readouterr().err
    assert "records no model" in err and "pass --model" in err and "index build --model" in err


def test_search_out_prints_its_summary_once(index_without_model, toy_beir, tiny_bert_dir, tmp_path, capsys):
    assert main(["search", "--index", str(index_without_model), "--model", str(tiny_bert_dir), "--queries",
                 str(toy_beir / "queries.jsonl"), "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count("10 queries") == 1, captured


def test_search_drops_the_query_itself_as_evaluate_does(tiny_bert_dir, tmp_path, capsys):
    # ArguAna-like: every query is also a document, under the same id.
    texts = [f"document number {i} about topic {i % 4}" for i in range(12)]  # words of the tiny BERT's vocabulary
    root = write_beir(tmp_path / "args", [{"_id": f"a{i}", "text": t} for i, t in enumerate(texts)],
                      [{"_id": f"a{i}", "text": texts[i]} for i in range(6)], [(f"a{i}", f"a{i + 6}", 1) for i in range(6)])
    experiment = load_experiment(data=str(root), model=str(tiny_bert_dir), split_seed=None)
    np.save(tmp_path / "docs.npy", np.asarray(experiment.embeddings.doc_embeddings, dtype=np.float32))
    (tmp_path / "ids.txt").write_text("".join(i + "\n" for i in experiment.embeddings.doc_ids))
    assert main(["index", "build", "--embeddings", str(tmp_path / "docs.npy"), "--ids", str(tmp_path / "ids.txt"), "--out",
                 str(tmp_path / "idx"), "--model", str(tiny_bert_dir)]) == 0
    capsys.readouterr()
    base = ["search", "--index", str(tmp_path / "idx"), "--queries", str(root / "queries.jsonl"), "--top-k", "5", "--json"]
    assert main(base) == 0
    hits = {q["query_id"]: q["hits"] for q in json.loads(capsys.readouterr().out)["queries"]}
    assert all(len(found) == 5 and qid not in [h["id"] for h in found] for qid, found in hits.items())
    assert all([h["rank"] for h in found] == [1, 2, 3, 4, 5] for found in hits.values())
    # What evaluate scores: the same ranking with the query's own document dropped.
    from embedtune.evaluate.retrieval import search_ids

    ids = list(experiment.dataset.queries)
    run = search_ids(ids, experiment.embeddings.queries(ids), experiment.embeddings.doc_ids,
                     np.ascontiguousarray(experiment.embeddings.doc_embeddings), 5, True)
    for qid in ids:
        assert [h["id"] for h in hits[qid]] == sorted(run[qid], key=lambda d: -run[qid][d])
    assert main([*base, "--keep-identical-ids"]) == 0
    kept = {q["query_id"]: q["hits"] for q in json.loads(capsys.readouterr().out)["queries"]}
    run = search_ids(ids, experiment.embeddings.queries(ids), experiment.embeddings.doc_ids,
                     np.ascontiguousarray(experiment.embeddings.doc_embeddings), 5, False)
    for qid in ids:  # --keep-identical-ids agrees with evaluate --keep-identical-ids
        assert [h["id"] for h in kept[qid]] == sorted(run[qid], key=lambda d: -run[qid][d])
    assert any(qid in [h["id"] for h in found] for qid, found in kept.items())


def test_shape_errors_name_the_vectors_not_a_variable():
    from embedtune.compress import get_compressor_class
    from embedtune.compress.base import TrainingData

    pca = get_compressor_class("pca")
    compressor = pca(pca.config_class(dim=4)).fit(TrainingData.corpus_only(np.random.default_rng(0).standard_normal((50, 16))))
    with pytest.raises(ValueError) as error:
        compressor.transform(np.zeros((3, 8), np.float32))
    message = str(error.value)
    assert "X " not in message and "the input vectors are 8-d (8 columns)" in message and "16-d" in message
    with pytest.raises(ValueError, match=r"the document vectors are 8-d \(8 columns\) but the query vectors are 16-d"):
        TrainingData(["q"], np.zeros((1, 16)), ["d"], np.zeros((1, 8)), {"q": {"d": 1}})


def test_evaluate_json_uses_results_json_metric_names(toy40, tiny_bert_dir, tmp_path, capsys):
    assert main(["evaluate", "--model", str(tiny_bert_dir), "--data", str(toy40), "--json", "--out", str(tmp_path / "ev")]) == 0
    printed = json.loads(capsys.readouterr().out)
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    for name, value in results["metrics"].items():
        if name != "n_queries":
            assert printed[name] == pytest.approx(value), name
    assert printed["main_score"] == printed["ndcg_at_10"] == printed["ndcg@10"]  # the older name: an alias for one release
    help_text = " ".join(next(a for a in build_parser()._subparsers._group_actions[0].choices["evaluate"]._actions
                              if "--json" in a.option_strings).help.split())
    assert "ndcg_at_10" in help_text and "kept for one release" in help_text


def test_mteb_file_holds_mtebs_metrics_and_version(toy40, tiny_bert_dir, tmp_path, capsys):
    assert main(["evaluate", "--model", str(tiny_bert_dir), "--data", str(toy40), "--out", str(tmp_path / "ev")]) == 0
    path = tmp_path / "ev" / "mteb" / "toy40.json"
    document = json.loads(path.read_text())
    assert isinstance(document["mteb_version"], str) and isinstance(document["dataset_revision"], str)
    assert set(document["dataset_sha256"]) >= {"corpus.jsonl", "queries.jsonl"}
    scores = document["scores"]["test"][0]
    expected = {f"{m}_at_{k}" for m in ("ndcg", "map", "recall", "precision", "mrr") for k in (1, 3, 5, 10, 20, 100)}
    assert expected <= set(scores) and "ndcg_at_1000" not in scores  # a top-100 run scores no cutoff beyond it
    assert scores["main_score"] == scores["ndcg_at_10"]
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert scores["ndcg_at_10"] == pytest.approx(results["metrics"]["ndcg_at_10"])
    try:
        from mteb.results.task_result import TaskResult
    except Exception:  # MTEB is not a dependency; the check runs where it is installed
        return
    loaded = TaskResult.from_disk(path, load_historic_data=False)
    assert loaded.scores["test"][0]["main_score"] == pytest.approx(scores["main_score"])


def test_pipeline_help_states_the_defaults_it_uses():
    from embedtune.cli.pipeline import configs_from_args
    from embedtune.finetune.config import DEFAULT_PRESETS, preset_config

    parser = build_parser()._subparsers._group_actions[0].choices["pipeline"]
    actions = {a.dest: a for a in parser._actions}
    assert f"default: {DEFAULT_PRESETS['text']}" in actions["preset"].help
    assert "one pass over the training tuples" in actions["stage1_steps"].help and "direct-dot-full 5 epochs" in actions["stage1_steps"].help
    config = configs_from_args(parser.parse_args(["--out", "x"]))[0]
    assert config.stage1.steps is None and config.stage1.epochs == 1.0  # one pass, as the help says
    assert config.stage2 is not None and config.stage2.steps is None and config.stage2.epochs == 1.0
    assert preset_config("direct-dot-full").stage1.epochs == 5.0


def test_pipeline_saves_every_fitted_compressor(tiny_bert_dir, tmp_path):
    from embedtune.compress import load_compressor
    from embedtune.encoders import SentenceEncoder
    from embedtune.finetune import preset_config
    from embedtune.workflows.pipeline import PipelineConfig, compressor_dir, run_pipeline

    corpus = [{"_id": f"d{i}", "title": "", "text": f"document number {i} about topic {i % 5}"} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"what about topic {i % 5} number {i}"} for i in range(30)]
    root = write_beir(tmp_path / "toy", corpus, queries, [(f"q{i}", f"d{i}", 1) for i in range(20, 30)], split="test")
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(20)))
    pace = preset_config("pace", stage1_steps=2, stage2_steps=1, stage2_init=1, model=str(tiny_bert_dir), data=str(root), batch_size=4,
                         n_negatives=2, hard_pool=5, save_steps=1, lora_rank=4, auto_temperature_samples=4)
    config = PipelineConfig(methods=["dive", "pca"], dim=8, seeds=[2027], dive_preset="paper",
                            compressor_overrides={"dive": {"epochs": 1, "batch_size": 8}}, compare_base=False)
    result = run_pipeline(pace, config, tmp_path / "run")
    compressed = [row for row in result["rows"] if row["method"] != "full"]
    assert compressed and all(row["compressor"] for row in compressed)
    assert compressed[0]["compressor"] == str(compressor_dir(tmp_path / "run", "finetuned", "dive", "", 2027))
    assert compressed[1]["compressor"] == str(compressor_dir(tmp_path / "run", "finetuned", "pca"))  # seed-free: no seed folder
    # The saved DIVE maps the fine-tuned model's vectors to 8 dims: the scored combination, deployable.
    dive = load_compressor(compressed[0]["compressor"])
    vectors = SentenceEncoder(result["model_dir"], normalize=result["similarity"] == "cosine", show_progress=False).encode(["a query"], "query")
    assert dive.transform(vectors).shape == (1, 8)
