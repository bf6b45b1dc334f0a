"""Export a fitted compressor as part of a sentence-transformers model folder.

The compressor is appended after the base model's last module (after ``Pooling``, and after
``Normalize`` when the base has one), so ``SentenceTransformer(out_dir).encode(texts)`` equals
``compressor.transform(base.encode(texts))`` up to float rounding.

DIVE is written with built-in modules only, so the folder loads with plain
``SentenceTransformer(out_dir)``, without ``trust_remote_code`` and without embedtune:

- ``Normalize`` (only when ``normalize_input`` and the base does not already end with one);
- ``Dense(d -> r + k, σ, use_residual=True)`` with weight ``[W1; 0]``, bias ``[b1; 0]`` and
  residual projection ``[0; I_k 0]``, which outputs ``[σ(W1 z + b1); z[:k]]`` exactly, since
  ``σ(0) = 0`` for every supported activation;
- ``Dense(r + k -> k, identity)`` with weight ``[W2[:k], I_k]`` and bias ``b2[:k]``, which
  gives head 1 of ``z + W2 σ(W1 z + b1) + b2``;
- ``Normalize``.

Other compressors go through :class:`embedtune.compress.st_module.CompressorModule`, which needs
``trust_remote_code=True`` to load on sentence-transformers >= 6.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from embedtune.compress.base import Compressor

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

__all__ = ["export_sentence_transformer", "COMPRESSOR_SUBFOLDER"]

# The compressor's own save(dir) is kept next to the s-t modules, so it can be reloaded as is.
COMPRESSOR_SUBFOLDER = "embedtune_compressor"
MODULE_FORMATS = ("auto", "builtin", "embedtune")


def _dive_builtin_modules(compressor: Compressor, input_is_normalized: bool) -> list[torch.nn.Module]:
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    from embedtune.compress.residual_mlp import ACTIVATIONS

    adapter = compressor.adapter_
    mlp = adapter.mlp
    k, d, r = adapter.dim, adapter.input_dim, mlp.up.out_features
    # Dense adds its input unprojected when in == out; one zero row keeps the projection.
    pad = 1 if r + k == d else 0
    width = r + k + pad
    with torch.no_grad():
        up_weight, up_bias = mlp.up.weight.detach().cpu(), mlp.up.bias.detach().cpu()
        down_weight, down_bias = mlp.down.weight.detach().cpu(), mlp.down.bias.detach().cpu()
        expand = Dense(d, width, activation_function=ACTIVATIONS[compressor.config.activation](), use_residual=True)
        expand.linear.weight.copy_(torch.cat([up_weight, torch.zeros(k + pad, d)]))  # (width, d)
        expand.linear.bias.copy_(torch.cat([up_bias, torch.zeros(k + pad)]))
        expand.residual.weight.copy_(torch.cat([torch.zeros(r, d), torch.eye(k, d), torch.zeros(pad, d)]))  # passes z[:k] through
        head = Dense(width, k, activation_function=None)
        head.linear.weight.copy_(torch.cat([down_weight[:k], torch.eye(k), torch.zeros(k, pad)], dim=1))  # (k, width)
        head.linear.bias.copy_(down_bias[:k])
    modules: list[torch.nn.Module] = []
    if adapter.normalize_input and not input_is_normalized:
        modules.append(Normalize())
    if adapter.rotation is not None:
        # init="pca": z ↦ zR is a bias-free Dense with weight Rᵀ.
        rotate = Dense(d, d, bias=False, activation_function=None)
        with torch.no_grad():
            rotate.linear.weight.copy_(adapter.rotation.detach().cpu().T)
        modules.append(rotate)
    return [*modules, expand, head, Normalize()]


def export_sentence_transformer(
    compressor: Compressor,
    base_model: "SentenceTransformer | str",
    out_dir: str | Path,
    module_format: Literal["auto", "builtin", "embedtune"] = "auto",
    overwrite: bool = False,
) -> Path:
    """Write ``base_model`` followed by ``compressor`` as a sentence-transformers folder.

    Args:
        compressor: a fitted compressor whose input dimension is the base model's output.
        base_model: a loaded ``SentenceTransformer`` (not modified) or a name/path to load.
        out_dir: the folder to write; it must not exist unless ``overwrite``.
        module_format: ``"builtin"`` (DIVE only: built-in s-t modules, loads without
            ``trust_remote_code``), ``"embedtune"`` (one ``CompressorModule``, loads with
            ``trust_remote_code=True``), or ``"auto"`` (builtin when possible).
        overwrite: replace an existing ``out_dir``.

    Returns:
        ``out_dir`` as a Path.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    from embedtune.compress.dive import DIVECompressor
    from embedtune.compress.st_module import CompressorModule

    if module_format not in MODULE_FORMATS:
        raise ValueError(f"module_format must be one of {list(MODULE_FORMATS)}; got {module_format!r}.")
    compressor._check_fitted()
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir}: folder exists and is not empty; pass overwrite=True or choose a new folder.")
    if isinstance(base_model, (str, os.PathLike)):
        base_model = SentenceTransformer(str(base_model), device="cpu")
    base_dim = base_model.get_embedding_dimension()
    if base_dim is not None and base_dim != compressor.input_dim_:
        raise ValueError(
            f"the base model outputs {base_dim}-d embeddings but the compressor was fitted on {compressor.input_dim_}-d input; "
            "export it with the model whose embeddings it was trained on."
        )

    is_dive = isinstance(compressor, DIVECompressor)
    if module_format == "builtin" and not is_dive:
        raise ValueError(f"module_format='builtin' supports DIVE only; use 'embedtune' for {compressor.method!r}.")
    if is_dive and compressor.config.output_norm != "unit":
        # Scaling by the input norm has no built-in sentence-transformers module.
        if module_format == "builtin":
            raise ValueError("module_format='builtin' needs DIVE with output_norm='unit'; use 'embedtune' (or 'auto') for output_norm='input'.")
        is_dive = False
    model = copy.deepcopy(base_model).to("cpu")
    if module_format != "embedtune" and is_dive:
        ends_normalized = isinstance(model[-1], Normalize)
        for module in _dive_builtin_modules(compressor, ends_normalized):
            model.append(module)
    else:
        model.append(CompressorModule(compressor))

    # Write next to the target, then swap it in, so a crash leaves no half-written model.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save(str(staging))
        compressor.save(staging / COMPRESSOR_SUBFOLDER)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("exported %s + %s to %s", type(base_model).__name__, compressor.method, out_dir)
    return out_dir
