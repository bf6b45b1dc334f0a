"""A retrieval index on disk: the FAISS index, the ids, an optional title per id, and a manifest.

Layout of an index folder::

    index.faiss     FAISS index (IndexFlatIP, IndexScalarQuantizer, IndexBinaryFlat or a factory index), or
    index.safetensors  instead, for a planned codec no FAISS index type holds (``klt-tcq``): its tables and codes,
                    searched by embedtune's numpy scan (:func:`embedtune.index.codecs.read_rotated_index`)
    ids.txt         one document id per line, row-aligned with the index
    titles.json     optional, a JSON list of titles row-aligned with ids.txt
    vectors.npy     optional (float rescoring: binary, a rabitq1-rescore plan): the float32 vectors the codes came from
    original_vectors.npy  optional (a ``+refine<N>`` plan): the original float32 vectors, before the adapter, that each
                    query's top N candidates are rescored with (:mod:`embedtune.index.refine`)
    manifest.json   kind, dims, counts, the adapter (path + sha256 of its files), the model, the
                    XXH3-128 digest of every file above (:func:`embedtune.io.xxh3_file`; format 1 recorded
                    sha256), and the sha256 of its own content

Building streams the embeddings in chunks (:func:`embedtune.compress.streaming.iter_embedding_blocks`),
applies the adapter per chunk and adds it to the index, so only the index itself has to fit in
memory. Every file is written atomically, the manifest last.

Loading checks every file against the manifest's digest before FAISS reads it: FAISS has no
checksum of its own, and damaged bytes can make ``faiss.read_index`` crash the process or load an
index that returns wrong neighbours.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedtune import __version__
from embedtune.compress import load_compressor
from embedtune.compress.base import Compressor, read_compressor_meta
from embedtune.compress.ray_apply import RayPool, apply_compressor_ray, check_ray_apply_paths
from embedtune.compress.streaming import default_tile_workers, embedding_file_shape, iter_embedding_blocks, transform_rows
from embedtune.encoders.precomputed import read_ids
from embedtune.encoders.recipe import recipe_for_vectors
from embedtune.errors import VECTORS_FIX, EmbedtuneError, check_finite
from embedtune.evaluate.search import as_rows, break_ties, exact_search, rescore
from embedtune.io import (
    DIGEST_KEY,
    IntegrityError,
    atomic_write,
    atomic_write_json,
    check_version_stamp,
    notify_written,
    older_than_installed,
    read_json_verified,
    sha256_file,
    verify_file_digest,
    write_json_with_digest,
    xxh3_file,
)
from embedtune.runtime import native_chatter_filtered

# The codecs (and approximate search and refinement, which build on them) are imported where a build or a search
# needs them: a flat index is built and searched with FAISS alone, and start-up is most of a small job's time.

logger = logging.getLogger(__name__)

__all__ = ["INDEX_KINDS", "build_index", "load_index", "verify_index", "Index", "adapter_fingerprint", "check_adapter"]

#: 2: the files' digests are XXH3-128 (``manifest["xxh3_128"]``); 1 recorded sha256 (``manifest["sha256"]``), still read.
FORMAT_VERSION = 2
#: The manifest field holding the files' digests, by format version.
_FILE_DIGEST = {1: "sha256", 2: "xxh3_128"}
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
#: The index file of a planned codec served by embedtune's numpy scan (its tables and codes, one safetensors file).
CODES_INDEX_FILE = "index.safetensors"
# A flat index is searched with FAISS's own scan: measured against embedtune's tuned kernels (exact_search's
# "auto") at 200k x 384 on one thread it was as fast or faster, and it needs no tuning run and no torch.
FLAT_KERNEL = "faiss"
IDS_FILE = "ids.txt"
#: A ``+refine<N>`` plan's original float32 vectors (:mod:`embedtune.index.refine` rescores with them).
ORIGINAL_VECTORS_FILE = "original_vectors.npy"
TITLES_FILE = "titles.json"
VECTORS_FILE = "vectors.npy"
ADAPTER_FILES = ("config.json", "model.safetensors")
REBUILD_HINT = "Rebuild the index with `embedtune index build` (or restore the folder from a copy)."
INDEX_KINDS = ("flat", "sq8", "binary")
"""Built-in kinds; any other string is passed to ``faiss.index_factory`` (e.g. ``IVF1024,Flat``)."""


def adapter_fingerprint(directory: str | Path, compressor: Compressor | None = None) -> dict[str, Any]:
    """Path, method, dims, input normalisation, sha256 of every file of a saved compressor, and of its fitted state."""
    directory = Path(directory)
    meta = read_compressor_meta(directory)
    info = {
        "path": str(directory.resolve()),
        "method": meta["method"],
        "input_dim": meta.get("input_dim"),
        "output_dim": meta.get("config", {}).get("dim"),
        "input_normalization": meta.get("input_normalization"),
        "sha256": {p.name: sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file() and p.name in ADAPTER_FILES},
    }
    if compressor is not None:
        info["state_sha256"] = compressor.state_sha256()
    return info


def check_adapter(manifest: dict[str, Any], manifest_path: Path, adapter: str | Path, compressor: Compressor) -> None:
    """Refuse ``compressor`` (loaded from ``adapter``) unless it is the adapter the index was built with.

    The manifest records the adapter's file digests and the digest of its fitted state; an adapter
    refitted or edited after ``index build`` would map queries into another space than the documents.
    """
    recorded = manifest.get("adapter") or {}
    fix = (f"rebuild the index with this adapter (`embedtune index build --adapter {adapter}`), or search with the adapter "
           "it was built with")
    expected = recorded.get("state_sha256")
    if isinstance(recorded.get("sha256"), dict) and Path(adapter).is_dir():
        for name, digest in sorted(recorded["sha256"].items()):
            if name not in ADAPTER_FILES:
                continue
            actual = sha256_file(Path(adapter) / name) if (Path(adapter) / name).is_file() else None
            if actual != digest and expected is None:
                raise IntegrityError(
                    f"{Path(adapter) / name}: sha256 {actual} differs from the {digest} that {manifest_path} field 'adapter.sha256' "
                    f"recorded when the index was built; the adapter was refitted or edited since. Fix: {fix}."
                )
    if expected is not None and compressor.state_sha256() != expected:
        raise IntegrityError(
            f"{adapter}: its fitted state (sha256 {compressor.state_sha256()}) is not the adapter {manifest_path} field "
            f"'adapter.state_sha256' recorded ({expected}); it was refitted or edited after the index was built, and its query "
            f"vectors would not match the indexed ones. Fix: {fix}."
        )


def _ids_text(ids: list[str], source: str) -> str:
    """``ids.txt``'s text, one id per line, after checking that no id holds a line break.

    The check runs on the joined text (one scan in C) and looks for the culprit only when it finds one.
    """
    text = "\n".join(ids) + "\n" if ids else ""
    if "\r" in text or text.count("\n") != len(ids):
        bad = next(i for i in ids if "\n" in i or "\r" in i)
        raise ValueError(f"{source}: id {bad!r} contains a line break, which ids.txt cannot hold.")
    return text


def build_index(
    embeddings: str | Path,
    out: str | Path,
    ids: str | Path | list[str] | None = None,
    adapter: str | Path | Compressor | None = None,
    kind: str = "flat",
    titles: dict[str, str] | None = None,
    model: str | None = None,
    chunk_size: int = 65536,
    keep_vectors: bool | None = None,
    train_size: int = 100_000,
    id_column: str = "id",
    vector_column: str = "embedding",
    sq8_ranges: tuple[np.ndarray, np.ndarray] | None = None,
    plan: dict[str, Any] | None = None,
    before_write: Callable[[], Any] | None = None,
    trained_index: Any = None,
    backend: str | None = None,
    ray: RayPool | None = None,
    keep_original_vectors: bool = False,
) -> Path:
    """Build an index folder from an embeddings file (``.npy`` + ``ids``, or parquet with ids).

    Args:
        embeddings: ``(n, d)`` float32/float16 ``.npy`` or a parquet file.
        out: the index folder to write.
        ids: ids of the ``.npy`` rows (a file, one per line or JSON, or a list); for parquet the
            id column is used.
        adapter: a fitted compressor or its folder, applied chunk by chunk before indexing.
        kind: ``flat`` (exact ``IndexFlatIP``), ``sq8``, ``binary``, or an ``index_factory``
            string (approximate; trained on at most ``train_size`` leading rows).
        titles: ``{doc_id: title}`` to show in search results.
        model: the encoder the embeddings came from, recorded so ``search`` can default to it.
        backend: the backend that encoded them (``torch`` unless given). The whole encoder recipe
            recorded beside the vectors (``encoder.json`` of ``embed``, ``run.json`` of
            ``embed-corpus``) is copied into the manifest, and ``model`` and ``backend`` must agree with it.
        keep_vectors: store the float32 vectors as ``vectors.npy`` (default: only for ``binary``,
            for float rescoring).
        sq8_ranges: ``sq8``: per-dimension ``(vmin, vmax)`` to use instead of calibrating on these
            vectors (a plan's saved int8 calibration).
        plan: what ``compress plan`` chose (see :func:`embedtune.index.planned.build_planned_index`),
            recorded in the manifest; its ``rescore`` and ``candidates`` become the search defaults.
        before_write: called once the index is built, right before anything is moved into ``out``
            (the command line prepares ``--out`` there, so a failed build leaves it untouched).
        trained_index: an ``index_factory`` kind: a trained FAISS index holding no vectors to add
            them to instead of training on these vectors (a plan's ``codec.faiss``, the tables it scored).
        ray: transform a ``.npy`` through ``adapter`` on this Ray actor pool
            (:func:`~embedtune.compress.ray_apply.apply_compressor_ray`, the same bits as here) into a
            file in the folder the index is built in, beside ``out``; the FAISS add stays in this
            process. On a cluster, ``out``'s folder and the inputs must be on storage every node reaches.
        keep_original_vectors: also store the input vectors themselves, before the adapter (normalised as the
            adapter normalises its input), as ``original_vectors.npy``: a ``+refine<N>`` plan rescores its
            candidates with them (:mod:`embedtune.index.refine`).
    Returns the folder.
    """
    import faiss

    start_time = time.perf_counter()
    embeddings, out = Path(embeddings), Path(out)
    recipe = recipe_for_vectors(embeddings, model, backend)  # before any work: a wrong --model fails now
    n, d_in = embedding_file_shape(embeddings, vector_column)
    compressor = None
    adapter_info = None
    if adapter is not None:
        if isinstance(adapter, Compressor):
            compressor = adapter
        else:
            compressor = load_compressor(adapter)
            adapter_info = adapter_fingerprint(adapter, compressor)
        if d_in != compressor.input_dim_:
            raise ValueError(f"{embeddings} has {d_in} columns but the adapter was fitted on {compressor.input_dim_}-d input.")
    d = compressor.output_dim if compressor is not None else d_in
    if ray is not None and compressor is None:
        logger.warning("%s: no adapter, so there is nothing for the Ray actors to transform; the index is built in this process.", embeddings)
        ray = None
    if ray is not None:
        ray.check()
        check_ray_apply_paths(embeddings, out / "adapted.npy", compressor)  # a .npy: before anything runs
    if embeddings.suffix == ".npy":
        if ids is None:
            raise ValueError(f"{embeddings}: a .npy file carries no ids; pass ids (one per line or a JSON list).")
        id_list = list(ids) if isinstance(ids, list) else read_ids(ids)
        if len(id_list) != n:
            raise ValueError(f"{embeddings}: {n} rows but {len(id_list)} ids; give exactly one id per row.")
    else:
        id_list = []
    keep_vectors = (kind == "binary") if keep_vectors is None else keep_vectors
    if trained_index is not None:
        if kind in INDEX_KINDS or trained_index.d != d or trained_index.ntotal != 0 or not trained_index.is_trained:
            raise ValueError(f"trained_index: expected a trained, empty {kind!r} index of {d}-d vectors; got a {type(trained_index).__name__} "
                             f"of {trained_index.d}-d vectors holding {trained_index.ntotal}.")
        index = trained_index
    else:
        index = new_index(kind, d, sq8_ranges)

    source, transform = embeddings, compressor  # with a Ray pool: the actors' transformed file, read as it is

    def blocks(collect_ids: bool = False):
        for start, block_ids, block in iter_embedding_blocks(source, chunk_size, id_column, vector_column, reuse_buffer=True):
            if collect_ids and block_ids is not None:
                id_list.extend(block_ids)
            if compressor is None:  # the adapter's tiles check their input; raw vectors are checked here, as every reader does
                check_finite(block, str(embeddings), "vectors", row_offset=start, fix=VECTORS_FIX, partial=True)
            yield start, (transform_rows(transform, block, workers=default_tile_workers()) if transform is not None else block)

    # Everything is built in a folder beside OUT and moved in at the end: a build that fails
    # (bad input, a FAISS error, a full disk) leaves OUT as it was.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".building", dir=out.parent))
    try:
        if ray is not None:
            source = apply_compressor_ray(adapter, embeddings, staging / "adapted.npy", ray, rows_per_range=chunk_size)
            transform = None
        if kind == "sq8" and sq8_ranges is None:
            from embedtune.index.codecs import Calibration, sq8_index

            # One extra pass for the per-dimension ranges, so the calibration sees every vector.
            index = sq8_index(d, Calibration.fit_blocks(blocks()))
        elif kind not in INDEX_KINDS:
            from embedtune.index.ann import default_params, set_search_params

            if not index.is_trained:
                sample = []
                for _, block in blocks():
                    sample.append(block[: train_size - sum(len(s) for s in sample)].copy())  # the reader reuses its buffer
                    if sum(len(s) for s in sample) >= train_size:
                        break
                points = np.concatenate(sample) if sample else np.zeros((0, d), np.float32)
                try:
                    with native_chatter_filtered():  # FAISS's "WARNING clustering" lines, unless -v
                        index.train(points)
                except RuntimeError as error:
                    raise EmbedtuneError(
                        f"{embeddings}: FAISS could not train the --kind {kind!r} index on {len(points)} vectors "
                        f"({_faiss_message(error)}). Fix: give more vectors, or choose an index that needs fewer training "
                        "points (fewer IVF lists or PQ bits), or --kind flat."
                    ) from None
            set_search_params(index, default_params(kind))

        if kind == "binary":
            from embedtune.index.codecs import binary_codes
        if trained_index is not None:
            from embedtune.index.codecs.row_encoding import add_encoded
        vectors_path = staging / VECTORS_FILE
        vectors_out = np.lib.format.open_memmap(vectors_path, mode="w+", dtype=np.float32, shape=(n, d)) if keep_vectors else None
        for start, block in blocks(collect_ids=True):
            try:
                if trained_index is not None:  # a plan's codec: the codes its sweep scored, on any thread count and block size
                    add_encoded(index, block)
                else:
                    index.add(binary_codes(block) if kind == "binary" else block)
            except RuntimeError as error:
                raise EmbedtuneError(f"{embeddings}: FAISS could not add rows {start}.. to the --kind {kind!r} index "
                                     f"({_faiss_message(error)}). Fix: choose another --kind (e.g. flat).") from None
            if vectors_out is not None:
                vectors_out[start : start + len(block)] = block
        if vectors_out is not None:
            vectors_out.flush()
            del vectors_out
        if keep_original_vectors:
            _write_original_vectors(embeddings, staging / ORIGINAL_VECTORS_FILE, (n, d_in), compressor, chunk_size, id_column,
                                    vector_column)
        if len(id_list) != index.ntotal:
            raise ValueError(f"{embeddings}: indexed {index.ntotal} vectors but read {len(id_list)} ids.")
        ids_text = _ids_text(id_list, str(embeddings))

        writer = faiss.write_index_binary if kind == "binary" else faiss.write_index
        numpy_codes = False
        if kind in INDEX_KINDS:
            served = index
        else:
            # A codec that encodes with more than its FAISS index (klt-wpq) has added its codes to that index: it is what is served.
            from embedtune.index.codecs import faiss_index_of, is_rotated_index

            served = faiss_index_of(index)
            numpy_codes = is_rotated_index(served)  # no FAISS index type holds these codes: the tables and codes, as safetensors
        index_file = CODES_INDEX_FILE if numpy_codes else INDEX_FILE

        def write_index(tmp: Path) -> None:
            try:
                writer(served, str(tmp))
            except RuntimeError as error:
                raise OSError(f"FAISS could not write the index ({_faiss_message(error)}); is the disk full? Free space or "
                              "choose another --out") from None

        if numpy_codes:
            served.write_file(staging / CODES_INDEX_FILE, with_codes=True)
        else:
            atomic_write(staging / INDEX_FILE, write_index)
        atomic_write(staging / IDS_FILE, lambda tmp: tmp.write_text(ids_text, encoding="utf-8"))
        if titles is not None:
            atomic_write_json(staging / TITLES_FILE, [titles.get(i, "") for i in id_list])
        seconds = time.perf_counter() - start_time
        manifest = {
            "format": "embedtune-index",
            "format_version": FORMAT_VERSION,
            "embedtune_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "kind": kind,
            "metric": "inner_product",
            "exact": kind == "flat",
            "dim": int(d),
            "input_dim": int(d_in),
            "ntotal": int(index.ntotal),
            # FAISS's own bytes per code, which is the precision table's figure for the built-in kinds (a test holds them equal);
            # a planned index's are the bytes its plan counted in RAM (a codec's or factory's code), unknown for other factories.
            "bytes_per_vector": int(index.code_size) if kind in INDEX_KINDS else (int(plan["ram_bytes"]) if plan and "ram_bytes" in plan else None),
            "index_bytes": (staging / index_file).stat().st_size,
            "search_params": {} if kind in INDEX_KINDS else default_params(kind),
            "adapter": adapter_info if adapter_info is not None else (
                {"method": compressor.method, "path": None, "input_dim": compressor.input_dim_, "output_dim": compressor.output_dim,
                 "input_normalization": compressor.input_normalization_, "state_sha256": compressor.state_sha256()}
                if compressor is not None else None),
            "model": recipe.model if recipe is not None else model,
            "encoder": recipe.to_dict() if recipe is not None else None,
            "source": {"embeddings": str(embeddings.resolve()), "bytes": embeddings.stat().st_size},
            "files": {"index": index_file, "ids": IDS_FILE, "titles": TITLES_FILE if titles is not None else None,
                      "vectors": VECTORS_FILE if keep_vectors else None,
                      "original_vectors": ORIGINAL_VECTORS_FILE if keep_original_vectors else None},
            _FILE_DIGEST[FORMAT_VERSION]: {name: xxh3_file(staging / name)
                                           for name in (*_INDEX_FILES, IDS_FILE, TITLES_FILE, VECTORS_FILE, ORIGINAL_VECTORS_FILE)
                                           if (staging / name).is_file()},
            **({"plan": plan} if plan is not None else {}),
            "build_seconds": seconds,
        }
        write_json_with_digest(staging / MANIFEST, manifest)
        if before_write is not None:
            before_write()  # e.g. the command's --overwrite: only now, with the new index ready
        out.mkdir(parents=True, exist_ok=True)
        (out / MANIFEST).unlink(missing_ok=True)  # first: a half-moved folder has no manifest, so it never loads
        for name in (*_INDEX_FILES, TITLES_FILE, VECTORS_FILE, ORIGINAL_VECTORS_FILE):
            if not (staging / name).exists():
                (out / name).unlink(missing_ok=True)  # a previous build's, which this index does not match
        for name in (*_INDEX_FILES, IDS_FILE, TITLES_FILE, VECTORS_FILE, ORIGINAL_VECTORS_FILE, MANIFEST):  # the manifest last
            if (staging / name).exists():
                os.replace(staging / name, out / name)
                notify_written(out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.debug("build_index: %d x %d-d %s index in %s (%.1fs)", index.ntotal, d, kind, out, seconds)
    return out


#: The index files a folder may hold (one of them).
_INDEX_FILES = (INDEX_FILE, CODES_INDEX_FILE)


def _write_original_vectors(embeddings: Path, path: Path, shape: tuple[int, int], compressor: Compressor | None, chunk_size: int,
                            id_column: str, vector_column: str) -> None:
    """Stream the input vectors into ``path`` as float32, normalised as ``compressor`` normalises its input.

    The plan rescored with the vectors its compressor was fitted on (unit rows for a cosine model), so the
    index keeps those, not whatever scale the file has; a pass of its own, so it works whatever transformed the
    rows for the index (this process or Ray actors).
    """
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    for start, _, block in iter_embedding_blocks(embeddings, chunk_size, id_column, vector_column, reuse_buffer=True):
        check_finite(block, str(embeddings), "vectors", row_offset=start, fix=VECTORS_FIX, partial=True)
        out[start : start + len(block)] = compressor.normalize_input(block) if compressor is not None else block
    out.flush()
    del out


def new_index(kind: str, d: int, sq8_ranges: tuple[np.ndarray, np.ndarray] | None = None) -> Any:
    """The empty FAISS index of ``kind`` for ``d``-d vectors, or an error naming ``--kind`` and the fix (nothing is written)."""
    import faiss

    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"an index needs vectors of at least 1 dimension; got {d!r}.")
    if kind == "flat":
        return faiss.IndexFlatIP(int(d))
    if kind == "sq8":
        if sq8_ranges is not None:
            vmin, vmax = (np.asarray(r, dtype=np.float32) for r in sq8_ranges)
            if vmin.shape != (d,) or vmax.shape != (d,) or not (np.isfinite(vmin).all() and np.isfinite(vmax).all()) or (vmax < vmin).any():
                raise EmbedtuneError(f"sq8 calibration: expected finite ({d},) ranges with vmin <= vmax; got {vmin.shape} and {vmax.shape}. "
                                     "Fix: write the plan again with `embedtune compress plan`.")
            from embedtune.index.codecs import sq8_index

            return sq8_index(int(d), (vmin, vmax))
        return faiss.IndexScalarQuantizer(int(d), faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    if kind == "binary":
        return faiss.IndexBinaryFlat(((int(d) + 7) // 8) * 8)
    if not isinstance(kind, str) or not kind.strip():
        raise EmbedtuneError(f"--kind {kind!r}: give flat, sq8, binary, or a FAISS index_factory string such as 'IVF1024,Flat'.")
    from embedtune.index.codecs import check_faiss_supports, faiss_release_needed, faiss_version_error, without_polysemous_training

    check_faiss_supports(kind, faiss_module=faiss)  # RaBitQ / TurboQuant on an older FAISS: name the release that has them
    try:
        return without_polysemous_training(faiss.index_factory(int(d), kind, faiss.METRIC_INNER_PRODUCT))
    except RuntimeError as error:
        if faiss_release_needed(kind) is not None and "index_factory" in str(error):
            raise faiss_version_error(kind, faiss_module=faiss) from None
        raise EmbedtuneError(
            f"--kind {kind!r}: FAISS cannot make this index for {d}-d vectors ({_faiss_message(error)}). Fix: use flat, sq8, "
            f"binary, or a valid FAISS index_factory string such as 'IVF1024,Flat' or 'PQ{max(1, d // 8)}' (its numbers must "
            f"divide the dimension {d})."
        ) from None


@dataclass
class Index:
    """A loaded index folder. ``search`` takes vectors already in the index's space."""

    path: Path
    manifest: dict[str, Any]
    faiss_index: Any
    ids: list[str]
    titles: list[str] | None = None
    vectors: np.ndarray | None = field(default=None, repr=False)
    original_vectors: np.ndarray | None = field(default=None, repr=False)

    @property
    def refine(self) -> dict[str, Any] | None:
        """What a ``+refine<N>`` plan recorded (``candidates``, ``original_dim``), or None for an index searched by its codes alone."""
        return (self.manifest.get("plan") or {}).get("refine")

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def search(self, xq: np.ndarray, k: int = 10, rescore_with: str | None = None, candidates: int = 100,
               original_queries: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)`` for float queries ``xq`` of shape ``(nq, dim)``; ties by ascending row.

        An index built from a ``+refine<N>`` plan (:attr:`refine`) searches its codes for the top ``max(k, N)``
        and rescores them with ``original_vectors.npy`` against ``original_queries``, the queries' vectors
        before the adapter (normalised as its input), which it then needs.
        """
        if self.refine is None:
            return self._search_codes(xq, k, rescore_with, candidates)
        if original_queries is None:
            raise ValueError(f"{self.path}: the index rescores its candidates with the original vectors ({ORIGINAL_VECTORS_FILE}), so "
                             "it needs the queries' original vectors too (original_queries: the model's vectors, before the adapter); "
                             "`embedtune search` passes them.")
        if self.original_vectors is None:
            raise IntegrityError(f"{self.path}: {MANIFEST} field 'plan.refine' says candidates are rescored with {ORIGINAL_VECTORS_FILE}, "
                                 f"which is missing. {REBUILD_HINT}")
        if rescore_with is not None:
            raise ValueError(f"{self.path}: the index rescores with the original vectors as planned; drop --rescore {rescore_with}.")
        fetch = min(self.faiss_index.ntotal, max(int(k), int(self.refine["candidates"])))
        from embedtune.index.refine import refine_candidates

        _, I = self._search_codes(xq, fetch, None, candidates)
        return refine_candidates(I, original_queries, self.original_vectors, min(int(k), self.faiss_index.ntotal))

    def _search_codes(self, xq: np.ndarray, k: int, rescore_with: str | None, candidates: int) -> tuple[np.ndarray, np.ndarray]:
        """The search of the stored codes (see :meth:`search`).

        ``flat`` runs :func:`embedtune.evaluate.search.exact_search` on the index's own vectors
        (no copy), its candidates from FAISS's own ``IndexFlatIP`` scan (the ``faiss`` kernel;
        ``EMBEDTUNE_SEARCH_KERNEL`` pins another), rescored canonically: the same hits, in the same
        order, as every other exact kernel, without timing kernels first or importing torch. ``binary`` takes ``rescore_with`` ``"float"`` (needs ``vectors.npy``) or ``"asym"``; other
        kinds ``"float"`` (a plan's ``rabitq1-rescore``: its default), rescoring the top ``candidates``.
        """
        import faiss

        xq = as_rows(xq, "xq")
        if xq.shape[1] != self.dim:
            raise ValueError(f"queries are {xq.shape[1]}-d but the index is {self.dim}-d (wrong or missing --adapter?).")
        kind = self.manifest["kind"]
        if kind == "flat":
            xb = faiss.rev_swig_ptr(self.faiss_index.get_xb(), self.faiss_index.ntotal * self.dim).reshape(-1, self.dim)
            return exact_search(xq, xb, k, kernel=os.environ.get("EMBEDTUNE_SEARCH_KERNEL") or FLAT_KERNEL)
        from embedtune.index.codecs import binary_search, sq8_search

        if kind == "binary":
            planned = self.manifest.get("plan") or {}
            if rescore_with is None and planned.get("rescore"):  # built from a plan: search as planned
                rescore_with, candidates = planned["rescore"], int(planned.get("candidates", candidates))
            return binary_search(self.faiss_index, xq, k, rescore_with, self.vectors, candidates)  # type: ignore[arg-type]
        planned = self.manifest.get("plan") or {}
        if rescore_with is None and planned.get("rescore") == "float":  # e.g. a plan's rabitq1-rescore
            rescore_with, candidates = "float", int(planned.get("candidates", candidates))
        if rescore_with is not None:
            if rescore_with != "float":
                raise ValueError(f"{self.path}: a {kind!r} index rescores only in float32 (rescore 'float'); got {rescore_with!r}.")
            if self.vectors is None:
                raise ValueError(f"{self.path}: rescoring needs {VECTORS_FILE}, which this {kind!r} index was built without; search "
                                 "without --rescore, or rebuild it keeping the vectors (a rabitq1-rescore plan's `index build --plan`).")
            _, I = sq8_search(self.faiss_index, xq, max(k, candidates))
            D, I = break_ties(rescore(xq, self.vectors, I), I)
            return D[:, :k], I[:, :k]
        sphere = self.sphere_candidates
        if sphere:  # a -sphere codec: its top candidates ranked by their decoded direction, as the plan scored them
            from embedtune.index.codecs.sphere import sphere_search

            return sphere_search(self.faiss_index, xq, k, sphere)
        return sq8_search(self.faiss_index, xq, k)

    @property
    def sphere_candidates(self) -> int:
        """Candidates per query ranked by their decoded direction: the planned codec's, or 0 (plain scores)."""
        from embedtune.index.codecs import codec_family, is_registered_codec

        name = (self.manifest.get("plan") or {}).get("precision")
        return codec_family(name).sphere_candidates if is_registered_codec(name) else 0

    def hits(self, D: np.ndarray, I: np.ndarray) -> list[list[dict[str, Any]]]:
        """Rows of ``{"rank", "id", "score", "title"}`` per query."""
        results = []
        for scores, rows in zip(D, I):
            results.append([
                {"rank": rank + 1, "id": self.ids[row], "score": float(score), **({"title": self.titles[row]} if self.titles else {})}
                for rank, (score, row) in enumerate(zip(scores, rows))
                if row >= 0
            ])
        return results


def verify_index(path: str | Path) -> dict[str, Any]:
    """Check an index folder's manifest and every file it lists against their digests; return the manifest.

    Raises :class:`embedtune.io.IntegrityError` naming the damaged file (nothing is handed to FAISS).
    A folder built before digests were recorded passes with a note.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path}: no {MANIFEST}; build the index with `embedtune index build`.")
    manifest, verified = read_json_verified(manifest_path, REBUILD_HINT)
    if manifest.get("format") != "embedtune-index":
        raise IntegrityError(f"{manifest_path}: field 'format' is {manifest.get('format')!r}, not 'embedtune-index': not an embedtune "
                             f"index manifest. {REBUILD_HINT}")
    version = manifest.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise IntegrityError(f"{manifest_path}: field 'format_version' must be an integer; got {version!r}. {REBUILD_HINT}")
    if version > FORMAT_VERSION:
        raise IntegrityError(f"{manifest_path}: format_version {version} is newer than this embedtune reads ({FORMAT_VERSION}); "
                             "upgrade embedtune (pip install -U embedtune) to read it.")
    check_version_stamp(manifest.get("embedtune_version"), str(manifest_path))
    algorithm = _FILE_DIGEST.get(version, "sha256")
    digests = manifest.get(algorithm)
    if not isinstance(digests, dict) or not verified:
        if verified or isinstance(digests, dict) or not older_than_installed(manifest.get("embedtune_version")):
            # This version always writes both the manifest's own digest and the files': a missing one is damage, not age.
            raise IntegrityError(f"{manifest_path}: field {algorithm if verified else DIGEST_KEY!r} is missing, which embedtune "
                                 f"{manifest.get('embedtune_version', '(no version stamp)')} always writes; the manifest was edited "
                                 f"or damaged. {REBUILD_HINT}")
        logger.info("%s: built without file digests (by embedtune %s), so its files are loaded unchecked; rebuild it to add them",
                    path, manifest.get("embedtune_version"))
        return manifest
    index_file = _index_file(manifest, manifest_path)
    if index_file not in digests or IDS_FILE not in digests:
        raise ValueError(f"{manifest_path}: field {algorithm!r} lacks {index_file} or {IDS_FILE}. {REBUILD_HINT}")
    for name, digest in digests.items():
        verify_file_digest(path / name, algorithm, digest, REBUILD_HINT)
    for name in (*_INDEX_FILES, TITLES_FILE, VECTORS_FILE, ORIGINAL_VECTORS_FILE):
        if (path / name).is_file() and name not in digests:
            raise ValueError(f"{path / name}: not listed in {MANIFEST}, so it cannot be checked; remove it or rebuild the index.")
    return manifest


def load_index(path: str | Path, mmap_vectors: bool = True) -> Index:
    """Load an index folder written by :func:`build_index`, after checking every file's digest."""
    import faiss

    path = Path(path)
    manifest = verify_index(path)
    manifest_path = path / MANIFEST
    kind, dim, ntotal = _manifest_shape(manifest, manifest_path)
    index_path = path / _index_file(manifest, manifest_path)
    if index_path.name == CODES_INDEX_FILE:
        from embedtune.index.codecs import read_rotated_index

        index = read_rotated_index(index_path)
    else:
        reader = faiss.read_index_binary if kind == "binary" else faiss.read_index
        try:
            index = reader(str(index_path))
        except RuntimeError as error:
            raise IntegrityError(f"{index_path}: FAISS cannot read it ({_faiss_message(error)}). {REBUILD_HINT}") from None
    _check_index_agrees(index, kind, dim, ntotal, index_path, manifest_path)
    if manifest.get("search_params"):
        from embedtune.index.ann import set_search_params

        set_search_params(index, manifest["search_params"])
    ids = (path / IDS_FILE).read_text(encoding="utf-8").split("\n")[:-1]
    if len(ids) != index.ntotal:
        raise IntegrityError(f"{path / IDS_FILE}: {len(ids)} ids for the {index.ntotal} vectors of {index_path}. {REBUILD_HINT}")
    titles = None
    if (path / TITLES_FILE).is_file():
        titles = json.loads((path / TITLES_FILE).read_text(encoding="utf-8"))
        if not isinstance(titles, list) or len(titles) != len(ids):
            raise IntegrityError(f"{path / TITLES_FILE}: expected a list of {len(ids)} titles, one per id of {path / IDS_FILE}. {REBUILD_HINT}")
    vectors = None
    if (path / VECTORS_FILE).is_file():
        vectors = np.load(path / VECTORS_FILE, mmap_mode="r" if mmap_vectors else None, allow_pickle=False)
        if vectors.shape != (ntotal, dim) or vectors.dtype != np.float32:
            raise IntegrityError(f"{path / VECTORS_FILE}: holds {vectors.dtype} {vectors.shape} but {manifest_path} says "
                                 f"({ntotal}, {dim}) float32. {REBUILD_HINT}")
    original = None
    if (path / ORIGINAL_VECTORS_FILE).is_file():
        original = np.load(path / ORIGINAL_VECTORS_FILE, mmap_mode="r" if mmap_vectors else None, allow_pickle=False)
        input_dim = manifest.get("input_dim")
        if original.shape != (ntotal, input_dim) or original.dtype != np.float32:
            raise IntegrityError(f"{path / ORIGINAL_VECTORS_FILE}: holds {original.dtype} {original.shape} but {manifest_path} says "
                                 f"({ntotal}, {input_dim}) float32. {REBUILD_HINT}")
    elif (manifest.get("plan") or {}).get("refine"):
        raise IntegrityError(f"{path / ORIGINAL_VECTORS_FILE}: missing, but {manifest_path} field 'plan.refine' rescores with it. "
                             f"{REBUILD_HINT}")
    return Index(path, manifest, index, ids, titles, vectors, original)


def _manifest_shape(manifest: dict[str, Any], manifest_path: Path) -> tuple[str, int, int]:
    """The manifest's ``kind``, ``dim`` and ``ntotal``, checked to be a string and two integers."""
    kind, dim, ntotal = manifest.get("kind"), manifest.get("dim"), manifest.get("ntotal")
    if not isinstance(kind, str) or not kind:
        raise IntegrityError(f"{manifest_path}: field 'kind' must be an index kind such as 'flat'; got {kind!r}. {REBUILD_HINT}")
    for name, value in (("dim", dim), ("ntotal", ntotal)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "dim" else 0):
            raise IntegrityError(f"{manifest_path}: field {name!r} must be a {'positive' if name == 'dim' else 'non-negative'} integer; "
                             f"got {value!r}. {REBUILD_HINT}")
    return kind, int(dim), int(ntotal)  # type: ignore[arg-type]


def _index_file(manifest: dict[str, Any], manifest_path: Path) -> str:
    """The index file the manifest names (``files.index``; :data:`INDEX_FILE` in folders written before it could be another)."""
    name = (manifest.get("files") or {}).get("index", INDEX_FILE) if isinstance(manifest.get("files"), dict) else INDEX_FILE
    if name not in _INDEX_FILES:
        raise IntegrityError(f"{manifest_path}: field 'files.index' is {name!r}, not one of {list(_INDEX_FILES)}. {REBUILD_HINT}")
    return name


def _faiss_message(error: BaseException) -> str:
    """The first line of a FAISS RuntimeError, without the C++ file and line noise."""
    text = str(error).strip().splitlines()
    message = next((line for line in text if "Error" in line or "error" in line), text[0] if text else type(error).__name__)
    return message.split("Error in ")[-1].strip()


def _check_index_agrees(index: Any, kind: str, dim: int, ntotal: int, index_path: Path, manifest_path: Path) -> None:
    """The FAISS index is the one its manifest describes: its type, dimension, count and metric.

    Digests only say that the files are the ones written; a file swapped in from another index,
    with the digests recomputed, still has to agree with the manifest (a smaller ``d`` would make
    a flat search read past the index's buffer).
    """
    import faiss

    def refuse(what: str) -> None:
        raise IntegrityError(f"{index_path}: {what}, which disagrees with {manifest_path}. {REBUILD_HINT}")

    if index_path.name == CODES_INDEX_FILE:  # a codec served by embedtune's numpy scan: its name is the kind
        from embedtune.index.codecs import codec_family, is_registered_codec

        family = codec_family(kind) if is_registered_codec(kind) else None
        if family is None or not family.numpy_scan:
            refuse(f"holds a codec's tables and codes, but field 'kind' is {kind!r}, not a codec served by embedtune's numpy scan")
        if index.d != dim:
            refuse(f"holds {index.d}-d vectors but field 'dim' is {dim}")
        if index.sa_code_size() != family.code_size(dim):
            refuse(f"holds {index.sa_code_size()}-byte codes, not {kind!r}'s")
        mismatch = family.mismatch(index)
        if mismatch:
            refuse(f"holds {mismatch}, not {kind!r}'s")
        if index.ntotal != ntotal:
            refuse(f"holds {index.ntotal} vectors but field 'ntotal' is {ntotal}")
        return

    if kind == "binary":
        if not isinstance(index, faiss.IndexBinary):
            refuse(f"a {type(index).__name__}, not the binary index field 'kind' says")
        if index.d != ((dim + 7) // 8) * 8:
            refuse(f"holds {index.d}-bit codes but field 'dim' is {dim}")
    else:
        if isinstance(index, faiss.IndexBinary):
            refuse(f"a binary index, but field 'kind' is {kind!r}")
        if index.d != dim:
            refuse(f"holds {index.d}-d vectors but field 'dim' is {dim}")
        if kind == "flat" and not isinstance(index, faiss.IndexFlat):
            refuse(f"a {type(index).__name__}, not the flat index field 'kind' says")
        if kind == "sq8" and not isinstance(index, faiss.IndexScalarQuantizer):
            refuse(f"a {type(index).__name__}, not the sq8 index field 'kind' says")
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            refuse("ranks by another metric than the inner product field 'metric' says")
    if index.ntotal != ntotal:
        refuse(f"holds {index.ntotal} vectors but field 'ntotal' is {ntotal}")
