"""Output folders and files that embedtune never overwrites unasked, and never deletes what it did not write.

Every command with ``--out`` calls :func:`prepare_output_dir` (or :func:`prepare_output_file`)
before it writes anything:

* a missing or empty ``--out`` is used as is;
* an existing non-empty one is refused unless ``overwrite`` (``--overwrite``) is given, or the
  command resumes its own earlier run there (``resume=True``: ``finetune pace``, ``pipeline``);
* ``overwrite`` removes only the files embedtune's marker ``.embedtune-output.json`` lists as
  written by an earlier run, file by file (a file the user put inside a folder embedtune wrote
  stays, and so does that folder); a folder without a marker is refused, and so is any removal
  that would touch an input of the command: a listed file that is an input, lies inside an
  input folder (``--out`` is the input's own folder), or a folder that holds an input;
* an output file equal to one of the inputs is always refused.

Ownership is exact. The marker is written when the folder is prepared (``complete: false``,
with the files that were already there, ``kept``); every file embedtune then writes through
:func:`embedtune.io.atomic_write` is recorded in it as it is written (so a run killed
mid-way still lists what it wrote), and :func:`finish_output_dir` records the rest and sets
``complete: true``. A run that fails with an error finishes its marker too (``failed: true``)
with what it wrote up to then (:func:`close_open_outputs`, called by the command line), so a file
the user adds after a failed run is never taken for embedtune's.

Markers written by embedtune before the per-file record (no ``files`` field) list top-level
entries; for those the top-level rule of that version applies.

Links. Nothing is removed or written through a symbolic link that leaves the folder: with
``overwrite`` (or when resuming), a link anywhere inside ``--out`` whose target lies outside it
(a moved-away subfolder linked back, a file linked to an archive) is refused with an error that
names the link and its target, before anything is removed; the fix is to remove the link (what it
points to is kept) or choose another ``--out``. A file embedtune wrote that has since been
replaced by a link is removed as a link (its target is untouched). A marker names only relative
paths of files inside its own folder: an entry that is absolute, holds ``..``, names the folder
itself or a folder, or is reached through a link is never removed, and a warning names it.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from embedtune import __version__
from embedtune.errors import EmbedtuneError
from embedtune.io import add_write_observer, atomic_write_json

logger = logging.getLogger(__name__)

__all__ = [
    "MARKER_NAME",
    "OVERWRITE_HELP",
    "OutputExistsError",
    "prepare_output_dir",
    "finish_output_dir",
    "prepare_output_file",
    "read_marker",
    "owned_files",
    "close_open_outputs",
    "command_outputs",
]

MARKER_NAME = ".embedtune-output.json"
MARKER_FORMAT = 2
OVERWRITE_HELP = ("replace what an earlier embedtune run wrote in --out (files embedtune did not write are kept, "
                  "the inputs are never removed, and a symbolic link in --out that leaves it is refused); "
                  "without it, a non-empty --out is refused")
# Seconds between two marker rewrites while a run records its files (the rest is recorded on finish).
_RECORD_INTERVAL = 0.5
_RECORD_EACH = 256


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


def _walk_files(directory: Path) -> list[str]:
    """Every file (and symlink) below ``directory``, as sorted POSIX paths relative to it; the marker excluded."""
    found = []
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        for name in files + [d for d in dirs if (base / d).is_symlink()]:
            rel = (base / name).relative_to(directory).as_posix()
            if rel != MARKER_NAME:
                found.append(rel)
    return sorted(found)


def _names(values: Any) -> list[str]:
    return [str(v) for v in values] if isinstance(values, list) else []


def _safe_relative(directory: Path, rel: str) -> Path | None:
    """``directory / rel`` when ``rel`` names a path strictly inside ``directory`` (a marker is never trusted to point outside)."""
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or ".." in parts or not parts:
        return None
    return directory.joinpath(*parts)


def _link_on_the_way(directory: Path, entry: Path) -> Path | None:
    """The first folder between ``directory`` and ``entry`` (``entry`` itself excluded) that is a symbolic link, or None."""
    current = directory
    for part in entry.relative_to(directory).parts[:-1]:
        current = current / part
        if current.is_symlink():
            return current
    return None


def _marker_entry_problem(directory: Path, rel: str, entry: Path | None) -> str | None:
    """Why a per-file marker entry is not removed (None: it is a file or link inside the folder, reached without a link)."""
    if entry is None:
        return "it is not a relative path inside the folder"
    link = _link_on_the_way(directory, entry)
    if link is not None:
        return f"it is reached through the link {link}"
    if entry.is_dir() and not entry.is_symlink():
        return "it names a folder (a marker lists files)"
    return None


def owned_files(directory: str | os.PathLike, marker: dict[str, Any] | None = None) -> list[Path]:
    """The paths in ``directory`` that embedtune wrote, by its marker (files; whole entries for an old marker)."""
    directory = Path(directory)
    marker = read_marker(directory) if marker is None else marker
    if marker is None:
        return []
    if "files" in marker:  # per-file record
        owned = []
        for rel in _names(marker["files"]):
            entry = _safe_relative(directory, rel)
            if entry is not None and not (entry.exists() or entry.is_symlink()) and _link_on_the_way(directory, entry) is None:
                continue  # already gone
            problem = _marker_entry_problem(directory, rel, entry)
            if problem is not None:
                logger.warning("%s: %s lists %r, which is never removed: %s", directory, MARKER_NAME, rel, problem)
                continue
            owned.append(entry)
        return owned
    # A marker of an older embedtune: top-level entries.
    present = {entry.name for entry in directory.iterdir()} - {MARKER_NAME}
    if marker.get("complete") and isinstance(marker.get("written"), list):
        owned = present & set(_names(marker["written"]))
    else:  # an unfinished run of that version: everything but what was there before it
        owned = present - set(_names(marker.get("kept", [])))
    return [directory / name for name in sorted(owned)]


class _OpenOutput:
    """A folder this process prepared and has not finished: the files recorded so far."""

    def __init__(self, directory: Path, command: str, kept: list[str]) -> None:
        self.directory, self.command, self.kept = directory, command, kept
        self.files: set[str] = set()
        self.resolved = directory.resolve()
        self.last_write = 0.0
        self.pending = False

    def record(self, path: Path) -> None:
        try:
            rel = path.resolve().relative_to(self.resolved).as_posix()
        except ValueError:
            return
        if rel == MARKER_NAME or rel in self.files:
            return
        self.files.add(rel)
        self.pending = True
        # Each file is recorded at once (a killed run still lists it); past a few hundred, at most twice a second.
        if len(self.files) <= _RECORD_EACH or time.monotonic() - self.last_write >= _RECORD_INTERVAL:
            self.flush()

    def flush(self, complete: bool = False, failed: bool = False) -> None:
        _write_marker(self.directory, self.command, self.kept, complete, sorted(self.files), failed=failed)
        self.last_write, self.pending = time.monotonic(), False


_open: dict[Path, _OpenOutput] = {}
_writing_marker = False


def _observe(path: Path) -> None:
    if _writing_marker or not _open:
        return
    for output in list(_open.values()):
        output.record(Path(path))


add_write_observer(_observe)


def _write_marker(directory: Path, command: str, kept: Iterable[str], complete: bool, files: Iterable[str] = (),
                  failed: bool = False) -> None:
    global _writing_marker
    files = sorted(set(files))
    _writing_marker = True
    try:
        atomic_write_json(directory / MARKER_NAME, {
            "command": command,
            "complete": complete,
            "failed": failed,
            "embedtune_version": __version__,
            "format": MARKER_FORMAT,
            "kept": sorted(set(kept)),
            "files": files,
            "written": sorted({rel.split("/", 1)[0] for rel in files}),  # top-level entries, as older versions read it
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        })
    finally:
        _writing_marker = False


def _open_output(directory: Path, command: str, kept: list[str], files: Iterable[str] = ()) -> None:
    output = _OpenOutput(directory, command, kept)
    output.files.update(files)
    _open[output.resolved] = output
    output.flush()


def _check_inputs(directory: Path, owned: list[Path], inputs: Iterable[str | os.PathLike | None], flag: str) -> None:
    """Refuse when removing ``owned`` would touch an input: one is an input, lies inside one, or holds one."""
    sources = [(source, _resolved(source)) for source in inputs if source is not None]
    if not sources:
        return
    for entry in owned:
        resolved = entry.resolve() if not entry.is_symlink() else entry.parent.resolve() / entry.name
        for source, source_path in sources:
            if _is_within(source_path, resolved):
                raise OutputExistsError(
                    f"{directory}: --overwrite would remove {entry}, which holds the input {source}; "
                    f"copy the input elsewhere or choose another {flag}."
                )
            if _is_within(resolved, source_path):
                where = (f" ({flag} is the input's own folder or lies inside it)" if _is_within(directory.resolve(), source_path)
                         else "")
                raise OutputExistsError(
                    f"{directory}: --overwrite would remove {entry}, which lies inside the input {source}{where}; "
                    f"copy the input elsewhere or choose another {flag}."
                )


def _links_leaving(directory: Path) -> list[tuple[Path, str]]:
    """Every symbolic link below ``directory`` (not followed) whose target lies outside it, with that target."""
    real = directory.resolve()
    found = []
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        for name in sorted(dirs + files):
            path = base / name
            if path.is_symlink() and not _is_within(Path(os.path.realpath(path)), real):
                found.append((path, os.readlink(path)))
    return found


def _check_links(directory: Path, removed: Iterable[Path], flag: str) -> None:
    """Refuse when a link inside ``directory`` leaves it (a write or removal through it would land outside).

    Links among ``removed`` are removed as links (their targets are untouched), so they are not refused.
    """
    removed = set(removed)
    leaving = [(path, target) for path, target in _links_leaving(directory) if path not in removed]
    if leaving:
        path, target = leaving[0]
        more = f" (and {len(leaving) - 1} more: {_listing([str(p) for p, _ in leaving[1:]])})" if len(leaving) > 1 else ""
        raise OutputExistsError(
            f"{directory}: {path} is a symbolic link to {target}, outside {flag}{more}; embedtune never writes or removes "
            f"through a link that leaves {flag}. Remove the link (what it points to is kept) or choose another {flag}."
        )


def _remove(directory: Path, owned: list[Path]) -> None:
    """Remove ``owned`` (files; whole entries of an old marker), then the folders that this left empty."""
    parents: set[Path] = set()
    real = directory.resolve()
    for entry in owned:
        # Checked again right before removing: the entry's folder must still be itself (no link on the way).
        if _link_on_the_way(directory, entry) is not None or not _is_within(entry.parent.resolve(), real):
            raise OutputExistsError(f"{directory}: {entry} is now reached through a symbolic link; nothing more is removed. "
                                    f"Remove the link or choose another folder.")
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)  # a whole top-level entry of an older marker (rmtree removes links in it, never their targets)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
        parent = entry.parent
        while parent != directory and _is_within(parent, directory):
            parents.add(parent)
            parent = parent.parent
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        try:
            parent.rmdir()  # only when empty: a folder holding the user's files stays
        except OSError:
            pass


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
        inputs: paths the command reads (None entries are skipped); removing one, a file inside
            one, or a folder holding one is refused.
        command: the command's name (``"compress train"``), recorded in the marker.
        resume: a folder this same command wrote (by its marker) is re-entered as it is.
        legacy_names: with ``resume``, files whose presence marks a folder this command wrote
            before markers existed (e.g. ``pace_config.json``); such a folder is resumed too.
        flag: the option that named ``path``, for the messages.
        check_only: only raise what would be refused; create, remove and write nothing (call
            again without it right before writing, e.g. after a long build).

    Raises:
        OutputExistsError: ``path`` is a file, is not empty (without ``overwrite``), has no
            marker (with ``overwrite``), or a file to remove is, holds or lies inside an input.
    """
    directory = Path(path)
    inputs = list(inputs)
    if directory.exists() and not directory.is_dir():
        raise OutputExistsError(f"{directory}: {flag} must be a folder, but a file is there; choose another {flag}.")
    entries = sorted(entry.name for entry in directory.iterdir()) if directory.is_dir() else []
    marker = read_marker(directory) if entries else None
    foreign = [name for name in entries if name != MARKER_NAME]
    if not foreign:
        if not check_only:
            directory.mkdir(parents=True, exist_ok=True)
            _open_output(directory, command, kept=[])
        return directory
    if resume and not overwrite:
        if marker is not None and marker["command"] == command:
            _check_links(directory, (), flag)
            if not check_only:
                logger.info("%s: resuming the earlier `embedtune %s` run in this folder", directory, command)
                if "files" in marker:
                    _open_output(directory, command, _names(marker.get("kept", [])), _names(marker["files"]))
            return directory
        legacy = [name for name in legacy_names if (directory / name).exists()]
        if marker is None and legacy:
            _check_links(directory, (), flag)
            if not check_only:
                logger.info("%s: resuming an earlier `embedtune %s` run (written before output markers; %s found)",
                            directory, command, legacy[0])
                _open_output(directory, command, kept=[], files=_walk_files(directory))
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
    owned = owned_files(directory, marker)
    _check_links(directory, [entry for entry in owned if entry.is_symlink()], flag)
    _check_inputs(directory, owned, inputs, flag)
    if check_only:
        return directory
    _remove(directory, owned)
    kept = _walk_files(directory)
    logger.info("%s: --overwrite removed %d files of an earlier `embedtune %s` run%s", directory, len(owned), marker["command"],
                f"; kept {_listing(kept)} (not written by embedtune)" if kept else "")
    _open_output(directory, command, kept=kept)
    return directory


def finish_output_dir(path: str | os.PathLike, command: str | None = None, failed: bool = False) -> None:
    """Record in the marker of ``path`` the files the run wrote, and that it finished (or ``failed``)."""
    directory = Path(path)
    resolved = directory.resolve()
    output = _open.pop(resolved, None)
    marker = read_marker(directory) or {"command": command or "embedtune", "kept": []}
    if output is not None:
        kept, files = output.kept, set(output.files)
    elif "files" in marker:
        kept, files = _names(marker.get("kept", [])), set(_names(marker["files"]))
    else:  # a marker of an older embedtune: its kept entries were top-level names
        top = set(_names(marker.get("kept", [])))
        kept = [rel for rel in _walk_files(directory) if rel.split("/", 1)[0] in top]
        files = set()
    # What is there now and was not there before: written by this run (most writes are recorded
    # as they happen; this adds the files other libraries wrote, e.g. a trainer's checkpoints).
    kept_set = set(kept)
    files |= {rel for rel in _walk_files(directory) if rel not in kept_set}
    existing = {rel for rel in files if (directory / rel).exists() or (directory / rel).is_symlink()}
    _write_marker(directory, command or marker["command"], kept=kept, complete=not failed, files=existing, failed=failed)


def close_open_outputs(failed: bool = True) -> None:
    """Finish the marker of every folder this process prepared and has not finished (a failed command's)."""
    for resolved, output in list(_open.items()):
        try:
            if output.directory.is_dir():
                finish_output_dir(output.directory, output.command, failed=failed)
        except OSError as error:  # the disk that failed the command may fail this too: the per-file record stays
            logger.warning("%s: could not finish %s (%s)", output.directory, MARKER_NAME, error)
        finally:
            _open.pop(resolved, None)


@contextmanager
def command_outputs() -> Iterator[None]:
    """Around one command: the folders it prepared and did not finish are finished as failed when it raises."""
    try:
        yield
    except BaseException:
        close_open_outputs(failed=True)
        raise
    finally:
        for output in list(_open.values()):
            if output.pending:
                try:
                    output.flush()
                except OSError:
                    pass
        _open.clear()


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
