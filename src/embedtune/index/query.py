"""Search an index folder with query texts, or with query vectors: what ``embedtune search`` runs.

The queries are encoded with ``model``, else the model the index records (an index that records
none needs ``model``: there is no silent default), mapped through the
adapter the index was built with (or ``adapter``), and searched. The adapter is checked against
the digests the manifest recorded at build time first: an adapter refitted or edited after
``index build`` would map the queries into another space than the documents, and every hit
would be wrong with no error. Query vectors (:func:`search_vectors`) skip the encoding: no model
is loaded. An index built from a ``+refine<N>`` plan also gets each query's vector before the adapter
(normalised as the adapter normalises its input), to rescore its candidates with the original vectors.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import load_compressor
from embedtune.encoders import SentenceEncoder
from embedtune.encoders.precomputed import load_embeddings
from embedtune.encoders.recipe import EncoderRecipe, model_sha256
from embedtune.index.store import MANIFEST, Index, check_adapter, load_index

__all__ = ["search_texts", "search_vectors", "query_vectors"]


def query_vectors(index: Index, vectors: np.ndarray, adapter: str | Path | None = None, use_adapter: bool = True,
                  source: str | Path | None = None) -> np.ndarray:
    """``vectors`` (model space) mapped into the index's space: through ``adapter``, else the index's own adapter.

    Raises when the adapter is not the one the index was built with (its recorded digests), when
    the index was built with an adapter whose folder is gone, or when the dimensions disagree
    (naming ``source``, the file the vectors came from, when given).
    """
    return _mapped_queries(index, vectors, adapter, use_adapter, source)[0]


def _mapped_queries(index: Index, vectors: np.ndarray, adapter: str | Path | None = None, use_adapter: bool = True,
                    source: str | Path | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(mapped, original)``: :func:`query_vectors`' result, and for an index that refines with the original vectors
    the queries' own vectors normalised as the adapter normalises its input (else None)."""
    recorded = index.manifest.get("adapter") or {}
    if use_adapter and adapter is None and recorded:
        path = recorded.get("path")
        if not path:
            raise ValueError(f"{index.path / MANIFEST}: the index was built with an in-memory {recorded.get('method')} adapter, "
                             "whose folder is not recorded; pass --adapter with it (saved), or --no-adapter.")
        if not Path(path).is_dir():
            raise FileNotFoundError(f"the index was built with the adapter {path}, which no longer exists; pass --adapter or --no-adapter.")
        adapter = path
    where = f"{source}: " if source is not None else ""
    if not use_adapter or adapter is None:
        if index.refine is not None and recorded:
            raise ValueError(f"{index.path}: the index rescores its candidates with the model's original vectors, so the queries "
                             "must be the model's vectors too, mapped by the index's adapter: drop --no-adapter.")
        if source is not None and vectors.ndim == 2 and vectors.shape[1] != index.dim:
            raise ValueError(f"{where}the query vectors are {vectors.shape[1]}-d but the index {index.path} holds {index.dim}-d vectors: "
                             "give query vectors from the model (and adapter) the index's vectors came from.")
        return vectors, (vectors if index.refine is not None else None)
    compressor = load_compressor(adapter)
    if recorded:
        check_adapter(index.manifest, index.path / MANIFEST, adapter, compressor)
    if vectors.ndim == 2 and vectors.shape[1] != compressor.input_dim_:
        fix = ("give query vectors from the model the index's vectors came from" if source is not None
               else "encode the queries with the model the index's vectors came from (--model)")
        raise ValueError(f"{where}the query vectors are {vectors.shape[1]}-d but the adapter {adapter} was fitted on "
                         f"{compressor.input_dim_}-d vectors: {fix}.")
    original = compressor.normalize_input(np.ascontiguousarray(vectors, dtype=np.float32)) if index.refine is not None else None
    return compressor.transform(vectors), original


def _hits(index: Index, vectors: np.ndarray, top_k: int, rescore: str | None, query_ids: list[str] | None,
          ignore_identical_ids: bool, original: np.ndarray | None = None) -> list[list[dict[str, Any]]]:
    """The index's top ``top_k`` hits per row of ``vectors``; with ``query_ids`` and ``ignore_identical_ids``, a hit whose id is its query's is dropped."""
    drop = ignore_identical_ids and query_ids is not None
    if drop and len(query_ids) != len(vectors):  # type: ignore[arg-type]
        raise ValueError(f"{len(query_ids)} query ids for {len(vectors)} queries.")  # type: ignore[arg-type]
    D, I = index.search(vectors, top_k + 1 if drop else top_k, rescore_with=rescore, original_queries=original)  # one spare for a dropped hit
    hits = index.hits(D, I)
    if not drop:
        return hits
    kept = []
    for qid, found in zip(query_ids, hits):  # type: ignore[arg-type]
        rows = [hit for hit in found if hit["id"] != str(qid)][:top_k]
        kept.append([{**hit, "rank": rank} for rank, hit in enumerate(rows, 1)])
    return kept


def _check_top_k(top_k: Any) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"--top-k must be an integer >= 1 (hits per query); got {top_k!r}.")


def search_vectors(index_dir: str | Path, vectors: str | Path, ids: str | Path | None = None, adapter: str | Path | None = None,
                   use_adapter: bool = True, top_k: int = 10, rescore: str | None = None,
                   ignore_identical_ids: bool = True) -> tuple[list[str], list[list[dict[str, Any]]]]:
    """The hits of the index for each query vector of a file; no model is loaded.

    ``vectors`` is an ``(nq, d)`` ``.npy`` with ``ids`` (one per line, or a JSON list), or a
    parquet file with an id column, as ``index build`` and ``--query-embeddings`` take them. The
    vectors are scored as given (inner product: normalise them as the index's vectors were) after
    the index's adapter (or ``adapter``), as text queries are. NaN or infinity, repeated ids and a
    dimension that fits neither the adapter nor the index are refused, naming the file. A hit whose
    id equals its query's id is dropped (``ignore_identical_ids``), as ``evaluate`` drops it.

    Returns ``(query_ids, hits)``, the hits as :func:`search_texts` gives them.
    """
    _check_top_k(top_k)
    index = load_index(index_dir)
    query_ids, matrix = load_embeddings(vectors, ids, unique=True)  # refuses NaN/inf and repeated ids, naming the file
    if not query_ids:
        raise ValueError(f"{vectors}: no query vectors (0 rows); give at least one.")
    mapped, original = _mapped_queries(index, np.ascontiguousarray(matrix, dtype=np.float32), adapter, use_adapter, source=vectors)
    return query_ids, _hits(index, mapped, top_k, rescore, query_ids, ignore_identical_ids, original)


def search_texts(index_dir: str | Path, queries: list[str], model: str | None = None, adapter: str | Path | None = None,
                 use_adapter: bool = True, top_k: int = 10, query_prompt: str | None = None, rescore: str | None = None,
                 show_progress: bool = False, query_ids: list[str] | None = None,
                 ignore_identical_ids: bool = True, backend: str | None = None) -> list[list[dict[str, Any]]]:
    """Encode ``queries`` with ``model`` (+ adapter) and return the hits of the index for each.

    With ``query_ids`` (real ids, e.g. from a BEIR queries file) and ``ignore_identical_ids``, a
    document whose id equals its query's id is dropped and the next one takes its place, as
    ``evaluate`` (and BEIR) score: on ArguAna every query is also a document. ``backend``: the
    encoding runtime (:class:`~embedtune.encoders.SentenceEncoder`). ``model``, ``backend`` and
    ``query_prompt`` default to the encoder recipe the index records (``manifest.json``'s
    ``encoder``); given ones must agree with it, since queries encoded another way than the
    documents give wrong hits.
    """
    _check_top_k(top_k)
    index = load_index(index_dir)
    recorded = index.manifest.get("encoder")
    # --no-adapter with another --model: a model that emits the index's own (compressed) space, e.g. one
    # exported with its compressor; it is a different model by design, so only the user's flags apply.
    exported_model = model is not None and not use_adapter
    if recorded and not exported_model:
        recipe = EncoderRecipe.from_dict(recorded, str(index.path / MANIFEST))
        given = EncoderRecipe(model=model or recipe.model, backend=backend or recipe.backend,
                              query_prompt=(recipe.query_prompt or "") if query_prompt is None else query_prompt,
                              max_seq_length=recipe.max_seq_length, document_prompt=recipe.document_prompt, normalize=recipe.normalize)
        # Another spelling of the recorded model (its folder for an alias) is the same model when its files are.
        given = replace(given, model_sha256=model_sha256(model) if model and model != recipe.model else recipe.model_sha256)
        recipe.check_same(given, here=f"the index {index.path}", there="these queries (--model, --backend, --query-prompt)")
        encoder = given.encoder(show_progress=show_progress)
        return _search_encoded(index, encoder, queries, adapter, use_adapter, top_k, rescore, query_ids, ignore_identical_ids)
    model = model or index.manifest.get("model")
    if not model:
        # No silent default: queries encoded by another model than the documents' give wrong hits, with no error.
        raise ValueError(f"{index.path / MANIFEST} records no model, so the queries' encoder is unknown: pass --model, the model "
                         "the index's vectors came from (e.g. --model minilm), or record it with `index build --model`.")
    encoder = SentenceEncoder(model, query_prompt=query_prompt or "", show_progress=show_progress, backend=backend or "torch")
    return _search_encoded(index, encoder, queries, adapter, use_adapter, top_k, rescore, query_ids, ignore_identical_ids)


def _search_encoded(index: Any, encoder: SentenceEncoder, queries: list[str], adapter: str | Path | None, use_adapter: bool,
                    top_k: int, rescore: str | None, query_ids: list[str] | None, ignore_identical_ids: bool) -> list[list[dict[str, Any]]]:
    if use_adapter and adapter is not None:
        load_compressor(adapter)  # a bad adapter fails before any encoding
    vectors, original = _mapped_queries(index, encoder.encode(queries, kind="query"), adapter, use_adapter)
    return _hits(index, vectors, top_k, rescore, query_ids, ignore_identical_ids, original)
