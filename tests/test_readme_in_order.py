"""The shell commands of the README and the docs pages, run in reading order in one fresh folder, on a slice of SciFact.

The commands are read as tests/test_readme_commands.py reads them (every ```bash block of the README,
then of the docs pages in its ``PAGES`` order, continuation lines joined, comments dropped) and run
one after the other through ``embedtune.cli.main`` in a temporary folder, so a how-to that fails, or
that breaks a later one (two commands writing the same ``--out``), fails here. Only the bundled SciFact and the bundled MiniLM are used; ``../shared`` is
not needed.

Rewrites, the whole list (everything else runs as written):

- ``--data scifact``, ``--data path/to/beir`` and ``--data path/to/arguana`` name a slice of the
  bundled SciFact (80 train and 50 test queries, their relevant documents and 400 documents in all),
  written as a BEIR folder: the placeholder "any BEIR folder" and the data, shrunk.
- The placeholder files ``docs.npy``/``docs.txt``, ``queries.npy``/``queries.txt``, ``pairs.jsonl``,
  ``queries.jsonl``, ``my-corpus.jsonl``, ``big.npy``, ``D.npy``/``D.txt``, ``Q.npy``/``Q.txt`` are
  made first from the slice and the bundled MiniLM vectors (no rewrite: they get those names).

The quality-per-byte plans run as written too, on the slice: the README's quick path (a label-free
plan, its corpus encoded, the planned index built and searched, the model exported), then the plans
of docs/planning.md, where the second and third reuse the first one's sweep from the shared default
sweep folder (no ``--work``), and ``index build --plan`` and ``compress export --plan`` follow them.

Not run (each with its reason in :data:`NOT_RUN`): Ray and cluster encoding, the benchmark grids, fine-tuning and the pipeline (MiniLM fine-tuning takes minutes per
step on a CPU; tests/test_pace_recipe.py and tests/test_pipeline.py run them with a tiny model), and
the vision-language commands (a GPU and a Qwen2-VL model).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from embedtune.cli import main
from test_readme_commands import readme_commands

pytestmark = pytest.mark.slow

# A command is not run when it starts with one of these (README order); the reason is stated.
NOT_RUN = {
    "embedtune embed-corpus --data my-corpus.jsonl --model minilm --out vectors/ --ray-actors": "starts a local Ray cluster (tests/test_ray_encode.py)",
    "embedtune embed-corpus --data /shared/": "a Ray cluster with GPUs",
    "embedtune compress apply --adapter /shared/": "an existing Ray cluster (tests/test_ray_cluster.py starts a two-node one)",
    "embedtune index build --embeddings /shared/": "an existing Ray cluster (tests/test_ray_apply.py covers the route)",
    "embedtune compress train --method dive --dim 128 --protocol beir-train": "five methods: covered by the commands below on one seed",
    "embedtune benchmark ": "a benchmark grid",
    "embedtune report dive": "reads the committed grid (tests/test_bench_stats.py)",
    "embedtune compress train --method dive --set ": "an ablation without --out: the same code path as the runs below",
    "embedtune compress train --method dive --dim 128 --heads auto --final --seeds": "three seeds of four methods (minutes); "
                                                                                     "the one-seed runs cover the path",
    "embedtune compress export --adapter runs/dive/dive/seed-2027": "needs the three-seed run above",
    "embedtune finetune ": "MiniLM fine-tuning: minutes per step on a CPU (tests/test_pace_recipe.py)",
    "embedtune evaluate --model runs/pace/model": "needs the fine-tuned model",
    "embedtune diagnose --model runs/pace/model": "needs the fine-tuned model",
    "embedtune evaluate-mmeb ": "a vision-language model and MMEB files",
    "embedtune pipeline ": "fine-tunes MiniLM (tests/test_pipeline.py)",
}
DATA_PLACEHOLDERS = ("scifact", "path/to/beir", "path/to/arguana")


def _skip_reason(command: str) -> str | None:
    return next((reason for prefix, reason in NOT_RUN.items() if command.startswith(prefix)), None)


def rewrite(command: str, data: Path) -> list[str]:
    """The argv of ``command`` with the rewrites of this module's docstring."""
    argv = shlex.split(command)[1:]
    out: list[str] = []
    for i, token in enumerate(argv):
        if i and argv[i - 1] == "--data" and token in DATA_PLACEHOLDERS:
            token = str(data)
        out.append(token)
    return out


def _write_slice(root: Path) -> Path:
    """80 train + 50 test queries of the bundled SciFact, their relevant documents, 400 documents in all."""
    from embedtune.data.beir import load_beir

    train, test = load_beir("scifact", "train"), load_beir("scifact", "test")
    train_ids, test_ids = sorted(train.qrels)[:80], sorted(test.qrels)[:50]
    relevant = {d for q in train_ids for d in train.qrels[q]} | {d for q in test_ids for d in test.qrels[q]}
    docs = [d for d in train.corpus if d in relevant]
    docs += [d for d in train.corpus if d not in relevant][: max(0, 400 - len(docs))]
    folder = root / "scifact-slice"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, **train.corpus[d]}) + "\n" for d in docs), encoding="utf-8")
    queries = {**{q: train.queries[q] for q in train_ids}, **{q: test.queries[q] for q in test_ids}}
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()), encoding="utf-8")
    for split, dataset, ids in (("train", train, train_ids), ("test", test, test_ids)):
        lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q in ids for d, r in dataset.qrels[q].items()]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _write_placeholder_files(root: Path, data: Path) -> None:
    """docs.npy, queries.npy, pairs.jsonl... from the slice and the bundled MiniLM vectors of SciFact (no encoding)."""
    from embedtune.workflows import load_experiment

    experiment = load_experiment("scifact", "minilm")  # the bundled vectors: a verified cache entry, nothing is encoded
    embeddings = experiment.embeddings
    row = {doc_id: i for i, doc_id in enumerate(embeddings.doc_ids)}
    doc_ids = [json.loads(line)["_id"] for line in (data / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    query_lines = (data / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    train_qrels = [line.split("\t") for line in (data / "qrels" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    train_ids = list(dict.fromkeys(q for q, _, _ in train_qrels))
    docs = np.ascontiguousarray(embeddings.doc_embeddings[[row[d] for d in doc_ids]], dtype=np.float32)
    for stem in ("docs", "D"):
        np.save(root / f"{stem}.npy", docs)
        (root / f"{stem}.txt").write_text("\n".join(doc_ids) + "\n", encoding="utf-8")
    np.save(root / "big.npy", docs)
    query_ids = [json.loads(line)["_id"] for line in query_lines]
    for stem, ids in (("queries", train_ids), ("Q", query_ids)):  # Q: every query of the slice, for `evaluate` on its test qrels
        np.save(root / f"{stem}.npy", np.ascontiguousarray(embeddings.queries(ids), dtype=np.float32))
        (root / f"{stem}.txt").write_text("\n".join(ids) + "\n", encoding="utf-8")
    (root / "pairs.jsonl").write_text("".join(json.dumps({"query_id": q, "doc_id": d}) + "\n" for q, d, _ in train_qrels), encoding="utf-8")
    (root / "queries.jsonl").write_text("\n".join(query_lines[:20]) + "\n", encoding="utf-8")
    # 120 documents: the label-free plans hold 10 % out and validate on at least 10 of them.
    (root / "my-corpus.jsonl").write_text("\n".join((data / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:120]) + "\n",
                                          encoding="utf-8")


def test_readme_commands_run_in_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMBEDTUNE_CACHE", str(tmp_path / "cache"))  # one encode of the slice, shared by every command
    monkeypatch.setenv("EMBEDTUNE_THREADS", "1")
    data = _write_slice(tmp_path)
    _write_placeholder_files(tmp_path, data)
    ran, skipped = [], []
    for command in readme_commands():
        reason = _skip_reason(command)
        if reason is not None:
            skipped.append((command, reason))
            continue
        argv = rewrite(command, data)
        code = main(argv)
        printed = capsys.readouterr()
        assert code == 0, f"the documented command failed (exit {code}) after {len(ran)} that ran before it:\n{command}\n{printed.err[-3000:]}"
        ran.append(command)
    # The how-to chain ran: fit, apply, export, index, search, embed-corpus, evaluate, split, embed, train.
    for name in ("compress fit", "compress apply", "compress export", "index build", "search", "embed-corpus", "evaluate", "split",
                 "embed", "compress train", "compress plan", "index build --plan", "compress export --plan"):
        assert any(command.startswith(f"embedtune {name} ") for command in ran), name
    assert (tmp_path / "runs" / "my-run" / "run.trec").is_file() and (tmp_path / "small.npy").is_file()
    assert (tmp_path / "my-plan" / "plan.json").is_file() and (tmp_path / "my-plan-48" / "plan.json").is_file()
    # The README's quick path: a label-free plan, its planned index and the model that encodes into its codes.
    assert (tmp_path / "my-index-32" / "manifest.json").is_file() and (tmp_path / "my-model-32" / "modules.json").is_file()
    assert all(re.match(r"embedtune [a-z-]+", command) for command, _ in skipped)
