"""Precomputed embeddings as first-class input: ``.npy`` plus ids, or parquet with an id column.

A user with their own (say 4096-d, from an API) vectors passes them here and nothing is
encoded; no corpus text is needed. float64 and float16 vectors are cast to float32 with a
one-line note; ids must be unique. :func:`vector_fingerprints` gives the sha256 of the files, so
a report can say ``model: precomputed`` and exactly which vectors it used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from embedtune.data.beir import BeirDataset, read_utf8
from embedtune.data.errors import DataFormatError
from embedtune.data.pairs import file_sha256
from embedtune.encoders.ray_encode import SHARD_MANIFEST, is_shard_folder, read_shards
from embedtune.errors import VECTORS_FIX, EmbedtuneError, NoQueriesError, NonFiniteError, check_finite
from embedtune.io import release_mapped_pages, xxh3_bytes

logger = logging.getLogger(__name__)

_PLURALS = {"query": "queries"}  # messages count ids in English: "3 queries missing", not "3 querys"

__all__ = ["load_embeddings", "parquet_vectors", "read_ids", "check_unique_ids", "require_ids", "judged_documents", "vector_fingerprints", "load_embedding_rows", "PRECOMPUTED_MODEL"]

#: What a report records as the model when the vectors were given, not encoded.
PRECOMPUTED_MODEL = "precomputed"
_CAST_DTYPES = (np.float64, np.float16)


def check_unique_ids(ids: list[str], source: str | Path) -> None:
    """Raise naming ``source`` and the first repeated id (and both of its rows) if ids repeat."""
    if len(set(ids)) == len(ids):  # the common case, at C speed; the loop below only finds the first repeat
        return
    seen: dict[str, int] = {}
    for row, item in enumerate(ids):
        if item in seen:
            raise DataFormatError(str(source), f"duplicate id {item!r} (rows {seen[item]} and {row})", "give every row a unique id")
        seen[item] = row


def require_ids(available: Iterable[str], needed: Iterable[str], source: str | Path, needed_by: str | Path, kind: str = "id") -> None:
    """Raise naming ``source``, the count and the first of ``needed`` (used by ``needed_by``) that ``available`` lacks.

    When an id differs from a missing one only by surrounding whitespace (``"d1 "`` for ``"d1"``),
    the message says so: such ids never match and would be scored as never retrieved.
    """
    have = set(available)
    missing = [item for item in dict.fromkeys(needed) if item not in have]
    if missing:
        hint = ""
        spaced = {item.strip(): item for item in have if item != item.strip()}
        near = next(((item, spaced[item.strip()]) for item in missing if item.strip() in spaced), None)
        near = near or next(((item, item.strip()) for item in missing if item != item.strip() and item.strip() in have), None)
        if near is not None:
            hint = (f"; {near[0]!r} and {near[1]!r} differ only by surrounding whitespace (ids are compared exactly): "
                    "strip the spaces from the ids")
        raise DataFormatError(
            str(source), f"no vector for {kind} {missing[0]!r}, which {needed_by} uses ({len(missing)} {_PLURALS.get(kind, kind + 's')} missing{hint})",
            f"add a row for every {kind} {needed_by} names, or drop those labels",
        )


def judged_documents(dataset: BeirDataset) -> list[str]:
    """The corpus documents the dataset's qrels judge (any relevance), in qrels order: each needs a vector."""
    corpus = dataset.corpus
    return list(dict.fromkeys(doc_id for docs in dataset.qrels.values() for doc_id in docs if doc_id in corpus))


def vector_fingerprints(*paths: str | Path | None) -> dict[str, str]:
    """``{file name: sha256}`` of the given vector and id files (None entries are skipped); an
    ``embed-corpus`` folder is named by its shard manifest, which holds every shard's sha256."""
    prints: dict[str, str] = {}
    for path in paths:
        if path is None:
            continue
        if is_shard_folder(path):
            prints[Path(path).name + "/" + SHARD_MANIFEST] = file_sha256(Path(path) / SHARD_MANIFEST)
        elif Path(path).is_file():
            prints[Path(path).name] = file_sha256(path)
    return prints


_FINITE_FIX = VECTORS_FIX


def _read_text(path: Path) -> str:
    """UTF-8 text, a byte-order mark dropped (:func:`~embedtune.data.beir.read_utf8`)."""
    return read_utf8(path)


def _load_npy(path: Path, mmap: bool) -> np.ndarray:
    """``np.load`` without pickle; a file it cannot read is an error naming it."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as error:
        if "object" in str(error).lower() or "pickle" in str(error).lower():
            raise DataFormatError(str(path), "holds Python objects (dtype object), which embedtune never unpickles",
                                  "save a numeric array: np.save(path, np.asarray(vectors, dtype=np.float32))") from None
        raise DataFormatError(str(path), f"not a readable .npy array ({error})", "save an (n, d) float32 array with np.save") from None
    except (OSError, EOFError) as error:
        raise DataFormatError(str(path), f"not a readable .npy array ({error})", "save an (n, d) float32 array with np.save") from None


def read_ids(path: str | Path) -> list[str]:
    """Ids from a ``.json`` list or a text file with one id per line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: ids file not found; give one id per line, or a JSON list.")
    text = _read_text(path)
    if path.suffix == ".json":
        try:
            ids = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataFormatError(str(path), f"not valid JSON ({error.msg})", "write a JSON array such as [\"d1\", \"d2\"]", error.lineno) from None
        if not isinstance(ids, list):
            raise DataFormatError(str(path), "expected a JSON list of ids", "write a JSON array such as [\"d1\", \"d2\"]")
        return [str(i) for i in ids]
    lines = text.splitlines()
    if "" in lines or any(map(str.isspace, lines)):  # blank lines are skipped; most files have none (a C-speed scan)
        return [line for line in lines if line.strip()]
    return lines


def _ids_of_rows(path: Path, n_rows: int, rows: np.ndarray) -> tuple[list[str], str]:
    """The ids of ``rows`` (ascending) in an ids file of ``n_rows`` ids, and the file's sha256.

    A text file of printable ASCII ids, one per line, is indexed by its newlines without making a
    string of every id; any other file (JSON, a byte-order mark, spaces, blank lines, other line
    breaks) is read whole by :func:`read_ids`, so both give the same ids.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: ids file not found; give one id per line, or a JSON list.")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    codes = np.frombuffer(data, dtype=np.uint8)
    newline = codes == 0x0A
    # Printable ASCII and newlines only (every byte below "!" is a newline), and no blank line (read_ids
    # skips one): whole-array passes at C speed, which also give the newlines the ids are cut at.
    plain = (path.suffix != ".json" and data.isascii() and len(data) > 0 and not newline[0]
             and np.count_nonzero(codes < 0x21) == np.count_nonzero(newline)
             and not np.count_nonzero(newline[1:] & newline[:-1]))
    if not plain:
        every = read_ids(path)
        if len(every) != n_rows:
            raise DataFormatError(str(path), f"{len(every)} ids for {n_rows} rows", "give exactly one id per row")
        return [every[row] for row in rows], digest
    ends = np.flatnonzero(newline)
    if not data.endswith(b"\n"):
        ends = np.append(ends, len(data))
    if len(ends) != n_rows:
        raise DataFormatError(str(path), f"{len(ends)} ids for {n_rows} rows", "give exactly one id per row")
    starts = np.concatenate(([0], ends[:-1] + 1))
    text = data.decode("ascii")  # one decode; slicing a str then makes each id without decoding it again
    return [text[start:end] for start, end in zip(starts[rows].tolist(), ends[rows].tolist())], digest


def _read_rows(path: Path, vectors: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``vectors[rows]`` (ascending rows of a memory-mapped ``.npy``), read with positioned reads, each run of consecutive
    rows in one.

    The mapping is never touched, so the file's pages never count in this process's memory and need no release: at
    3M x 384 a 65,536-row sample took 0.09 s this way, against 0.2 s through the mapping and its release (and 3 GB of
    mapped pages). A Fortran-ordered file, or a platform without ``os.preadv``, is read through the mapping.
    """
    offset = getattr(vectors, "offset", None)
    if offset is None or not vectors.flags.c_contiguous or not hasattr(os, "preadv"):
        stored = np.asarray(vectors[rows])
        release_mapped_pages(vectors)
        return stored
    row_bytes = vectors.shape[1] * vectors.dtype.itemsize
    out = np.empty((len(rows), vectors.shape[1]), dtype=vectors.dtype)
    if not len(rows) or not row_bytes:
        return out
    view = memoryview(out).cast("B")
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    with open(path, "rb", buffering=0) as handle:
        for lo, hi in zip([0, *breaks.tolist()], [*breaks.tolist(), len(rows)]):
            target, position = view[lo * row_bytes : hi * row_bytes], offset + int(rows[lo]) * row_bytes
            while len(target):
                got = os.preadv(handle.fileno(), [target], position)
                if not got:
                    raise DataFormatError(str(path), f"ends before row {int(rows[lo])} of its {len(vectors)} rows",
                                          "the file was cut short: write it again (np.save)")
                target, position = target[got:], position + got
    return out


def load_embedding_rows(path: str | Path, ids: str | Path, rows: np.ndarray | None) -> tuple[list[str], np.ndarray, dict[str, object]]:
    """``(ids, vectors, record)`` of only some rows of a ``.npy`` file: what a fit on a sample reads.

    ``rows`` names the rows (ascending; None: every row). Only those rows are read,
    cast to float32 and checked finite, and only their ids are made: a fit on 100k rows of a 3M-row
    file reads 100k rows. ``record`` says what was read: the file's name, size, shape and dtype, the
    row count, and the XXH3-128 digest of the rows as stored (the whole file is never hashed),
    beside the ids file's sha256. The ids' uniqueness is not checked here: a fit on a sample does not use them, and
    ``index build`` refuses repeated ids.

    Raises:
        DataFormatError: not a 2-D float ``.npy`` file, the ids do not match its rows, or a read row is not finite.
    """
    path, ids_path = Path(path), Path(ids)
    if path.suffix != ".npy" or not path.is_file():
        raise ValueError(f"{path}: reading some rows needs a .npy file.")
    vectors = _load_npy(path, mmap=True)
    if vectors.ndim != 2 or vectors.dtype not in (np.float32, np.float16, np.float64):
        raise DataFormatError(str(path), f"expected a 2-D float32/float16/float64 array, got {vectors.dtype} {vectors.shape}",
                              "save an (n, d) float32 array with np.save")
    n_rows, dim = vectors.shape
    rows = np.arange(n_rows) if rows is None else np.asarray(rows, dtype=np.int64)
    picked_ids, ids_sha256 = _ids_of_rows(ids_path, n_rows, rows)
    stored = _read_rows(path, vectors, rows)
    digest = xxh3_bytes(np.ascontiguousarray(stored).data)  # a record of what was read, taken at 10 GB/s
    sample = np.ascontiguousarray(stored, dtype=np.float32)
    try:
        check_finite(sample, str(path), "vectors", fix=_FINITE_FIX)
    except NonFiniteError as error:  # counted in the sample: name the row of the file, and only what was read
        raise NonFiniteError(str(path), "vectors", int(rows[error.row]), error.column, error.value, error.count, error.fix,
                             partial=True) from None
    record = {"file": path.name, "bytes": path.stat().st_size, "shape": [int(n_rows), int(dim)], "dtype": vectors.dtype.name,
              "rows_read": int(len(rows)), "rows_xxh3_128": digest, "ids": {ids_path.name: ids_sha256}}
    return picked_ids, sample, record


def load_embeddings(
    path: str | Path,
    ids: str | Path | list[str] | None = None,
    id_column: str = "id",
    vector_column: str = "embedding",
    mmap: bool = True,
    cast: bool = True,
    unique: bool = False,
) -> tuple[list[str], np.ndarray]:
    """Load ``(ids, vectors)``; ``.npy`` is memory-mapped.

    Args:
        cast: float64 and float16 ``.npy`` vectors are cast to float32 (in memory) with a
            one-line note; False keeps float16 as is (streaming readers cast per chunk).
        unique: raise if an id repeats (naming the ids file and the id).
    """
    path = Path(path)
    if is_shard_folder(path):  # an embed-corpus folder: its ids travel with its shards
        if ids is not None:
            raise ValueError(f"{path}: an embed-corpus folder carries its own ids (shard-*.ids.txt); drop the ids file.")
        folder_ids, vectors = read_shards(path)
        if unique:
            check_unique_ids(folder_ids, path)
        return folder_ids, vectors
    if not path.is_file():
        raise FileNotFoundError(f"{path}: embeddings file not found.")
    if path.suffix == ".npy":
        vectors = _load_npy(path, mmap)
        allowed = (np.float32, np.float16, np.float64) if cast else (np.float32, np.float16)
        if vectors.ndim != 2 or vectors.dtype not in allowed:
            names = "/".join(np.dtype(d).name for d in allowed)
            raise DataFormatError(str(path), f"expected a 2-D {names} array, got {vectors.dtype} {vectors.shape}", "save an (n, d) float32 array with np.save")
        if ids is None:
            raise ValueError(f"{path}: a .npy file carries no ids; pass the ids file too (one id per line or a JSON list).")
        id_list = list(ids) if isinstance(ids, list) else read_ids(ids)
        if len(id_list) != vectors.shape[0]:
            raise DataFormatError(str(path), f"{vectors.shape[0]} rows but {len(id_list)} ids", "give exactly one id per row")
        if unique:
            check_unique_ids(id_list, ids if not isinstance(ids, list) else path)
        if cast and vectors.dtype in _CAST_DTYPES:
            logger.info("%s: %s vectors cast to float32 (%d x %d).", path, vectors.dtype, *vectors.shape)
            vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        check_finite(vectors, str(path), "vectors", fix=_FINITE_FIX)
        release_mapped_pages(vectors)  # the check read every row: keep the map, not a resident copy of the file
        return id_list, vectors
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        for column in (id_column, vector_column):
            if column not in table.column_names:
                raise DataFormatError(str(path), f"no column {column!r} (columns: {table.column_names})", "add it or pass the right column name", field=column)
        id_values = table.column(id_column)
        if id_values.null_count:
            row = next(i for i, value in enumerate(id_values.to_pylist()) if value is None)
            raise DataFormatError(str(path), f"{id_values.null_count} rows have a null id (first: row {row}, 0-based)",
                                  "give every row an id", field=id_column)
        id_list = [str(v) for v in id_values.to_pylist()]
        vectors = parquet_vectors(table.column(vector_column), path, vector_column)
        if unique:
            check_unique_ids(id_list, path)
        check_finite(vectors, str(path), "vectors", fix=_FINITE_FIX)
        return id_list, np.ascontiguousarray(vectors)
    raise DataFormatError(str(path), f"unsupported extension {path.suffix!r}", "use .npy (with an ids file) or .parquet")


def parquet_vectors(column, path: str | Path, vector_column: str = "embedding") -> np.ndarray:
    """The ``(n, d)`` float32 matrix of a parquet list column, refusing null vectors, null values and ragged rows.

    Without the checks, flattening drops the nulls and a reshape can succeed on vectors of different
    lengths, silently shifting every later row's values.
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    fix = "give every row a vector of the same length, with no null values"
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type)):
        raise DataFormatError(str(path), f"column {vector_column!r} must be a list of floats; got {column.type}", fix, field=vector_column)
    n = len(column)
    if column.null_count:
        row = next(i for i in range(n) if not column[i].is_valid)
        raise DataFormatError(str(path), f"{column.null_count} null vectors (first: row {row}, 0-based)", fix, field=vector_column)
    if n == 0:
        return np.zeros((0, 0), np.float32)
    if pa.types.is_fixed_size_list(column.type):
        lengths = np.full(n, column.type.list_size)
    else:
        offsets = column.offsets.to_numpy()
        lengths = np.diff(offsets)
    if (lengths != lengths[0]).any():
        row = int(np.flatnonzero(lengths != lengths[0])[0])
        raise DataFormatError(str(path), f"vectors have different lengths: row 0 has {lengths[0]} values, row {row} has {lengths[row]}",
                              fix, field=vector_column)
    values = column.flatten()
    if values.null_count:
        position = next(i for i in range(len(values)) if not values[i].is_valid)
        raise DataFormatError(str(path), f"{values.null_count} null values inside vectors (first: row {position // int(lengths[0])}, "
                              f"0-based)", fix, field=vector_column)
    return np.ascontiguousarray(np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(n, int(lengths[0])))


def check_precomputed_pair(doc_path: str | Path, doc_ids: list[str], doc_vectors: np.ndarray, query_path: str | Path,
                           query_vectors: np.ndarray, dataset: BeirDataset) -> None:
    """Check that precomputed doc and query vectors can be scored together against ``dataset``.

    Raises:
        EmbedtuneError: the two files have different dimensions (both files and dims named).
        NoQueriesError: no doc id of ``doc_path`` is a document of the dataset's corpus, so every
            metric would be 0.
    """
    if doc_vectors.shape[1] != query_vectors.shape[1]:
        raise EmbedtuneError(
            f"{query_path} holds {query_vectors.shape[1]}-d vectors but {doc_path} holds {doc_vectors.shape[1]}-d vectors. "
            "Fix: embed queries and documents with the same model."
        )
    if len(doc_ids) == 0:
        raise DataFormatError(str(doc_path), "holds no document vectors", "give one row per corpus document")
    corpus = dataset.corpus
    if not any(doc_id in corpus for doc_id in doc_ids):
        raise NoQueriesError(
            f"{doc_path}: none of its {len(doc_ids)} doc ids (e.g. {doc_ids[0]!r}) is a document of {dataset.source} "
            f"(e.g. {next(iter(corpus))!r}), so no relevant document could ever be retrieved. "
            "Fix: pass the ids file that belongs to these vectors, with the corpus' '_id' values."
        )
