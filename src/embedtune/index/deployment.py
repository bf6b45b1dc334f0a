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

import math
import re
from typing import Any

from embedtune.index.codecs import CODEC_FILE, Precision
from embedtune.index.plan_format import index_kind

__all__ = ["deployment_recipe", "faiss_recipe", "lancedb_recipe", "LANCEDB_MIN_INDEX_ROWS"]

#: LanceDB trains IVF partitions and quantisers on the table; below this many rows the recipe scans exactly.
LANCEDB_MIN_INDEX_ROWS = 5000
_RESCORE = {"binary-asym": "asym", "binary-rescore": "float", "rabitq1-rescore": "float"}
_PQ = re.compile(r"^PQ(\d+)(?:x(\d+))?(?:fs|np)?$")


def faiss_recipe(precision: Precision) -> dict[str, Any]:
    """The FAISS side: the factory string, the ``index build --kind``, and the rescoring of the candidates."""
    recipe = {"factory": precision.factory, "index_kind": index_kind(precision), "rescore": _RESCORE.get(precision.name),
              "candidates": precision.candidates if precision.name in _RESCORE else None}
    if precision.is_codec:
        recipe["load"] = (f"load {CODEC_FILE} with faiss.read_index (the codec's tables, fitted on the corpus), then add the "
                          "compressed vectors; `embedtune index build --plan` does both")
    return recipe


def lancedb_recipe(precision: Precision, dim: int, top_k: int = 10) -> dict[str, Any]:
    """The equivalent LanceDB settings for ``precision`` on ``dim``-d vectors (see the module table).

    ``top_k``: the ``limit`` the rescoring is sized for (``refine_factor = ceil(candidates / top_k)``).
    """
    name, float_column = precision.name, f"float32 x {dim}"
    recipe: dict[str, Any] = {"vector_column": "vector", "vector_type": float_column, "distance": "dot", "index": None,
                              "refine_factor": None, "rescore": None, "candidates": None, "exact": False,
                              "min_rows_for_index": LANCEDB_MIN_INDEX_ROWS, "note": ""}
    if name == "float32":
        recipe.update(exact=True, note="exact scan of the float32 vectors, as the plan's flat index")
    elif name == "float16":
        recipe.update(vector_type=f"float16 x {dim}", note="float16 storage as FAISS SQfp16; LanceDB may compute the dot product in float16")
    elif precision.is_binary:
        recipe.update(vector_type=f"uint8 x {(dim + 7) // 8}", distance="hamming", exact=True,
                      note="packed sign bits x > 0, as embedtune.index.codecs.binary_codes; exact Hamming scan")
        if name != "binary":
            recipe.update(rescore=_RESCORE[name], candidates=precision.candidates,
                          note=recipe["note"] + "; LanceDB cannot rescore across columns, so the top candidates are rescored by the "
                               "client (embedtune.index.lancedb_store.search_lancedb)")
            if name == "binary-rescore":
                recipe["float_column"] = "vector_float"
    elif name == "int8":
        recipe.update(index={"index_type": "IVF_SQ", "distance_type": "dot"},
                      note="LanceDB has no user-calibrated int8 column: IVF_SQ trains its own 8-bit ranges, not the plan's")
    elif name.startswith("rabitq"):
        bits = 4 if name == "rabitq4" else 1
        recipe.update(index={"index_type": "IVF_RQ", "distance_type": "dot", "num_bits": bits},
                      note="LanceDB's RaBitQ (IVF_RQ), with IVF partitions FAISS's flat RaBitQ index does not have")
        if precision.rescores_float:
            recipe.update(refine_factor=math.ceil(precision.candidates / top_k), rescore="float", candidates=precision.candidates)
    elif name == "int4":
        recipe.update(index={"index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": _divisor_near(dim, dim // 2), "num_bits": 8},
                      note="no 4-bit scalar quantiser in LanceDB: IVF_PQ at about the same bytes")
    elif name.startswith("turboquant"):
        recipe.update(index={"index_type": "IVF_RQ", "distance_type": "dot", "num_bits": 1 if name == "turboquant1" else 4},
                      note="no TurboQuant in LanceDB: RaBitQ (IVF_RQ) at the same bits per dimension")
    elif precision.is_codec:
        code_bytes = precision.ram_bytes(dim)
        recipe.update(index={"index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": _divisor_near(dim, code_bytes), "num_bits": 8},
                      note=f"LanceDB has no {precision.codec.family} codec: IVF_PQ at about the same bytes, and LanceDB trains its own "
                           "codebooks (no KLT), not the plan's")
    else:  # faiss:<factory>
        parts = [p.strip() for p in precision.factory.split(",")]
        pq = _PQ.match(parts[-1])
        if pq:
            nlist = next((int(p[3:]) for p in parts if re.match(r"^IVF\d+$", p)), None)
            recipe.update(index={"index_type": "IVF_PQ", "distance_type": "dot", "num_sub_vectors": int(pq.group(1)),
                                 "num_bits": int(pq.group(2) or 8), **({"num_partitions": nlist} if nlist else {})},
                          note="LanceDB's IVF_PQ at the same code size (its own rotation and codebooks)")
        else:
            recipe.update(note=f"no LanceDB equivalent of FAISS {precision.factory!r}; exact float32 scan")
    return recipe


def _divisor_near(dim: int, target: int) -> int:
    """The divisor of ``dim`` closest to ``target`` (IVF_PQ needs sub-vectors that divide the dimension)."""
    return min((m for m in range(1, dim + 1) if dim % m == 0), key=lambda m: (abs(m - target), m))


def deployment_recipe(precision: Precision, dim: int) -> dict[str, Any]:
    """What ``plan.json`` records under ``deployment``: the FAISS and the LanceDB settings of the planned precision."""
    return {"faiss": faiss_recipe(precision), "lancedb": lancedb_recipe(precision, dim)}
