"""Encode text with any sentence-transformers model, by alias or local path, offline.

The model is loaded lazily, so an embedding-cache hit never pays for loading it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from functools import cached_property
from pathlib import Path
from typing import Callable, Literal

import numpy as np

from embedtune.encoders.bundled import resolve_model_path
from embedtune.encoders.onnx_backend import OnnxSentenceModel, backend_precision, check_backend
from embedtune.encoders.onnx_export import exported_graph
from embedtune.runtime import progress_bar

logger = logging.getLogger(__name__)

_PLURAL = {"document": "documents", "query": "queries"}  # progress-bar labels

__all__ = ["SentenceEncoder", "fingerprint_model_dir"]

TextKind = Literal["query", "document"]


def fingerprint_model_dir(path: str | os.PathLike) -> str:
    """sha256 over every file's relative path and bytes: any change to the weights changes it."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts and p.name != ".complete"):
        digest.update(str(file.relative_to(root)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


class SentenceEncoder:
    """Wrap a :class:`sentence_transformers.SentenceTransformer` for retrieval encoding.

    Args:
        model: ``minilm``, ``mpnet``, a local model folder, or a hub id already in the local cache.
        max_seq_length: overrides the model's maximum sequence length.
        query_prompt: text prepended to every query (instruction models), e.g. ``"query: "``.
        document_prompt: text prepended to every document.
        batch_size: encoding batch size; s-t sorts texts by length within the call.
        normalize: L2-normalise the output rows (cosine = inner product).
        device: torch device; default lets sentence-transformers choose.
        show_progress: draw a progress bar while encoding (:func:`embedtune.encoders.embed_dataset`
            draws one bar over a whole corpus; ``embedtune --quiet`` hides every bar).
        backend: ``torch`` (sentence-transformers itself), ``onnx`` (ONNX Runtime, fp32: the same
            vectors to about 1e-7) or ``onnx-int8`` (dynamic int8: faster, other vectors); the ONNX
            ones need ``pip install "embedtune[onnx]"`` and run on the CPU
            (:mod:`embedtune.encoders.onnx_backend`).
    """

    def __init__(
        self,
        model: str = "minilm",
        *,
        max_seq_length: int | None = None,
        query_prompt: str = "",
        document_prompt: str = "",
        batch_size: int = 64,
        normalize: bool = True,
        device: str | None = None,
        show_progress: bool = True,
        backend: str = "torch",
    ) -> None:
        self.backend = check_backend(backend)
        if self.backend != "torch" and device not in (None, "cpu"):
            raise ValueError(f"--backend {backend} runs on the CPU only; got device {device!r}. Use --backend torch on a GPU.")
        self.model_name = str(model)
        self.model_path = resolve_model_path(model)
        self.max_seq_length_override = max_seq_length
        self.query_prompt = query_prompt
        self.document_prompt = document_prompt
        self.batch_size = batch_size
        self.normalize = normalize
        self.device = device
        self.show_progress = show_progress

    @cached_property
    def model(self):
        if self.backend != "torch":
            return OnnxSentenceModel(self.model_path, self.fingerprint, backend_precision(self.backend),  # type: ignore[arg-type]
                                     model_name=self.model_name, max_seq_length=self.max_seq_length_override)
        from sentence_transformers import SentenceTransformer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        model = SentenceTransformer(self.model_path, device=self.device, local_files_only=True)
        if self.max_seq_length_override is not None:
            model.max_seq_length = self.max_seq_length_override
        return model

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint_model_dir(self.model_path)

    @cached_property
    def max_seq_length(self) -> int | None:
        """The effective max length, read from the model's config so a cache lookup needs no model load."""
        if self.max_seq_length_override is not None:
            return self.max_seq_length_override
        import json

        config = Path(self.model_path) / "sentence_bert_config.json"
        if config.is_file():
            value = json.loads(config.read_text()).get("max_seq_length")
            if value is not None:
                return int(value)
        return self.model.max_seq_length

    def recipe(self, kind: TextKind) -> dict[str, object]:
        """Everything besides the model and the data that changes the vectors (the cache key).

        The ONNX backends add ``backend`` and ``precision``, so their vectors never share an entry
        with torch's or each other's; torch's recipe is unchanged, so its entries (and the vectors
        bundled for them) stay valid. ``onnx-int8`` also adds ``batch_size``: its dynamic
        quantisation sets each activation's int8 range from the whole batch, so the same text gets
        other vectors in other batches, and an entry made at one batch size must not serve another.
        It adds the sha256 of the int8 graph too: which quantisation recipe passed the graph's check
        (and what ONNX Runtime made of it) changes the vectors, and vectors encoded by a graph that
        has since been refused or rebuilt must never be served for the new one.
        """
        recipe: dict[str, object] = {
            "kind": kind,
            "text": "title + ' ' + text, stripped" if kind == "document" else "text",
            "prompt": self.document_prompt if kind == "document" else self.query_prompt,
            "max_seq_length": self.max_seq_length,
            "normalize": self.normalize,
        }
        if self.backend != "torch":
            recipe.update(backend=self.backend, precision=backend_precision(self.backend))
        if self.backend == "onnx-int8":
            recipe["batch_size"] = self.batch_size
            recipe["int8_graph_sha256"] = self.int8_graph_sha256
        return recipe

    @cached_property
    def int8_graph_sha256(self) -> str:
        """sha256 of the cached int8 graph of this model (built and checked on first use, as encoding would)."""
        return str(exported_graph(self.model_path, self.fingerprint, "int8", self.model_name).meta["sha256"])

    def encode(self, texts: list[str], kind: TextKind = "document", progress: Callable[[int], object] | None = None) -> np.ndarray:
        """Embed ``texts`` as ``kind``: float32 ``(len(texts), d)``, unit rows when ``normalize``.

        Args:
            progress: called with the number of texts of each finished batch, e.g. the ``update``
                of a bar the caller draws over a larger job. Without it, ``show_progress`` draws
                one bar over this call.
        """
        prompt = self.document_prompt if kind == "document" else self.query_prompt
        inputs = [prompt + text for text in texts] if prompt else list(texts)
        if not inputs:
            return np.zeros((0, self.model.get_sentence_embedding_dimension()), dtype=np.float32)
        options = dict(batch_size=self.batch_size, convert_to_numpy=True, normalize_embeddings=self.normalize)
        bar = None
        if progress is None:
            bar = progress_bar(len(inputs), f"encoding {_PLURAL[kind]}", unit="doc" if kind == "document" else "query", enabled=self.show_progress)
            progress = bar.update
        # The batches sentence-transformers would form (longest texts first, sorted over the whole
        # call), encoded one call each so that one labelled bar moves after every batch.
        order = np.argsort([-len(text) for text in inputs])
        vectors = np.empty((0, 0), dtype=np.float32)
        try:
            for lo in range(0, len(order), self.batch_size):
                rows = order[lo : lo + self.batch_size]
                batch = np.asarray(self.model.encode([inputs[i] for i in rows], show_progress_bar=False, **options), dtype=np.float32)
                if lo == 0:
                    vectors = np.empty((len(inputs), batch.shape[1]), dtype=np.float32)
                vectors[rows] = batch
                progress(len(rows))
        finally:
            if bar is not None:
                bar.close()
        return vectors

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts, "query")

    def encode_documents(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts, "document")
