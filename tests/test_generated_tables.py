"""Result tables in the README are generated from committed result files, so a rerun updates them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import near_limit_report  # noqa: E402


def test_the_readme_headline_table_is_what_the_report_script_writes_from_the_committed_rows():
    summary = json.loads((near_limit_report.RESULTS / "summary.json").read_text(encoding="utf-8"))
    meta = json.loads((near_limit_report.RESULTS / near_limit_report.HEADLINE_CORPUS / "meta.json").read_text(encoding="utf-8"))
    block = near_limit_report.headline(summary, int(meta["dim"]))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"{near_limit_report.README_START}\n{block}\n{near_limit_report.README_END}" in readme, (
        "README.md's headline table is not what benchmarks/near_limit_report.py writes from "
        "benchmarks/results/near-limit/summary.json; run `python benchmarks/near_limit_report.py`.")


def test_the_headline_verdict_counts_wins_and_losses_from_the_paired_tests():
    rows = [
        {"corpus": "scifact-minilm", "budget": 16, "pick": "frozen/klt-pq:16", "pick_share": 0.8, "peer": "frozen/faiss:PQ16",
         "peer_share": 0.7, "disk": None, "disk_share": None, "pick_minus_peer": 0.05, "pick_minus_peer_p": 0.01},
        {"corpus": "arguana-minilm", "budget": 32, "pick": "frozen/klt-pq:32", "pick_share": 0.8, "peer": "frozen/faiss:PQ32",
         "peer_share": 0.9, "disk": None, "disk_share": None, "pick_minus_peer": -0.05, "pick_minus_peer_p": 0.01},
        {"corpus": "arguana-minilm", "budget": 48, "pick": "frozen/klt-pq:48", "pick_share": 0.9, "peer": "frozen/faiss:PQ48",
         "peer_share": 0.9, "disk": None, "disk_share": None, "pick_minus_peer": 0.0, "pick_minus_peer_p": 0.9},
    ]
    text = near_limit_report.headline(rows, 384)
    assert "| 16 | 96x | `klt-pq:16` | 80.0 % | `faiss:PQ16` | 70.0 % | – | – |" in text
    assert "above the best other in-RAM code (paired test, p < 0.05, one test per cell) in 1 (scifact-minilm at 16 B)" in text
    assert "significantly below it in 1 (arguana-minilm at 32 B)" in text
