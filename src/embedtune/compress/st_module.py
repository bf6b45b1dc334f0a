"""A sentence-transformers module that runs any embedtune compressor with a torch forward.

Exported folders normally do not need it: :func:`embedtune.compress.st_export.export_sentence_transformer`
writes DIVE as built-in sentence-transformers modules, which load anywhere. This module is the
fallback for compressors without such a translation. sentence-transformers >= 6 imports a
module class outside its own namespace only with ``trust_remote_code=True``, so a folder that
uses it loads with ``SentenceTransformer(path, trust_remote_code=True)`` (embedtune installed).
"""

from __future__ import annotations

from typing import Any

import torch
from sentence_transformers.base.modules.module import Module

from embedtune.compress.base import Compressor
from embedtune.compress.registry import load_compressor

__all__ = ["CompressorModule"]


class CompressorModule(Module):
    """Maps ``features["sentence_embedding"]`` (batch, d) to the compressed (batch, k) embedding.

    The compressor is saved in the module folder with its own ``save(dir)`` (``config.json`` and
    ``model.safetensors``) and loaded back with :func:`embedtune.compress.load_compressor`.
    """

    config_keys: list[str] = []

    def __init__(self, compressor: Compressor) -> None:
        super().__init__()
        builder = getattr(compressor, "torch_module", None)
        if builder is None:
            raise NotImplementedError(
                f"{type(compressor).__name__} ({compressor.method!r}) has no torch_module(), so it cannot run inside "
                "a sentence-transformers model yet; apply it to embeddings with compressor.transform(...) instead."
            )
        self.compressor = compressor
        self.encoder = builder()  # registered as a submodule, so .to(device) moves it

    def forward(self, features: dict[str, torch.Tensor | Any], **kwargs: Any) -> dict[str, torch.Tensor | Any]:
        embedding = features["sentence_embedding"]
        features["sentence_embedding"] = self.encoder(embedding.float()).to(embedding.dtype)
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.compressor.output_dim)

    def get_config_dict(self) -> dict[str, Any]:
        return {"method": self.compressor.method}

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.compressor.save(output_path)

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ) -> "CompressorModule":
        path = cls.load_dir_path(
            model_name_or_path,
            subfolder=subfolder,
            token=token,
            cache_folder=cache_folder,
            revision=revision,
            local_files_only=local_files_only,
        )
        return cls(load_compressor(path))
