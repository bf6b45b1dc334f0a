"""Tables of ``benchmarks/near_limit.py``'s rows: per corpus and budget, embedtune's pick against the textbook coder and the peers.

    .venv/bin/python benchmarks/near_limit_report.py            # writes benchmarks/results/near-limit/REPORT.md and summary.json,
                                                                # and the headline table in README.md

Every choice is made without labels, by the agreement objective (recall@10 of the float32 top-10,
held-out corpus documents as queries), then scored on the judged test queries:

* **embedtune** — the best embedtune codec (``klt-pq``, ``klt-pq4``, ``klt-rq``, ``klt-wpq``, ``klt-apq``, and where run
  ``klt-pq4-sphere`` and ``klt-apq-sphere``: the same codes, each query's top 100 ranked by the direction of their decoded
  vectors, :mod:`embedtune.index.codecs.sphere`) that fits the budget,
  or, where run (``--learned``), label-free DIVE (``compress fit --unsupervised``, fitted on the other half's documents) in
  front of a codec (``dive-128/klt-apq:32``; ``dive@text-128/...`` where fitted from the corpus's text, ``--learned-text``),
  and, where run (``--truncated``), PCA to k dims in front of ``klt-apq``
  (``pca-128/klt-apq:32``, a space the plan also scores): a learned transform is picked only where its agreement beats
  the best codec without one at its bytes by a paired test over the held-out documents (p < 0.05, as ``compress plan``
  keeps a learned map; rows written before the benchmark kept each document's hits are compared by their means);
* **a default plan's pick** — the best of the same rows that a default label-free ``compress plan`` scores
  (:func:`in_default_plan`: ``klt-pq4`` and its ``-sphere`` form on every space, ``klt-apq`` and its ``-sphere`` form, the
  8-bit PQ/OPQ/fast-scan peers, RaBitQ, TurboQuant and the precisions; no trellis code, ``klt-pq``, ``klt-rq`` or
  ``klt-wpq``, which are opt-in), chosen the same way: what a user who does not ask for more gets;
* **best in-RAM peer** — the best of everything else that fits in RAM: FAISS PQ / OPQ / fast-scan PQ /
  RQ / PRQ / LSQ (where run), RaBitQ, TurboQuant, SQ4, sign bits, PCA (centred) with a quantiser (embedtune's best in-RAM codes
  before its codecs), ScaNN and extended RaBitQ;
* **textbook** — ``klt-sq:B``, the textbook transform coder;
* **trellis** — ``klt-tcq:B``, a trellis code over the principal axes (the nearest the bound a coder of these bytes
  gets), shown in its own column;
* **on the sphere** — ``klt-tcq-sphere:B``, the trellis code's codes with every document decoded onto the unit sphere
  (where run). Both are served by embedtune's numpy scan (no FAISS index type holds their codes), so both, and DIVE in
  front of them, are also candidates of embedtune's pick; rows written while they were references are counted so
  by :func:`load_rows`;
* **disk tier** — the best setting that rescores its top 100 with float32 vectors read from disk
  (RAM bytes as shown; ``+4d`` bytes per candidate read per query), a separate tier.

"share" is nDCG@10 over the float32 model's on the same queries; Δ and p are paired (permutation
test over queries, :func:`embedtune.workflows.significance.paired_test`) against embedtune's pick; dB
is the pick's MSE above the Gaussian rate-distortion bound at ``8 B`` bits for that corpus's spectrum; for a pick
with a transform in front (DIVE, PCA), which cannot be decoded back to the d-dim vectors, it is measured in the
transform's own k-dim space, against the bound for that space's spectrum, and marked †. On halves of
these small corpora every dB reads farther than the codec's own distance: the tables are fitted on a
few thousand vectors, and the coded half's sample spectrum puts the bound low (the trellis code at 32 B: 0.7-1.3 dB
here, MED 2.2-2.9, against 0.4-0.6 dB on a large sample of the same spectrum; ``results/trellis/AT-SCALE.md``).

Under each table, the bill of each pick (:func:`embedtune.index.bill.vector_bill`): its bytes as a
share of the float32 vector's, vectors per GB (10^9 bytes), RAM at a million, a hundred million and
a billion vectors (codebooks, rotations and a map's weights, held once, included), dollars a month at a billion at
``$PRICE`` per GB-month (an assumption, as in ``compress plan --price-per-gb-month``), and what
the disk tier reads per query.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.index.bill import DEFAULT_PRICE_PER_GB_MONTH, BillLine, bill_table, disk_read_per_query, float32_bytes
from embedtune.index.codecs import codec_family
from embedtune.workflows.plan import DEFAULT_CODECS, LEARNED_GATE_P, SEARCHED_CODECS
from embedtune.io import atomic_write, atomic_write_json
from embedtune.workflows.significance import align_by_query, paired_test

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "near-limit"
BUDGETS = (16, 32, 48, 64, 128)
LEARNED = "embedtune learned + codec"
#: The rows of label-free DIVE fitted from the corpus's text (``near_limit.py --learned-text``).
TEXT_DIVE = "dive@text"
OURS = {"embedtune codec", LEARNED}
TEXTBOOK = {"textbook transform coder"}
TRELLIS = {"trellis code (reference)"}
SPHERE = {"sphere decode (reference)"}
#: Rows read from disk per query by the disk tier (``near_limit.RESCORE_CANDIDATES``).
RESCORE_CANDIDATES = 100
ORDER = ("scifact-minilm", "arguana-minilm", "npl-minilm", "cacm-minilm", "med-minilm", "scifact-mpnet", "arguana-mpnet")


def load_rows(folder: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(folder.glob("*.json")):
        if path.name == "meta.json":
            continue
        row = json.loads(path.read_text(encoding="utf-8"))
        if "skipped" not in row:
            rows.append(served(row))
    return rows


def served(row: dict[str, Any]) -> dict[str, Any]:
    """``row``, labelled as embedtune's where a plan can now ship its codec (a trellis row written as a reference)."""
    if row["family"] in TRELLIS | SPHERE:
        precision = row["setting"].split("/", 1)[1]
        if codec_family(precision).deployable:
            return {**row, "family": "embedtune codec" if row["setting"].startswith("frozen/") else LEARNED}
    return row


def learned_gate(row: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[Any, str] | None:
    """The paired test (over held-out documents' agreement hits) of learned ``row`` against the best of ``rows`` without a
    learned transform at the same or fewer bytes, or None where either row predates the hits (then the mean decides)."""
    rival = pick([r for r in rows if r["family"] != LEARNED and r["ram_bytes"] <= row["ram_bytes"]])
    if rival is None or "agreement_hits" not in row or "agreement_hits" not in rival:
        return None
    return paired_test(np.asarray(row["agreement_hits"], float) / 10, np.asarray(rival["agreement_hits"], float) / 10), rival["setting"]


def gate_learned(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` less each learned transform's that does not beat the best codec without one at its bytes by a paired test
    (p < ``LEARNED_GATE_P`` and a higher mean), as ``compress plan`` keeps a learned map (``gate_learned``)."""
    kept = []
    for row in rows:
        gate = learned_gate(row, rows) if row["family"] == LEARNED else None
        if gate is None or (gate[0].mean_difference > 0 and gate[0].p_value < LEARNED_GATE_P):
            kept.append(row)
    return kept


#: FAISS peers a default label-free ``compress plan`` trains (``DEFAULT_PEERS``: 8-bit PQ, OPQ, fast-scan PQ; not RQ, PRQ, LSQ).
DEFAULT_FAISS_PEERS = ("faiss:PQ", "faiss:OPQ")


def in_default_plan(row: dict[str, Any]) -> bool:
    """Whether a default label-free ``compress plan`` scores ``row``'s setting: its default codecs (``DEFAULT_CODECS``) on
    every space, its searched codecs (``SEARCHED_CODECS``) and default peers on the uncompressed vectors, and every
    precision of the vectors and of PCA's spaces. The trellis codes, ``klt-pq``, ``klt-rq``, ``klt-wpq``, the additive
    FAISS peers, ScaNN and extended RaBitQ are opt-in (``--codecs``, ``--peers``) or not in a plan at all."""
    space, _, precision = row["setting"].partition("/")
    family = precision.split(":")[0]
    if row["family"] in OURS:
        return family in DEFAULT_CODECS or (space == "frozen" and family in SEARCHED_CODECS)
    if row["family"] == "FAISS PQ/OPQ/RQ":
        return precision.startswith(DEFAULT_FAISS_PEERS)
    return row["family"] in {"frozen + FAISS quantiser", "PCA + quantiser"}


def within_float32(row: dict[str, Any], n_docs: int, dim: int) -> bool:
    """Whether ``row``'s index over the whole corpus, its codes and its tables (a map's weights included, ``fixed_bytes``), is
    no larger than the float32 vectors: ``compress plan`` chooses nothing larger unless ``--allow-index-over-float32``."""
    return row["ram_bytes"] + (row.get("fixed_bytes") or 0) / n_docs <= float32_bytes(dim)


def pick(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row with the highest agreement (ties: fewer bytes, then the name). Agreement is a mean of tenths over the held-out
    documents, compared to 9 decimals: rows written by other versions of the benchmark sum it in another order."""
    return max(rows, key=lambda r: (round(r["agreement"], 9), -r["ram_bytes"], r["setting"]), default=None)


def _paired(row: dict[str, Any], other: dict[str, Any]) -> Any:
    """The paired test of ``row`` against ``other`` over the queries both scored (mean difference ``row − other``)."""
    return paired_test(*align_by_query(row["per_query"], other["per_query"]))


def _versus(row: dict[str, Any], other: dict[str, Any]) -> str:
    """``row − other``, paired over queries: ``"+0.0012, p 0.345"``."""
    test = _paired(row, other)
    return f"{test.mean_difference:+.4f}, p {test.p_value:.3f}"


def compare(ours: dict[str, Any], other: dict[str, Any] | None) -> str:
    if other is None:
        return "–"
    test = _paired(ours, other)
    return f"{-test.mean_difference:+.4f} (p {test.p_value:.3f})"


def share_at_the_bound(rows: list[dict[str, Any]], budget: int, base: float) -> float | None:
    """The share of float32's nDCG@10 a codec whose MSE were the Gaussian bound at ``budget`` would keep: read off the trellis
    code's share against its MSE over the budgets it ran, linear in log MSE between the two rows either side (None outside)."""
    trellis = sorted((r["mse"], r["ndcg@10"] / base) for r in rows
                     if r["setting"].startswith("frozen/klt-tcq:") and r.get("mse") and r.get("ndcg@10") is not None)
    bound = next((r["bound_mse"] for r in rows if r["setting"] == f"frozen/klt-tcq:{budget}"), None)
    if bound is None:
        return None
    for (low_mse, low_share), (high_mse, high_share) in zip(trellis, trellis[1:]):
        if low_mse <= bound <= high_mse:
            t = (np.log(bound) - np.log(low_mse)) / (np.log(high_mse) - np.log(low_mse))
            return float(low_share + t * (high_share - low_share))
    return None


def corpus_table(name: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    reference = next(r for r in rows if r["setting"] == "frozen/float32")
    base = reference["ndcg@10"]
    lines = [f"### {name}: {meta['n_docs']:,} documents, {meta['dim']}-d, {reference['n_queries']} test queries, "
             f"float32 nDCG@10 {base:.4f}", "",
             "| budget | embedtune's pick | share | dB to bound | a default plan's pick | share | Δ default − pick (p) "
             "| best in-RAM peer | share | Δ peer − pick (p) "
             "| textbook | share | its dB | Δ textbook − pick (p) | trellis | share | its dB | Δ trellis − pick (p) "
             "| on the sphere | share | its dB | Δ − pick (p) | disk tier (RAM B) | share | fit s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary, bills, learned_lines = [], [], []
    measured = {b for b in BUDGETS if any(r["setting"] == f"frozen/klt-pq4:{b}" for r in rows)}
    for budget in BUDGETS:
        if budget not in measured:  # the run has not reached this budget (or was not asked for it): no row rather than a stale pick
            continue
        # Every column picks as a plan would: within the budget, and never an index larger than the float32 vectors.
        fits_any = [r for r in rows if r["ram_bytes"] <= budget and r.get("tier", "ram") == "ram" and r["setting"] != "frozen/float32"]
        fits = [r for r in fits_any if within_float32(r, meta["n_docs"], int(meta["dim"]))]
        ours = pick(gate_learned([r for r in fits if r["family"] in OURS]))
        default = pick(gate_learned([r for r in fits if in_default_plan(r)]))
        # What each would have been without that rule, to count where it decided.
        ours_any = pick(gate_learned([r for r in fits_any if r["family"] in OURS]))
        default_any = pick(gate_learned([r for r in fits_any if in_default_plan(r)]))
        passed_over = default_any if default_any is not None and default is not None and default_any["setting"] != default["setting"] else None
        peers = [r for r in fits if r["family"] not in OURS | TEXTBOOK | TRELLIS | SPHERE]
        peer = pick(peers)
        textbook = next((r for r in rows if r["setting"] == f"frozen/klt-sq:{budget}"), None)
        trellis = next((r for r in rows if r["setting"] == f"frozen/klt-tcq:{budget}"), None)
        sphere = next((r for r in rows if r["setting"] == f"frozen/klt-tcq-sphere:{budget}"), None)
        disk = pick([r for r in rows if r.get("tier") == "disk-rescore" and r["ram_bytes"] <= budget
                     and within_float32(r, meta["n_docs"], int(meta["dim"]))])
        if ours is None:
            continue

        def cell(row: dict[str, Any] | None) -> str:
            if row is None:
                return "–"
            name = row["setting"].removeprefix("frozen/").removeprefix("peer/").removeprefix("disk/")
            return f"`{name}`"

        def share(row: dict[str, Any] | None) -> str:
            return "–" if row is None else f"{100 * row['ndcg@10'] / base:.1f} %"

        def db(row: dict[str, Any] | None) -> str:
            if row is not None and row.get("gap_db") is None and row.get("space_gap_db") is not None:
                return f"{row['space_gap_db']:.2f}†"  # measured in the transform's own k-dim space
            return "–" if row is None or row.get("gap_db") is None else f"{row['gap_db']:.2f}"

        gap = db(ours)
        disk_bytes = "" if disk is None else f" ({disk['ram_bytes']})"
        lines.append(f"| {budget} B | {cell(ours)} | **{share(ours)}** | {gap} | {cell(default)} | {share(default)} "
                     f"| {compare(ours, default) if default is not ours else 'the same'} | {cell(peer)} | {share(peer)} | {compare(ours, peer)} "
                     f"| {cell(textbook)} | {share(textbook)} | {db(textbook)} | {compare(ours, textbook)} "
                     f"| {cell(trellis)} | {share(trellis)} | {db(trellis)} | {compare(ours, trellis)} "
                     f"| {cell(sphere)} | {share(sphere)} | {db(sphere)} | {compare(ours, sphere)} "
                     f"| {cell(disk)}{disk_bytes} | {share(disk)} | {ours['fit_s']:.1f} |")
        versus_peer = None
        if peer is not None:
            versus_peer = _paired(ours, peer)
        # The peer a user with labels would keep: the best test score, chosen after the fact (which favours the peers).
        scored = [r for r in peers if r.get("ndcg@10") is not None]
        best_peer = max(scored, key=lambda r: (r["ndcg@10"], r["setting"])) if scored else None
        versus_best_peer = None if best_peer is None else _paired(ours, best_peer)
        sphere_test = None if sphere is None else _paired(sphere, ours)
        versus_default = None if default is None or default is ours else _paired(ours, default)
        default_versus_peer = None if default is None or peer is None or default is peer else _paired(default, peer)
        summary.append({"corpus": name, "budget": budget, "pick": ours["setting"], "pick_share": ours["ndcg@10"] / base,
                        "pick_fixed_bytes": ours.get("fixed_bytes"),
                        "default_fixed_bytes": None if default is None else default.get("fixed_bytes"),
                        "peer_fixed_bytes": None if peer is None else peer.get("fixed_bytes"),
                        "n_docs": meta["n_docs"], "dim": int(meta["dim"]),
                        "pick_over_float32": None if ours_any is None or ours_any["setting"] == ours["setting"] else ours_any["setting"],
                        "default_over_float32": None if passed_over is None else passed_over["setting"],
                        "default_over_float32_share": None if passed_over is None else passed_over["ndcg@10"] / base,
                        "default": None if default is None else default["setting"],
                        "default_share": None if default is None else default["ndcg@10"] / base,
                        "pick_minus_default": 0.0 if default is ours else None if versus_default is None else versus_default.mean_difference,
                        "pick_minus_default_p": 1.0 if default is ours else None if versus_default is None else versus_default.p_value,
                        "default_minus_peer": None if default_versus_peer is None else default_versus_peer.mean_difference,
                        "default_minus_peer_p": None if default_versus_peer is None else default_versus_peer.p_value,
                        "pick_minus_peer": None if versus_peer is None else versus_peer.mean_difference,
                        "pick_minus_peer_p": None if versus_peer is None else versus_peer.p_value,
                        "pick_gap_db": ours.get("gap_db") if ours.get("gap_db") is not None else ours.get("space_gap_db"),
                        "pick_gap_db_in_transform_space": ours.get("gap_db") is None and ours.get("space_gap_db") is not None, "peer": None if peer is None else peer["setting"],
                        "peer_share": None if peer is None else peer["ndcg@10"] / base,
                        "textbook_share": None if textbook is None else textbook["ndcg@10"] / base,
                        "trellis_share": None if trellis is None else trellis["ndcg@10"] / base,
                        "trellis_gap_db": None if trellis is None else trellis.get("gap_db"),
                        "sphere": None if sphere is None else sphere["setting"],
                        "sphere_share": None if sphere is None else sphere["ndcg@10"] / base,
                        "sphere_minus_pick": None if sphere_test is None else sphere_test.mean_difference,
                        "sphere_minus_pick_p": None if sphere_test is None else sphere_test.p_value,
                        "disk": None if disk is None else disk["setting"], "disk_share": None if disk is None else disk["ndcg@10"] / base,
                        "best_peer": None if best_peer is None else best_peer["setting"],
                        "best_peer_share": None if best_peer is None else best_peer["ndcg@10"] / base,
                        "pick_minus_best_peer": None if versus_best_peer is None else versus_best_peer.mean_difference,
                        "pick_minus_best_peer_p": None if versus_best_peer is None else versus_best_peer.p_value})
        bills.append((budget, ours, disk))
        learned = pick([r for r in fits if r["family"] == LEARNED and r["ram_bytes"] == budget])
        if learned is not None:
            plain = pick([r for r in fits if r["family"] == "embedtune codec"])
            versus = _paired(learned, plain)
            gate = learned_gate(learned, [r for r in fits if r["family"] in OURS])
            summary[-1].update(learned=learned["setting"], learned_share=learned["ndcg@10"] / base, plain=plain["setting"],
                               plain_share=plain["ndcg@10"] / base, learned_minus_plain=versus.mean_difference,
                               learned_minus_plain_p=versus.p_value, learned_picked=learned is ours,
                               learned_agreement_p=None if gate is None else gate[0].p_value)
            gate_text = ("no agreement per document to test" if gate is None else
                         f"agreement {gate[0].mean_difference:+.4f} over {_pretty(gate[1])}, p {gate[0].p_value:.3f}")
            learned_lines.append(
                f"- {budget} B: {_pretty(learned['setting'])} keeps {100 * learned['ndcg@10'] / base:.1f} % (agreement "
                f"{learned['agreement']:.3f}); the best codec without a learned transform, {_pretty(plain['setting'])}, keeps "
                f"{100 * plain['ndcg@10'] / base:.1f} % (agreement {plain['agreement']:.3f}): learned − plain "
                f"{versus.mean_difference:+.4f} (p {versus.p_value:.3f}); {gate_text}; {'picked' if learned is ours else 'not picked'}.")
            same_bytes = [r for r in fits if r["family"] == LEARNED and r["ram_bytes"] == budget]
            from_text = pick([r for r in same_bytes if r["setting"].startswith(f"{TEXT_DIVE}-")])
            # The same DIVE and codec fitted from the vectors alone: one paired difference, the preset's.
            from_vectors = None if from_text is None else next(
                (r for r in same_bytes if r["setting"] == from_text["setting"].replace(f"{TEXT_DIVE}-", "dive-", 1)), None)
            if from_text is not None and from_vectors is not None:
                text_test, text_plain = _paired(from_text, from_vectors), _paired(from_text, plain)
                summary[-1].update(text_dive=from_text["setting"], text_dive_share=from_text["ndcg@10"] / base,
                                   text_minus_vectors=text_test.mean_difference, text_minus_vectors_p=text_test.p_value,
                                   text_minus_plain=text_plain.mean_difference, text_minus_plain_p=text_plain.p_value)
                learned_lines.append(
                    f"  Fitted from the corpus's text (the `unsupervised-guarded` preset, as a plan fits DIVE from a corpus): "
                    f"{_pretty(from_text['setting'])} keeps {100 * from_text['ndcg@10'] / base:.1f} % (agreement "
                    f"{from_text['agreement']:.3f}); − {_pretty(from_vectors['setting'])} {text_test.mean_difference:+.4f} "
                    f"(p {text_test.p_value:.3f}); − {_pretty(plain['setting'])} {text_plain.mean_difference:+.4f} (p {text_plain.p_value:.3f}).")
    at_bound = [(b, share_at_the_bound(rows, b, base)) for b in sorted(measured)]
    at_bound = [(b, v) for b, v in at_bound if v is not None]
    if at_bound:
        lines += ["", "What a codec *at* the Gaussian bound would keep, read off the trellis code's share of float32 against its MSE "
                  "(linear in log MSE between its two budgets either side of the bound's MSE): "
                  + "; ".join(f"{b} B about {100 * v:.1f} %" for b, v in at_bound)
                  + ". A score-aware or learned code is not held to it: the bound limits the vectors' error, not the ranking's."]
        for entry in summary:
            entry["share_at_bound"] = dict(at_bound).get(entry["budget"])
    behind = sorted((r for r in rows if r["family"] in TRELLIS | SPHERE and not r["setting"].startswith("frozen/")),
                    key=lambda r: (r["ram_bytes"], r["setting"]))
    if behind:
        picks = {entry["budget"]: entry for entry in summary}
        lines += ["", "The trellis code behind label-free DIVE, plain and on the sphere (references, as above): "
                  + "; ".join(f"{_pretty(r['setting'])} keeps {100 * r['ndcg@10'] / base:.1f} %"
                              + (f" ({r['space_gap_db']:.2f} dB† above the bound in DIVE's space)" if r.get("space_gap_db") is not None else "")
                              + (f", against the pick's {100 * picks[r['ram_bytes']]['pick_share']:.1f} % "
                                 f"(it − pick {_versus(r, next(x for x in rows if x['setting'] == picks[r['ram_bytes']]['pick']))})"
                                 if r["ram_bytes"] in picks else "")
                              for r in behind) + "."]
    if learned_lines:
        lines += ["", "Label-free DIVE in front of a codec, against the best codec without a learned transform (on the plain "
                  "vectors, or after PCA where run) at the same bytes (each chosen by agreement, no labels; every test query is "
                  "unseen):", "", *learned_lines]
    return lines + ["", *bill_lines(bills, int(meta["dim"]))], summary


def bill_lines(bills: list[tuple[int, dict[str, Any], dict[str, Any] | None]], dim: int) -> list[str]:
    """What each budget's pick costs at scale, beside float32, and what its disk tier reads per query."""
    read = lambda disk: "–" if disk is None else (  # noqa: E731
        f"disk tier: {disk_read_per_query(True, dim, RESCORE_CANDIDATES) / 1000:.1f} kB (`{disk['setting'].removeprefix('disk/')}`)")
    return bill_table([BillLine(f"{budget} B", f"`{ours['setting'].removeprefix('frozen/')}`", ours["ram_bytes"],
                                ours.get("fixed_bytes") or 0.0, read(disk)) for budget, ours, disk in bills], dim)


#: The block of the quality-per-byte results page this script owns: everything between the two markers is rewritten.
RESULTS_PAGE = RESULTS.parent / "quality-per-byte.md"
START, END = "<!-- near-limit tables: generated by benchmarks/near_limit_report.py -->", "<!-- end of near-limit tables -->"


def replace_between_markers(path: Path, start: str, end: str, block: str) -> None:
    """Replace what lies between ``start`` and ``end`` in ``path`` with ``block`` (nothing else in the file changes)."""
    page = path.read_text(encoding="utf-8")
    if start not in page or end not in page:
        raise SystemExit(f"{path}: the markers {start!r} and {end!r} are missing; put them where the generated block goes.")
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    atomic_write(path, lambda tmp: tmp.write_text(f"{head}{start}\n{block}\n{end}{tail}", encoding="utf-8"))


def update_results_page(tables: str) -> None:
    """Replace the generated block of ``benchmarks/results/quality-per-byte.md`` with ``tables``."""
    replace_between_markers(RESULTS_PAGE, START, END, tables)


#: The README's headline table (SciFact, MiniLM) and its one-line verdict over every corpus, between these markers.
README = HERE.parent / "README.md"
README_START, README_END = "<!-- headline table: generated by benchmarks/near_limit_report.py -->", "<!-- end of headline table -->"
HEADLINE_CORPUS = "scifact-minilm"
#: A paired difference counts as significant below this p (one test per cell, no correction: the verdict says so).
SIGNIFICANT = 0.05


def _span(values: list[float]) -> str:
    """``-0.0013`` for one value, ``-0.0013 to +0.0040`` for several."""
    low, high = min(values), max(values)
    return f"{low:+.4f}" if low == high else f"{low:+.4f} to {high:+.4f}"


def _points(shares: list[float]) -> str:
    """Differences of shares in points: ``+2.0`` for one, ``-3.4 to +5.0`` for several."""
    low, high = 100 * min(shares), 100 * max(shares)
    return f"{low:+.1f}" if f"{low:+.1f}" == f"{high:+.1f}" else f"{low:+.1f} to {high:+.1f}"


def _pretty(setting: str | None) -> str:
    if setting is None:
        return "–"
    return "`" + setting.removeprefix("frozen/").removeprefix("peer/").removeprefix("disk/") + "`"


def _where(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['corpus']} at {r['budget']} B" for r in rows) or "none"


def _significant(rows: list[dict[str, Any]], key: str, sign: int) -> list[dict[str, Any]]:
    """``rows`` whose paired difference ``key`` is significant (p < :data:`SIGNIFICANT`) with ``sign``."""
    return [r for r in rows if r.get(f"{key}_p") is not None and r[f"{key}_p"] < SIGNIFICANT and sign * r[key] > 0]


def headline(summary: list[dict[str, Any]], dim: int) -> str:
    """The README's table for :data:`HEADLINE_CORPUS` and a few counts over every corpus; the cells behind each count are in
    :func:`verdict`, on the results page."""
    lines = ["| bytes per vector | smaller than float32 | a default plan's pick | keeps | tables | best of every codec | keeps | tables | "
             "best other in-RAM code | keeps | tables | best setting that rescores from disk | keeps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def share(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.1f} %"

    def tables(value: float | None) -> str:
        return "–" if value is None else f"{value / 1e6:.2g} MB"

    headline_rows = [r for r in summary if r["corpus"] == HEADLINE_CORPUS]
    for row in headline_rows:
        lines.append(f"| {row['budget']} | {4 * dim // row['budget']}x | {_pretty(row.get('default'))} | {share(row.get('default_share'))} | "
                     f"{tables(row.get('default_fixed_bytes'))} | {_pretty(row['pick'])} | {share(row['pick_share'])} | "
                     f"{tables(row.get('pick_fixed_bytes'))} | {_pretty(row['peer'])} | {share(row['peer_share'])} | "
                     f"{tables(row.get('peer_fixed_bytes'))} | {_pretty(row['disk'])} | {share(row['disk_share'])} |")
    cells = [r for r in summary if r.get("pick_minus_peer_p") is not None]
    corpora = sorted({r["corpus"] for r in cells}, key=lambda c: ORDER.index(c) if c in ORDER else 99)
    text = (f"Over all {len(cells)} corpus × budget cells measured ({', '.join(corpora)}; paired tests over the test queries, "
            f"p < {SIGNIFICANT}), the best of every codec is significantly above the best other in-RAM code in "
            f"{len(_significant(cells, 'pick_minus_peer', 1))} and below it in {len(_significant(cells, 'pick_minus_peer', -1))}.")
    defaults = [r for r in summary if r.get("pick_minus_default_p") is not None]
    if defaults:
        behind = _significant(defaults, "pick_minus_default", 1)
        same = [r for r in defaults if r.get("default") == r["pick"]]
        text += (f" A default plan's pick is the same setting in {len(same)} of {len(defaults)} cells and significantly below "
                 f"the best of every codec in {len(behind)}; against the best other in-RAM code it is significantly above in "
                 f"{len(_significant(defaults, 'default_minus_peer', 1))} and below in "
                 f"{len(_significant(defaults, 'default_minus_peer', -1))}.")
    ran = [r for r in summary if "learned" in r]
    if ran:
        text += (f" Label-free DIVE in front of a codec was picked, without labels, in {sum(bool(r['learned_picked']) for r in ran)} "
                 f"of the {len(ran)} cells where it ran.")
    fixed = [r for r in summary if r.get("n_docs")]
    if fixed:
        over = [r for r in fixed if r.get("default_over_float32")]
        over_pick = [r for r in fixed if r.get("pick_over_float32")]
        cost = [r["default_over_float32_share"] - r["default_share"] for r in over]
        text += (" Bytes per vector count the codes; an index also holds its tables once (\"tables\": codebooks, rotations, "
                 "and the weights of a PCA or DIVE map in front). No column picks a setting whose index, tables included, is "
                 "larger than the float32 vectors, as `compress plan` chooses unless `--allow-index-over-float32`: on these "
                 f"corpora of {min(r['n_docs'] for r in fixed):,} to {max(r['n_docs'] for r in fixed):,} documents that rule "
                 f"decided a default plan's pick in {len(over)} of {len(fixed)} cells"
                 + (f" (the larger index would have kept {_points(cost)} points of float32's nDCG@10 more, its tables "
                    "fitted on the other half of the corpus)" if over else "")
                 + f" and the best of every codec's in {len(over_pick)}.")
    return "\n".join(lines + ["", text])


def verdict(summary: list[dict[str, Any]]) -> list[str]:
    """Cell by cell, over every corpus: where the pick wins or loses against the peers, where a default plan's pick falls
    behind it, and where label-free DIVE was kept."""
    cells = [r for r in summary if r.get("pick_minus_peer_p") is not None]
    above, below = _significant(cells, "pick_minus_peer", 1), _significant(cells, "pick_minus_peer", -1)
    corpora = sorted({r["corpus"] for r in summary}, key=lambda c: ORDER.index(c) if c in ORDER else 99)
    lines = ["## Verdict over every corpus", "",
             f"Over all {len(cells)} corpus × budget cells measured with a peer ({', '.join(corpora)}), the pick is significantly "
             f"above the best other in-RAM code (paired test, p < {SIGNIFICANT}, one test per cell) in {len(above)} "
             f"({_where(above)}) and significantly below it in {len(below)} ({_where(below)}); the rest are ties."]
    hindsight = [r for r in summary if r.get("pick_minus_best_peer_p") is not None]
    if hindsight:
        h_above, h_below = _significant(hindsight, "pick_minus_best_peer", 1), _significant(hindsight, "pick_minus_best_peer", -1)
        lines[-1] += (f" Against the peer with the best test score in each cell instead (chosen after the fact, which favours the "
                      f"peers), it is significantly above in {len(h_above)} ({_where(h_above)}) and below in {len(h_below)} "
                      f"({_where(h_below)}).")
    defaults = [r for r in summary if r.get("pick_minus_default_p") is not None]
    if defaults:
        behind, ahead = _significant(defaults, "pick_minus_default", 1), _significant(defaults, "pick_minus_default", -1)
        lines[-1] += (f" A default plan (its default codecs, searched codecs, peers and precisions, as `in_default_plan` in "
                      f"`benchmarks/near_limit_report.py` reads them; no trellis code) picks, from the same rows, a setting significantly below the pick in {len(behind)} "
                      f"({_where(behind)}) and above it in {len(ahead)} ({_where(ahead)}). Against the best other in-RAM code, a "
                      f"default plan's pick is significantly above in {len(d_above := _significant(defaults, 'default_minus_peer', 1))} "
                      f"({_where(d_above)}) and below in {len(d_below := _significant(defaults, 'default_minus_peer', -1))} "
                      f"({_where(d_below)}).")
    ran = [r for r in summary if "learned" in r]
    picked = [r for r in ran if r["learned_picked"]]
    if ran:
        significant = [r for r in picked if r["learned_minus_plain_p"] < SIGNIFICANT]
        avoided = [r for r in ran if not r["learned_picked"] and r["learned_minus_plain_p"] < SIGNIFICANT and r["learned_minus_plain"] < 0]
        worse = [r for r in picked if r["learned_minus_plain"] < 0]
        gated = [r for r in ran if r.get("learned_agreement_p") is not None]
        lines[-1] += (f" Label-free DIVE in front of a codec ran in {len(ran)} cells and was picked, without labels, in "
                      f"{len(picked)}" + (f" ({_where(picked)})" if picked else "")
                      + (f": {_span([r['learned_minus_plain'] for r in picked])} nDCG@10 over the best codec without a learned "
                         f"transform, significant in {len(significant)} ({_where(significant)})" if picked else "")
                      + f"; picked where it was worse: {len(worse)}; left out where it was significantly worse: {len(avoided)}. It is "
                      f"picked only where its agreement beats the best codec without it by a paired test over the held-out documents "
                      f"(p < {LEARNED_GATE_P}; in {len(gated)} of the {len(ran)} cells, the rest by the mean, their rows predating "
                      "the per-document hits), as `compress plan` keeps a learned map.")
    return lines + [""]


#: The codecs whose codes are also ranked by their decoded direction (``<family>-sphere``), in the sphere table's order.
SPHERE_PAIRS = ("klt-pq4", "klt-apq", "klt-sq", "klt-tcq")


def sphere_table(rows_by_corpus: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Per corpus and budget: each family's share of float32 with its plain scores and on the sphere, paired (sphere − plain)."""
    lines = ["## Ranking by the decoded direction: each code plain and on the sphere", "",
             "The same codes, scored `q · x̂` (plain) and `q · x̂ / ‖x̂‖` (`-sphere`: each query's top 100 re-ranked for `klt-pq4` "
             "and `klt-apq`, every document for the references `klt-sq` and `klt-tcq`). Share of float32 nDCG@10, plain → sphere, "
             "the paired difference sphere − plain (p), and each one's distance above the Gaussian bound (the sphere's decode is the "
             "direction at the rows' norm, not the least-squares one, so its dB can rise while it ranks better). Cross-fitted halves, "
             "as above.", "",
             "| corpus | budget | " + " | ".join(f"`{f}`" for f in SPHERE_PAIRS) + " |", "|---|---|" + "---|" * len(SPHERE_PAIRS)]
    up = total = 0
    for corpus, rows in rows_by_corpus.items():
        by = {r["setting"]: r for r in rows}
        base = by["frozen/float32"]["ndcg@10"]
        for budget in BUDGETS:
            cells = []
            for family in SPHERE_PAIRS:
                plain, sphere = by.get(f"frozen/{family}:{budget}"), by.get(f"frozen/{family}-sphere:{budget}")
                if plain is None or sphere is None:
                    cells.append("–")
                    continue
                test = _paired(sphere, plain)
                total += 1
                up += test.mean_difference > 0
                gaps = [r.get("gap_db") for r in (plain, sphere)]
                cells.append(f"{100 * plain['ndcg@10'] / base:.1f} → {100 * sphere['ndcg@10'] / base:.1f} % "
                             f"({test.mean_difference:+.4f}, p {test.p_value:.3f}"
                             + (f"; {gaps[0]:.2f} → {gaps[1]:.2f} dB" if None not in gaps else "") + ")")
            if any(c != "–" for c in cells):
                lines.append(f"| {corpus} | {budget} B | " + " | ".join(cells) + " |")
    return lines + ["", f"On the sphere above plain in {up} of {total} cells."] if total else []


def update_readme(block: str) -> None:
    """Replace the README's generated headline block."""
    replace_between_markers(README, README_START, README_END, block)


def main() -> int:
    sections, summary, rows_by_corpus = [], [], {}
    folders = sorted((p for p in RESULTS.iterdir() if p.is_dir()), key=lambda p: (ORDER.index(p.name) if p.name in ORDER else 99, p.name))
    for folder in folders:
        rows = load_rows(folder)
        if not any(r["setting"] == "frozen/float32" for r in rows):
            continue
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        lines, part = corpus_table(folder.name, rows, meta)
        rows_by_corpus[folder.name] = rows
        dates = sorted(r["date"] for r in rows if "date" in r)
        peak = max((r.get("peak_rss_mb") or 0) for r in rows)
        fit_total = sum(r.get("fit_s") or 0 for r in rows if r.get("tier", "ram") == "ram")
        lines += ["", f"Rows: `{folder.relative_to(HERE.parent)}/` ({len(rows)} settings, {dates[0]} to {dates[-1]}); "
                      f"fitting every setting took {fit_total / 60:.0f} minutes on one thread (both halves, a shared machine), peak RSS {peak:.0f} MB; "
                      f"vectors `{meta['vectors']}`; machine{'s' if len(meta.get('machines', [])) > 1 else ''} "
                      f"{', '.join(meta.get('machines') or [meta['machine'].get('cpu', meta['machine'])])}; "
                      "commands " + ", ".join(f"`.venv/bin/python {c}`" for c in meta.get("commands", [meta["command"]])) + ".", ""]
        sections += lines
        summary += part
    intro = (__doc__ or "").split("\n\n", 2)[2].strip().replace("$PRICE", f"${DEFAULT_PRICE_PER_GB_MONTH:g}")
    text = "\n".join(["# In-RAM codes near the limit", "", intro, "", *sections, *verdict(summary), *sphere_table(rows_by_corpus)])
    atomic_write(RESULTS / "REPORT.md", lambda tmp: tmp.write_text(text + "\n", encoding="utf-8"))
    update_results_page("\n".join(sections + verdict(summary)).strip())
    atomic_write_json(RESULTS / "summary.json", summary)
    headline_meta = json.loads((RESULTS / HEADLINE_CORPUS / "meta.json").read_text(encoding="utf-8"))
    update_readme(headline(summary, int(headline_meta["dim"])))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
