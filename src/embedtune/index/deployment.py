"""The deployment recipe of a planned precision: its FAISS index and the equivalent LanceDB settings.

``compress plan`` writes :func:`deployment_recipe` into ``plan.json`` (field ``deployment``), so
the plan says how to serve its choice outside embedtune too:

- ``faiss``: the ``index_factory`` string and the ``index build --kind`` it builds, with the
  rescoring the plan scored;
- ``lancedb``: LanceDB (embedded, ``pip install 'embedtune[lancedb]'``): the vector column's type,
  the distance, the vector index (or none: an exact scan) and the rescoring, and ``exact``:
  whether LanceDB's top-k then equals the planned index's by construction (up to ties) or is
  only the nearest LanceDB has (its own trained quantiser, or none at all). Loading and searching
  by this recipe: :mod:`embedtune.index.lancedb_store`.

================  =========================================  ==========  ===============================
precision         LanceDB vector column                      exact       index / search
================  =========================================  ==========  ===============================
float32           float32 × k                                yes         none (flat scan), dot
float16           float16 × k                                no          none (flat scan), dot
binary            uint8 × ceil(k/8) (packed sign bits)       yes         none (flat scan), hamming
binary-asym       uint8 × ceil(k/8)                          yes         hamming top ``candidates``,
                                                                         rescored as float · ±1 (client)
binary-rescore    uint8 × ceil(k/8) + float32 × k            yes         hamming top ``candidates``,
                                                                         rescored in float32 (client)
int8              float32 × k                                no          ``IVF_SQ`` (Lance's 8-bit ranges)
rabitq1(-rescore) float32 × k                                no          ``IVF_RQ`` 1 bit (+ refine_factor)
rabitq4           float32 × k                                no          ``IVF_RQ`` 4 bits
int4, turboquant  float32 × k                                no          none in LanceDB: the nearest
                                                                         (``IVF_PQ`` / ``IVF_RQ``)
faiss:…PQm[xb]    float32 × k                                no          ``IVF_PQ`` m sub-vectors, b bits
family:B (codec)  float32 × k                                no          ``IVF_PQ`` B sub-vectors, 8 bits
                                                                         (LanceDB's own codebooks)
================  =========================================  ==========  ===============================

A registered codec (``klt-pq:32``, :mod:`embedtune.index.codecs.registry`) is a FAISS index fitted
on the corpus, not an ``index_factory`` string: FAISS serves it by loading the plan's
``codec.faiss`` (``faiss.read_index``) and adding the compressed vectors, which is what
``index build --plan`` does; its ``factory`` and ``index_kind`` are the codec's name.

LanceDB keeps the float32 vectors of an indexed column on disk, so its ``refine_factor``
(rerank ``limit × refine_factor`` candidates with them) is the float rescoring of
``rabitq1-rescore``; an index needs enough rows to train (``min_rows``): below that the recipe's
table is scanned exactly.
"""

from __future__ import annotations

from typing import Any

from embedtune.index.codecs import Precision
from embedtune.index.plan_format import index_kind

__all__ = ["deployment_recipe", "faiss_recipe", "lancedb_recipe", "LANCEDB_MIN_INDEX_ROWS"]

#: LanceDB trains IVF partitions and quantisers on the table; below this many rows the recipe scans exactly.
LANCEDB_MIN_INDEX_ROWS = 5000


def faiss_recipe(precision: Precision) -> dict[str, Any]:
    """The FAISS side: the factory string, the ``index build --kind``, and the rescoring of the candidates."""
    codec = precision.precision_codec
    recipe = {"factory": precision.factory, "index_kind": index_kind(precision), "rescore": codec.rescore,
              "candidates": precision.candidates if codec.rescore else None}
    if codec.faiss_load:
        recipe["load"] = codec.faiss_load
    return recipe


def lancedb_recipe(precision: Precision, dim: int, top_k: int = 10) -> dict[str, Any]:
    """The equivalent LanceDB settings for ``precision`` on ``dim``-d vectors (see the module table).

    The defaults are an exact float32 scan; the precision's codec says what differs
    (:meth:`~embedtune.index.codecs.PrecisionCodec.lancedb_settings`).
    ``top_k``: the ``limit`` the rescoring is sized for (``refine_factor = ceil(candidates / top_k)``).
    """
    recipe: dict[str, Any] = {"vector_column": "vector", "vector_type": f"float32 x {dim}", "distance": "dot", "index": None,
                              "refine_factor": None, "rescore": None, "candidates": None, "exact": False,
                              "min_rows_for_index": LANCEDB_MIN_INDEX_ROWS, "note": ""}
    recipe.update(precision.precision_codec.lancedb_settings(dim, precision.candidates, top_k))
    return recipe


def deployment_recipe(precision: Precision, dim: int) -> dict[str, Any]:
    """What ``plan.json`` records under ``deployment``: the FAISS and the LanceDB settings of the planned precision."""
    return {"faiss": faiss_recipe(precision), "lancedb": lancedb_recipe(precision, dim)}
