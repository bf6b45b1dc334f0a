"""The how-tos in ``docs/``: every ```python block that starts with "# How-to:" runs as written.

Each block runs in a fresh folder holding ``docs.npy`` and ``queries.npy`` (unit vectors with a
decaying spectrum, like sentence embeddings), so a how-to that stops working fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"
MARKER = "# How-to:"


def howtos() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS_DIR.glob("*.md")):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            if block.startswith(MARKER):
                found.append((f"{page.name}: {block.splitlines()[0][len(MARKER):].strip()}", block))
    return found


def test_the_docs_have_tested_howtos():
    for page in ("codecs.md", "errors.md"):
        assert any(name.startswith(page) for name, _ in howtos()), page


@pytest.mark.parametrize("name,block", howtos(), ids=[name for name, _ in howtos()])
def test_a_docs_howto_runs_as_written(name, block, tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(0)
    d = 64
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    docs = (rng.standard_normal((3000, d)) * np.geomspace(1.0, 0.05, d)) @ basis.T + 0.3 * basis[:, 0]
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[:50] + 0.05 * rng.standard_normal((50, d))
    np.save(tmp_path / "docs.npy", docs.astype(np.float32))
    np.save(tmp_path / "queries.npy", queries.astype(np.float32))
    monkeypatch.chdir(tmp_path)
    exec(compile(block, name, "exec"), {})
    printed = capsys.readouterr().out
    if name.startswith("codecs.md: a codec on your own vectors"):
        assert "dB above the Gaussian bound" in printed
    if name.startswith("codecs.md: refine"):  # 100 candidates x 4 bytes x 64 dimensions read per query
        refined, alone = (float(word) for word in printed.split() if word.replace(".", "").isdigit() and "." in word)
        assert refined >= alone and "25,600 B read per query" in printed
    if name.startswith("codecs.md: how near the bound a trellis code"):  # the trellis code is nearer the bound
        gaps = {line.split(":")[0]: float(line.split()[1]) for line in printed.splitlines()}
        assert gaps["klt-tcq"] < gaps["klt-pq"], gaps
    if name.startswith("errors.md"):  # the error was raised, and it names the first bad row and column
        assert printed.splitlines()[0] == "7 3 1" and "docs.npy: vectors row 7" in printed
