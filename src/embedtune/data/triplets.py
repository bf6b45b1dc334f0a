"""Training triplets ``(query, positive, negative)``, mined once and persisted by id.

Every supervised compressor trains on the same triplets (the DIVE paper's "shared
deterministic triplets", §4.1). Mining is deterministic given the seed: queries and their
relevant documents are visited in sorted id order and one numpy generator draws every negative.
Optional robustness settings (off by default) filter likely false negatives out of the hard
pool and cap the triplets per query; see :func:`mine_triplets`.
Triplets are persisted with ids rather than row numbers, so they stay valid when embeddings are
recomputed or reordered.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np

from embedtune.constraints import Constraint, Interval, Options, validate_constraints
from embedtune.data.errors import DataFormatError
from embedtune.evaluate.search import exact_search
from embedtune.io import atomic_write_bytes

logger = logging.getLogger(__name__)

__all__ = [
    "mine_triplets",
    "check_mining_options",
    "check_random_negatives",
    "MINING_CONSTRAINTS",
    "mining_options",
    "save_triplets",
    "load_triplets",
    "StoredTriplets",
    "NEGATIVE_KINDS",
    "MARGIN_REFERENCES",
    "MINING_DEFAULTS",
    "explain_no_triplets",
]

NEGATIVE_KINDS = ("hard", "random")
MARGIN_REFERENCES = ("pair", "query-min")
# The false-negative filter and the cap are off by default: the miner's output is unchanged.
MINING_DEFAULTS: dict[str, Any] = {
    "skip_top": 0,
    "false_negative_margin": None,
    "false_negative_reference": "pair",
    "max_triplets_per_query": None,
}
#: What each triplet-mining option accepts, declared once: :class:`embedtune.compress.MiningOptions` declares
#: these (its ``_parameter_constraints``), and :func:`check_mining_options` checks :func:`mine_triplets`'s arguments with them.
MINING_CONSTRAINTS: dict[str, list[Constraint]] = {
    "negatives": [Options(NEGATIVE_KINDS)],
    "n_negatives": [Interval(int, 1, None)],
    "skip_top": [Interval(int, 0, None, means="0 skips nothing")],
    "false_negative_margin": [Interval(float, None, None), Options((None,), means="no filter")],
    "false_negative_reference": [Options(MARGIN_REFERENCES)],
    "max_triplets_per_query": [Interval(int, 1, None), Options((None,), means="no cap")],
}
TRIPLETS_FORMAT = "embedtune.triplets"
TRIPLETS_VERSION = 1
# Separate random streams for the two strategies, so switching one never shifts the other.
# The cap draws from a third, so capping never changes which negatives are drawn.
_STREAM = {"hard": 1, "random": 2, "cap": 3}


def _row_index(ids: list[str], name: str) -> dict[str, int]:
    index = {doc_id: row for row, doc_id in enumerate(ids)}
    if len(index) != len(ids):
        raise ValueError(f"{name} contains duplicate ids; every row needs a unique id.")
    return index


def check_mining_options(
    negatives: str = "hard",
    skip_top: int = 0,
    false_negative_margin: float | None = None,
    false_negative_reference: str = "pair",
    max_triplets_per_query: int | None = None,
    where: str = "mine_triplets",
) -> None:
    """Raise ``ValueError`` (naming ``where``) unless the robustness options are valid.

    Each value is checked against :data:`MINING_CONSTRAINTS`, the declaration
    :class:`embedtune.compress.MiningOptions` (and so the CLI and the protocol TOML) checks too, so
    all of them fail the same way and before any encoding.
    """
    values = {"negatives": negatives, "skip_top": skip_top, "false_negative_margin": false_negative_margin,
              "false_negative_reference": false_negative_reference, "max_triplets_per_query": max_triplets_per_query}
    # numpy scalars (a count read from an array) are checked as the Python numbers they hold.
    values = {name: value.item() if isinstance(value, np.generic) else value for name, value in values.items()}
    try:
        validate_constraints(SimpleNamespace(**values), {name: MINING_CONSTRAINTS[name] for name in values})
        check_random_negatives(negatives, values["skip_top"], values["false_negative_margin"])
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def check_random_negatives(negatives: str, skip_top: int, false_negative_margin: float | None) -> None:
    """Refuse a hard-negative filter with ``negatives='random'`` (what relates the fields; each one's own
    range is :data:`MINING_CONSTRAINTS`')."""
    if negatives == "random" and (skip_top != 0 or false_negative_margin is not None):
        raise ValueError(
            "skip_top and false_negative_margin filter hard negatives; with negatives='random' leave them at "
            "their defaults (0 and None)."
        )


def mining_options(
    skip_top: int = 0,
    false_negative_margin: float | None = None,
    false_negative_reference: str = "pair",
    max_triplets_per_query: int | None = None,
) -> dict[str, Any]:
    """The robustness options that differ from :data:`MINING_DEFAULTS`, as a dict.

    This is what goes into a triplet file's metadata: with every option at its default the
    dict is empty, so triplets mined before these options existed keep matching.
    ``false_negative_reference`` only matters with a margin and is left out without one.
    """
    given = {
        "skip_top": int(skip_top),
        "false_negative_margin": None if false_negative_margin is None else float(false_negative_margin),
        "false_negative_reference": false_negative_reference if false_negative_margin is not None else "pair",
        "max_triplets_per_query": None if max_triplets_per_query is None else int(max_triplets_per_query),
    }
    return {key: value for key, value in given.items() if value != MINING_DEFAULTS[key]}


def explain_no_triplets(
    query_ids: list[str],
    doc_ids: list[str],
    qrels: dict[str, dict[str, int]],
    *,
    skip_top: int = 0,
    false_negative_margin: float | None = None,
    false_negative_reference: str = "pair",
) -> tuple[str, str]:
    """Which mining step left no triplet, as ``(step, sentence)``, so an error blames the right one.

    ``step`` is ``"queries"`` (no training query), ``"judgments"`` (no query has a relevant
    document), ``"corpus"`` (no relevant document, or no other document, is in the corpus),
    ``"false_negative_filter"`` or ``"skip_top"``. The checks run in mining order.
    """
    if not query_ids:
        return "queries", "the training split has no queries, so there is nothing to mine"
    positives = {doc_id for qid in query_ids for doc_id, rel in qrels.get(qid, {}).items() if rel > 0}
    if not positives:
        return "judgments", f"none of the {len(query_ids)} training queries has a relevant (score > 0) judgment"
    corpus = set(doc_ids)
    if positives.isdisjoint(corpus):
        return "corpus", (f"none of the {len(positives)} relevant documents of the {len(query_ids)} training queries "
                          f"(e.g. {sorted(positives)[0]!r}) is in the corpus")
    if corpus <= positives | set(query_ids):
        return "corpus", f"the corpus ({len(corpus)} documents) holds nothing but relevant documents, so no negative can be drawn"
    if false_negative_margin is not None:
        return "false_negative_filter", (f"the false-negative filter (margin {false_negative_margin}, reference "
                                         f"{false_negative_reference!r}) dropped every candidate negative")
    if skip_top:
        return "skip_top", f"skip_top={skip_top} skipped every candidate negative"
    return "corpus", "no candidate negative was left after the exclusions"


def mine_triplets(
    query_ids: list[str],
    query_embeddings: np.ndarray,
    doc_ids: list[str],
    doc_embeddings: np.ndarray,
    qrels: dict[str, dict[str, int]],
    n_negatives: int = 4,
    negatives: Literal["hard", "random"] = "hard",
    hard_pool: int = 50,
    seed: int = 2027,
    *,
    skip_top: int = 0,
    false_negative_margin: float | None = None,
    false_negative_reference: Literal["pair", "query-min"] = "pair",
    max_triplets_per_query: int | None = None,
) -> np.ndarray:
    """Triplets for every (query, relevant doc) pair of the given (training) queries.

    Each pair of a query in ``query_ids`` and a doc with ``qrels[query][doc] > 0`` gets
    ``n_negatives`` negatives, drawn without replacement:

    - ``"hard"``: from the frozen model's ``hard_pool`` best-scoring docs (exact inner-product
      search) that remain after the exclusions and the false-negative filter below;
    - ``"random"``: uniformly from the corpus, with the same exclusions.

    Excluded as negatives: every doc relevant to the query (``rel > 0``) and any doc whose id
    equals the query id (ArguAna-style self matches). A pool smaller than ``n_negatives`` gives
    fewer negatives (logged).

    **False-negative filter** (hard negatives only). With incomplete judgements the frozen top
    ranks are full of unjudged relevant documents (near-duplicates of the positives, ...), which
    hard mining would push away. Let ``s(q, d)`` be the frozen inner product and rank the
    corpus by it for query ``q``, with the excluded docs removed. Then:

    1. ``skip_top``: the first ``skip_top`` ranks are never negatives;
    2. ``false_negative_margin`` (per pair ``(q, p)``): a remaining candidate ``c`` is dropped
       if ``s(q, c) > ref(q, p) - false_negative_margin``, where::

           ref(q, p) = s(q, p)                          (false_negative_reference="pair")
           ref(q, p) = min over p' in P(q) of s(q, p')  (false_negative_reference="query-min")

       and ``P(q)`` is the query's judged positives in the corpus. Scores are computed in
       float64;
    3. the pool of the pair is the first ``hard_pool`` candidates that pass 1 and 2, in rank
       order; ``n_negatives`` are drawn from it uniformly, without replacement.

    Without a margin, the pool is the ranks ``skip_top + 1 .. skip_top + hard_pool`` (after the
    exclusions); with one, it starts at the first candidate below the threshold, i.e. the
    margin moves the window down instead of emptying it (the search deepens as needed).

    Correspondence with sentence-transformers' ``util.mine_hard_negatives`` (there the window
    is ranks ``range_min .. range_max``, after masking positives and applying the score filters):

    - ``skip_top`` ~ ``range_min``, except that ``range_min`` counts ranks after the score
      filters and ``skip_top`` counts ranks of the frozen ranking, so that the two filters here
      are independent;
    - ``false_negative_margin`` = ``absolute_margin`` (it drops ``c`` if
      ``s(q, c) + absolute_margin > s(q, p)``). sentence-transformers takes the *minimum*
      positive score of the query as ``s(q, p)``: that is ``false_negative_reference="query-min"``.
      ``"pair"`` (the default) compares with the pair's own positive and so drops fewer
      candidates for a query with many positives of different scores;
    - ``hard_pool`` ~ ``range_max - range_min`` counted in surviving candidates (with a margin,
      sentence-transformers widens its default ``range_max`` to ``range_min + 10·num_negatives
      + max_positives`` for the same reason); drawing uniformly from the pool is its
      ``sampling_strategy="random"``;
    - ``relative_margin`` ``r`` is the absolute margin ``r·|s(q, p)|``; ``max_score`` and
      ``min_score`` have no counterpart.

    **Cap per query.** With ``max_triplets_per_query = m``, a query whose pairs produce more
    than ``m`` triplets keeps ``m`` of them, spread over its positives: a seeded shuffle of the
    positives deals one slot at a time to each positive that still has a negative left (so the
    quotas differ by at most one, unless a positive runs out), and each positive keeps a
    uniform random subset of its negatives of that size. The cap draws from its own random
    stream, so capped triplets are a subset of the uncapped ones. Without a cap, a query with
    ``P`` judged positives contributes ``P·n_negatives`` triplets, and training steps grow with
    the number of judgements.

    With the defaults (``skip_top=0``, no margin, no cap) the output is exactly that of the
    original miner.

    Args:
        query_ids, query_embeddings: the queries, ndarray of shape (n_queries, d).
        doc_ids, doc_embeddings: the corpus, ndarray of shape (n_docs, d).
        qrels: ``{query_id: {doc_id: relevance}}``.
        n_negatives: negatives per (query, positive) pair.
        negatives: ``"hard"`` or ``"random"``.
        hard_pool: size of the hard-negative pool (paper-style top-50), counted after every
            exclusion and filter.
        seed: seed of the numpy generator.
        skip_top: hard negatives only: the frozen model's best ``skip_top`` non-positive docs
            are never negatives (0: none skipped).
        false_negative_margin: hard negatives only: drop a candidate scoring more than the
            reference positive score minus this margin (None: no filter; 0: drop candidates that
            score above the positive; a negative value tolerates candidates up to ``-margin``
            above it). Must be finite.
        false_negative_reference: ``"pair"`` or ``"query-min"``; the reference positive score
            (see above). Used only with a margin.
        max_triplets_per_query: cap on the triplets of one query (None: no cap).

    Returns:
        ndarray of shape (n_triplets, 3), int64: rows (query row, positive doc row, negative doc
        row) into the given arrays, ordered by query id, then positive id, then draw order.
    """
    check_mining_options(negatives, skip_top, false_negative_margin, false_negative_reference, max_triplets_per_query)
    if n_negatives < 1 or hard_pool < 1:
        raise ValueError(f"n_negatives and hard_pool must be >= 1; got {n_negatives} and {hard_pool}.")
    if len(query_ids) != len(query_embeddings) or len(doc_ids) != len(doc_embeddings):
        raise ValueError("ids and embeddings must have the same number of rows.")
    start = time.perf_counter()
    query_row = _row_index(query_ids, "query_ids")
    doc_row = _row_index(doc_ids, "doc_ids")
    n_docs = len(doc_ids)

    # (query id, its positive rows, its excluded rows), in sorted id order.
    plan: list[tuple[str, list[int], set[int]]] = []
    missing = 0
    for query_id in sorted(query_row):
        judged = qrels.get(query_id, {})
        positives = [doc_row[doc_id] for doc_id in sorted(judged) if judged[doc_id] > 0 and doc_id in doc_row]
        missing += sum(1 for doc_id, rel in judged.items() if rel > 0 and doc_id not in doc_row)
        if not positives:
            continue
        excluded = set(positives)
        if query_id in doc_row:
            excluded.add(doc_row[query_id])
        plan.append((query_id, positives, excluded))
    if missing:
        logger.warning("mine_triplets: %d relevant docs are not in the corpus and were skipped.", missing)

    # pools[position][i]: the hard-negative pool of the plan entry's i-th positive.
    pools: list[list[np.ndarray]] = []
    if negatives == "hard" and plan:
        pools = _hard_pools(
            plan, [query_row[query_id] for query_id, _, _ in plan], np.asarray(query_embeddings), doc_embeddings,
            hard_pool, skip_top, false_negative_margin, false_negative_reference,
        )

    # Random draws index docs in sorted-id order, so the result does not depend on row order.
    rows_by_id = np.array([doc_row[doc_id] for doc_id in sorted(doc_row)], dtype=np.int64)
    rank_of_row = np.empty(n_docs, dtype=np.int64)
    rank_of_row[rows_by_id] = np.arange(n_docs)
    rng = np.random.default_rng([seed, _STREAM[negatives]])
    # The cap has its own stream: capping selects among the negatives drawn above, never shifts them.
    cap_rng = np.random.default_rng([seed, _STREAM["cap"]]) if max_triplets_per_query is not None else None
    triplets: list[tuple[int, int, int]] = []
    short = capped = 0
    for position, (query_id, positives, excluded) in enumerate(plan):
        drawn: list[np.ndarray] = []
        for index, positive in enumerate(positives):
            if negatives == "hard":
                pool = pools[position][index]
                take = min(n_negatives, len(pool))
                chosen = rng.choice(pool, size=take, replace=False)
            else:
                take = min(n_negatives, n_docs - len(excluded))
                ranks = _draw_uniform(rng, n_docs, take, {int(rank_of_row[row]) for row in excluded})
                chosen = rows_by_id[ranks]
            short += take < n_negatives
            drawn.append(np.asarray(chosen, dtype=np.int64))
        if cap_rng is not None and sum(len(chosen) for chosen in drawn) > max_triplets_per_query:
            drawn = _cap(cap_rng, drawn, int(max_triplets_per_query))
            capped += 1
        for positive, chosen in zip(positives, drawn):
            triplets.extend((query_row[query_id], positive, int(negative)) for negative in chosen)
    if short:
        logger.warning("mine_triplets: %d (query, positive) pairs had fewer than %d candidate negatives.", short, n_negatives)
    if capped:
        logger.debug("mine_triplets: %d queries capped at %d triplets.", capped, max_triplets_per_query)
    result = np.array(triplets, dtype=np.int64).reshape(-1, 3)
    logger.debug(
        "mine_triplets: %d triplets (%s negatives) for %d queries in %.2fs", len(result), negatives, len(plan), time.perf_counter() - start
    )
    return result


def _hard_pools(
    plan: list[tuple[str, list[int], set[int]]],
    rows: list[int],
    query_embeddings: np.ndarray,
    doc_embeddings: np.ndarray,
    hard_pool: int,
    skip_top: int,
    margin: float | None,
    reference: str,
) -> list[list[np.ndarray]]:
    """Per plan entry, per positive: the first ``hard_pool`` ranked candidates that pass the filters.

    Without a margin the window is fixed (ranks ``skip_top + 1 .. skip_top + hard_pool`` after
    the exclusions) and one exact search suffices. With a margin, the search deepens
    (doubling) for the queries whose most demanding pair has fewer than ``hard_pool``
    survivors, until it has them or has reached the whole corpus.
    """
    n_docs = len(doc_embeddings)
    depth = skip_top + hard_pool + max(len(excluded) for _, _, excluded in plan)
    pools: list[list[np.ndarray] | None] = [None] * len(plan)
    pending = list(range(len(plan)))
    dropped = 0
    while pending:
        _, I = exact_search(query_embeddings[[rows[p] for p in pending]], doc_embeddings, k=depth)
        again = []
        for position, candidates in zip(pending, I):
            _, positives, excluded = plan[position]
            ranked = candidates[~np.isin(candidates, np.fromiter(excluded, dtype=np.int64, count=len(excluded)))][skip_top:]
            if margin is None:
                pools[position] = [np.asarray(ranked[:hard_pool], dtype=np.int64)] * len(positives)
                continue
            query_vector = np.asarray(query_embeddings[rows[position]], dtype=np.float64)
            scores = np.asarray(doc_embeddings[ranked], dtype=np.float64) @ query_vector
            thresholds = np.asarray(doc_embeddings[positives], dtype=np.float64) @ query_vector - margin
            if reference == "query-min":
                thresholds = np.full_like(thresholds, thresholds.min())
            pair_pools = [np.asarray(ranked[scores <= threshold][:hard_pool], dtype=np.int64) for threshold in thresholds]
            if min(len(pool) for pool in pair_pools) < hard_pool and depth < n_docs:
                again.append(position)
                continue
            dropped += sum(int(np.count_nonzero(scores > threshold)) for threshold in thresholds)
            pools[position] = pair_pools
        pending = again
        depth = min(2 * depth, n_docs)
    if margin is not None:
        n_pairs = sum(len(positives) for _, positives, _ in plan)
        logger.debug("mine_triplets: the false-negative margin %s skipped %.1f candidates per (query, positive) pair.", margin, dropped / n_pairs)
    return pools  # type: ignore[return-value]


def _cap(rng: np.random.Generator, drawn: list[np.ndarray], cap: int) -> list[np.ndarray]:
    """Keep ``cap`` of the negatives in ``drawn`` (one array per positive), spread over positives.

    A seeded shuffle of the positives deals one slot at a time, round robin, to each positive
    that still has a negative left; each positive then keeps a random subset of that size, in
    draw order.
    """
    counts = [len(chosen) for chosen in drawn]
    quota = [0] * len(drawn)
    order = [int(index) for index in rng.permutation(len(drawn))]
    remaining = cap
    while remaining:
        for index in order:
            if remaining and quota[index] < counts[index]:
                quota[index] += 1
                remaining -= 1
    kept = []
    for chosen, count, size in zip(drawn, counts, quota):
        if size == count:
            kept.append(chosen)
        else:
            kept.append(chosen[np.sort(rng.choice(count, size=size, replace=False))])
    return kept


def _draw_uniform(rng: np.random.Generator, n_docs: int, take: int, excluded: set[int]) -> list[int]:
    """``take`` distinct values from ``range(n_docs)`` minus ``excluded``, by rejection.

    Rejection keeps each draw O(take) on a large corpus, where building the allowed list per
    pair would be O(n_docs).
    """
    if take * 2 > n_docs - len(excluded):
        allowed = np.setdiff1d(np.arange(n_docs), np.fromiter(excluded, dtype=np.int64, count=len(excluded)))
        return [int(row) for row in rng.choice(allowed, size=take, replace=False)]
    chosen: list[int] = []
    seen = set(excluded)
    while len(chosen) < take:
        row = int(rng.integers(n_docs))
        if row not in seen:
            seen.add(row)
            chosen.append(row)
    return chosen


@dataclass
class StoredTriplets:
    """Triplets as ids, as read from disk.

    Attributes:
        ids: list of (query id, positive doc id, negative doc id).
        meta: what produced them (dataset, split, mining settings, ...).
    """

    ids: list[tuple[str, str, str]]
    meta: dict[str, Any]
    path: Path | None = None

    def rows(self, query_ids: list[str], doc_ids: list[str]) -> np.ndarray:
        """Map to row indices of ``query_ids`` / ``doc_ids``: ndarray of shape (n, 3), int64."""
        query_row = _row_index(query_ids, "query_ids")
        doc_row = _row_index(doc_ids, "doc_ids")
        out = np.empty((len(self.ids), 3), dtype=np.int64)
        for position, (query_id, positive_id, negative_id) in enumerate(self.ids):
            try:
                out[position] = (query_row[query_id], doc_row[positive_id], doc_row[negative_id])
            except KeyError as error:
                where = str(self.path) if self.path else "triplets"
                raise ValueError(
                    f"{where}: triplet {position} uses id {error.args[0]!r}, which is not among the given "
                    "query/doc ids. The triplets were mined for other data; mine them again for this split."
                ) from None
        return out


def save_triplets(
    path: str | Path, triplets: np.ndarray, query_ids: list[str], doc_ids: list[str], meta: dict[str, Any] | None = None
) -> Path:
    """Write row-index ``triplets`` as ids to a JSON file, atomically; returns the path."""
    triplets = np.asarray(triplets, dtype=np.int64).reshape(-1, 3)
    if len(triplets) and (triplets[:, 0].max() >= len(query_ids) or triplets[:, 1:].max() >= len(doc_ids) or triplets.min() < 0):
        raise ValueError("triplets index a query or document row that does not exist.")
    document = {
        "format": TRIPLETS_FORMAT,
        "version": TRIPLETS_VERSION,
        "meta": meta or {},
        "n_triplets": len(triplets),
        "triplets": [[query_ids[q], doc_ids[p], doc_ids[n]] for q, p, n in triplets.tolist()],
    }
    # Compact and key-sorted: equal triplets give equal bytes (and an equal sha256).
    text = json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


def load_triplets(path: str | Path) -> StoredTriplets:
    """Read triplets written by :func:`save_triplets`; map them with ``.rows(query_ids, doc_ids)``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: triplets file not found. Create it with embedtune.data.triplets.save_triplets(...).")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataFormatError(str(path), f"not valid JSON ({error})", "re-create it with save_triplets(...)") from error
    if not isinstance(document, dict) or document.get("format") != TRIPLETS_FORMAT:
        raise DataFormatError(str(path), "not an embedtune triplets file", "re-create it with save_triplets(...)", field="format")
    if document.get("version") != TRIPLETS_VERSION:
        raise DataFormatError(
            str(path), f"version {document.get('version')!r} is not supported (expected {TRIPLETS_VERSION})", "mine the triplets again", field="version"
        )
    rows = document.get("triplets")
    if not isinstance(rows, list) or not all(isinstance(row, list) and len(row) == 3 and all(isinstance(x, str) for x in row) for row in rows):
        raise DataFormatError(str(path), "must be a list of [query_id, positive_id, negative_id] strings", "re-create it with save_triplets(...)", field="triplets")
    if document.get("n_triplets", len(rows)) != len(rows):
        raise DataFormatError(str(path), f"holds {len(rows)} triplets but n_triplets says {document['n_triplets']}", "the file is truncated; mine again", field="n_triplets")
    return StoredTriplets(ids=[tuple(row) for row in rows], meta=document.get("meta", {}), path=path)
