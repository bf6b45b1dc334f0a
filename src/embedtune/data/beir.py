"""Load BEIR-layout datasets from a folder or a ``.zip``, validating every line.

Layout (as BEIR distributes it): ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``) and ``qrels/<split>.tsv`` with the header
``query-id<TAB>corpus-id<TAB>score``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Iterator, Mapping

from embedtune.data.errors import DataFormatError
from embedtune.errors import NoQueriesError

logger = logging.getLogger(__name__)

__all__ = ["BeirDataset", "untitled_corpus", "load_beir", "load_beir_corpus", "qrels_splits", "resolve_dataset_path", "document_text", "BUNDLED_DATASETS"]

BUNDLED_DATASETS = {"scifact": "scifact.zip"}
QRELS_HEADER = ("query-id", "corpus-id", "score")

#: The text of a document known only by its vector: one read-only object shared by every such id.
UNTITLED: Mapping[str, str] = MappingProxyType({"title": "", "text": ""})


def untitled_corpus(doc_ids) -> dict[str, Mapping[str, str]]:
    """``{doc_id: {"title": "", "text": ""}}`` for documents that come as vectors without texts.

    Every id maps to the one read-only :data:`UNTITLED`, so a million ids cost one dict, not a
    million (a dict each took 0.7 s of a 3.6 s ``compress fit`` on 1M vectors).
    """
    return dict.fromkeys(doc_ids, UNTITLED)


@dataclass
class BeirDataset:
    """A BEIR dataset with one qrels split loaded.

    Attributes:
        name: folder or zip stem, e.g. ``"scifact"``.
        corpus: ``{doc_id: {"title": str, "text": str}}`` in file order.
        queries: ``{query_id: text}`` in file order.
        qrels: ``{query_id: {doc_id: relevance}}`` for ``split``, restricted to known ids.
        split: the qrels split that was loaded.
        fingerprints: sha256 of every source file, keyed by its path inside the dataset.
        source: where it was loaded from.
    """

    name: str
    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    split: str
    fingerprints: dict[str, str]
    source: str
    dropped_judgments: dict[str, int] = field(default_factory=dict)

    @property
    def doc_ids(self) -> list[str]:
        return list(self.corpus)

    def judged_query_ids(self) -> list[str]:
        """Query ids with at least one positive judgment, in file order of the queries."""
        return [qid for qid in self.queries if any(rel > 0 for rel in self.qrels.get(qid, {}).values())]

    def document_texts(self) -> list[str]:
        return [document_text(doc) for doc in self.corpus.values()]

    def __repr__(self) -> str:
        return (
            f"BeirDataset(name={self.name!r}, split={self.split!r}, docs={len(self.corpus)}, "
            f"queries={len(self.queries)}, judged={len(self.qrels)})"
        )


def document_text(doc: dict[str, str]) -> str:
    """BEIR's document recipe: ``title + " " + text``, stripped."""
    return (doc.get("title", "") + " " + doc.get("text", "")).strip()


def resolve_dataset_path(name_or_path: str | Path) -> Path:
    """Map a bundled name (``scifact``) to its zip in the package; otherwise return the path."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        return path
    if text in BUNDLED_DATASETS:
        bundled = Path(__file__).resolve().parent.parent / "datasets" / BUNDLED_DATASETS[text]
        if bundled.is_file():
            return bundled
        raise FileNotFoundError(f"bundled dataset {text!r} is missing from the install ({bundled}); reinstall embedtune.")
    raise FileNotFoundError(
        f"{text}: no such dataset folder or zip. Pass a BEIR folder or .zip path, or a bundled name: "
        f"{', '.join(BUNDLED_DATASETS)}."
    )


class _Source:
    """Read files of a BEIR dataset from a folder or a zip, uniformly."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.zip: zipfile.ZipFile | None = None
        self.prefix = ""
        if root.is_file():
            if not zipfile.is_zipfile(root):
                raise DataFormatError(str(root), "not a folder and not a zip archive", "pass a BEIR folder or a BEIR-layout .zip")
            self.zip = zipfile.ZipFile(root)
            corpora = sorted(
                (n for n in self.zip.namelist() if PurePosixPath(n).name == "corpus.jsonl"), key=lambda n: n.count("/")
            )
            if not corpora:
                raise DataFormatError(str(root), "zip holds no corpus.jsonl", "zip a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
            self.prefix = corpora[0][: -len("corpus.jsonl")]

    def label(self, relative: str) -> str:
        return f"{self.root}!{self.prefix}{relative}" if self.zip else str(self.root / relative)

    def exists(self, relative: str) -> bool:
        if self.zip:
            return f"{self.prefix}{relative}" in self.zip.namelist()
        return (self.root / relative).is_file()

    def read(self, relative: str) -> bytes:
        if not self.exists(relative):
            raise FileNotFoundError(f"{self.label(relative)}: file not found; a BEIR dataset needs corpus.jsonl, queries.jsonl and qrels/<split>.tsv.")
        if self.zip:
            return self.zip.read(f"{self.prefix}{relative}")
        return (self.root / relative).read_bytes()

    def splits(self) -> list[str]:
        if self.zip:
            names = [n[len(self.prefix) :] for n in self.zip.namelist() if n.startswith(self.prefix)]
        else:
            names = [str(p.relative_to(self.root)) for p in (self.root / "qrels").glob("*.tsv")]
        return sorted(PurePosixPath(n).stem for n in names if n.startswith("qrels/") and n.endswith(".tsv"))


def read_utf8(path: str | Path) -> str:
    """The text of ``path``: UTF-8, a leading byte-order mark dropped (editors on Windows write one).

    The one reader of every text input (corpus, queries, qrels, pairs, ids and query files); a bad
    byte is a :class:`DataFormatError` naming the file, line and column.
    """
    return _decode(str(path), Path(path).read_bytes())


def _decode(label: str, data: bytes) -> str:
    """``data`` as text: UTF-8, a leading byte-order mark dropped; an error names the line of a bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise DataFormatError(
            label, f"not valid UTF-8 (byte 0x{data[error.start]:02x} at column {column})",
            "save the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 in > out`", line,
        ) from None


def _jsonl(label: str, data: bytes) -> Iterator[tuple[int, dict]]:
    # Universal newlines, as a text-mode file reads them (\n, \r\n or \r).
    for line_number, raw in enumerate(io.StringIO(_decode(label, data), newline=None), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as error:
            raise DataFormatError(label, f"malformed JSON ({error.msg} at column {error.colno})", "write one JSON object per line", line_number) from None
        if not isinstance(record, dict):
            raise DataFormatError(label, "line is not a JSON object", "write one JSON object per line", line_number)
        yield line_number, record


def _records(label: str, data: bytes, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    records: dict[str, dict[str, str]] = {}
    first_line: dict[str, int] = {}
    for line_number, record in _jsonl(label, data):
        for name in required:
            if name not in record or record[name] is None:
                raise DataFormatError(label, "missing required field", f"give every record an {name!r} field", line_number, name)
        for name in (*required, *optional):
            if name in record and record[name] is not None and not isinstance(record[name], (str, int)):
                raise DataFormatError(label, f"expected a string, got {type(record[name]).__name__}", f"make {name!r} a string", line_number, name)
        record_id = str(record["_id"])
        if record_id in records:
            raise DataFormatError(
                label, f"duplicate id {record_id!r} (first seen on line {first_line[record_id]})", "make every '_id' unique", line_number, "_id"
            )
        first_line[record_id] = line_number
        records[record_id] = {name: str(record.get(name) or "") for name in (*required, *optional) if name != "_id"}
    return records


def _qrels(label: str, data: bytes) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    first_line: dict[tuple[str, str], int] = {}
    duplicates: list[tuple[int, int, str, str]] = []
    lines = _decode(label, data).splitlines()
    if not lines or tuple(cell.strip() for cell in lines[0].split("\t")) != QRELS_HEADER:
        found = lines[0] if lines else "<empty file>"
        raise DataFormatError(label, f"bad qrels header {found!r}", "start the file with 'query-id<TAB>corpus-id<TAB>score'", 1)
    for line_number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != 3:
            raise DataFormatError(label, f"expected 3 tab-separated columns, got {len(cells)}", "write query-id, corpus-id and score separated by tabs", line_number)
        query_id, doc_id, score = (cell.strip() for cell in cells)
        try:
            relevance = int(score)
        except ValueError:
            raise DataFormatError(label, f"score {score!r} is not an integer", "use integer relevance grades (0, 1, 2, ...)", line_number, "score") from None
        pair = (query_id, doc_id)
        if pair in first_line:
            duplicates.append((line_number, first_line[pair], query_id, doc_id))
        else:
            first_line[pair] = line_number
        qrels.setdefault(query_id, {})[doc_id] = relevance
    if duplicates:
        line_number, first, query_id, doc_id = duplicates[0]
        warnings.warn(
            f"{label}: {len(duplicates)} line(s) repeat an earlier (query-id, corpus-id) pair and the last score wins "
            f"(e.g. line {line_number} repeats line {first}: {query_id!r}, {doc_id!r}); a repeated 0 can drop a judged "
            "query. Keep one line per pair.",
            stacklevel=3,
        )
    return qrels


def _why_no_judged_query(qrels_all: dict[str, dict[str, int]], corpus: dict, queries: dict) -> str:
    """Which step left no judged query: an empty file, unknown ids, or no positive score."""
    judgments = [(qid, did, rel) for qid, docs in qrels_all.items() for did, rel in docs.items()]
    if not judgments:
        return "the file has a header but no judgment lines. Fix: add 'query-id<TAB>corpus-id<TAB>score' lines"
    known = [(qid, did, rel) for qid, did, rel in judgments if qid in queries and did in corpus]
    if not known:
        qid, did, _ = judgments[0]
        missing = f"query {qid!r} is not in queries.jsonl" if qid not in queries else f"document {did!r} is not in corpus.jsonl"
        return (f"all {len(judgments)} judgment(s) name queries or documents absent from the data files (e.g. {missing}). "
                "Fix: use the qrels that belong to this corpus and these queries")
    return (f"none of the {len(known)} judgment(s) of known ids has a positive score. "
            "Fix: mark relevant documents with a score of 1 or more")


def load_beir(path: str | Path, split: str = "test") -> BeirDataset:
    """Load a BEIR dataset (folder, ``.zip`` or bundled name) with the qrels of ``split``.

    Judgments naming a document or query absent from the files are dropped with a warning
    that counts them; loading continues (ArguAna has 5 such documents).
    """
    root = resolve_dataset_path(path)
    source = _Source(root)
    qrels_file = f"qrels/{split}.tsv"
    if not source.exists(qrels_file):
        raise FileNotFoundError(f"{source.label(qrels_file)}: no qrels for split {split!r}; available splits: {source.splits() or 'none'}.")
    raw = {name: source.read(name) for name in ("corpus.jsonl", "queries.jsonl", qrels_file)}
    fingerprints = {name: hashlib.sha256(data).hexdigest() for name, data in raw.items()}
    corpus = _records(source.label("corpus.jsonl"), raw["corpus.jsonl"], ("_id", "text"), ("title",))
    queries = {qid: rec["text"] for qid, rec in _records(source.label("queries.jsonl"), raw["queries.jsonl"], ("_id", "text")).items()}
    qrels_all = _qrels(source.label(qrels_file), raw[qrels_file])
    if not corpus:
        raise DataFormatError(source.label("corpus.jsonl"), "holds no documents", "write one JSON object per document: {\"_id\": ..., \"text\": ...}")
    if not queries:
        raise DataFormatError(source.label("queries.jsonl"), "holds no queries", "write one JSON object per query: {\"_id\": ..., \"text\": ...}")

    missing_docs = sum(1 for docs in qrels_all.values() for did in docs if did not in corpus)
    missing_queries = sum(1 for qid in qrels_all if qid not in queries)
    if missing_docs or missing_queries:
        warnings.warn(
            f"{source.label(qrels_file)}: {missing_docs} judgment(s) name documents absent from corpus.jsonl and "
            f"{missing_queries} query id(s) are absent from queries.jsonl; they are ignored.",
            stacklevel=2,
        )
    qrels = {
        qid: {did: rel for did, rel in docs.items() if did in corpus}
        for qid, docs in qrels_all.items()
        if qid in queries
    }
    qrels = {qid: docs for qid, docs in qrels.items() if docs}
    if not any(rel > 0 for docs in qrels.values() for rel in docs.values()):
        raise NoQueriesError(f"{source.label(qrels_file)}: no judged query is left, so there is nothing to score: "
                             f"{_why_no_judged_query(qrels_all, corpus, queries)}.")
    name = root.stem if root.is_file() else root.name
    return BeirDataset(
        name=name,
        corpus=corpus,
        queries=queries,
        qrels=qrels,
        split=split,
        fingerprints=fingerprints,
        source=str(root),
        dropped_judgments={"missing_docs": missing_docs, "missing_queries": missing_queries},
    )


def load_beir_corpus(path: str | Path) -> BeirDataset:
    """Only the corpus of a BEIR dataset (``corpus.jsonl``): no queries, no qrels (split ``"corpus"``).

    What unsupervised fitting reads; ``qrels/`` and ``queries.jsonl`` need not exist. ``path``
    may also be the ``.jsonl`` file itself.
    """
    if Path(path).suffix == ".jsonl" and Path(path).is_file():
        root = Path(path)
        label, raw = str(root), root.read_bytes()
    else:
        root = resolve_dataset_path(path)
        source = _Source(root)
        label, raw = source.label("corpus.jsonl"), source.read("corpus.jsonl")
    corpus = _records(label, raw, ("_id", "text"), ("title",))
    if not corpus:
        raise DataFormatError(label, "holds no documents", "write one JSON object per document: {\"_id\": ..., \"text\": ...}")
    return BeirDataset(
        name=root.stem if root.is_file() else root.name,
        corpus=corpus,
        queries={},
        qrels={},
        split="corpus",
        fingerprints={"corpus.jsonl": hashlib.sha256(raw).hexdigest()},
        source=str(root),
    )


def qrels_splits(path: str | Path) -> list[str]:
    """The qrels splits a BEIR dataset holds (``qrels/<split>.tsv``), sorted; empty when it has none."""
    return _Source(resolve_dataset_path(path)).splits()
