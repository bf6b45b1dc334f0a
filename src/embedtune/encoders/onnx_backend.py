"""Encode with ONNX Runtime on a CPU: the model's transformer as an exported graph, the rest as the model says.

:class:`OnnxSentenceModel` stands in for a :class:`sentence_transformers.SentenceTransformer` in
:class:`~embedtune.encoders.SentenceEncoder` (``backend="onnx"`` or ``"onnx-int8"``). Per batch:

1. the model's own preprocessing tokenises (its tokenizer, ``max_seq_length`` truncation, padding);
2. ONNX Runtime runs the exported transformer (:mod:`embedtune.encoders.onnx_export`): token embeddings;
3. the model's remaining sentence-transformers modules (Pooling with its mode, mean, CLS or last
   token; Dense; Normalize) run on them as in ``SentenceTransformer.encode``, then the optional
   L2 normalisation.

The sentence-transformers model is loaded without its transformer weights (meta device): the
graph holds them. fp32 vectors match ``SentenceTransformer.encode`` to about 1e-7
(tests/test_onnx_backend.py checks 1e-5); int8 vectors do not, their quality is measured in
benchmarks/RESULTS.md, "CPU encoding backends". Threads: ONNX Runtime uses as many intra-op
threads as torch is set to (``embedtune --threads``, one budget for every library).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np

from embedtune.encoders.onnx_export import (
    OnnxGraph,
    Precision,
    exported_graph,
    load_sentence_transformer,
    require_onnxruntime,
    session_options,
)

logger = logging.getLogger(__name__)

__all__ = ["BACKENDS", "Backend", "OnnxSentenceModel", "backend_precision", "check_backend"]

Backend = Literal["torch", "onnx", "onnx-int8"]
BACKENDS: tuple[str, ...] = ("torch", "onnx", "onnx-int8")
_PRECISION: dict[str, Precision] = {"onnx": "fp32", "onnx-int8": "int8"}


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}.")
    return backend


def backend_precision(backend: str) -> str:
    """``fp32`` for ``torch`` and ``onnx``, ``int8`` for ``onnx-int8``."""
    return _PRECISION.get(check_backend(backend), "fp32")


class OnnxSentenceModel:
    """The subset of ``SentenceTransformer`` that :class:`~embedtune.encoders.SentenceEncoder` calls, on ONNX Runtime.

    Args:
        model_path: a local sentence-transformers folder.
        fingerprint: its file hash (keys the graph cache).
        precision: ``fp32`` or ``int8``.
        model_name: how errors and logs name the model (the alias or path the user gave).
        max_seq_length: overrides the model's own.
        threads: ONNX Runtime intra-op threads; default: torch's current setting.
    """

    def __init__(self, model_path: str, fingerprint: str, precision: Precision = "fp32", *, model_name: str | None = None,
                 max_seq_length: int | None = None, threads: int | None = None, graph_root: str | None = None) -> None:
        onnxruntime = require_onnxruntime()
        self.model_name = model_name or str(model_path)
        self.graph: OnnxGraph = exported_graph(model_path, fingerprint, precision, self.model_name, graph_root)
        self.modules = load_sentence_transformer(model_path, weights=False)
        if any(p.device.type == "meta" for module in list(self.modules)[1:] for p in module.parameters()):
            # A module with weights after the transformer (Dense): load them all, then drop the transformer's.
            self.modules = load_sentence_transformer(model_path)
            self.modules[0].to("meta")
        if max_seq_length is not None:
            self.modules.max_seq_length = max_seq_length
        self.after = list(self.modules)[1:]
        if threads is None:
            import torch

            threads = torch.get_num_threads()
        self.session = onnxruntime.InferenceSession(str(self.graph.path), session_options(onnxruntime, threads),
                                                    providers=["CPUExecutionProvider"])
        self.precision = precision

    @property
    def max_seq_length(self) -> int | None:
        return self.modules.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int | None) -> None:
        self.modules.max_seq_length = value

    def get_sentence_embedding_dimension(self) -> int | None:
        return self.modules.get_sentence_embedding_dimension()

    def encode(self, sentences: list[str], batch_size: int = 32, convert_to_numpy: bool = True, normalize_embeddings: bool = False,
               show_progress_bar: bool = False, **_: Any) -> np.ndarray:
        """float32 ``(len(sentences), d)``, as ``SentenceTransformer.encode`` returns (batches in the given order)."""
        import torch

        blocks = []
        for lo in range(0, len(sentences), batch_size):
            features = self.modules.preprocess(list(sentences[lo : lo + batch_size]))
            feeds = {name: features[name].numpy() for name in self.graph.input_names}
            tokens = self.session.run(None, feeds)[0]  # (batch, sequence, hidden)
            state: dict[str, Any] = {**features, "token_embeddings": torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.float32))}
            with torch.inference_mode():
                for module in self.after:
                    state = module(state)
                vectors = state["sentence_embedding"].float()  # (batch, d)
                if normalize_embeddings:
                    vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
            blocks.append(vectors.numpy())
        if not blocks:
            return np.zeros((0, self.get_sentence_embedding_dimension() or 0), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(blocks), dtype=np.float32)
