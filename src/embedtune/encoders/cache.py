"""An on-disk embedding cache under the user cache dir (``$EMBEDTUNE_CACHE`` overrides it).

Each entry is a folder named by a sha256 key over the model fingerprint, the data-file
fingerprint, the text recipe, the max sequence length and normalisation. It holds
``embeddings.npy`` (memory-mappable), ``ids.json`` and ``meta.json``; ``meta.json`` is written
last, so an entry without it is incomplete. A miss whose key parts match vectors shipped in the
package (:mod:`embedtune.encoders.bundled_vectors`, e.g. MiniLM on the bundled SciFact) is filled
from them, after their checks, instead of encoding. ``meta.json`` records the sha256 of the array file
and of the ids, and carries the digest of its own content, so a truncated, damaged or mismatched
entry is detected on load (one flipped byte is enough), logged and rebuilt. An entry's vectors
must be finite: NaN or infinity from the encoder is refused before it is stored, and an entry
holding them is rebuilt.

An interrupted encode resumes from ``partial/``: each finished shard ``<lo>-<hi>.npy`` has a record
``<lo>-<hi>.json`` (the sha256 of the array and of its ids, the entry key and the token of the
encode in ``partial/run.json``, with its own content digest). A shard is reused only when all of
that agrees; a damaged, truncated or foreign shard is encoded again, never sealed into the entry.
A full disk is an error naming the entry and the fix (free space, or point ``EMBEDTUNE_CACHE``
elsewhere).

One process at a time computes an entry: :meth:`EmbeddingCache.get_or_compute` takes an
exclusive ``fcntl.flock`` on ``<key>.lock`` next to the entry before encoding, so a second
process that wants the same entry waits, then reuses the first one's result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from embedtune.encoders.bundled_vectors import bundled_vectors
from embedtune.encoders.paths import cache_root
from embedtune.errors import VECTORS_FIX, check_finite
from embedtune.io import (
    IntegrityError,
    atomic_save_npy,
    atomic_write_json,
    read_json_verified,
    sha256_file,
    sha256_json,
    write_json_with_digest,
    writing,
)
from embedtune.locks import exclusive_lock, touch

logger = logging.getLogger(__name__)

__all__ = ["EmbeddingCache", "cache_key"]


_CACHE_SPACE_FIX = "free space on that disk, or point EMBEDTUNE_CACHE at another disk, and run again"
_PARTIAL_FIX = "The shard is encoded again."


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class EmbeddingCache:
    def __init__(self, root: str | Path | None = None, use_bundled: bool = True) -> None:
        self.root = Path(root) if root is not None else cache_root() / "embeddings"
        # A miss first looks for vectors shipped in the package for exactly these key parts
        # (embedtune.encoders.bundled_vectors: checked, then stored as this cache's entry).
        self.use_bundled = use_bundled

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lock_path(self, key: str) -> Path:
        """The lock file of ``key``: beside the entry, so removing a bad entry keeps the lock."""
        return self.root / key[:2] / f"{key}.lock"

    def lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Hold the exclusive lock of entry ``key`` (waits while another process holds it)."""
        return exclusive_lock(self.lock_path(key), f"embedding cache entry {key[:12]} is being computed by another process; waiting for it")

    def load(self, key: str, expected_ids: list[str] | None = None, remove_bad: bool = True) -> tuple[list[str], np.ndarray] | None:
        """Return ``(ids, embeddings)`` (memory-mapped) or None on a miss or a bad entry.

        Every file is checked before use: ``meta.json``'s own digest, the sha256 of
        ``embeddings.npy`` and of the ids, the shape and the dtype. A bad entry is logged and
        (``remove_bad``) removed, so the caller rebuilds it.
        """
        folder = self.entry(key)
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            return None
        try:
            meta, _ = read_json_verified(meta_path, "The entry is rebuilt.")
            ids_text = (folder / "ids.json").read_text(encoding="utf-8")
            array_path = folder / "embeddings.npy"
            if meta.get("key") != key:
                raise ValueError("meta.json key does not match its folder")
            if array_path.stat().st_size != meta["nbytes_file"]:
                raise ValueError(f"embeddings.npy has {array_path.stat().st_size} bytes, expected {meta['nbytes_file']}")
            if meta.get("sha256") and sha256_file(array_path) != meta["sha256"]:
                raise ValueError("embeddings.npy checksum mismatch")
            ids = json.loads(ids_text)
            if meta.get("ids_sha256") and sha256_json(ids) != meta["ids_sha256"]:
                raise ValueError("ids.json checksum mismatch")
            embeddings = np.load(array_path, mmap_mode="r", allow_pickle=False)
            if embeddings.dtype != np.float32:
                raise ValueError(f"embeddings.npy holds {embeddings.dtype}, expected float32")
            if list(embeddings.shape) != meta["shape"] or len(ids) != embeddings.shape[0]:
                raise ValueError(f"shape {embeddings.shape} does not match meta {meta['shape']} / {len(ids)} ids")
            if expected_ids is not None and ids != list(expected_ids):
                raise ValueError("cached ids differ from the requested ids")
            check_finite(embeddings, str(array_path), "vectors", fix=VECTORS_FIX)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as error:
            if not remove_bad:
                logger.debug("embedding cache entry %s is not usable (%s)", folder, error)
                return None
            logger.warning("embedding cache entry %s is corrupt (%s); rebuilding it", folder, error)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return ids, embeddings

    def store(self, key: str, ids: list[str], embeddings: np.ndarray, meta: dict[str, Any]) -> Path:
        """Write entry ``key``: the vectors, their ids, and last ``meta.json`` with the digests of both.

        Vectors holding NaN or infinity are refused (:class:`~embedtune.errors.NonFiniteError`):
        an entry is what every later run reads, and no score may come from them.
        """
        folder = self.entry(key)
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        check_finite(embeddings, f"the encoder's output for embedding cache entry {key[:12]}", "vectors",
                     fix="the model produced NaN or infinity for these rows; check the model and its inputs (a damaged model file?)")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").unlink(missing_ok=True)
        with writing(folder, _CACHE_SPACE_FIX):
            array_path = atomic_save_npy(folder / "embeddings.npy", embeddings)
            atomic_write_json(folder / "ids.json", list(ids))
            self._write_meta(folder, key, ids, embeddings, array_path, meta)
        return folder

    @staticmethod
    def _write_meta(folder: Path, key: str, ids: list[str], embeddings: np.ndarray, array_path: Path, meta: dict[str, Any]) -> None:
        size = array_path.stat().st_size
        write_json_with_digest(
            folder / "meta.json",
            {
                **meta,
                "key": key,
                "shape": list(embeddings.shape),
                "nbytes_file": size,
                "sha256": sha256_file(array_path),
                "ids_sha256": sha256_json(list(ids)),
            },
        )

    def get_or_compute(
        self,
        parts: dict[str, Any],
        ids: list[str],
        compute: Callable[[int, int], np.ndarray],
        shard_size: int = 2048,
    ) -> tuple[np.ndarray, bool]:
        """Return ``(embeddings, hit)``; on a miss compute rows ``[lo, hi)`` shard by shard.

        Each finished shard is written to the entry's ``partial/`` folder, so an interrupted
        encode resumes from the last finished shard instead of starting over.
        """
        key = cache_key(parts)
        cached = self.load(key, expected_ids=ids, remove_bad=False)
        if cached is not None:
            touch(self.entry(key))  # `embedtune cache prune --older-than` removes what has not been used
            return cached[1], True
        with self.lock(key):
            # Checked again under the lock: another process may have computed it meanwhile.
            cached = self.load(key, expected_ids=ids)
            if cached is not None:
                logger.info("embedding cache entry %s was computed by another process; reusing it", key[:12])
                return cached[1], True
            if self.use_bundled:
                shipped = bundled_vectors(parts, ids)
                if shipped is not None:
                    array, provenance = shipped
                    self.store(key, ids, array, {"parts": parts, "bundled": provenance})
                    loaded = self.load(key, expected_ids=ids)
                    return (loaded[1] if loaded is not None else array), True
            return self._compute(key, parts, ids, compute, shard_size), False

    def _compute(self, key: str, parts: dict[str, Any], ids: list[str], compute: Callable[[int, int], np.ndarray], shard_size: int) -> np.ndarray:
        """Encode entry ``key`` shard by shard (the caller holds its lock) and store it.

        Each finished shard goes to ``partial/<lo>-<hi>.npy`` with ``<lo>-<hi>.json`` beside it (its
        rows, dimension, the sha256 of the array and of its ids, the entry key, the token of this
        encode from ``partial/run.json``, and its own content digest), so an interrupted encode
        resumes from the shards already done. A shard is reused only when its record is intact, is
        this encode's, and the array matches it; anything else is encoded again.
        """
        partial = self.entry(key) / "partial"
        with writing(partial, _CACHE_SPACE_FIX):
            partial.mkdir(parents=True, exist_ok=True)
            run = self._partial_run(partial, key)
        shards = []
        for lo in range(0, len(ids), shard_size):
            hi = min(lo + shard_size, len(ids))
            shard_path = partial / f"{lo:010d}-{hi:010d}.npy"
            shard = self._partial_shard(shard_path, ids[lo:hi], key, run)
            if shard is None:
                shard = np.ascontiguousarray(compute(lo, hi), dtype=np.float32)
                check_finite(shard, f"the encoder's output for rows {lo}-{hi} of embedding cache entry {key[:12]}", "vectors",
                             fix="the model produced NaN or infinity for these rows; check the model and its inputs (a damaged model file?)")
                record_path = shard_path.with_suffix(".json")
                with writing(shard_path, _CACHE_SPACE_FIX):
                    record_path.unlink(missing_ok=True)  # an older shard's record no longer holds
                    atomic_save_npy(shard_path, shard)
                    write_json_with_digest(record_path, {"rows": int(shard.shape[0]), "dim": int(shard.shape[1]) if shard.ndim == 2 else 0,
                                                         "sha256": sha256_file(shard_path), "ids_sha256": sha256_json(list(ids[lo:hi])),
                                                         "key": key, "run": run})
            shards.append(shard)
        embeddings = np.concatenate(shards) if shards else np.zeros((0, 0), np.float32)
        self.store(key, ids, embeddings, {"parts": parts})
        shutil.rmtree(partial, ignore_errors=True)
        return embeddings

    @staticmethod
    def _partial_run(partial: Path, key: str) -> str:
        """The token of the encode that owns ``partial/`` (``run.json``, made with the folder): shards of another encode carry another."""
        path = partial / "run.json"
        try:
            record, _ = read_json_verified(path, _PARTIAL_FIX, require_digest=True)
            if record.get("key") == key and isinstance(record.get("run"), str):
                return record["run"]
        except (OSError, ValueError):
            pass
        for stale in partial.iterdir():  # shards of an encode whose record is gone cannot be told from another encode's
            if stale.is_file():
                stale.unlink()
        run = secrets.token_hex(16)
        write_json_with_digest(path, {"key": key, "run": run})
        return run

    @staticmethod
    def _partial_shard(shard_path: Path, ids: list[str], key: str, run: str) -> np.ndarray | None:
        """The finished shard at ``shard_path`` if its record is intact and it matches it (and ``ids``, ``key``, ``run``); else None, logged."""
        record_path = shard_path.with_suffix(".json")
        if not shard_path.is_file() and not record_path.is_file():
            return None
        try:
            if not record_path.is_file():
                raise IntegrityError(f"{record_path}: missing (the shard's digests were never written)")
            record, _ = read_json_verified(record_path, _PARTIAL_FIX, require_digest=True)
            if record.get("ids_sha256") != sha256_json(list(ids)) or record.get("rows") != len(ids):
                raise IntegrityError(f"{record_path}: records other rows than this entry's {len(ids)} ids at this place")
            if record.get("key") != key or record.get("run") != run:
                raise IntegrityError(f"{record_path}: written by another encode (entry {str(record.get('key'))[:12]}, run "
                                     f"{str(record.get('run'))[:8]}), not the one this partial folder belongs to")
            if not shard_path.is_file() or sha256_file(shard_path) != record.get("sha256"):
                raise IntegrityError(f"{shard_path}: missing, or its sha256 differs from the one {record_path.name} recorded")
            shard = np.load(shard_path, allow_pickle=False)
            if shard.dtype != np.float32 or shard.ndim != 2 or shard.shape != (len(ids), record.get("dim")):
                raise IntegrityError(f"{shard_path}: {shard.dtype} {shard.shape}, expected float32 ({len(ids)}, {record.get('dim')})")
            check_finite(shard, str(shard_path), "vectors", fix=VECTORS_FIX)
        except (OSError, ValueError, KeyError, TypeError) as error:
            logger.warning("embedding cache: %s is encoded again (%s)", shard_path.name, error)
            return None
        logger.debug("resuming: %s already encoded", shard_path.name)
        return shard
