"""Run files: the ranked hits of a set of queries, as TREC text or JSONL, for pytrec_eval, ranx or a script.

TREC: one line per hit, ``query_id Q0 doc_id rank score tag`` (rank from 1), what ``trec_eval``,
``pytrec_eval.parse_run`` and ``ranx.Run.from_file(kind="trec")`` read. JSONL: one object per query,
``{"query_id", "query", "hits": [{"rank", "id", "score", ...}]}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from embedtune.io import atomic_write_bytes

__all__ = ["write_trec_run", "read_trec_run", "write_jsonl_run"]


def _token(value: str, what: str) -> str:
    if not value or any(ch.isspace() for ch in value):
        raise ValueError(f"{what} {value!r} is empty or contains whitespace, which a TREC run file cannot hold; use ids without spaces.")
    return value


def write_trec_run(path: str | Path, hits: Mapping[str, Sequence[Mapping[str, Any]]], tag: str = "embedtune") -> Path:
    """Write ``{query_id: [{"id", "score"}, ...]}`` (hits best first) as a TREC run file; returns the path.

    Ranks are the hits' positions (1 = best). Scores keep 9 significant digits (a float32 exactly):
    trec_eval and pytrec_eval order a query's hits by score, not by rank, so rounding must not tie them.
    """
    _token(tag, "run tag")
    lines = []
    for qid, ranked in hits.items():
        _token(str(qid), "query id")
        for rank, hit in enumerate(ranked, 1):
            lines.append(f"{qid} Q0 {_token(str(hit['id']), 'document id')} {rank} {float(hit['score']):.9g} {tag}\n")
    return atomic_write_bytes(path, "".join(lines).encode("utf-8"))


def read_trec_run(path: str | Path) -> dict[str, dict[str, float]]:
    """``{query_id: {doc_id: score}}`` from a TREC run file (the shape ``pytrec_eval`` evaluates)."""
    run: dict[str, dict[str, float]] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise ValueError(f"{path}:{number}: expected 'query_id Q0 doc_id rank score tag' (6 columns); got {len(parts)}.")
        run.setdefault(parts[0], {})[parts[2]] = float(parts[4])
    return run


def write_jsonl_run(path: str | Path, queries: Iterable[tuple[str, str]], hits: Mapping[str, Sequence[Mapping[str, Any]]]) -> Path:
    """One JSON object per query: ``{"query_id", "query", "hits"}``, in the order of ``queries``."""
    text = "".join(json.dumps({"query_id": qid, "query": query, "hits": list(hits[qid])}, ensure_ascii=False) + "\n" for qid, query in queries)
    return atomic_write_bytes(path, text.encode("utf-8"))
