"""Precomputed embeddings as first-class input: ``.npy`` plus ids, or parquet with an id column.

A user with their own (say 4096-d) vectors passes them here and nothing is encoded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from embedtune.data.errors import DataFormatError

__all__ = ["load_embeddings", "read_ids"]


def read_ids(path: str | Path) -> list[str]:
    """Ids from a ``.json`` list or a text file with one id per line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: ids file not found; give one id per line, or a JSON list.")
    if path.suffix == ".json":
        ids = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(ids, list):
            raise DataFormatError(str(path), "expected a JSON list of ids", "write a JSON array such as [\"d1\", \"d2\"]")
        return [str(i) for i in ids]
    return [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_embeddings(
    path: str | Path,
    ids: str | Path | list[str] | None = None,
    id_column: str = "id",
    vector_column: str = "embedding",
    mmap: bool = True,
) -> tuple[list[str], np.ndarray]:
    """Load ``(ids, vectors)``; ``.npy`` is memory-mapped, float16 is accepted and kept as is."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: embeddings file not found.")
    if path.suffix == ".npy":
        vectors = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        if vectors.ndim != 2 or vectors.dtype not in (np.float32, np.float16):
            raise DataFormatError(str(path), f"expected a 2-D float32/float16 array, got {vectors.dtype} {vectors.shape}", "save an (n, d) float32 array with np.save")
        if ids is None:
            raise ValueError(f"{path}: a .npy file carries no ids; pass the ids file too (one id per line or a JSON list).")
        id_list = list(ids) if isinstance(ids, list) else read_ids(ids)
        if len(id_list) != vectors.shape[0]:
            raise DataFormatError(str(path), f"{vectors.shape[0]} rows but {len(id_list)} ids", "give exactly one id per row")
        return id_list, vectors
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        for column in (id_column, vector_column):
            if column not in table.column_names:
                raise DataFormatError(str(path), f"no column {column!r} (columns: {table.column_names})", "add it or pass the right column name", field=column)
        id_list = [str(v) for v in table.column(id_column).to_pylist()]
        column = table.column(vector_column).combine_chunks()
        width = len(column[0]) if len(column) else 0
        vectors = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(column), width)
        return id_list, np.ascontiguousarray(vectors)
    raise DataFormatError(str(path), f"unsupported extension {path.suffix!r}", "use .npy (with an ids file) or .parquet")
