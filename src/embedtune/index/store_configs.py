"""Ready configurations of a planned precision for Qdrant, pgvector and Milvus, from one table.

:data:`STORE_SETTINGS` maps each kind of planned precision to the setting each store gets and a
note where that store's own quantiser differs from the plan's. The table is per-store data, keyed by
*store kind*, not by precision: each registered precision names its row
(:attr:`~embedtune.index.codecs.PrecisionCodec.store_kind`), so a new precision picks a row, or adds
one here. :func:`qdrant_config`, :func:`pgvector_sql` and :func:`milvus_config` turn a row into what
the store takes (a Qdrant ``create_collection`` body, pgvector SQL, a Milvus schema with index parameters); FAISS and
LanceDB keep theirs in :mod:`embedtune.index.deployment`. ``embedtune index deploy`` writes them
all into a bundle (:mod:`embedtune.index.deploy_bundle`).

Every store scores by inner product on the compressed vectors (the plan's compressor output); a
binary plan's sign bits ``x > 0`` (:func:`embedtune.index.codecs.binary_codes`) rank by Hamming
distance, which equals ranking the ±1 sign vectors by inner product (``dot = d - 2·hamming``).
"""

from __future__ import annotations

import math
from typing import Any

from embedtune.index.codecs import Precision
from embedtune.index.codecs.precision_registry import divisor_near

__all__ = ["STORE_SETTINGS", "STORES", "precision_kind", "store_settings", "qdrant_config", "pgvector_sql", "milvus_config"]

STORES = ("qdrant", "pgvector", "milvus")

#: precision kind → store → (setting, note). The note says where the store's own quantiser is not the plan's ("" when it is the same).
STORE_SETTINGS: dict[str, dict[str, tuple[str, str]]] = {
    "float32": {
        "qdrant": ("float32 vectors, Dot, no quantization", ""),
        "pgvector": ("vector(d), vector_ip_ops", ""),
        "milvus": ("FLOAT_VECTOR, FLAT, IP", ""),
    },
    "float16": {
        "qdrant": ("datatype float16, Dot, no quantization", "Qdrant may compute the dot product in float16"),
        "pgvector": ("halfvec(d), halfvec_ip_ops", ""),
        "milvus": ("FLOAT16_VECTOR, FLAT, IP", "Milvus Lite has no FLOAT16_VECTOR: it stores FLOAT_VECTOR (2x the bytes)"),
    },
    "int8": {
        "qdrant": ("scalar quantization int8 (quantile 0.99), rescore off",
                   "Qdrant calibrates its own int8 range (one quantile range for all dimensions), not the plan's per-dimension ranges"),
        "pgvector": ("halfvec(d), halfvec_ip_ops",
                     "pgvector has no int8 vector type: halfvec (2 bytes per dimension, twice the plan's)"),
        "milvus": ("FLOAT_VECTOR, IVF_SQ8, IP", "Milvus trains its own 8-bit ranges and IVF lists, not the plan's calibration"),
    },
    "binary": {
        "qdrant": ("binary quantization one_bit, query binary, rescore off",
                   "Qdrant's sign bits are its own (x > 0 after its own offsets); it keeps the float vectors too (on disk)"),
        "pgvector": ("bit(d), bit_hamming_ops, <~>", ""),
        "milvus": ("BINARY_VECTOR, BIN_FLAT, HAMMING",
                   "Milvus Lite has no BINARY_VECTOR: it stores the ±1 signs as FLOAT_VECTOR with IP (the same ranking)"),
    },
    "binary-asym": {
        "qdrant": ("binary quantization one_bit, query scalar8bits, rescore off",
                   "Qdrant quantises the query to 8 bits; the plan scores the float query against the ±1 signs"),
        "pgvector": ("bit(d) for the candidates (<~>), rescored by the client as float query · ±1",
                     "SQL cannot score a float query against bits: the top candidates are rescored by the client"),
        "milvus": ("BINARY_VECTOR, BIN_FLAT, HAMMING, rescored by the client",
                   "Milvus scores Hamming only; the client rescores the candidates as float query · ±1"),
    },
    "binary-rescore": {
        "qdrant": ("binary quantization one_bit, rescore on, oversampling candidates/k", ""),
        "pgvector": ("vector(d) with an HNSW index on binary_quantize(vector)::bit(d), rescored by <#> in SQL", ""),
        "milvus": ("BINARY_VECTOR (BIN_FLAT, HAMMING) + FLOAT_VECTOR, rescored by the client",
                   "Milvus cannot rescore across fields: the client rescores the candidates with the float field"),
    },
    "rabitq": {
        "qdrant": ("binary quantization one_bit (rescore as planned)",
                   "no RaBitQ in Qdrant: its 1-bit binary quantization at the same bits"),
        "pgvector": ("bit(d) on binary_quantize(vector) (rescored by <#> where planned)",
                     "no RaBitQ in pgvector: sign bits at the same bits, without RaBitQ's rotation and correction"),
        "milvus": ("FLOAT_VECTOR, IVF_RABITQ, IP (refine where planned)", "Milvus's RaBitQ adds IVF lists the plan's flat index does not have"),
    },
    "four-bit": {
        "qdrant": ("binary quantization two_bits", "no 4-bit quantiser in Qdrant: its 2-bit binary quantization, half the plan's bits"),
        "pgvector": ("halfvec(d), halfvec_ip_ops", "no 4-bit type in pgvector: halfvec (4x the plan's bytes)"),
        "milvus": ("FLOAT_VECTOR, IVF_PQ at the same bytes, IP", "no 4-bit scalar quantiser in Milvus: its IVF_PQ at about the same bytes"),
    },
    "product": {
        "qdrant": ("product quantization at the nearest compression ratio",
                   "Qdrant trains its own PQ codebooks (ratios x4..x64 only): no FAISS codes or the plan's codec tables"),
        "pgvector": ("halfvec(d), halfvec_ip_ops", "pgvector has no product quantization: halfvec, more bytes than the plan"),
        "milvus": ("FLOAT_VECTOR, IVF_PQ (m, nbits), IP", "Milvus trains its own IVF_PQ codebooks, not the plan's"),
    },
    "other": {
        "qdrant": ("float32 vectors, Dot, no quantization", "no equivalent of this FAISS index: exact float32"),
        "pgvector": ("vector(d), vector_ip_ops", "no equivalent of this FAISS index: exact float32"),
        "milvus": ("FLOAT_VECTOR, FLAT, IP", "no equivalent of this FAISS index: exact float32"),
    },
}


def precision_kind(precision: Precision) -> str:
    """The :data:`STORE_SETTINGS` row of ``precision``: the one its codec names."""
    kind = precision.precision_codec.store_kind
    if kind not in STORE_SETTINGS:
        raise ValueError(f"precision {precision.name!r} names store kind {kind!r}, which STORE_SETTINGS has no row for; "
                         f"name one of {sorted(STORE_SETTINGS)} in its codec's store_kind, or add the row.")
    return kind


def store_settings(precision: Precision) -> dict[str, dict[str, str]]:
    """``{store: {"setting", "note"}}`` of ``precision`` (see :data:`STORE_SETTINGS`)."""
    row = STORE_SETTINGS[precision_kind(precision)]
    return {store: {"setting": setting, "note": note} for store, (setting, note) in row.items()}


def _candidates(precision: Precision) -> int | None:
    return precision.candidates if precision.rescore else None


def qdrant_config(precision: Precision, dim: int, top_k: int = 10, collection: str = "vectors") -> dict[str, Any]:
    """The Qdrant collection (``create_collection`` body) and search parameters of ``precision`` on ``dim``-d vectors."""
    kind = precision_kind(precision)
    vectors: dict[str, Any] = {"size": dim, "distance": "Dot", "on_disk": False}
    quantization: dict[str, Any] | None = None
    search: dict[str, Any] = {"exact": kind in ("float32", "float16", "other")}
    candidates = _candidates(precision)
    if kind == "float16":
        vectors["datatype"] = "float16"
    elif kind == "int8":
        quantization = {"scalar": {"type": "int8", "quantile": 0.99, "always_ram": True}}
        search["quantization"] = {"rescore": False}
    elif kind in ("binary", "binary-asym", "binary-rescore", "rabitq"):
        quantization = {"binary": {"always_ram": True, "encoding": "one_bit",
                                   "query_encoding": "scalar8bits" if precision.rescore == "asym" else "binary"}}
        search["quantization"] = ({"rescore": True, "oversampling": candidates / top_k} if candidates and precision.rescore != "asym"
                                  else {"rescore": False})
        vectors["on_disk"] = True  # the float vectors are only read to rescore
    elif kind == "four-bit":
        quantization = {"binary": {"always_ram": True, "encoding": "two_bits", "query_encoding": "scalar8bits"}}
        search["quantization"] = {"rescore": False}
    elif kind == "product":
        ratio = 4 * dim / precision.ram_bytes(dim)
        nearest = min((4, 8, 16, 32, 64), key=lambda r: (abs(math.log(r / ratio)), r))
        quantization = {"product": {"compression": f"x{nearest}", "always_ram": True}}
        search["quantization"] = {"rescore": False}
    return {"collection_name": collection, "vectors_config": vectors, "quantization_config": quantization,
            "search_params": search, "limit": top_k}


def pgvector_sql(precision: Precision, dim: int, table: str = "items", top_k: int = 10) -> str:
    """SQL for pgvector: the extension, a table for ``precision`` on ``dim``-d vectors, its inner-product index and the top-k query.

    ``:query`` in the query stands for the compressed query vector (a ``'[...]'`` literal or a bound parameter).
    """
    kind = precision_kind(precision)
    candidates = _candidates(precision) or top_k
    lines = ["-- embedtune deploy: pgvector (PostgreSQL with CREATE EXTENSION vector; pgvector >= 0.7 for halfvec and bit)",
             f"-- precision {precision.name}, {dim} dimensions: {store_settings(precision)['pgvector']['setting']}"]
    note = store_settings(precision)["pgvector"]["note"]
    if note:
        lines.append(f"-- note: {note}")
    lines.append("CREATE EXTENSION IF NOT EXISTS vector;")
    if kind in ("binary", "binary-asym"):
        lines += [f"CREATE TABLE {table} (row_id bigint PRIMARY KEY, id text NOT NULL, embedding bit({dim}));",
                  f"CREATE INDEX ON {table} USING hnsw (embedding bit_hamming_ops);",
                  "-- load: embedding = the sign bits x > 0 as a bit string ('0101...')",
                  f"-- top-{top_k}: :query is the query's sign bits",
                  f"SELECT row_id, id FROM {table} ORDER BY embedding <~> :query, row_id LIMIT {candidates if precision.rescore == 'asym' else top_k};"]
        return "\n".join(lines) + "\n"
    column = "halfvec" if kind in ("float16", "int8", "four-bit", "product") else "vector"
    lines += [f"CREATE TABLE {table} (row_id bigint PRIMARY KEY, id text NOT NULL, embedding {column}({dim}));"]
    if kind in ("binary-rescore", "rabitq"):
        lines += [f"CREATE INDEX ON {table} USING hnsw ((binary_quantize(embedding)::bit({dim})) bit_hamming_ops);",
                  f"-- top-{top_k}: Hamming candidates, rescored by inner product (<#> is the negative inner product)",
                  f"SELECT row_id, id FROM (SELECT row_id, id, embedding FROM {table} "
                  f"ORDER BY binary_quantize(embedding)::bit({dim}) <~> binary_quantize(:query::vector({dim})) LIMIT {candidates}) AS c",
                  f"  ORDER BY embedding <#> :query::vector({dim}), row_id LIMIT {top_k};"]
    else:
        lines += [f"CREATE INDEX ON {table} USING hnsw (embedding {column}_ip_ops);",
                  f"-- top-{top_k} (<#> is the negative inner product; without the index the scan is exact)",
                  f"SELECT row_id, id FROM {table} ORDER BY embedding <#> :query::{column}({dim}), row_id LIMIT {top_k};"]
    return "\n".join(lines) + "\n"


def milvus_config(precision: Precision, dim: int, top_k: int = 10, collection: str = "vectors") -> dict[str, Any]:
    """The Milvus collection schema, index parameters and search parameters of ``precision`` on ``dim``-d vectors.

    ``lite`` is what Milvus Lite (``pip install pymilvus milvus-lite``) takes where it lacks the
    server's field type (binary and float16 vectors).
    """
    kind = precision_kind(precision)
    candidates = _candidates(precision)
    fields = [{"name": "row", "type": "INT64", "is_primary": True}, {"name": "id", "type": "VARCHAR", "max_length": 512}]
    vector = {"name": "vector", "type": "FLOAT_VECTOR", "dim": dim}
    index: dict[str, Any] = {"field_name": "vector", "index_type": "FLAT", "metric_type": "IP", "params": {}}
    search: dict[str, Any] = {"metric_type": "IP", "params": {}}
    extra_fields: list[dict[str, Any]] = []
    if kind == "float16":
        vector["type"] = "FLOAT16_VECTOR"
    elif kind == "int8":
        index.update(index_type="IVF_SQ8", params={"nlist": 128})
        search["params"] = {"nprobe": 16}
    elif precision.is_binary:
        vector = {"name": "vector", "type": "BINARY_VECTOR", "dim": dim}
        index.update(index_type="BIN_FLAT", metric_type="HAMMING")
        search["metric_type"] = "HAMMING"
        if precision.rescore == "float":  # Milvus cannot rescore across fields: the float vectors ride along for the client
            extra_fields.append({"name": "vector_float", "type": "FLOAT_VECTOR", "dim": dim})
    elif kind == "rabitq":
        index.update(index_type="IVF_RABITQ", params={"nlist": 128, **({"refine": True, "refine_type": "SQ8"} if candidates else {})})
        search["params"] = {"nprobe": 16, **({"rbq_query_bits": 0, "refine_k": candidates / top_k} if candidates else {})}
    elif kind in ("four-bit", "product"):
        # A FAISS product quantiser keeps its shape; anything else gets Milvus's IVF_PQ at about the same bytes.
        m, nbits = precision.precision_codec.pq_shape(dim) or (divisor_near(dim, precision.ram_bytes(dim)), 8)
        index.update(index_type="IVF_PQ", params={"nlist": 128, "m": m, "nbits": nbits})
        search["params"] = {"nprobe": 16}
    lite_vector = dict(vector, type="FLOAT_VECTOR") if vector["type"] != "FLOAT_VECTOR" else vector
    lite_index = dict(index, index_type="FLAT", metric_type="IP", params={}) if vector["type"] == "BINARY_VECTOR" else index
    binary = vector["type"] == "BINARY_VECTOR"
    return {"collection_name": collection, "fields": [*fields, vector, *extra_fields], "index_params": [index],
            "search_params": search, "limit": candidates if binary and candidates else top_k,
            "rescore": precision.rescore if binary else None,  # the client's rescoring (a RaBitQ refine runs in Milvus)
            "lite": {"fields": [*fields, lite_vector, *extra_fields], "index_params": [lite_index],
                     "search_params": {"metric_type": "IP", "params": {}} if binary else search,
                     "stores": "the ±1 sign vectors (inner product ranks as Hamming)" if binary else "the compressed vectors"}}

