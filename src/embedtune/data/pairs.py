"""Relevance labels without a BEIR folder: a pairs file or a standalone qrels TSV.

A practitioner with their own vectors rarely has BEIR's ``corpus.jsonl``/``queries.jsonl``; they
have ids and a list of (query, relevant document) pairs. Two pair formats are read:

- JSONL, one object per line: ``{"query_id": "q1", "doc_id": "d7"}``, with an optional integer
  ``"relevance"`` (default 1);
- TSV, one pair per line: ``q1<TAB>d7``, with an optional third column (an integer relevance)
  and an optional header line ``query_id<TAB>doc_id``.

A BEIR qrels file (header ``query-id<TAB>corpus-id<TAB>score``) is read as such. Every error names
the file, the line and the fix. :func:`labelled_dataset` then turns ids and labels into a
:class:`~embedtune.data.beir.BeirDataset` with empty texts, so the whole split/mining/evaluation
machinery runs on precomputed vectors without any corpus text.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from embedtune.data.beir import QRELS_HEADER, BeirDataset, read_utf8, untitled_corpus
from embedtune.data.errors import DataFormatError

__all__ = ["read_pairs", "read_labels", "labelled_dataset", "file_sha256", "PAIR_FIELDS"]

PAIR_FIELDS = ("query_id", "doc_id")
_PAIR_HEADERS = {("query_id", "doc_id"), ("query-id", "corpus-id"), ("query_id", "doc_id", "relevance"), ("query-id", "corpus-id", "score")}


def _relevance(value: object, path: Path, line: int, field: str) -> int:
    """An integer relevance grade from a JSON number or a TSV cell."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise DataFormatError(str(path), f"relevance {value!r} is not an integer", "use an integer grade (1 = relevant)", line, field)


def _add(labels: dict[str, dict[str, int]], first_seen: dict[tuple[str, str], tuple[int, int]], query_id: str, doc_id: str,
         relevance: int, path: Path, line: int) -> None:
    key = (query_id, doc_id)
    if key in first_seen and first_seen[key][1] != relevance:
        previous_line, previous = first_seen[key]
        raise DataFormatError(
            str(path), f"pair ({query_id!r}, {doc_id!r}) has relevance {relevance} here but {previous} on line {previous_line}",
            "give each (query, document) pair one relevance", line,
        )
    first_seen.setdefault(key, (line, relevance))
    labels.setdefault(query_id, {})[doc_id] = relevance


def _read_jsonl(path: Path, text: str) -> dict[str, dict[str, int]]:
    labels: dict[str, dict[str, int]] = {}
    first_seen: dict[tuple[str, str], tuple[int, int]] = {}
    for line_number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as error:
            raise DataFormatError(str(path), f"malformed JSON ({error.msg} at column {error.colno})",
                                  'write one object per line, e.g. {"query_id": "q1", "doc_id": "d7"}', line_number) from None
        if not isinstance(record, dict):
            raise DataFormatError(str(path), "line is not a JSON object", 'write one object per line, e.g. {"query_id": "q1", "doc_id": "d7"}', line_number)
        for name in PAIR_FIELDS:
            value = record.get(name)
            if value is None or isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
                problem = "missing required field" if value is None else f"expected a non-empty string id, got {value!r}"
                raise DataFormatError(str(path), problem, f"give every line a string {name!r}", line_number, name)
        relevance = _relevance(record["relevance"], path, line_number, "relevance") if "relevance" in record else 1
        _add(labels, first_seen, str(record["query_id"]).strip(), str(record["doc_id"]).strip(), relevance, path, line_number)
    return labels


def _read_tsv(path: Path, text: str) -> dict[str, dict[str, int]]:
    labels: dict[str, dict[str, int]] = {}
    first_seen: dict[tuple[str, str], tuple[int, int]] = {}
    for line_number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        cells = [cell.strip() for cell in raw.split("\t")]
        if line_number == 1 and tuple(cell.lower() for cell in cells) in _PAIR_HEADERS:
            continue
        if len(cells) not in (2, 3):
            raise DataFormatError(str(path), f"expected 2 or 3 tab-separated columns, got {len(cells)}",
                                  "write query_id<TAB>doc_id (optionally <TAB>relevance) on each line", line_number)
        if not cells[0] or not cells[1]:
            field = "query_id" if not cells[0] else "doc_id"
            raise DataFormatError(str(path), "empty id", "give both a query id and a document id", line_number, field)
        relevance = _relevance(cells[2], path, line_number, "relevance") if len(cells) == 3 else 1
        _add(labels, first_seen, cells[0], cells[1], relevance, path, line_number)
    return labels


def _read_text(path: Path) -> str:
    """The file as UTF-8 text, a leading byte-order mark dropped (:func:`~embedtune.data.beir.read_utf8`)."""
    return read_utf8(path)


def read_pairs(path: str | Path) -> dict[str, dict[str, int]]:
    """Read a pairs file (JSONL or TSV, see the module docstring) as ``{query_id: {doc_id: relevance}}``.

    The format follows the extension: ``.jsonl``/``.json`` is JSONL, anything else TSV. A
    repeated pair is kept once; a pair given two different relevances is an error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: pairs file not found; give a JSONL file of {{\"query_id\", \"doc_id\"}} objects or a TSV of query_id<TAB>doc_id.")
    text = _read_text(path)
    labels = _read_jsonl(path, text) if path.suffix.lower() in (".jsonl", ".json") else _read_tsv(path, text)
    if not any(rel > 0 for docs in labels.values() for rel in docs.values()):
        raise DataFormatError(str(path), "no relevant (query, document) pair", "give at least one pair with relevance >= 1")
    return labels


def read_labels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read relevance labels from a BEIR qrels TSV (its header says so) or a pairs file."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() not in (".jsonl", ".json"):
        with open(path, encoding="utf-8-sig", errors="replace") as handle:  # a byte-order mark is not part of the header
            first = handle.readline()
        if tuple(cell.strip() for cell in first.split("\t")) == QRELS_HEADER:
            labels: dict[str, dict[str, int]] = {}
            first_seen: dict[tuple[str, str], tuple[int, int]] = {}
            for line_number, raw in enumerate(_read_text(path).splitlines()[1:], 2):
                if not raw.strip():
                    continue
                cells = [cell.strip() for cell in raw.split("\t")]
                if len(cells) != 3:
                    raise DataFormatError(str(path), f"expected 3 tab-separated columns, got {len(cells)}",
                                          "write query-id, corpus-id and score separated by tabs", line_number)
                _add(labels, first_seen, cells[0], cells[1], _relevance(cells[2], path, line_number, "score"), path, line_number)
            if not any(rel > 0 for docs in labels.values() for rel in docs.values()):
                raise DataFormatError(str(path), "no judgment with score >= 1", "give at least one relevant (query, document) pair")
            return labels
    return read_pairs(path)


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def labelled_dataset(
    doc_ids: list[str],
    query_ids: list[str],
    labels: dict[str, dict[str, int]],
    labels_path: str | Path,
    doc_ids_source: str = "doc ids",
    query_ids_source: str = "query ids",
    name: str = "own-vectors",
    fingerprints: dict[str, str] | None = None,
) -> BeirDataset:
    """A :class:`BeirDataset` with empty texts from vector ids and relevance labels.

    Every labelled query must have a query vector and every labelled document a document
    vector: the first that does not is an error naming both files.
    """
    known_docs, known_queries = set(doc_ids), set(query_ids)
    for query_id, docs in labels.items():
        if query_id not in known_queries:
            raise DataFormatError(
                str(labels_path), f"query {query_id!r} has no vector in {query_ids_source}",
                f"embed every labelled query, or drop its pairs ({sum(1 for q in labels if q not in known_queries)} labelled queries lack one)",
                field="query_id",
            )
        for doc_id in docs:
            if doc_id not in known_docs:
                missing = sum(1 for d in labels.values() for x in d if x not in known_docs)
                raise DataFormatError(
                    str(labels_path), f"document {doc_id!r} (query {query_id!r}) has no vector in {doc_ids_source}",
                    f"embed every labelled document, or drop its pairs ({missing} labelled documents lack one)", field="doc_id",
                )
    prints = dict(fingerprints or {})
    if Path(labels_path).is_file():
        prints.setdefault(Path(labels_path).name, file_sha256(labels_path))
    return BeirDataset(
        name=name,
        corpus=untitled_corpus(doc_ids),
        queries={query_id: "" for query_id in query_ids},
        qrels={query_id: dict(docs) for query_id, docs in labels.items() if any(rel > 0 for rel in docs.values())},
        split=Path(labels_path).stem,
        fingerprints=prints,
        source=str(labels_path),
    )
