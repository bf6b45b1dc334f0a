"""benchmarks/frontier.py scores every budget on seen and unseen test queries for both protocols:
``beir-train`` relative to qrels/train.tsv, the paper protocol relative to the train and validation parts of its split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import frontier  # noqa: E402

from embedtune.data.beir import load_beir  # noqa: E402
from embedtune.data.splits import query_disjoint_split  # noqa: E402


def _beir(folder: Path, test: dict[str, str], train: dict[str, str] | None = None) -> Path:
    docs = sorted(set(test.values()) | set((train or {}).values()) | {"spare"})
    folder.mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": f"text {d}"}) + "\n" for d in docs))
    queries = sorted(set(test) | set(train or {}))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": f"query {q}"}) + "\n" for q in queries))
    (folder / "qrels").mkdir()
    for name, qrels in (("test", test), ("train", train)):
        if qrels is not None:
            rows = "".join(f"{q}\t{d}\t1\n" for q, d in qrels.items())
            (folder / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows)
    return folder


def test_beir_train_subsets_are_relative_to_train_qrels(tmp_path):
    data = _beir(tmp_path / "d", test={"t1": "a", "t2": "z"}, train={"r1": "a", "r2": "b"})
    groups, seen_from = frontier.test_subsets(str(data), "beir-train", ["t1", "t2"])
    assert groups == {"seen": ["t1"], "unseen": ["t2"], "mixed": []}
    assert "train-qrels" in seen_from


def test_paper_subsets_are_relative_to_the_split_train_and_val_parts(tmp_path):
    # Ten queries; q0-q4 and q9 share document "pop". Seed 2027 puts q9 and q6 in test: q9 is seen, q6 unseen.
    test = {f"q{i}": ("pop" if i < 5 or i == 9 else f"d{i}") for i in range(10)}
    data = _beir(tmp_path / "d", test=test)
    split = query_disjoint_split(load_beir(str(data), "test"), seed=2027)
    groups, seen_from = frontier.test_subsets(str(data), "paper", split.test)
    train_docs = {test[q] for q in split.train_val}
    expected_seen = sorted(q for q in split.test if test[q] in train_docs)
    assert groups["seen"] == expected_seen == ["q9"] and groups["unseen"] == ["q6"]
    assert sorted(groups["seen"] + groups["unseen"]) == sorted(split.test)
    assert "split" in seen_from


def _row(setting: str, scores: dict[str, float], embedtune: bool, ram: int = 16) -> dict:
    return {"setting": setting, "per_query": scores, "embedtune": embedtune, "ram_bytes": ram}


def test_subset_lines_test_each_subset_and_print_a_dash_for_an_empty_one():
    ids = [f"q{i}" for i in range(12)]
    ours = _row("dive-128/binary", {q: 0.9 for q in ids}, True)
    peer = _row("pca-128/binary", {q: 0.1 for q in ids}, False)
    budgets = [{"budget": 16, "embedtune": ours["setting"], "peer": peer["setting"], "difference": 0.8}]
    lines = frontier.subset_budget_lines(budgets, [ours, peer], {"seen": [], "unseen": ids, "mixed": []}, "a split query")
    row = lines[-1].split(" | ")
    assert row[2] == "–" and row[5] == "–" and row[7] == "–"  # no seen query: no mean, no test
    assert row[3] == "0.9000" and row[6] == "0.1000" and row[8].startswith("+0.8000 (") and row[9] == "ahead"
    lines = frontier.subset_budget_lines(budgets, [ours, peer], {"seen": ids[:6], "unseen": ids[6:], "mixed": []})
    row = lines[-1].split(" | ")
    assert row[7].startswith("+0.8000 (") and row[8].startswith("+0.8000 (")
