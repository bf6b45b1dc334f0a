"""Encode a whole corpus into resumable ``.npy`` shards, here or on a Ray cluster (``embedtune embed-corpus``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embedtune.compress.ray_apply import ray_session
from embedtune.data.beir import document_text, load_beir_corpus
from embedtune.data.query_files import read_query_file
from embedtune.encoders.ray_encode import encode_sharded, encode_sharded_ray

__all__ = ["encode_corpus"]


def encode_corpus(
    data: str | Path,
    model: str,
    out: str | Path,
    *,
    shard_size: int = 50_000,
    ray_actors: int = 0,
    ray_address: str | None = None,
    cpus_per_actor: float = 1.0,
    gpus_per_actor: float = 0.0,
    threads_per_actor: int | None = None,
    kind: str = "document",
    prompt: str = "",
    **encoder_options: Any,
) -> dict[str, Any]:
    """Encode every document of ``data`` (a BEIR folder or a ``corpus.jsonl``) into shards under ``out``.

    ``ray_actors=0`` encodes in this process; ``N > 0`` starts (or joins, with ``ray_address``,
    e.g. ``"auto"`` on a cluster node) Ray and runs an actor pool of ``N`` encoders. Either way a
    rerun skips complete shards. Returns the shard manifest (rows, shards, seconds, backend).

    ``kind="query"``: ``data`` is a query file (JSONL ``{"_id", "text"}`` or TSV ``id<TAB>text``,
    :func:`~embedtune.data.query_files.read_query_file`), encoded as queries. ``prompt`` is
    prepended to every text: the model's query or document prompt, as ``kind`` says.
    """
    if kind not in ("document", "query"):
        raise ValueError(f"kind must be 'document' or 'query'; got {kind!r}.")
    if kind == "query":
        queries = read_query_file(data)
        ids, texts = [qid for qid, _ in queries], [text for _, text in queries]
    else:
        corpus = load_beir_corpus(data).corpus
        ids = list(corpus)
        texts = [document_text(corpus[doc_id]) for doc_id in ids]
    if prompt:
        encoder_options[f"{kind}_prompt"] = prompt
    if ray_actors <= 0:
        return encode_sharded(ids, texts, model, out, shard_size=shard_size, kind=kind, **encoder_options)
    with ray_session(ray_address):  # joins the cluster, or starts a local Ray for this call and stops it after
        return encode_sharded_ray(ids, texts, model, out, shard_size=shard_size, kind=kind, actors=ray_actors, num_cpus=cpus_per_actor,
                                  num_gpus=gpus_per_actor, threads_per_actor=threads_per_actor, **encoder_options)
