"""The false-negative filter and the triplet cap, threaded through the runner, the protocol TOML and the CLI."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from embedtune.bench.protocol_config import BackboneSpec, DatasetSpec, ProtocolConfig, load_protocol_config
from embedtune.compress import MiningOptions
from embedtune.data.synthetic import make_false_negative_dataset
from embedtune.data.triplets import load_triplets, mine_triplets
from embedtune.workflows.triplets import shared_triplets


@pytest.fixture()
def experiment():
    """The parts of an Experiment that shared_triplets reads, over a synthetic dataset."""
    data = make_false_negative_dataset(n_queries=8, n_docs=800, dim=24, positives_per_query=6,
                                       near_duplicates_per_positive=2, judged_fraction=0.5, seed=1)
    query_row = {query_id: row for row, query_id in enumerate(data.query_ids)}
    embeddings = SimpleNamespace(doc_ids=data.doc_ids, doc_embeddings=data.doc_emb,
                                 queries=lambda ids: data.query_emb[[query_row[i] for i in ids]])
    return SimpleNamespace(
        data=data,
        embeddings=embeddings,
        dataset=SimpleNamespace(name="synthetic", split="test", fingerprints={"qrels": "abc"}),
        split=SimpleNamespace(seed=2027),
        part_ids=lambda part: list(data.query_ids),
        qrels_for=lambda ids: {i: data.qrels[i] for i in ids},
    )


ROBUST = {"skip_top": 4, "false_negative_margin": 0.05, "false_negative_reference": "query-min", "max_triplets_per_query": 10}


def test_shared_triplets_records_only_non_default_options(experiment, tmp_path):
    plain, robust = tmp_path / "plain.json", tmp_path / "robust.json"
    triplets = shared_triplets(experiment, "train", path=plain)
    assert np.array_equal(triplets, mine_triplets(*experiment.data))
    assert not {"skip_top", "false_negative_margin", "false_negative_reference", "max_triplets_per_query"} & set(load_triplets(plain).meta)

    capped = shared_triplets(experiment, "train", MiningOptions(**ROBUST), path=robust)
    assert np.array_equal(capped, mine_triplets(*experiment.data, **ROBUST))
    meta = load_triplets(robust).meta
    assert {key: meta[key] for key in ROBUST} == ROBUST


def test_shared_triplets_reuses_a_file_only_for_the_same_options(experiment, tmp_path, monkeypatch):
    path = tmp_path / "triplets.json"
    default = shared_triplets(experiment, "train", path=path)
    # A file written before the options existed (its meta has none of them) is reused by a default call ...
    mined = []
    monkeypatch.setattr("embedtune.workflows.triplets.mine_triplets", lambda *a, **k: mined.append(k) or mine_triplets(*a, **k))
    assert np.array_equal(shared_triplets(experiment, "train", path=path), default) and not mined
    # ... never by a call with other options, whose file then replaces it.
    capped = shared_triplets(experiment, "train", MiningOptions(max_triplets_per_query=5), path=path)
    assert len(mined) == 1 and mined[0]["max_triplets_per_query"] == 5
    assert len(capped) < len(default) and load_triplets(path).meta["max_triplets_per_query"] == 5
    assert np.array_equal(shared_triplets(experiment, "train", MiningOptions(max_triplets_per_query=5), path=path), capped) and len(mined) == 1
    shared_triplets(experiment, "train", path=path)
    assert len(mined) == 2


def test_mining_options_are_validated_in_one_place():
    with pytest.raises(ValueError, match=r"^skip_top must be an integer >= 0 \(0 skips nothing\); got -2\.$"):
        MiningOptions(skip_top=-2)
    with pytest.raises(ValueError, match="filter hard negatives"):
        MiningOptions(negatives="random", false_negative_margin=0.1)
    with pytest.raises(ValueError, match="unknown mining options"):
        MiningOptions().replace(margin=0.1)
    # Switching to random negatives drops the (hard-negative) filter but keeps the cap.
    robust = MiningOptions(**ROBUST)
    assert robust.replace(negatives="random") == MiningOptions(negatives="random", max_triplets_per_query=10)


def _minimal(**fields):
    return ProtocolConfig(datasets=[DatasetSpec("a", "x")], backbones=[BackboneSpec("b", "m", (8,))], **fields)


def test_protocol_defaults_and_toml_keys(tmp_path):
    default = load_protocol_config()
    assert default.mining().filter_options() == {"skip_top": 0, "false_negative_margin": None, "false_negative_reference": "pair",
                                         "max_triplets_per_query": None}
    assert load_protocol_config("benchmarks/dive_paper.toml").mining().filter_options() == default.mining().filter_options()
    path = tmp_path / "robust.toml"
    path.write_text('[protocol]\nskip_top = 10\nfalse_negative_margin = 0.05\nfalse_negative_reference = "query-min"\n'
                    "max_triplets_per_query = 64\n")
    assert load_protocol_config(path).mining().filter_options() == {"skip_top": 10, "false_negative_margin": 0.05,
                                                            "false_negative_reference": "query-min", "max_triplets_per_query": 64}


@pytest.mark.parametrize(
    "body, message",
    [
        ("skip_top = -1", r"bad.toml \[protocol\]: skip_top must be an integer >= 0"),
        ("skip_top = 2.5", r"bad.toml \[protocol\]: skip_top must be an integer >= 0"),
        ('false_negative_margin = "small"', r"bad.toml \[protocol\]: false_negative_margin must be a finite number or None \(no filter\); got \'small\'"),
        ("false_negative_margin = nan", r"bad.toml \[protocol\]: false_negative_margin must be a finite number or None \(no filter\); got nan"),
        ('false_negative_reference = "max"', r"bad.toml \[protocol\]: false_negative_reference must be one of"),
        ("max_triplets_per_query = 0", r"bad.toml \[protocol\]: max_triplets_per_query must be a positive integer or None \(no cap\); got 0"),
        ('negatives = "random"\nskip_top = 5', r"bad.toml \[protocol\]: skip_top and false_negative_margin filter hard negatives"),
        ('negatives = "semi"', r"bad.toml \[protocol\]: negatives must be one of"),
        ("n_negatives = 0", r"bad.toml \[protocol\]: n_negatives must be a positive integer; got 0"),
        ("false_negative_margn = 0.1", r"bad.toml: unknown \[protocol\] keys \['false_negative_margn'\]"),
    ],
)
def test_protocol_toml_errors_name_the_file_and_key(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(f"[protocol]\n{body}\n")
    with pytest.raises(ValueError, match=message):
        load_protocol_config(path)


def test_protocol_config_object_is_validated_too():
    with pytest.raises(ValueError, match="max_triplets_per_query"):
        _minimal(max_triplets_per_query=-3)
    assert _minimal(false_negative_margin=0, skip_top=3).mining().filter_options()["skip_top"] == 3


def _write_precomputed(tmp_path, experiment_data):
    from conftest import write_beir

    data = experiment_data
    corpus = [{"_id": d, "text": d} for d in data.doc_ids]
    queries = [{"_id": q, "text": q} for q in data.query_ids]
    qrels = [(q, d, r) for q, judged in data.qrels.items() for d, r in judged.items()]
    root = write_beir(tmp_path / "synthetic", corpus, queries, qrels)
    np.save(tmp_path / "d.npy", data.doc_emb)
    np.save(tmp_path / "q.npy", data.query_emb)
    (tmp_path / "d.txt").write_text("\n".join(data.doc_ids))
    (tmp_path / "q.txt").write_text("\n".join(data.query_ids))
    return ["--data", str(root), "--doc-embeddings", str(tmp_path / "d.npy"), "--doc-ids", str(tmp_path / "d.txt"),
            "--query-embeddings", str(tmp_path / "q.npy"), "--query-ids", str(tmp_path / "q.txt")]


def test_compress_train_flags_reach_the_triplets(experiment, tmp_path, capsys):
    from embedtune.cli import main

    flags = _write_precomputed(tmp_path, experiment.data)
    out = tmp_path / "run"
    code = main(["compress", "train", "--method", "search-adaptor", "--dim", "8", "--epochs", "1", "--compare", "", "--json",
                 "--out", str(out), "--skip-top", "3", "--false-negative-margin", "0.02", "--max-triplets-per-query", "6", *flags])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    # Search-Adaptor's default preset is the safety net: its query-min reference stays, the flags override the rest.
    assert report["triplets"] == {"negatives": "hard", "n_negatives": 4, "skip_top": 3, "false_negative_margin": 0.02,
                                  "false_negative_reference": "query-min", "max_triplets_per_query": 6,
                                  "n_triplets": report["triplets"]["n_triplets"]}
    stored = load_triplets(out / "triplets-train.json")
    assert {stored.meta[k] for k in ("skip_top", "false_negative_margin", "max_triplets_per_query")} == {3, 0.02, 6}
    per_query = np.unique([q for q, _, _ in stored.ids], return_counts=True)[1]
    assert per_query.max() <= 6 and len(stored.ids) == report["triplets"]["n_triplets"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--skip-top", "-1"], "skip_top must be an integer >= 0 (0 skips nothing); got -1."),
        (["--false-negative-margin", "inf"], "false_negative_margin must be a finite number or None (no filter); got inf."),
        (["--false-negative-margin", "x"], "--false-negative-margin: false_negative_margin expects a number or none; got 'x'"),
        (["--max-triplets-per-query", "0"], "max_triplets_per_query must be a positive integer or None (no cap); got 0."),
        (["--false-negative-reference", "max"], "--false-negative-reference: invalid choice"),
    ],
)
def test_compress_train_rejects_bad_flags(flags, message, capsys):
    """A value argparse cannot read is refused by argparse; one MiningOptions refuses, by its declared constraints,
    before any data is read (``--data nowhere`` is never opened). Both exit 2."""
    from embedtune.cli import main

    try:
        code = main(["compress", "train", "--data", "nowhere", *flags])
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_compress_train_rejects_filters_with_random_negatives_before_loading(capsys):
    from embedtune.cli import main

    assert main(["compress", "train", "--data", "nowhere", "--negatives", "random", "--skip-top", "2"]) == 2
    assert "skip_top and false_negative_margin filter hard negatives" in capsys.readouterr().err
