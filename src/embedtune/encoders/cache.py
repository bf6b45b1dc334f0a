"""An on-disk embedding cache under the user cache dir (``$EMBEDTUNE_CACHE`` overrides it).

Each entry is a folder named by a sha256 key over the model fingerprint, the data-file
fingerprint, the text recipe, the max sequence length and normalisation. It holds
``embeddings.npy`` (memory-mappable), ``ids.json`` and ``meta.json``; ``meta.json`` is written
last, so an entry without it is incomplete. A truncated or mismatched entry is detected on
load, logged and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from embedtune.encoders.paths import cache_root
from embedtune.io import atomic_save_npy, atomic_write_json, sha256_file

logger = logging.getLogger(__name__)

__all__ = ["EmbeddingCache", "cache_key"]

# Above this size the full checksum costs more than re-reading is worth; size and shape still guard.
_CHECKSUM_LIMIT_BYTES = 512 << 20


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class EmbeddingCache:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root() / "embeddings"

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str, expected_ids: list[str] | None = None) -> tuple[list[str], np.ndarray] | None:
        """Return ``(ids, embeddings)`` (memory-mapped) or None on a miss or a bad entry."""
        folder = self.entry(key)
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            ids = json.loads((folder / "ids.json").read_text())
            array_path = folder / "embeddings.npy"
            if meta.get("key") != key:
                raise ValueError("meta.json key does not match its folder")
            if array_path.stat().st_size != meta["nbytes_file"]:
                raise ValueError(f"embeddings.npy has {array_path.stat().st_size} bytes, expected {meta['nbytes_file']}")
            if meta.get("sha256") and sha256_file(array_path) != meta["sha256"]:
                raise ValueError("embeddings.npy checksum mismatch")
            embeddings = np.load(array_path, mmap_mode="r", allow_pickle=False)
            if list(embeddings.shape) != meta["shape"] or len(ids) != embeddings.shape[0]:
                raise ValueError(f"shape {embeddings.shape} does not match meta {meta['shape']} / {len(ids)} ids")
            if expected_ids is not None and ids != list(expected_ids):
                raise ValueError("cached ids differ from the requested ids")
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as error:
            logger.warning("embedding cache entry %s is corrupt (%s); rebuilding it", folder, error)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return ids, embeddings

    def store(self, key: str, ids: list[str], embeddings: np.ndarray, meta: dict[str, Any]) -> Path:
        folder = self.entry(key)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").unlink(missing_ok=True)
        array_path = atomic_save_npy(folder / "embeddings.npy", np.ascontiguousarray(embeddings, dtype=np.float32))
        atomic_write_json(folder / "ids.json", list(ids))
        size = array_path.stat().st_size
        atomic_write_json(
            folder / "meta.json",
            {
                **meta,
                "key": key,
                "shape": list(embeddings.shape),
                "nbytes_file": size,
                "sha256": sha256_file(array_path) if size <= _CHECKSUM_LIMIT_BYTES else None,
            },
        )
        return folder

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
        cached = self.load(key, expected_ids=ids)
        if cached is not None:
            return cached[1], True
        partial = self.entry(key) / "partial"
        partial.mkdir(parents=True, exist_ok=True)
        shards = []
        for lo in range(0, len(ids), shard_size):
            hi = min(lo + shard_size, len(ids))
            shard_path = partial / f"{lo:010d}-{hi:010d}.npy"
            shard = None
            if shard_path.is_file():
                try:
                    shard = np.load(shard_path, allow_pickle=False)
                    if shard.shape[0] != hi - lo:
                        shard = None
                    else:
                        logger.info("resuming: rows %d-%d already encoded", lo, hi)
                except (OSError, ValueError):
                    shard = None
            if shard is None:
                shard = np.ascontiguousarray(compute(lo, hi), dtype=np.float32)
                atomic_save_npy(shard_path, shard)
            shards.append(shard)
        embeddings = np.concatenate(shards) if shards else np.zeros((0, 0), np.float32)
        self.store(key, ids, embeddings, {"parts": parts})
        shutil.rmtree(partial, ignore_errors=True)
        return embeddings, False
