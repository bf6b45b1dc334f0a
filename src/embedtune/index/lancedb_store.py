"""Serve a plan from LanceDB, embedded: load the plan's vectors by its recipe and search them as planned.

LanceDB (``pip install 'embedtune[lancedb]'``) runs in-process on a folder, like an index folder.
:func:`load_plan_into_lancedb` streams uncompressed embeddings through the plan's compressor and
stores them as the plan's ``deployment.lancedb`` recipe says (:mod:`embedtune.index.deployment`):
float32 or float16 vectors, or packed sign bits (plus the float32 vectors for ``binary-rescore``),
with the recipe's vector index once the table has enough rows to train it. :func:`search_lancedb`
searches with the recipe's distance and rescoring and returns ``(D, I)`` as every embedtune search
does: ``D`` higher-is-better, ``I`` the rows in load order, ties by ascending row.

>>> table = load_plan_into_lancedb("my-plan", docs, doc_ids, "lancedb-folder")       # doctest: +SKIP
>>> D, I = search_lancedb(table, lancedb_recipe_of("my-plan"), compressed_queries, k=10)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.evaluate.search import as_rows, break_ties
from embedtune.index.codecs import binary_codes, sign_vectors
from embedtune.index.deployment import lancedb_recipe
from embedtune.index.plan_format import load_plan

__all__ = ["load_plan_into_lancedb", "search_lancedb", "lancedb_recipe_of"]

ROW_COLUMN = "row"  # the load order, so results map back to ids and ties break by row as in FAISS
ID_COLUMN = "id"


def lancedb_recipe_of(plan: str | Path) -> dict[str, Any]:
    """The plan's LanceDB recipe: ``plan.json``'s ``deployment.lancedb``, or (an older plan) the one its precision implies."""
    info, compressor, precision, _ = load_plan(plan)
    recorded = (info.get("deployment") or {}).get("lancedb")
    return dict(recorded) if recorded else lancedb_recipe(precision, compressor.output_dim)


def _import_lancedb() -> Any:
    try:
        import lancedb
    except ImportError:
        raise ImportError("LanceDB is not installed; pip install 'embedtune[lancedb]' (or pip install lancedb).") from None
    return lancedb


def load_plan_into_lancedb(plan: str | Path, embeddings: np.ndarray, ids: Sequence[str], uri: str | Path, table: str = "vectors",
                           overwrite: bool = False) -> Any:
    """Create LanceDB table ``table`` at ``uri`` holding ``embeddings`` (uncompressed, ``(n, d)``) as the plan deploys them.

    Args:
        plan: a plan folder (checked first, :func:`~embedtune.index.plan_format.load_plan`).
        embeddings: the corpus vectors the plan's compressor takes (the model's embeddings).
        ids: one document id per row.
        uri: the LanceDB folder (``lancedb.connect(uri)``).
        table: the table name.
        overwrite: replace an existing table of that name (default: an error).

    Returns:
        The LanceDB table.
    """
    import pyarrow as pa

    lancedb = _import_lancedb()
    _, compressor, _, _ = load_plan(plan)
    recipe = lancedb_recipe_of(plan)
    embeddings = as_rows(embeddings, "embeddings")
    if len(ids) != len(embeddings):
        raise ValueError(f"{len(embeddings)} embeddings but {len(ids)} ids; give exactly one id per row.")
    x = compressor.transform(embeddings)

    def vectors(values: np.ndarray) -> Any:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(values).ravel()), values.shape[1])

    stored = binary_codes(x) if recipe["distance"] == "hamming" else x.astype(np.float16 if recipe["vector_type"].startswith("float16") else np.float32)
    columns = {ROW_COLUMN: pa.array(np.arange(len(x), dtype=np.int64)), ID_COLUMN: pa.array([str(i) for i in ids]),
               recipe["vector_column"]: vectors(stored)}
    if recipe.get("float_column"):
        columns[recipe["float_column"]] = vectors(x.astype(np.float32))
    db = lancedb.connect(str(uri))
    created = db.create_table(table, pa.table(columns), mode="overwrite" if overwrite else "create")
    index = recipe.get("index")
    if index and len(x) >= int(recipe.get("min_rows_for_index") or 0):
        settings = {key: value for key, value in index.items() if key != "distance_type"}
        created.create_index(metric=index["distance_type"], vector_column_name=recipe["vector_column"], **settings)
    return created


def search_lancedb(table: Any, recipe: dict[str, Any], xq: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``(D, I)`` of the top ``k`` rows for each compressed query ``xq``, searched by ``recipe`` (higher ``D`` is better).

    Hamming recipes search the packed sign bits of the query; ``binary-asym`` and ``binary-rescore``
    then rescore the top ``candidates`` here (float query · ±1 signs, or · the float32 column),
    as the plan's index does.
    """
    xq = as_rows(xq, "xq")
    hamming = recipe["distance"] == "hamming"
    fetch = max(k, int(recipe.get("candidates") or 0)) if recipe.get("rescore") in ("asym", "float") and hamming else k
    # Naming `_distance` among the columns keeps it without Lance's per-query deprecation warning (it will stop adding it itself).
    columns = [ROW_COLUMN, "_distance"] + ([recipe["vector_column"]] if recipe.get("rescore") == "asym" else []) \
        + ([recipe["float_column"]] if recipe.get("float_column") else [])
    D_rows, I_rows = [], []
    for q in xq:
        query = table.search(binary_codes(q[None])[0] if hamming else q, vector_column_name=recipe["vector_column"])
        query = query.distance_type(recipe["distance"]).limit(fetch).select(columns)
        if recipe.get("refine_factor"):
            query = query.refine_factor(int(recipe["refine_factor"]))
        hits = query.to_arrow()
        rows = np.asarray(hits[ROW_COLUMN].to_numpy(), dtype=np.int64)
        distance = np.asarray(hits["_distance"].to_numpy(), dtype=np.float32)
        if hamming and recipe.get("rescore") == "asym":
            codes = np.asarray(hits[recipe["vector_column"]].to_pylist(), dtype=np.uint8).reshape(len(rows), -1)
            scores = (sign_vectors(codes, len(q)).astype(np.float64) @ q.astype(np.float64)).astype(np.float32)
        elif hamming and recipe.get("rescore") == "float":
            floats = np.asarray(hits[recipe["float_column"]].to_pylist(), dtype=np.float32).reshape(len(rows), -1)
            scores = (floats.astype(np.float64) @ q.astype(np.float64)).astype(np.float32)
        else:  # LanceDB's distances: hamming, or 1 - dot for "dot"
            scores = -distance if hamming else 1 - distance
        D, I = break_ties(scores[None], rows[None])
        D_rows.append(D[0, :k])
        I_rows.append(I[0, :k])
    return np.stack(D_rows), np.stack(I_rows)


