"""Search an index folder with query texts: what ``embedtune search`` runs.

The queries are encoded with the model the index records (or ``model``), mapped through the
adapter the index was built with (or ``adapter``), and searched. The adapter is checked against
the digests the manifest recorded at build time first: an adapter refitted or edited after
``index build`` would map the queries into another space than the documents, and every hit
would be wrong with no error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import load_compressor
from embedtune.encoders import SentenceEncoder
from embedtune.index.store import MANIFEST, Index, check_adapter, load_index

__all__ = ["search_texts", "query_vectors"]


def query_vectors(index: Index, vectors: np.ndarray, adapter: str | Path | None = None, use_adapter: bool = True) -> np.ndarray:
    """``vectors`` (model space) mapped into the index's space: through ``adapter``, else the index's own adapter.

    Raises when the adapter is not the one the index was built with (its recorded digests), when
    the index was built with an adapter whose folder is gone, or when the dimensions disagree.
    """
    recorded = index.manifest.get("adapter") or {}
    if use_adapter and adapter is None and recorded:
        path = recorded.get("path")
        if not path:
            raise ValueError(f"{index.path / MANIFEST}: the index was built with an in-memory {recorded.get('method')} adapter, "
                             "whose folder is not recorded; pass --adapter with it (saved), or --no-adapter.")
        if not Path(path).is_dir():
            raise FileNotFoundError(f"the index was built with the adapter {path}, which no longer exists; pass --adapter or --no-adapter.")
        adapter = path
    if not use_adapter or adapter is None:
        return vectors
    compressor = load_compressor(adapter)
    if recorded:
        check_adapter(index.manifest, index.path / MANIFEST, adapter, compressor)
    return compressor.transform(vectors)


def search_texts(index_dir: str | Path, queries: list[str], model: str | None = None, adapter: str | Path | None = None,
                 use_adapter: bool = True, top_k: int = 10, query_prompt: str = "", rescore: str | None = None,
                 show_progress: bool = False) -> list[list[dict[str, Any]]]:
    """Encode ``queries`` with ``model`` (+ adapter) and return the hits of the index for each."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"--top-k must be an integer >= 1 (hits per query); got {top_k!r}.")
    index = load_index(index_dir)
    model = model or index.manifest.get("model") or "minilm"
    if use_adapter and adapter is not None:
        load_compressor(adapter)  # a bad adapter fails before any encoding
    encoder = SentenceEncoder(model, query_prompt=query_prompt, show_progress=show_progress)
    vectors = query_vectors(index, encoder.encode(queries, kind="query"), adapter, use_adapter)
    D, I = index.search(vectors, top_k, rescore_with=rescore)
    return index.hits(D, I)
