"""Export a fitted compressor as part of a sentence-transformers model folder.

The compressor is appended after the base model's last module (after ``Pooling``, and after
``Normalize`` when the base has one), so ``SentenceTransformer(out_dir).encode(texts)`` equals
``compressor.transform(base.encode(texts))`` up to float rounding.

Every registered method describes its fitted map as plain layers
(:meth:`~embedtune.compress.base.Compressor.export_layers`, see
:mod:`embedtune.compress.export_layers`), written as sentence-transformers' built-in ``Dense`` and
``Normalize`` modules, so the folder loads with plain ``SentenceTransformer(out_dir)``, without
``trust_remote_code`` and without embedtune. The one exception is DIVE with
``output_norm='input'``: scaling the output by the input's norm has no built-in module.

A map without such layers goes through :class:`embedtune.compress.st_module.CompressorModule`,
which needs ``trust_remote_code=True`` to load on sentence-transformers >= 6.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from embedtune.compress.base import Compressor
from embedtune.compress.export_layers import ExportLayer, NormalizeLayer
from embedtune.io import OUT_SPACE_FIX, current_umask, writing
from embedtune.outputs import OutputExistsError, finish_output_dir, prepare_output_dir

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

__all__ = ["export_sentence_transformer", "builtin_modules", "COMPRESSOR_SUBFOLDER"]

# The compressor's own save(dir) is kept next to the s-t modules, so it can be reloaded as is.
COMPRESSOR_SUBFOLDER = "embedtune_compressor"
MODULE_FORMATS = ("auto", "builtin", "embedtune")
EXPORT_COMMAND = "compress export"


def export_sentence_transformer(
    compressor: Compressor,
    base_model: "SentenceTransformer | str",
    out_dir: str | Path,
    module_format: Literal["auto", "builtin", "embedtune"] = "auto",
    overwrite: bool = False,
    inputs: Sequence[str | os.PathLike] = (),
    extra_files: Callable[[Path], object] | None = None,
) -> Path:
    """Write ``base_model`` followed by ``compressor`` as a sentence-transformers folder.

    Args:
        compressor: a fitted compressor whose input dimension is the base model's output.
        base_model: a loaded ``SentenceTransformer`` (not modified) or a name/path to load.
        out_dir: the folder to write; it must not exist unless ``overwrite``.
        module_format: ``"builtin"`` (built-in s-t modules, loads without ``trust_remote_code``;
            for methods that provide them, e.g. DIVE), ``"embedtune"`` (one ``CompressorModule``,
            loads with ``trust_remote_code=True``), or ``"auto"`` (builtin when possible).
        overwrite: replace what an earlier embedtune run wrote in ``out_dir`` (recognised by its
            ``.embedtune-output.json`` marker); other files there are kept, and a folder without
            a marker is refused (see :func:`embedtune.outputs.prepare_output_dir`).
        inputs: files or folders the export reads (e.g. the adapter's folder); a path
            ``base_model`` is added. ``overwrite`` refuses to remove them.
        extra_files: called with the folder being written, before it is moved into ``out_dir``, to
            add files that travel with the model (e.g. a plan's precision:
            :func:`embedtune.index.plan_export.export_plan`), so they appear with it or not at all.

    Returns:
        ``out_dir`` as a Path.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize

    from embedtune.compress.st_module import CompressorModule  # heavy optional dependency: sentence-transformers

    if module_format not in MODULE_FORMATS:
        raise ValueError(f"module_format must be one of {list(MODULE_FORMATS)}; got {module_format!r}.")
    compressor._check_fitted()
    out_dir = Path(out_dir)
    inputs = [*inputs, *([base_model] if isinstance(base_model, (str, os.PathLike)) else [])]
    # Refused now, before the build; nothing is removed until the new model is ready.
    prepare_output_dir(out_dir, overwrite, inputs=inputs, command=EXPORT_COMMAND, check_only=True)
    if isinstance(base_model, (str, os.PathLike)):
        base_model = SentenceTransformer(str(base_model), device="cpu")
    base_dim = base_model.get_embedding_dimension()
    if base_dim is not None and base_dim != compressor.input_dim_:
        raise ValueError(
            f"the base model outputs {base_dim}-d embeddings but the compressor was fitted on {compressor.input_dim_}-d input; "
            "export it with the model whose embeddings it was trained on."
        )

    model = copy.deepcopy(base_model).to("cpu")
    builtin = None
    if module_format != "embedtune":
        input_is_normalized = isinstance(model[-1], Normalize)
        builtin = compressor.sentence_transformer_modules(input_is_normalized=input_is_normalized)
        if builtin is None:
            layers = compressor.export_layers()
            builtin = None if layers is None else builtin_modules(layers, input_is_normalized)
    if builtin is None and module_format == "builtin":
        raise ValueError(
            f"module_format='builtin': {compressor.method!r} (with these settings) has no built-in sentence-transformers form; "
            "use 'embedtune' (or 'auto'). Every registered method has one except DIVE with output_norm='input'."
        )
    # An empty list is a built-in form too: e.g. frozen on a base that already normalises.
    modules = list(builtin) if builtin is not None else [CompressorModule(compressor)]
    # Fitted (and scored) on unit rows: the exported model normalises before the compressor, as
    # compressor.transform does, unless the base already ends with Normalize or the map starts with one.
    if compressor.input_normalization_ == "unit" and not isinstance(model[-1], Normalize) and not (modules and isinstance(modules[0], Normalize)):
        modules.insert(0, Normalize())
    for module in modules:
        model.append(module)

    # Write next to the target, then move it in, so a crash leaves no half-written model.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    staging.chmod(0o777 & ~current_umask())  # mkdtemp makes it 0700: the model would be unreadable to others
    try:
        # sentence-transformers and safetensors report a full disk in their own words (a SafetensorError, a
        # RuntimeError): one error naming the folder and the fix instead.
        with writing(out_dir, OUT_SPACE_FIX, staging=staging):
            model.save(str(staging))
            compressor.save(staging / COMPRESSOR_SUBFOLDER)
            if extra_files is not None:
                extra_files(staging)
        _umask_modes(staging)  # safetensors writes its weights 0600, whatever the umask
        if not out_dir.exists():
            os.replace(staging, out_dir)
        else:
            prepare_output_dir(out_dir, overwrite, inputs=inputs, command=EXPORT_COMMAND)
            clashes = [entry.name for entry in staging.iterdir() if (out_dir / entry.name).exists()]
            if clashes:
                raise OutputExistsError(f"{out_dir}: holds {', '.join(sorted(clashes))}, which embedtune did not write and the "
                                        "exported model needs; move them away or choose another folder.")
            for entry in staging.iterdir():
                os.replace(entry, out_dir / entry.name)
            staging.rmdir()
        finish_output_dir(out_dir, EXPORT_COMMAND)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.debug("exported %s + %s to %s", type(base_model).__name__, compressor.method, out_dir)
    return out_dir


def _umask_modes(folder: Path) -> None:
    """Give every file and folder below ``folder`` the permissions the umask allows (``0666``/``0777 & ~umask``)."""
    mask = current_umask()
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(Path(root) / name, 0o777 & ~mask)
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                os.chmod(path, 0o666 & ~mask)


def builtin_modules(layers: Sequence[ExportLayer], input_is_normalized: bool) -> "list[torch.nn.Module]":
    """sentence-transformers ``Dense``/``Normalize`` modules running ``layers``.

    A leading :class:`~embedtune.compress.export_layers.NormalizeLayer` is dropped when the base
    model already ends with ``Normalize`` (its rows are unit already).
    """
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    from embedtune.compress.residual_mlp import ACTIVATIONS

    layers = list(layers)
    if input_is_normalized and layers and isinstance(layers[0], NormalizeLayer):
        layers = layers[1:]
    modules: list[torch.nn.Module] = []
    for layer in layers:
        if isinstance(layer, NormalizeLayer):
            modules.append(Normalize())
            continue
        activation = None if layer.activation is None else ACTIVATIONS[layer.activation]()
        dense = Dense(layer.in_features, layer.out_features, bias=layer.bias is not None, activation_function=activation,
                      use_residual=layer.residual is not None)
        with torch.no_grad():
            dense.linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(layer.weight, dtype=np.float32)))
            if layer.bias is not None:
                dense.linear.bias.copy_(torch.from_numpy(np.ascontiguousarray(layer.bias, dtype=np.float32)))
            if layer.residual is not None:
                dense.residual.weight.copy_(torch.from_numpy(np.ascontiguousarray(layer.residual, dtype=np.float32)))
        modules.append(dense)
    return modules
