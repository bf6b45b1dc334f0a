"""Embeddings shipped in the package, used as verified embedding-cache entries.

``datasets/<name>-vectors.json`` describes a ``.npz`` beside it: the file's sha256, and per
array (``document``, ``query``) the cache-key parts it was made from (the model folder's
fingerprint, the data file's sha256, the text recipe) and its shape. The bundled SciFact
vectors of the ``minilm`` model let the first ``make demo`` skip a 10-minute encode.

An entry is used only when a cache miss asks for exactly those parts (so the installed model's
files and the dataset's files hash to what the vectors were made from, and the recipe is the
same), and only after the ``.npz``'s sha256, the ids, the shape, the dtype and the finiteness
are checked. Anything else (another model, an edited corpus, a prompt, a damaged file) finds no
entry, and the texts are encoded as without it.

``$EMBEDTUNE_VECTORS_PATH`` (folders separated by ``os.pathsep``) adds folders of manifests made
the same way (``benchmarks/make_bundled_vectors.py --out-dir``) but not shipped in the wheel, e.g.
the repository's ``benchmarks/data/vectors`` (mpnet on SciFact, an hour and a half to encode on a
2-core CPU). They are checked exactly like the package's own.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from embedtune.io import sha256_file

logger = logging.getLogger(__name__)

__all__ = ["bundled_vectors", "bundled_manifests", "vector_folders", "BUNDLED_VECTORS_DIR", "VECTORS_PATH_VARIABLE"]

BUNDLED_VECTORS_DIR = Path(__file__).resolve().parent.parent / "datasets"
VECTORS_PATH_VARIABLE = "EMBEDTUNE_VECTORS_PATH"


def vector_folders() -> list[Path]:
    """The package's ``datasets/``, then every folder named in ``$EMBEDTUNE_VECTORS_PATH`` (missing ones are skipped, with a warning)."""
    folders = [BUNDLED_VECTORS_DIR]
    for entry in os.environ.get(VECTORS_PATH_VARIABLE, "").split(os.pathsep):
        if not entry.strip():
            continue
        folder = Path(entry).expanduser()
        if folder.is_dir():
            folders.append(folder)
        else:
            logger.warning("%s names %s, which is not a folder; it is ignored", VECTORS_PATH_VARIABLE, folder)
    return folders


def bundled_manifests(folder: Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every ``*-vectors.json`` manifest in ``folder`` (the package's ``datasets/``), parsed."""
    folder = BUNDLED_VECTORS_DIR if folder is None else Path(folder)
    found = []
    for path in sorted(folder.glob("*-vectors.json")):
        try:
            found.append((path, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as error:
            logger.warning("bundled vectors manifest %s is unreadable (%s); it is ignored", path, error)
    return found


@functools.lru_cache(maxsize=8)
def _verified_file(path: str, size: int, mtime_ns: int, expected_sha256: str) -> bool:
    """Whether the file hashes to ``expected_sha256`` (once per process and file version)."""
    return sha256_file(path) == expected_sha256


def bundled_vectors(parts: dict[str, Any], ids: list[str], folder: Path | None = None) -> tuple[np.ndarray, dict[str, Any]] | None:
    """The shipped float32 vectors made from exactly ``parts`` for ``ids``, checked; else None.

    Returns ``(array, provenance)``: provenance names the file and what made it.
    """
    manifests = bundled_manifests(folder) if folder is not None else [m for f in vector_folders() for m in bundled_manifests(f)]
    for manifest_path, manifest in manifests:
        for kind, entry in (manifest.get("entries") or {}).items():
            if entry.get("parts") != parts:
                continue
            data_path = manifest_path.parent / str(manifest.get("file", ""))
            try:
                stat = data_path.stat()
                if not _verified_file(str(data_path), stat.st_size, stat.st_mtime_ns, str(manifest.get("sha256"))):
                    raise ValueError("its sha256 differs from the manifest's")
                with np.load(data_path, allow_pickle=False) as archive:
                    array = archive[kind]
                    stored_ids = archive[f"{kind}_ids"].tolist()
                if array.dtype != np.float32:
                    raise ValueError(f"{kind} holds {array.dtype}, expected float32")
                if list(array.shape) != list(entry.get("shape", [])) or len(stored_ids) != array.shape[0]:
                    raise ValueError(f"{kind} has shape {array.shape}, the manifest says {entry.get('shape')}")
                if stored_ids != list(ids):
                    raise ValueError(f"its {kind} ids differ from the dataset's")
                if not np.isfinite(array).all():
                    raise ValueError(f"{kind} holds non-finite values")
            except (OSError, ValueError, KeyError) as error:
                logger.warning("bundled vectors %s are not used (%s); encoding instead", data_path.name, error)
                return None
            provenance = {"file": data_path.name, "sha256": manifest.get("sha256"), "made_with": manifest.get("made_with")}
            logger.info("%s embeddings: using the %d bundled vectors in %s (checked), no encoding needed", kind, array.shape[0], data_path.name)
            return np.ascontiguousarray(array), provenance
    return None
