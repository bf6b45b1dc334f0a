"""Output folders and files that embedtune never overwrites unasked.

Every command with ``--out`` calls :func:`prepare_output_dir` (or :func:`prepare_output_file`)
before it writes anything:

* a missing or empty ``--out`` is used as is;
* an existing non-empty one is refused unless ``overwrite`` (``--overwrite``) is given, or the
  command resumes its own earlier run there (``resume=True``: ``finetune pace``, ``pipeline``);
* ``overwrite`` removes only what embedtune wrote there, recognised by the marker file
  ``.embedtune-output.json`` (the command and the entries it wrote); files that were there
  before embedtune are kept, a folder without a marker is refused, and so is a folder whose
  removal would delete an input the command reads;
* an output file equal to one of the inputs is always refused.

The marker is written when the folder is prepared (``complete: false``, with the entries that
were already there) and finished by :func:`finish_output_dir` (``complete: true`` and the
entries written). For a run that never finished, everything but the entries that were there
before it counts as its output.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from embedtune import __version__
from embedtune.errors import EmbedtuneError
from embedtune.io import atomic_write_json

logger = logging.getLogger(__name__)

__all__ = [
    "MARKER_NAME",
    "OVERWRITE_HELP",
    "OutputExistsError",
    "prepare_output_dir",
    "finish_output_dir",
    "prepare_output_file",
    "read_marker",
]

MARKER_NAME = ".embedtune-output.json"
OVERWRITE_HELP = ("replace what an earlier embedtune run wrote in --out (files embedtune did not write are kept, "
                  "and the inputs are never removed); without it, a non-empty --out is refused")


class OutputExistsError(FileExistsError, EmbedtuneError):
    """``--out`` holds something embedtune will not overwrite without being asked (or at all).

    Both a ``FileExistsError`` (what it is) and an :class:`~embedtune.errors.EmbedtuneError`
    (bad input: the command line prints it as one message).
    """


def _resolved(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve()


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def read_marker(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of a folder embedtune wrote, or None (no marker, or an unreadable one)."""
    path = Path(directory) / MARKER_NAME
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("command"), str) else None


def _owned_entries(directory: Path, marker: dict[str, Any]) -> list[Path]:
    """The top-level entries of ``directory`` that embedtune wrote, by its marker."""
    present = {entry.name for entry in directory.iterdir()} - {MARKER_NAME}
    if marker.get("complete") and isinstance(marker.get("written"), list):
        owned = present & {str(name) for name in marker["written"]}
    else:  # an unfinished run: everything but what was there before it
        owned = present - {str(name) for name in marker.get("kept", [])}
    return [directory / name for name in sorted(owned)]


def _write_marker(directory: Path, command: str, kept: Iterable[str], complete: bool, written: Iterable[str] = ()) -> None:
    atomic_write_json(directory / MARKER_NAME, {
        "command": command,
        "complete": complete,
        "embedtune_version": __version__,
        "kept": sorted(kept),
        "written": sorted(written),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    })


def prepare_output_dir(
    path: str | os.PathLike,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike | None] = (),
    command: str = "embedtune",
    resume: bool = False,
    legacy_names: Iterable[str] = (),
    flag: str = "--out",
    check_only: bool = False,
) -> Path:
    """Make ``path`` ready for ``command`` to write into, or refuse; returns it.

    Args:
        path: the output folder.
        overwrite: remove what an earlier embedtune run wrote there first (never other files).
        inputs: paths the command reads (None entries are skipped); removing one is refused.
        command: the command's name (``"compress train"``), recorded in the marker.
        resume: a folder this same command wrote (by its marker) is re-entered as it is.
        legacy_names: with ``resume``, files whose presence marks a folder this command wrote
            before markers existed (e.g. ``pace_config.json``); such a folder is resumed too.
        flag: the option that named ``path``, for the messages.
        check_only: only raise what would be refused; create, remove and write nothing (call
            again without it right before writing, e.g. after a long build).

    Raises:
        OutputExistsError: ``path`` is a file, is not empty (without ``overwrite``), has no
            marker (with ``overwrite``), or holds an input that ``overwrite`` would remove.
    """
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise OutputExistsError(f"{directory}: {flag} must be a folder, but a file is there; choose another {flag}.")
    entries = sorted(entry.name for entry in directory.iterdir()) if directory.is_dir() else []
    marker = read_marker(directory) if entries else None
    foreign = [name for name in entries if name != MARKER_NAME]
    if not foreign:
        if not check_only:
            directory.mkdir(parents=True, exist_ok=True)
            _write_marker(directory, command, kept=(), complete=False)
        return directory
    if resume and not overwrite:
        if marker is not None and marker["command"] == command:
            if not check_only:
                logger.info("%s: resuming the earlier `embedtune %s` run in this folder", directory, command)
            return directory
        legacy = [name for name in legacy_names if (directory / name).exists()]
        if marker is None and legacy:
            if not check_only:
                logger.info("%s: resuming an earlier `embedtune %s` run (written before output markers; %s found)",
                            directory, command, legacy[0])
                _write_marker(directory, command, kept=(), complete=False)
            return directory
    if not overwrite:
        what = f"an earlier `embedtune {marker['command']}` run" if marker is not None else "files embedtune did not write"
        resumable = " or re-run the same command to resume" if resume else ""
        raise OutputExistsError(
            f"{directory}: {flag} is not empty (it holds {what}: {_listing(foreign)}); choose a new {flag}{resumable}, "
            "or pass --overwrite to replace what embedtune wrote there."
        )
    if marker is None:
        raise OutputExistsError(
            f"{directory}: --overwrite only replaces what embedtune wrote, and this folder has no {MARKER_NAME} "
            f"(it holds {_listing(foreign)}); remove it yourself or choose a new {flag}."
        )
    owned = _owned_entries(directory, marker)
    for source in inputs:
        if source is None:
            continue
        source_path = _resolved(source)
        for entry in owned:
            if _is_within(source_path, entry.resolve()):
                raise OutputExistsError(
                    f"{directory}: --overwrite would remove {entry}, which holds the input {source}; "
                    f"copy the input elsewhere or choose another {flag}."
                )
    if check_only:
        return directory
    for entry in owned:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    kept = [name for name in foreign if directory / name not in owned]
    logger.info("%s: --overwrite removed %d entries of an earlier `embedtune %s` run%s", directory, len(owned), marker["command"],
                f"; kept {_listing(kept)}" if kept else "")
    _write_marker(directory, command, kept=kept, complete=False)
    return directory


def finish_output_dir(path: str | os.PathLike, command: str | None = None) -> None:
    """Record in the marker of ``path`` that the run finished, and the entries it wrote."""
    directory = Path(path)
    marker = read_marker(directory) or {"command": command or "embedtune", "kept": []}
    kept = [str(name) for name in marker.get("kept", [])]
    written = [entry.name for entry in directory.iterdir() if entry.name != MARKER_NAME and entry.name not in kept]
    if marker.get("complete") and isinstance(marker.get("written"), list):  # a resumed run keeps what the first one wrote
        written = sorted(set(written) | {str(name) for name in marker["written"]})
    _write_marker(directory, command or marker["command"], kept=kept, complete=True, written=written)


def prepare_output_file(
    path: str | os.PathLike,
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike | None] = (),
    flag: str = "--out",
) -> Path:
    """Check that the file ``path`` may be written: not an input, and new unless ``overwrite``."""
    target = Path(path)
    resolved = _resolved(target)
    for source in inputs:
        if source is not None and _resolved(source) == resolved:
            raise OutputExistsError(f"{target}: {flag} is the input file {source}; writing it would destroy the input. Choose another {flag}.")
    if target.is_dir():
        raise OutputExistsError(f"{target}: {flag} names a file, but a folder is there; choose another {flag}.")
    if target.exists() and not overwrite:
        raise OutputExistsError(f"{target}: {flag} already exists; choose a new {flag}, or pass --overwrite to replace it.")
    return target


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
