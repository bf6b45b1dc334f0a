"""Build the index a plan folder describes (``embedtune index build --plan DIR``).

A plan (``embedtune compress plan``, :func:`embedtune.workflows.plan.run_plan`) fixes the
compressor, the dimension and the precision, with the int8 calibration ranges fitted on the
corpus it was planned on. :func:`build_planned_index` streams the embeddings through the plan's
compressor into the matching index kind, reusing those ranges (so nothing is re-calibrated), and
records the plan in the manifest, so ``search`` rescores binary candidates as planned.

==================  =========================================================
plan precision      index
==================  =========================================================
float32             ``flat`` (exact)
float16             ``SQfp16``
int8                ``sq8`` with the plan's ``calibration.safetensors`` ranges
binary              ``binary`` (Hamming)
binary-asym         ``binary``; search rescores candidates as float · ±1
binary-rescore      ``binary`` + ``vectors.npy``; search rescores in float32
int4                ``SQ4`` with the plan's trained ranges (``codec.faiss``)
rabitq1, rabitq4    ``RaBitQ``, ``RaBitQ4`` with the plan's centroid (``codec.faiss``)
rabitq1-rescore     ``RaBitQ`` + ``vectors.npy``; search rescores in float32
turboquant1, 4      ``SQtqmse1``, ``SQtqmse4`` (``codec.faiss``)
faiss:FACTORY       ``FACTORY``
P+refineN           P's index + ``original_vectors.npy`` (the input vectors, before the
                    compressor); search rescores P's top N with them
==================  =========================================================
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedtune.compress.ray_apply import RayPool
from embedtune.encoders.precomputed import PRECOMPUTED_MODEL
from embedtune.encoders.recipe import recipe_beside
from embedtune.index.codecs import read_codec_index, registered_precisions
from embedtune.index.store import build_index
from embedtune.index.plan_format import load_plan
from embedtune.index.refine import plan_refine

__all__ = ["build_planned_index", "RESCORE_OF"]

#: How each built-in precision that rescores its candidates rescores them (the codecs' ``rescore``; kept for callers of this name).
RESCORE_OF = {cls.precision_name: cls.rescore for cls in registered_precisions() if cls.precision_name and cls.rescore}


def _encoding_model(info: dict[str, Any]) -> str | None:
    """The model a plan's vectors came from, or None when they were the user's own (precomputed)."""
    model = info.get("model")
    return None if model in (None, PRECOMPUTED_MODEL) else str(model)


def build_planned_index(
    embeddings: str | Path,
    out: str | Path,
    plan: str | Path,
    ids: str | Path | list[str] | None = None,
    titles: dict[str, str] | None = None,
    model: str | None = None,
    chunk_size: int = 65536,
    id_column: str = "id",
    vector_column: str = "embedding",
    before_write: Callable[[], Any] | None = None,
    backend: str | None = None,
    ray: RayPool | None = None,
) -> Path:
    """Build the index folder of plan ``plan`` from uncompressed ``embeddings`` (``.npy`` + ``ids``, or parquet).

    Every file of the plan is checked against the digests ``plan.json`` recorded, and against the
    others, first (:func:`embedtune.index.plan_format.load_plan`): an edited index kind or int8 range
    would build another index than the one planned and scored. ``before_write`` and ``ray`` (a Ray actor pool
    for the adapter's transform): as in :func:`build_index`.
    """
    plan = Path(plan)
    info, _, precision, calibration = load_plan(plan)
    if info.get("index_kind") is None:
        raise ValueError(f"{plan / 'plan.json'}: field 'index_kind' is missing; write the plan again with `embedtune compress plan`.")
    recorded: dict[str, Any] = {
        "path": str(plan.resolve()),
        "setting": info["chosen"]["setting"],
        "precision": precision.name,
        "rescore": precision.rescore,
        "candidates": precision.candidates,
        "faiss_factory": info["faiss_factory"],
        "ram_bytes": info["ram_bytes"],
        "disk_bytes": info["disk_bytes"],
    }
    refine = plan_refine(info, str(plan / "plan.json"))
    if refine is not None:  # the codes find candidates, the original vectors (written beside the index) rank them
        recorded["refine"] = refine.to_dict()
    trained = None
    tables = precision.precision_codec.tables_file
    if precision.uses_factory and (plan / tables).is_file():  # int4, RaBitQ, the codecs: the trained tables the plan scored, not a refit
        trained = read_codec_index(plan, precision, int(info["dim"]))
        recorded["codec"] = tables
    ranges = None
    if calibration is not None:
        ranges = (calibration.vmin, calibration.vmax)
        recorded["calibration"] = {"vmin": calibration.vmin.tolist(), "vmax": calibration.vmax.tolist()}
    return build_index(embeddings, out, ids=ids, adapter=plan / "compressor", kind=info["index_kind"], titles=titles,
                       model=model or (None if recipe_beside(embeddings) else _encoding_model(info)), backend=backend, chunk_size=chunk_size, keep_vectors=precision.rescores_float,
                       id_column=id_column, vector_column=vector_column, sq8_ranges=ranges, plan=recorded, before_write=before_write,
                       trained_index=trained, ray=ray, keep_original_vectors=refine is not None)
