"""The Python routes beside the CLI how-tos (in the docs pages) run, in reading order.

Every ```python block of the README and the docs pages (tests/test_readme_commands.py's ``PAGES``,
in that order) that starts with "# The same in Python" is run as written in one fresh folder, with
only the model alias swapped for the tiny test BERT and the input files (``docs.npy``,
``pairs.jsonl``, ``my-corpus.jsonl``...) made from it first, so the blocks stay true.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from test_readme_commands import page_blocks

MARKER = "# The same in Python"
DOCS = [f"document number {i} about topic {i % 5}" for i in range(40)]
QUERIES = [f"what about topic {i % 5} number {i}" for i in range(20)]


def python_routes() -> list[tuple[Path, str]]:
    return [(page, block) for page, block in page_blocks("python") if block.startswith(MARKER)]


def test_the_readme_has_python_routes_for_the_cli_how_tos():
    text = "\n".join(block for _, block in python_routes())
    for call in ("fit_on_all(", "apply_compressor_streaming(", "export_sentence_transformer(", "build_index(", "search_texts(",
                 "encode_corpus(", "run_plan(", "build_planned_index(", "run_label_free_plan("):
        assert call in text, f"no Python route calls {call}"


@pytest.fixture
def folder(tmp_path, tiny_bert_dir, monkeypatch):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    np.save(tmp_path / "docs.npy", model.encode(DOCS).astype(np.float32))
    np.save(tmp_path / "queries.npy", model.encode(QUERIES).astype(np.float32))
    (tmp_path / "docs.txt").write_text("".join(f"d{i}\n" for i in range(len(DOCS))))
    (tmp_path / "queries.txt").write_text("".join(f"q{i}\n" for i in range(len(QUERIES))))
    pairs = [{"query_id": f"q{i}", "doc_id": f"d{i}"} for i in range(len(QUERIES))] + [
        {"query_id": f"q{i}", "doc_id": f"d{i + 20}"} for i in range(len(QUERIES))]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    (tmp_path / "my-corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n"
                                                      for i, t in enumerate(DOCS)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_python_routes_run_in_order(folder, tiny_bert_dir, capsys, one_torch_thread):
    blocks = python_routes()
    assert len(blocks) >= 3
    namespace: dict = {}
    for page, block in blocks:
        code = block.replace('"minilm"', repr(str(tiny_bert_dir)))
        code = code.replace('fit_on_all("dive", 128,', 'fit_on_all("dive", 16, settings={"epochs": 2}, mining={"false_negative_margin": None},')
        # The plans: the cheap compressors only (test_plan.py and test_label_free_plan.py sweep the rest).
        code = code.replace('budget_bytes=48)', 'budget_bytes=48, methods=["truncate", "pca"], peers=[], rounds=1)')
        code = code.replace('"agreement", budget_bytes=32)', '"agreement", budget_bytes=32, methods=["truncate", "pca-uncentred"], dims=[16, 8], peers=[], rounds=1, '
                            'held_out_fraction=0.25)')  # 40 documents: 10 held out, the fewest a label-free plan validates on
        exec(compile(code, str(page), "exec"), namespace)  # noqa: S102 - the docs' own code
    printed = capsys.readouterr().out
    assert "supervised" in printed and re.search(r"^1 [-0-9.e]+ d\d+$", printed, re.M)
    assert np.load(folder / "docs-128.npy").shape == (40, 16)
    assert (folder / "model-dive" / "modules.json").is_file() and (folder / "my-index" / "manifest.json").is_file()
    assert namespace["vectors"].shape == (40, 32) and namespace["ids"] == [f"d{i}" for i in range(40)]
    for plan in ("my-plan-py", "my-plan-free-py"):
        assert (folder / plan / "plan.json").is_file(), plan
    assert (folder / "my-plan-py-index" / "manifest.json").is_file()
    assert namespace["plan"]["chosen"]["ram_bytes"] <= 48 and namespace["free"]["chosen"]["ram_bytes"] <= 32
