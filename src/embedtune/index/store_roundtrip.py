"""Load a plan's compressed vectors into embedded Qdrant or Milvus Lite and search them as the bundle's configuration says.

These are the round trips behind ``tests/test_deploy_bundle.py`` and the measured top-10 agreement
in ``docs/deploy.md``: the vectors each store holds (:func:`stored_vectors`: the compressed
vectors, or the ±1 signs of a binary plan, whose inner product ranks as Hamming distance), loaded
into the real engine on a local folder, searched, and the candidates of ``binary-asym`` and
``binary-rescore`` rescored by the client from the vectors the store returns, as the plan's index
rescores them. Both return ``(D, I)`` like every embedtune search: higher ``D`` is better, ``I``
the rows in load order, ties by ascending row.

Embedded Qdrant (``QdrantClient(path=...)``) and Milvus Lite search exactly: they accept the
quantization and index settings but do not apply them, so a quantised plan's agreement measured
here is that of exact search on the compressed vectors with the plan's quantised index.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.evaluate.search import as_rows, break_ties
from embedtune.index.codecs import Precision, binary_codes, sign_vectors

__all__ = ["stored_vectors", "load_qdrant", "search_qdrant", "load_milvus_lite", "search_milvus_lite", "search_bundle_store"]

SIGNS, FLOATS = "signs", "vector"


def stored_vectors(precision: Precision, x: np.ndarray) -> dict[str, np.ndarray]:
    """The named vectors a store holds for ``precision``: ``signs`` (±1) for binary plans (and ``vector`` for ``binary-rescore``), else ``vector``."""
    x = as_rows(x, "vectors").astype(np.float32)
    if not precision.is_binary:
        return {FLOATS: x}
    signs = {SIGNS: sign_vectors(binary_codes(x), x.shape[1])}
    return {**signs, FLOATS: x} if precision.rescore == "float" else signs


def _plan_search(precision: Precision, xq: np.ndarray, k: int,
                 search: Any) -> tuple[np.ndarray, np.ndarray]:
    """Run ``search(name, query, limit) -> [(row, score, {name: vector})]`` per query, with the plan's candidates and rescoring."""
    xq = as_rows(xq, "xq").astype(np.float32)
    binary = precision.is_binary
    client_rescore = precision.rescore if binary else None  # the store returns Hamming candidates; the client rescores them
    keep = max(k, precision.candidates) if client_rescore else k
    D_rows, I_rows = [], []
    for q in xq:
        query = sign_vectors(binary_codes(q[None]), len(q))[0] if binary else q
        fetch = 2 * keep if binary else keep
        hits = search(SIGNS if binary else FLOATS, query, fetch)
        # Hamming distances tie often: fetch until every row tied with the last kept one is in, then cut by
        # (distance, row) as the plan's index does.
        while binary and len(hits) == fetch and len(hits) > keep and round(hits[-1][1]) >= round(hits[keep - 1][1]):
            fetch *= 2
            hits = search(SIGNS, query, fetch)
        if binary:
            order = sorted(range(len(hits)), key=lambda i: (-round(hits[i][1]), hits[i][0]))[:keep]
            hits = [hits[i] for i in order]
        rows = np.array([row for row, _, _ in hits], dtype=np.int64)
        if client_rescore == "asym":  # the float query against the ±1 signs, as the plan's index rescores
            scores = np.array([np.dot(np.asarray(v[SIGNS], np.float64), q.astype(np.float64)) for _, _, v in hits], dtype=np.float32)
        elif client_rescore == "float":
            scores = np.array([np.dot(np.asarray(v[FLOATS], np.float64), q.astype(np.float64)) for _, _, v in hits], dtype=np.float32)
        elif binary:  # ±1 · ±1 = d - 2·hamming: report the negative Hamming distance, as the plan's index does
            scores = np.array([-(len(q) - score) / 2 for _, score, _ in hits], dtype=np.float32)
        else:
            scores = np.array([score for _, score, _ in hits], dtype=np.float32)
        D, I = break_ties(scores[None], rows[None])
        D_rows.append(D[0, :k])
        I_rows.append(I[0, :k])
    return np.stack(D_rows), np.stack(I_rows)


def load_qdrant(config: dict[str, Any], vectors: dict[str, np.ndarray], path: str | Path) -> Any:
    """An embedded Qdrant client at ``path`` holding ``vectors`` (:func:`stored_vectors`) in ``config``'s collection (``qdrant.json``)."""
    try:
        from qdrant_client import QdrantClient, models
    except ImportError:
        raise ImportError("Qdrant's client is not installed; pip install 'embedtune[deploy]' (or pip install qdrant-client).") from None
    from pydantic import TypeAdapter

    params = {k: v for k, v in config["vectors_config"].items() if k != "size"}
    quantization = config["quantization_config"]
    client = QdrantClient(path=str(path))
    client.create_collection(config["collection_name"],
                             vectors_config={name: models.VectorParams(size=x.shape[1], **params) for name, x in vectors.items()},
                             quantization_config=TypeAdapter(models.QuantizationConfig).validate_python(quantization) if quantization else None)
    n = len(next(iter(vectors.values())))
    client.upload_collection(config["collection_name"], vectors={name: x for name, x in vectors.items()}, ids=list(range(n)))
    return client


def search_qdrant(client: Any, config: dict[str, Any], precision: Precision, xq: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``(D, I)`` of the top ``k`` rows for each compressed query, from the Qdrant collection :func:`load_qdrant` made."""
    from qdrant_client import models

    rescoring = precision.is_binary and precision.rescore is not None

    def search(name: str, query: np.ndarray, limit: int) -> list[tuple[int, float, dict[str, Any]]]:
        with warnings.catch_warnings():  # embedded Qdrant warns on every query that it searches exactly (the module docstring says so)
            warnings.filterwarnings("ignore", message="Local mode performs exact")
            points = client.query_points(config["collection_name"], query=query.tolist(), using=name, limit=limit,
                                         with_vectors=rescoring, search_params=models.SearchParams(**config["search_params"])).points
        return [(int(p.id), float(p.score), p.vector or {}) for p in points]

    return _plan_search(precision, xq, k, search)


def load_milvus_lite(config: dict[str, Any], vectors: dict[str, np.ndarray], uri: str | Path) -> Any:
    """A Milvus Lite client at ``uri`` (a ``.db`` file) holding ``vectors`` in a collection by ``config["lite"]`` (``milvus.json``)."""
    try:
        from pymilvus import DataType, MilvusClient
    except ImportError:
        raise ImportError("Milvus Lite is not installed; pip install 'embedtune[deploy]' (or pip install pymilvus milvus-lite).") from None
    client = MilvusClient(str(uri))
    schema = MilvusClient.create_schema(auto_id=False)
    schema.add_field("row", DataType.INT64, is_primary=True)
    index = client.prepare_index_params()
    settings = config["lite"]["index_params"][0]
    for name, x in vectors.items():
        schema.add_field(name, DataType.FLOAT_VECTOR, dim=x.shape[1])
        index.add_index(field_name=name, index_type=settings["index_type"], metric_type="IP", params=settings["params"])
    client.create_collection(config["collection_name"], schema=schema, index_params=index)
    n = len(next(iter(vectors.values())))
    client.insert(config["collection_name"], [{"row": i, **{name: x[i].tolist() for name, x in vectors.items()}} for i in range(n)])
    return client


def search_milvus_lite(client: Any, config: dict[str, Any], precision: Precision, xq: np.ndarray,
                       k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``(D, I)`` of the top ``k`` rows for each compressed query, from the collection :func:`load_milvus_lite` made."""
    rescoring = precision.is_binary and precision.rescore is not None
    params = config["lite"]["search_params"]

    def search(name: str, query: np.ndarray, limit: int) -> list[tuple[int, float, dict[str, Any]]]:
        fields = ([SIGNS] if precision.rescore == "asym" else [FLOATS]) if rescoring else []
        hits = client.search(config["collection_name"], data=[query.tolist()], limit=limit, anns_field=name,
                             search_params=params, output_fields=fields)[0]
        return [(int(h["row"]), float(h["distance"]), {f: h["entity"][f] for f in fields}) for h in hits]

    return _plan_search(precision, xq, k, search)


#: The stores a bundle is round-tripped in here: its configuration file, and how to load and search it.
_STORES = {"qdrant": ("qdrant.json", load_qdrant, search_qdrant, "qdrant"),
           "milvus-lite": ("milvus.json", load_milvus_lite, search_milvus_lite, "milvus.db")}


def search_bundle_store(store: str, bundle: str | Path, precision: Precision, x: np.ndarray, xq: np.ndarray, work: str | Path,
                        k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Load ``x`` into ``store`` (``qdrant`` or ``milvus-lite``) as the bundle's configuration says, under ``work``,
    and return ``(D, I)`` of the top ``k`` rows for each compressed query; the client is closed afterwards."""
    if store not in _STORES:
        raise ValueError(f"store must be one of {list(_STORES)}; got {store!r}.")
    config_file, load, search, location = _STORES[store]
    config = json.loads((Path(bundle) / config_file).read_text(encoding="utf-8"))
    client = load(config, stored_vectors(precision, x), Path(work) / location)
    try:
        return search(client, config, precision, xq, k)
    finally:
        client.close()
