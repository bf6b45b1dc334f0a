"""A retrieval index on disk: the FAISS index, the ids, an optional title per id, and a manifest.

Layout of an index folder::

    index.faiss     FAISS index (IndexFlatIP, IndexScalarQuantizer, IndexBinaryFlat or a factory index)
    ids.txt         one document id per line, row-aligned with the index
    titles.json     optional, a JSON list of titles row-aligned with ids.txt
    vectors.npy     optional (binary with float rescoring): the float32 vectors the bits came from
    manifest.json   kind, dims, counts, the adapter (path + sha256 of its files), the model, the
                    sha256 of every file above, and the digest of its own content

Building streams the embeddings in chunks (:func:`embedtune.compress.streaming.iter_embedding_blocks`),
applies the adapter per chunk and adds it to the index, so only the index itself has to fit in
memory. Every file is written atomically, the manifest last.

Loading checks every file against the manifest's sha256 before FAISS reads it: FAISS has no
checksum of its own, and damaged bytes can make ``faiss.read_index`` crash the process or load an
index that returns wrong neighbours.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embedtune import __version__
from embedtune.compress import load_compressor
from embedtune.compress.base import Compressor, read_compressor_meta
from embedtune.compress.streaming import embedding_file_shape, iter_embedding_blocks, transform_rows
from embedtune.encoders.precomputed import read_ids
from embedtune.evaluate.search import as_rows, exact_search
from embedtune.index import quantize
from embedtune.index.ann import default_params, set_search_params
from embedtune.io import (
    atomic_write,
    atomic_write_json,
    check_version_stamp,
    read_json_verified,
    sha256_file,
    verify_sha256,
    write_json_with_digest,
)

logger = logging.getLogger(__name__)

__all__ = ["INDEX_KINDS", "build_index", "load_index", "verify_index", "Index", "adapter_fingerprint"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
IDS_FILE = "ids.txt"
TITLES_FILE = "titles.json"
VECTORS_FILE = "vectors.npy"
REBUILD_HINT = "Rebuild the index with `embedtune index build` (or restore the folder from a copy)."
INDEX_KINDS = ("flat", "sq8", "binary")
"""Built-in kinds; any other string is passed to ``faiss.index_factory`` (e.g. ``IVF1024,Flat``)."""


def adapter_fingerprint(directory: str | Path) -> dict[str, Any]:
    """Path, method, dims and sha256 of every file of a saved compressor."""
    directory = Path(directory)
    meta = read_compressor_meta(directory)
    return {
        "path": str(directory.resolve()),
        "method": meta["method"],
        "input_dim": meta.get("input_dim"),
        "output_dim": meta.get("config", {}).get("dim"),
        "sha256": {p.name: sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file()},
    }


def _check_ids(ids: list[str], source: str) -> None:
    bad = next((i for i in ids if "\n" in i or "\r" in i), None)
    if bad is not None:
        raise ValueError(f"{source}: id {bad!r} contains a line break, which ids.txt cannot hold.")


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
        keep_vectors: store the float32 vectors as ``vectors.npy`` (default: only for ``binary``,
            for float rescoring).
        sq8_ranges: ``sq8``: per-dimension ``(vmin, vmax)`` to use instead of calibrating on these
            vectors (a plan's saved int8 calibration).
        plan: what ``compress plan`` chose (see :func:`embedtune.index.precision.build_planned_index`),
            recorded in the manifest; its ``rescore`` and ``candidates`` become the search defaults.
    Returns the folder.
    """
    import faiss

    start_time = time.perf_counter()
    embeddings, out = Path(embeddings), Path(out)
    n, d_in = embedding_file_shape(embeddings, vector_column)
    compressor = None
    adapter_info = None
    if adapter is not None:
        if isinstance(adapter, Compressor):
            compressor = adapter
        else:
            compressor = load_compressor(adapter)
            adapter_info = adapter_fingerprint(adapter)
        if d_in != compressor.input_dim_:
            raise ValueError(f"{embeddings} has {d_in} columns but the adapter was fitted on {compressor.input_dim_}-d input.")
    d = compressor.output_dim if compressor is not None else d_in
    if embeddings.suffix == ".npy":
        if ids is None:
            raise ValueError(f"{embeddings}: a .npy file carries no ids; pass ids (one per line or a JSON list).")
        id_list = list(ids) if isinstance(ids, list) else read_ids(ids)
        if len(id_list) != n:
            raise ValueError(f"{embeddings}: {n} rows but {len(id_list)} ids; give exactly one id per row.")
    else:
        id_list = []
    keep_vectors = (kind == "binary") if keep_vectors is None else keep_vectors

    def blocks(collect_ids: bool = False):
        for start, block_ids, block in iter_embedding_blocks(embeddings, chunk_size, id_column, vector_column, reuse_buffer=True):
            if collect_ids and block_ids is not None:
                id_list.extend(block_ids)
            yield start, (transform_rows(compressor, block) if compressor is not None else block)

    out.mkdir(parents=True, exist_ok=True)
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "sq8":
        # One extra pass for the per-dimension ranges, so the calibration sees every vector.
        index = quantize.sq8_index(d, ranges=sq8_ranges if sq8_ranges is not None else quantize.sq8_ranges(blocks()))
    elif kind == "binary":
        index = faiss.IndexBinaryFlat(((d + 7) // 8) * 8)
    else:
        index = faiss.index_factory(d, kind, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            sample = []
            for _, block in blocks():
                sample.append(block[: train_size - sum(len(s) for s in sample)].copy())  # the reader reuses its buffer
                if sum(len(s) for s in sample) >= train_size:
                    break
            index.train(np.concatenate(sample))
        set_search_params(index, default_params(kind))

    vectors_out = np.lib.format.open_memmap(out / f".{VECTORS_FILE}.tmp", mode="w+", dtype=np.float32, shape=(n, d)) if keep_vectors else None
    try:
        for start, block in blocks(collect_ids=True):
            if kind == "binary":
                index.add(quantize.binary_codes(block))
            else:
                index.add(block)
            if vectors_out is not None:
                vectors_out[start : start + len(block)] = block
        if vectors_out is not None:
            vectors_out.flush()
            del vectors_out
            (out / f".{VECTORS_FILE}.tmp").replace(out / VECTORS_FILE)
        else:
            (out / VECTORS_FILE).unlink(missing_ok=True)  # a previous build's, which this index does not match
    except BaseException:
        (out / f".{VECTORS_FILE}.tmp").unlink(missing_ok=True)
        raise
    if len(id_list) != index.ntotal:
        raise ValueError(f"{embeddings}: indexed {index.ntotal} vectors but read {len(id_list)} ids.")
    _check_ids(id_list, str(embeddings))

    writer = faiss.write_index_binary if kind == "binary" else faiss.write_index
    atomic_write(out / INDEX_FILE, lambda tmp: writer(index, str(tmp)))
    atomic_write(out / IDS_FILE, lambda tmp: tmp.write_text("".join(i + "\n" for i in id_list), encoding="utf-8"))
    if titles is not None:
        atomic_write_json(out / TITLES_FILE, [titles.get(i, "") for i in id_list])
    elif (out / TITLES_FILE).exists():
        (out / TITLES_FILE).unlink()
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
        "bytes_per_vector": quantize.bytes_per_vector(kind, d) if kind in INDEX_KINDS else None,
        "index_bytes": (out / INDEX_FILE).stat().st_size,
        "search_params": default_params(kind) if kind not in INDEX_KINDS else {},
        "adapter": adapter_info if adapter_info is not None else ({"method": compressor.method, "path": None} if compressor is not None else None),
        "model": model,
        "source": {"embeddings": str(embeddings.resolve()), "bytes": embeddings.stat().st_size},
        "files": {"index": INDEX_FILE, "ids": IDS_FILE, "titles": TITLES_FILE if titles is not None else None, "vectors": VECTORS_FILE if keep_vectors else None},
        "sha256": {name: sha256_file(out / name) for name in (INDEX_FILE, IDS_FILE, TITLES_FILE, VECTORS_FILE)
                   if (out / name).is_file() and (name != TITLES_FILE or titles is not None) and (name != VECTORS_FILE or keep_vectors)},
        **({"plan": plan} if plan is not None else {}),
        "build_seconds": seconds,
    }
    write_json_with_digest(out / MANIFEST, manifest)
    logger.debug("build_index: %d x %d-d %s index in %s (%.1fs)", index.ntotal, d, kind, out, seconds)
    return out


@dataclass
class Index:
    """A loaded index folder. ``search`` takes vectors already in the index's space."""

    path: Path
    manifest: dict[str, Any]
    faiss_index: Any
    ids: list[str]
    titles: list[str] | None = None
    vectors: np.ndarray | None = field(default=None, repr=False)

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def search(self, xq: np.ndarray, k: int = 10, rescore_with: str | None = None, candidates: int = 100) -> tuple[np.ndarray, np.ndarray]:
        """``(D, I)`` for float queries ``xq`` of shape ``(nq, dim)``; ties by ascending row.

        ``flat`` runs :func:`embedtune.evaluate.search.exact_search` on the index's own vectors
        (no copy). ``binary`` takes ``rescore_with`` ``"float"`` (needs ``vectors.npy``) or ``"asym"``.
        """
        import faiss

        xq = as_rows(xq, "xq")
        if xq.shape[1] != self.dim:
            raise ValueError(f"queries are {xq.shape[1]}-d but the index is {self.dim}-d (wrong or missing --adapter?).")
        kind = self.manifest["kind"]
        if kind == "flat":
            xb = faiss.rev_swig_ptr(self.faiss_index.get_xb(), self.faiss_index.ntotal * self.dim).reshape(-1, self.dim)
            return exact_search(xq, xb, k)
        if kind == "binary":
            planned = self.manifest.get("plan") or {}
            if rescore_with is None and planned.get("rescore"):  # built from a plan: search as planned
                rescore_with, candidates = planned["rescore"], int(planned.get("candidates", candidates))
            return quantize.binary_search(self.faiss_index, xq, k, rescore_with, self.vectors, candidates)  # type: ignore[arg-type]
        return quantize.sq8_search(self.faiss_index, xq, k)

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
    """Check an index folder's manifest and every file it lists against their sha256; return the manifest.

    Raises :class:`embedtune.io.IntegrityError` naming the damaged file (nothing is handed to FAISS).
    A folder built before digests were recorded passes with a note.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path}: no {MANIFEST}; build the index with `embedtune index build`.")
    manifest, verified = read_json_verified(manifest_path, REBUILD_HINT)
    if manifest.get("format") != "embedtune-index":
        raise ValueError(f"{manifest_path}: not an embedtune index manifest.")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise ValueError(f"{manifest_path}: format_version {manifest['format_version']} is newer than this embedtune reads ({FORMAT_VERSION}).")
    check_version_stamp(manifest.get("embedtune_version"), str(manifest_path))
    digests = manifest.get("sha256")
    if not isinstance(digests, dict):
        if verified:
            raise ValueError(f"{manifest_path}: field 'sha256' is missing. {REBUILD_HINT}")
        logger.info("%s: built without file digests (by an older embedtune), so its files are loaded unchecked; rebuild it to add them", path)
        return manifest
    if INDEX_FILE not in digests or IDS_FILE not in digests:
        raise ValueError(f"{manifest_path}: field 'sha256' lacks {INDEX_FILE} or {IDS_FILE}. {REBUILD_HINT}")
    for name, digest in digests.items():
        verify_sha256(path / name, digest, REBUILD_HINT)
    for name in (TITLES_FILE, VECTORS_FILE):
        if (path / name).is_file() and name not in digests:
            raise ValueError(f"{path / name}: not listed in {MANIFEST}, so it cannot be checked; remove it or rebuild the index.")
    return manifest


def load_index(path: str | Path, mmap_vectors: bool = True) -> Index:
    """Load an index folder written by :func:`build_index`, after checking every file's sha256."""
    import faiss

    path = Path(path)
    manifest = verify_index(path)
    reader = faiss.read_index_binary if manifest["kind"] == "binary" else faiss.read_index
    index = reader(str(path / INDEX_FILE))
    if manifest.get("search_params"):
        set_search_params(index, manifest["search_params"])
    ids = (path / IDS_FILE).read_text(encoding="utf-8").split("\n")[:-1]
    if len(ids) != index.ntotal:
        raise ValueError(f"{path}: {len(ids)} ids for {index.ntotal} vectors.")
    titles = None
    if (path / TITLES_FILE).is_file():
        titles = json.loads((path / TITLES_FILE).read_text(encoding="utf-8"))
    vectors = None
    if (path / VECTORS_FILE).is_file():
        vectors = np.load(path / VECTORS_FILE, mmap_mode="r" if mmap_vectors else None)
    return Index(path, manifest, index, ids, titles, vectors)
