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


def test_the_headline_counts_where_label_free_learning_was_kept_and_where_it_was_left_out():
    base = {"pick_share": 0.8, "peer": None, "peer_share": None, "disk": None, "disk_share": None,
            "pick_minus_peer": None, "pick_minus_peer_p": None}
    rows = [
        {**base, "corpus": "arguana-minilm", "budget": 16, "pick": "dive-64/klt-apq:16", "learned": "dive-64/klt-apq:16",
         "learned_picked": True, "learned_minus_plain": 0.03, "learned_minus_plain_p": 0.001},
        {**base, "corpus": "arguana-minilm", "budget": 32, "pick": "dive-128/klt-apq:32", "learned": "dive-128/klt-apq:32",
         "learned_picked": True, "learned_minus_plain": 0.01, "learned_minus_plain_p": 0.4},
        {**base, "corpus": "arguana-minilm", "budget": 48, "pick": "frozen/klt-apq:48", "learned": "dive-128/klt-apq:48",
         "learned_picked": False, "learned_minus_plain": -0.02, "learned_minus_plain_p": 0.01},
        {**base, "corpus": "scifact-minilm", "budget": 48, "pick": "frozen/klt-apq:48"},
    ]
    text = near_limit_report.headline(rows, 384)
    assert "ran in 3 cells and was picked, without labels, in 2 (arguana-minilm at 16 B, arguana-minilm at 32 B)" in text
    assert "(p < 0.05; in 0 of the 3 cells, the rest by the mean, their rows predating the per-document hits)" in text
    assert "+0.0100 to +0.0300 nDCG@10 over the best codec without a learned transform, significant in 1 (arguana-minilm at 16 B)" in text
    assert "picked where it was worse: 0; left out where it was significantly worse: 1." in text


def test_the_trellis_at_scale_report_is_what_its_script_writes_from_the_committed_rows():
    import trellis_gap_at_scale

    rows = json.loads(trellis_gap_at_scale.ROWS.read_text(encoding="utf-8"))
    written = (trellis_gap_at_scale.OUT / "AT-SCALE.md").read_text(encoding="utf-8")
    assert written == trellis_gap_at_scale.report(rows), (
        "benchmarks/results/trellis/AT-SCALE.md is not what `python benchmarks/trellis_gap_at_scale.py --report` writes "
        "from at-scale.json; run it.")


def test_the_gaussian_stand_in_has_the_corpus_spectrum():
    import numpy as np
    import trellis_gap_at_scale

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4000, 6)) * np.array([3.0, 2.0, 1.0, 0.5, 0.2, 0.1])) @ np.linalg.qr(rng.standard_normal((6, 6)))[0]
    mean, values, vectors = trellis_gap_at_scale.gaussian_like(x)
    assert np.all(np.diff(values) <= 0)
    draws = trellis_gap_at_scale.draw(mean, values, vectors, 200_000, seed=1)
    assert draws.dtype == np.float32 and draws.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(np.cov(draws.astype(np.float64), rowvar=False), np.cov(x, rowvar=False), atol=0.05)
    np.testing.assert_allclose(draws.mean(axis=0), x.mean(axis=0), atol=0.02)
