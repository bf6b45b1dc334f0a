"""`make demo` is the main job; it reruns (exit 0, the table again) and needs no encoding.

The Makefile's own demo command is read from the Makefile, so the test follows it; only the
model and the data are swapped for the tiny test BERT on 40 documents (the real run is 40 s).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from embedtune.cli import main

ROOT = Path(__file__).resolve().parents[1]


def demo_argv() -> list[str]:
    """The arguments of `embedtune` in the Makefile's `demo` recipe."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe, "the Makefile has no demo recipe"
    command = recipe.group(1).replace("\\\n", " ")
    words = shlex.split(command)
    assert words[0] == "$(BIN)/embedtune"
    return words[1:]


def _swap(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def test_make_demo_reruns_and_reprints(tmp_path, tiny_bert_dir, toy40, capsys, monkeypatch):
    argv = demo_argv()
    assert "--overwrite" in argv and argv[argv.index("--out") + 1] == "runs/demo-dive-128"
    monkeypatch.chdir(tmp_path)
    argv = _swap(_swap(_swap(argv, "--model", str(tiny_bert_dir)), "--data", str(toy40)), "--dim", "16")  # the tiny BERT is 32-d
    argv = [*argv, "--epochs", "2", "--false-negative-margin", "none"]  # 40 documents: too few negatives for the filter
    tables = []
    for _ in range(2):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "saved to runs/demo-dive-128" in out
        tables.append([line.split()[:5] for line in out.splitlines() if re.match(r"^(dive|frozen|truncate|pca)\s", line)][:5])
    assert tables[0] and tables[0] == tables[1]
    assert (tmp_path / "runs/demo-dive-128/results.json").is_file()


def test_demo_uses_the_bundled_minilm_scifact_vectors():
    """The demo's model and data are the ones the shipped vectors were made from (so no encoding)."""
    argv = demo_argv()
    assert argv[argv.index("--model") + 1] == "minilm" and argv[argv.index("--data") + 1] == "scifact"
    from embedtune.encoders.bundled_vectors import bundled_manifests

    assert any(manifest["file"] == "scifact-minilm-vectors.npz" for _, manifest in bundled_manifests())
