"""The plan folder on disk: what ``compress plan`` writes (:func:`write_plan`) and every deployment reads (:func:`load_plan`).

A plan folder::

    plan.json                 the choice, its validation scores, the frontier, the FAISS factory string,
                              the sha256 of every other file below and the digest of its own content
    compressor/               the fitted compressor (``load_compressor``)
    precision.json            the precision (name, rescoring candidates) and the dimension
    calibration.safetensors   int8 only: the per-dimension ranges, calibrated on the corpus
    calibration.json          the same ranges, readable
    codec.faiss               int4, RaBitQ, TurboQuant, faiss:FACTORY (PQ/OPQ peers) and the registered codecs
                              (klt-pq:32...): their trained FAISS tables (an index holding no vectors), trained on
                              the corpus the plan was made on
    frontier.png              quality against bytes on the validation queries (not checked: a picture)

A ``+refine<N>`` choice records field ``refine`` (:mod:`embedtune.index.refine`): the index built from the plan
keeps the original vectors beside the codes and rescores each query's top N with them; ``disk_bytes`` then counts
the original float32 vector too.

The format lives here, below the workflows that plan, so that ``index build --plan`` and the
exporters read a plan without importing the sweep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.compress import Compressor, load_compressor
from embedtune.index.codecs import (
    CALIBRATION_FILE,
    CALIBRATION_JSON,
    PRECISION_FILE,
    Calibration,
    Precision,
    QuantizedIndex,
    load_precision,
)
from embedtune.index.codecs.precision_registry import precision_file_names
from embedtune.index.refine import Refine, plan_refine
from embedtune.io import (
    IntegrityError,
    older_than_installed,
    read_json_verified,
    sha256_file,
    verify_sha256,
    write_json_with_digest,
)

__all__ = ["PLAN_FILE", "COMPRESSOR_DIR", "PLAN_FIX", "write_plan", "load_plan", "plan_files", "index_kind"]

PLAN_FILE = "plan.json"
COMPRESSOR_DIR = "compressor"
PLAN_FIX = "The plan folder was damaged or edited after `embedtune compress plan` wrote it; write it again with `embedtune compress plan`."


#: How far (max abs difference) the plan's vectors may be from those a prebuilt index was trained on.
PREBUILT_TOLERANCE = 1e-6


def write_plan(out: str | Path, compressor: Compressor, precision: Precision, doc_embeddings: np.ndarray, plan: dict[str, Any],
               prebuilt: QuantizedIndex | None = None, refine: Refine | None = None) -> dict[str, Any]:
    """Write the deployable folder: ``compressor/``, ``precision.json`` (+ int8 calibration), ``plan.json`` (last).

    ``plan.json`` carries the sha256 of every other file of the plan (``files_sha256``), the digest of
    the compressor's fitted state, and the digest of its own content; :func:`load_plan` checks them all.
    The int8 ranges are calibrated on ``doc_embeddings`` through the compressor.

    ``prebuilt`` is an index of ``precision`` that the caller already built on ``doc_embeddings``
    themselves (a plan's sweep trains the FAISS PQ/OPQ peers of the uncompressed vectors, minutes
    each on a small CPU). It is used only when the compressor leaves ``doc_embeddings`` unchanged to
    within :data:`PREBUILT_TOLERANCE` (the frozen choice: it renormalises unit rows, which moves their
    last bits) and the index holds every one of them; otherwise the index is built here. The plan then
    ships the very tables its sweep scored.

    ``refine``: the choice rescores its top candidates with the original vectors (a ``+refine<N>`` setting),
    recorded as field ``refine``; its disk bytes count the original float32 vector.
    """
    out = Path(out)
    compressor.save(out / COMPRESSOR_DIR)
    source = np.ascontiguousarray(doc_embeddings, dtype=np.float32)
    docs = compressor.transform(source)
    # faiss:FACTORY (a PQ/OPQ peer) too: its tables are trained here, once, so the exported model's
    # codes and `index build --plan`'s index share one codebook (FAISS's k-means is seeded: the same
    # corpus gives the same tables).
    if prebuilt is not None and _prebuilt_fits(prebuilt, precision, docs, source):
        index = prebuilt
    else:
        index = QuantizedIndex.build(docs, precision)
    index.save_precision(out)
    for stale in precision_file_names():  # left by an earlier plan of another precision
        if stale not in precision.precision_codec.files:
            (out / stale).unlink(missing_ok=True)
    ram = precision.ram_bytes(docs.shape[1])
    plan = {**plan, "precision": precision.to_dict(), "dim": int(docs.shape[1]), "faiss_factory": precision.factory,
            "ram_bytes": ram, "disk_bytes": refine.disk_bytes(ram) if refine is not None else precision.disk_bytes(docs.shape[1]),
            **({"refine": refine.to_dict()} if refine is not None else {}),
            "index_kind": index_kind(precision), "compressor_state_sha256": compressor.state_sha256(),
            "files_sha256": {name: sha256_file(out / name) for name in plan_files(out)}}
    write_json_with_digest(out / PLAN_FILE, plan)
    return plan


def _prebuilt_fits(index: QuantizedIndex, precision: Precision, docs: np.ndarray, source: np.ndarray) -> bool:
    """Whether ``index`` (built on ``source``) is the index of ``precision`` that ``docs`` would get."""
    if not (index.precision.name == precision.name and index.dim == docs.shape[1] and index.backend is not None
            and int(index.backend.ntotal) == len(docs) and docs.shape == source.shape):
        return False
    return all(float(np.abs(docs[start : start + 65536] - source[start : start + 65536]).max(initial=0.0)) <= PREBUILT_TOLERANCE
               for start in range(0, len(docs), 65536))


def plan_files(out: Path) -> list[str]:
    """The files of a plan folder that ``plan.json`` records digests of (relative POSIX paths)."""
    names = [PRECISION_FILE, *precision_file_names(), f"{COMPRESSOR_DIR}/config.json", f"{COMPRESSOR_DIR}/model.safetensors"]
    return [name for name in names if (out / name).is_file()]


def index_kind(precision: Precision) -> str:
    """What ``embedtune index build --kind`` builds for this precision.

    A registered codec's kind is its name (``klt-pq:32``): no ``index_factory`` string makes it, so
    only ``index build --plan`` builds it, from the plan's trained ``codec.faiss``.
    """
    return precision.precision_codec.index_kind


def load_plan(directory: str | Path) -> tuple[dict[str, Any], Compressor, Precision, Calibration | None]:
    """Read a plan folder: ``(plan, compressor, precision, calibration)``, every file checked first.

    ``plan.json``'s own digest, the sha256 of every file it lists, the compressor's fitted state, and
    the agreement of the files with each other (precision, dimension, index kind, FAISS factory,
    bytes, calibration ranges) are checked; any failure is an error naming the file and the field.
    """
    directory = Path(directory)
    path = directory / PLAN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {PLAN_FILE}; write a plan with `embedtune compress plan --out {directory}`.")
    plan, verified = read_json_verified(path, PLAN_FIX)
    if not verified or not isinstance(plan.get("files_sha256"), dict):
        if verified or not older_than_installed(plan.get("embedtune_version")):
            missing = "files_sha256" if verified else "content_sha256"
            raise IntegrityError(f"{path}: field {missing!r} is missing, which embedtune {plan.get('embedtune_version', '(no version stamp)')} "
                                 f"always writes. {PLAN_FIX}")
        raise IntegrityError(f"{path}: written by embedtune {plan.get('embedtune_version')} without file digests, so its files cannot "
                             "be checked; write the plan again with `embedtune compress plan`.")
    recorded = plan["files_sha256"]
    expected_files = set(plan_files(directory)) | {PRECISION_FILE, f"{COMPRESSOR_DIR}/config.json", f"{COMPRESSOR_DIR}/model.safetensors"}
    unlisted = sorted(expected_files - set(recorded))
    if unlisted:
        raise IntegrityError(f"{directory / unlisted[0]}: not listed in {path} field 'files_sha256', so it is not this plan's. {PLAN_FIX}")
    for name, digest in sorted(recorded.items()):
        if name not in expected_files or not isinstance(digest, str):
            raise IntegrityError(f"{path}: field 'files_sha256' lists {name!r}, which is not a file of a plan folder. {PLAN_FIX}")
        verify_sha256(directory / name, digest, PLAN_FIX)
    precision, calibration = load_precision(directory)
    compressor = load_compressor(directory / COMPRESSOR_DIR)
    _check_plan_agrees(directory, plan, compressor, precision, calibration)
    return plan, compressor, precision, calibration


def _check_plan_agrees(directory: Path, plan: dict[str, Any], compressor: Compressor, precision: Precision,
                       calibration: Calibration | None) -> None:
    """The plan's files describe one deployment: the same precision, dimension, index kind, factory, bytes and compressor."""
    path = directory / PLAN_FILE

    def refuse(field: str, said: Any, actual: Any, source: str) -> None:
        raise IntegrityError(f"{path}: field {field!r} is {said!r} but {source} says {actual!r}. {PLAN_FIX}")

    values = json.loads((directory / PRECISION_FILE).read_text(encoding="utf-8"))
    dim = compressor.output_dim
    planned = plan.get("precision") if isinstance(plan.get("precision"), dict) else {}
    if planned.get("name") != precision.name:
        refuse("precision.name", planned.get("name"), precision.name, str(directory / PRECISION_FILE))
    if plan.get("dim") != dim:
        refuse("dim", plan.get("dim"), dim, f"{directory / COMPRESSOR_DIR} (its output dimension)")
    if values.get("dim") != dim:
        raise IntegrityError(f"{directory / PRECISION_FILE}: field 'dim' is {values.get('dim')!r} but the compressor outputs {dim}. {PLAN_FIX}")
    try:
        refine = plan_refine(plan, str(path))
    except ValueError as error:
        raise IntegrityError(f"{error} {PLAN_FIX}") from None
    if refine is not None and refine.original_dim != compressor.input_dim_:
        refuse("refine.original_dim", refine.original_dim, compressor.input_dim_, f"{directory / COMPRESSOR_DIR} (its input dimension)")
    disk_bytes = refine.disk_bytes(precision.ram_bytes(dim)) if refine is not None else precision.disk_bytes(dim)
    for field, actual, source in (("index_kind", index_kind(precision), "its precision"), ("faiss_factory", precision.factory, "its precision"),
                                  ("ram_bytes", precision.ram_bytes(dim), "its precision and dimension"),
                                  ("disk_bytes", disk_bytes, "its precision, dimension and refinement"),
                                  ("compressor_state_sha256", compressor.state_sha256(), f"{directory / COMPRESSOR_DIR}")):
        if plan.get(field) != actual:
            refuse(field, plan.get(field), actual, source)
    files = precision.precision_codec.files
    if (CALIBRATION_FILE in files) != (calibration is not None):
        raise IntegrityError(f"{directory}: precision {precision.name} {'needs' if CALIBRATION_FILE in files else 'has no use for'} "
                             f"{CALIBRATION_FILE}. {PLAN_FIX}")
    for name in precision_file_names():
        if name not in (CALIBRATION_FILE, CALIBRATION_JSON) and (directory / name).is_file() and name not in files:
            raise IntegrityError(f"{directory}: precision {precision.name} has no use for {name}. {PLAN_FIX}")
    missing = [name for name in files if not (directory / name).is_file()]
    tables = precision.precision_codec.tables_file
    if tables in files and (directory / tables).is_file() and missing:
        raise IntegrityError(f"{directory}: precision {precision.name} needs {', '.join(missing)} beside {tables}. {PLAN_FIX}")
    if calibration is not None:
        if calibration.dim != dim:
            raise IntegrityError(f"{directory / CALIBRATION_FILE}: {calibration.dim} ranges for {dim} dimensions. {PLAN_FIX}")
        readable = json.loads((directory / CALIBRATION_JSON).read_text(encoding="utf-8")) if (directory / CALIBRATION_JSON).is_file() else None
        if readable is not None and (not np.array_equal(np.asarray(readable.get("vmin"), np.float32), calibration.vmin)
                                     or not np.array_equal(np.asarray(readable.get("vmax"), np.float32), calibration.vmax)):
            raise IntegrityError(f"{directory / CALIBRATION_FILE}: its ranges differ from {directory / CALIBRATION_JSON}'s. {PLAN_FIX}")
