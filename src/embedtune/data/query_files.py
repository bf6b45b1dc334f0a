"""Query files for ``embedtune search``: JSONL (BEIR's ``queries.jsonl`` layout) or TSV.

- JSONL: one object per line with an id (``_id``, ``query_id`` or ``id``) and ``text`` (or ``query``);
  BEIR's ``queries.jsonl`` reads as it is.
- TSV: ``id<TAB>text`` per line; a first line ``id``/``query-id``/``query_id``/``_id`` + ``text``/``query``
  is a header and skipped.

Ids are kept as strings, must be unique and contain no whitespace (a TREC run file separates
its columns with it). A bad line raises :class:`DataFormatError` naming the file, line and field.
"""

from __future__ import annotations

import json
from pathlib import Path

from embedtune.data.beir import read_utf8
from embedtune.data.errors import DataFormatError

__all__ = ["read_query_file"]

_ID_FIELDS = ("_id", "query_id", "id")
_TEXT_FIELDS = ("text", "query")
_HEADER_IDS = {"id", "_id", "query-id", "query_id", "qid"}


def _check_id(path: str, line: int, qid: str, seen: set[str], field: str) -> None:
    if not qid or any(ch.isspace() for ch in qid):
        raise DataFormatError(path, f"query id {qid!r} is empty or contains whitespace", "use ids without spaces or tabs "
                              "(TREC run files separate columns with whitespace)", line, field)
    if qid in seen:
        raise DataFormatError(path, f"query id {qid!r} appears twice", "give every query its own id", line, field)
    seen.add(qid)


def read_query_file(path: str | Path) -> list[tuple[str, str]]:
    """``[(query_id, text), ...]`` in file order from a JSONL or TSV query file (see the module docstring).

    The format is chosen by the suffix (``.jsonl``/``.json`` or ``.tsv``/``.txt``), else by the first line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such query file. Pass a JSONL file ({{\"_id\", \"text\"}} per line) or a TSV file (id<TAB>text).")
    lines = read_utf8(path).splitlines()  # a byte-order mark dropped, as for corpus, ids and pairs files
    first = next((line for line in lines if line.strip()), "")
    is_jsonl = path.suffix.lower() in (".jsonl", ".json") or (path.suffix.lower() not in (".tsv", ".txt") and first.lstrip().startswith("{"))
    queries: list[tuple[str, str]] = []
    seen: set[str] = set()
    name = str(path)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if is_jsonl:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(name, f"not valid JSON ({error.msg})", "one JSON object per line, e.g. {\"_id\": \"q1\", \"text\": \"...\"}", number) from None
            if not isinstance(row, dict):
                raise DataFormatError(name, "expected a JSON object", "one object per line, e.g. {\"_id\": \"q1\", \"text\": \"...\"}", number)
            id_field = next((f for f in _ID_FIELDS if f in row), None)
            text_field = next((f for f in _TEXT_FIELDS if f in row), None)
            if id_field is None:
                raise DataFormatError(name, "no query id", f"add one of the fields {', '.join(_ID_FIELDS)}", number, "_id")
            if text_field is None or not isinstance(row[text_field], str):
                raise DataFormatError(name, "no query text (a string)", "add the field 'text'", number, "text")
            qid, text = str(row[id_field]), row[text_field]
            _check_id(name, number, qid, seen, id_field)
        else:
            parts = line.split("\t")
            if len(parts) < 2:
                raise DataFormatError(name, "expected 'id<TAB>text'", "separate the query id and its text with one tab", number)
            qid, text = parts[0].strip(), "\t".join(parts[1:]).strip()
            if not queries and not seen and qid.lower() in _HEADER_IDS and text.lower() in _TEXT_FIELDS:
                continue  # a header line before the first query
            _check_id(name, number, qid, seen, "id")
        if not text.strip():
            raise DataFormatError(name, f"query {qid!r} has empty text", "give every query its text", number, "text")
        queries.append((qid, text))
    if not queries:
        raise DataFormatError(name, "no queries", "one query per line: JSONL {\"_id\", \"text\"} or TSV id<TAB>text")
    return queries
