"""Result tables in the README are generated from committed result files, so a rerun updates them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
    assert "| 16 | 96x | – | – | – | `klt-pq:16` | 80.0 % | – | `faiss:PQ16` | 70.0 % | – | – | – |" in text
    assert "significantly above the best other in-RAM code in 1 and below it in 1." in text
    cells = "\n".join(near_limit_report.verdict(rows))
    assert "above the best other in-RAM code (paired test, p < 0.05, one test per cell) in 1 (scifact-minilm at 16 B)" in cells
    assert "significantly below it in 1 (arguana-minilm at 32 B)" in cells


def test_the_headline_counts_where_a_default_plan_falls_behind_the_best_code_and_where_it_beats_the_peers():
    base = {"peer": "frozen/faiss:PQ32", "peer_share": 0.8, "disk": None, "disk_share": None, "pick_minus_peer": 0.1,
            "pick_minus_peer_p": 0.001}
    rows = [
        {**base, "corpus": "scifact-minilm", "budget": 32, "pick": "frozen/klt-tcq-sphere:32", "pick_share": 0.98,
         "default": "frozen/klt-apq:32", "default_share": 0.93, "pick_minus_default": 0.03, "pick_minus_default_p": 0.001,
         "default_minus_peer": 0.05, "default_minus_peer_p": 0.001, "default_fixed_bytes": 13_502_475, "pick_fixed_bytes": 4_285_372,
         "peer_fixed_bytes": 250_000, "n_docs": 5183, "dim": 384, "default_over_float32": "frozen/klt-apq-sphere:32",
         "default_over_float32_share": 0.95},
        {**base, "corpus": "npl-minilm", "budget": 48, "pick": "frozen/klt-apq:48", "pick_share": 0.99,
         "default": "frozen/klt-apq:48", "default_share": 0.99, "pick_minus_default": 0.0, "pick_minus_default_p": 1.0,
         "default_minus_peer": 0.01, "default_minus_peer_p": 0.3, "default_fixed_bytes": 19_957_899, "n_docs": 1_000_000, "dim": 384},
    ]
    text = near_limit_report.headline(rows, 384)
    assert ("| 32 | 48x | `klt-apq:32` | 93.0 % | 14 MB | `klt-tcq-sphere:32` | 98.0 % | 4.3 MB | `faiss:PQ32` | 80.0 % | 0.25 MB "
            "| – | – |") in text
    assert ("A default plan's pick is the same setting in 1 of 2 cells and significantly below the best of every codec in 1; "
            "against the best other in-RAM code it is significantly above in 1 and below in 0.") in text
    # Where the rule against an index larger than the float32 vectors decided a default pick, and what it cost.
    assert ("on these corpora of 5,183 to 1,000,000 documents that rule decided a default plan's pick in 1 of 2 cells (the larger "
            "index would have kept +2.0 points of float32's nDCG@10 more") in text and "the best of every codec's in 0." in text
    cells = "\n".join(near_limit_report.verdict(rows))
    assert "a setting significantly below the pick in 1 (scifact-minilm at 32 B) and above it in 0 (none)" in cells


def test_a_default_plan_scores_its_default_and_searched_codecs_and_peers_not_the_opt_in_ones():
    def scored(setting: str, family: str) -> bool:
        return near_limit_report.in_default_plan({"setting": setting, "family": family})

    assert scored("frozen/klt-apq-sphere:32", "embedtune codec") and scored("pca-128/klt-pq4:32", "embedtune codec")
    assert scored("dive-64/klt-pq4-sphere:16", "embedtune learned + codec")
    assert not scored("pca-128/klt-apq:32", "embedtune codec")  # searched codecs run on the uncompressed vectors only
    assert not scored("frozen/klt-tcq12-sphere:32", "embedtune codec") and not scored("frozen/klt-rq:32", "embedtune codec")
    assert scored("frozen/faiss:OPQ32,PQ32np", "FAISS PQ/OPQ/RQ") and not scored("frozen/faiss:RQ32x8", "FAISS PQ/OPQ/RQ")
    assert scored("pca-96/int4", "PCA + quantiser") and not scored("peer/scann-ah:32", "ScaNN / RaBitQ-Library")


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
    text = "\n".join(near_limit_report.verdict(rows))
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


def test_no_column_picks_an_index_larger_than_the_float32_vectors():
    """On 5,183 documents of 384 dims, 14 MB of tables make a 32 B code's index 2,733 B a vector, above float32's 1,536 B:
    the pick passes it over for the best setting whose index is not, and the summary says which it passed over."""
    per_query = lambda value: {f"q{i}": value + 0.01 * i for i in range(8)}  # noqa: E731
    row = lambda setting, family, ram, fixed, agreement, ndcg: {  # noqa: E731
        "setting": setting, "family": family, "ram_bytes": ram, "fixed_bytes": fixed, "agreement": agreement, "ndcg@10": ndcg,
        "per_query": per_query(ndcg), "n_queries": 8, "fit_s": 1.0, "tier": "ram"}
    rows = [row("frozen/float32", "frozen + FAISS quantiser", 1536, 0, 1.0, 0.65),
            row("frozen/klt-pq4:32", "embedtune codec", 32, 150_000, 0.80, 0.60),
            row("frozen/klt-apq:32", "embedtune codec", 32, 14_000_000, 0.85, 0.62)]
    assert near_limit_report.within_float32(rows[1], 5183, 384) and not near_limit_report.within_float32(rows[2], 5183, 384)
    assert near_limit_report.within_float32(rows[2], 1_000_000, 384)  # a larger corpus shares the tables over more rows
    _, summary = near_limit_report.corpus_table("scifact-minilm", rows, {"n_docs": 5183, "dim": 384})
    cell = next(r for r in summary if r["budget"] == 32)
    assert cell["pick"] == cell["default"] == "frozen/klt-pq4:32"
    assert cell["pick_over_float32"] == cell["default_over_float32"] == "frozen/klt-apq:32"
    assert cell["default_over_float32_share"] == pytest.approx(0.62 / 0.65)
    _, summary = near_limit_report.corpus_table("scifact-minilm", rows, {"n_docs": 1_000_000, "dim": 384})
    cell = next(r for r in summary if r["budget"] == 32)
    assert cell["pick"] == "frozen/klt-apq:32" and cell["pick_over_float32"] is None and cell["default_over_float32"] is None
