"""Export a plan as a sentence-transformers folder that carries its precision (``compress export --plan``).

:func:`export_plan` writes the base model followed by the plan's compressor
(:func:`embedtune.compress.st_export.export_sentence_transformer`) and, in its
``embedtune_precision/`` subfolder, the planned precision with every parameter the plan fitted on
the corpus: the int8 ranges (``calibration.safetensors`` and ``.json``), or the trained FAISS
tables of int4, RaBitQ and TurboQuant (``codec.faiss``). The deployed codes of new texts are then
one call, with those parameters and never per-batch ranges::

    from sentence_transformers import SentenceTransformer
    from embedtune.index.codecs import DeployedCodec

    model = SentenceTransformer("model-dive-int8")
    codes = DeployedCodec.load("model-dive-int8").encode(model.encode(texts))

The folder still loads with plain ``SentenceTransformer(out)``; the subfolder is ignored there.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from embedtune.compress import Compressor
from embedtune.compress.st_export import export_sentence_transformer
from embedtune.index.codecs import PRECISION_SUBFOLDER, Calibration, DeployedCodec, Precision, read_codec_index
from embedtune.index.plan_format import load_plan

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

__all__ = ["export_plan", "plan_codec"]


def plan_codec(plan: str | Path) -> DeployedCodec:
    """The :class:`DeployedCodec` of a plan folder, every file checked first (:func:`load_plan`)."""
    plan = Path(plan)
    _, compressor, precision, calibration = load_plan(plan)
    return _codec(plan, compressor, precision, calibration)


def _codec(plan: Path, compressor: Compressor, precision: Precision, calibration: Calibration | None) -> DeployedCodec:
    trained = None
    if precision.uses_factory:
        tables = precision.precision_codec.tables_file
        if not (plan / tables).is_file():  # faiss: peers were trained at index build before plans kept their tables
            raise FileNotFoundError(f"{plan}: precision {precision.name!r} needs {tables} (its trained tables), which plans "
                                    "written by an older embedtune lack; write the plan again with `embedtune compress plan`, or "
                                    f"export the compressor alone with `compress export --adapter {plan / 'compressor'}`.")
        trained = read_codec_index(plan, precision, compressor.output_dim)
    return DeployedCodec(precision, compressor.output_dim, calibration, trained)


def export_plan(
    plan: str | Path,
    base_model: "SentenceTransformer | str",
    out_dir: str | Path,
    overwrite: bool = False,
    inputs: Sequence[str | os.PathLike] = (),
) -> Path:
    """Write ``base_model`` + the plan's compressor as a sentence-transformers folder with the planned precision in ``embedtune_precision/``.

    Args:
        plan: a plan folder (``embedtune compress plan --out``).
        base_model: the model the plan's vectors came from (a loaded ``SentenceTransformer`` or a name/path).
        out_dir, overwrite, inputs: as in :func:`~embedtune.compress.st_export.export_sentence_transformer`
            (the plan folder is an input too).

    Returns:
        ``out_dir`` as a Path.
    """
    plan = Path(plan)
    _, compressor, precision, calibration = load_plan(plan)
    codec = _codec(plan, compressor, precision, calibration)
    return export_sentence_transformer(compressor, base_model, out_dir, overwrite=overwrite, inputs=[*inputs, plan],
                                       extra_files=lambda staging: codec.save(staging / PRECISION_SUBFOLDER,
                                                                              compressor_state_sha256=compressor.state_sha256()))
