"""Links and hostile markers planted in ``--out``: with ``--overwrite`` nothing outside ``--out`` changes.

Each writing command (``compress fit``, ``compress train``, ``compress plan``, ``index build``,
``embed-corpus``) first writes its folder; then, in a fresh copy of that folder, one probe is
planted and the command runs again with ``--overwrite`` (and, for the commands that resume their
own folder, once more without it). A sentinel tree outside ``--out`` (files, a folder, a marker
copy) is hashed before and after, without following links, and a file of the user's inside
``--out`` must survive. Every probe ends in one of:

* ``refused clearly``: exit 2 with embedtune's message naming the link or the folder, nothing changed;
* ``safe success``: exit 0, the sentinel tree and the user's file unchanged;
* ``escaped``: something outside ``--out`` (or the user's file) changed or vanished (the target is 0);
* ``unclear failure``: another exit code, or an exception (the target is 0).

The probes: an owned file replaced by a link to an outside file; an owned subfolder moved outside
and linked back; a link (not in the marker) to an outside file or folder; a link that stays inside;
the marker itself a link to an outside copy; marker entries that are absolute, climb out with
``..``, pass through a link, or name the folder itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from conftest import write_toy_vectors
from embedtune.cli import main
from embedtune.outputs import MARKER_NAME

OUTCOMES = ("refused clearly", "safe success", "escaped", "unclear failure")
PROBES = ("owned file linked outside", "owned folder moved outside and linked back", "planted link to an outside file",
          "planted link to an outside folder", "planted link staying inside", "marker is a link outside",
          "marker lists an absolute path", "marker lists ../", "marker lists a path through a link", "marker lists the folder itself")
USER_FILE = "notes-of-the-user.md"
D = 24


def _hash_tree(root: Path) -> dict[str, str]:
    """Every entry below ``root`` (links not followed): a file's sha256, inode and mtime, a link's target, or 'dir'."""
    found = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(base) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                found[rel] = "dir"
            else:  # the same bytes written again still count: the inode and the mtime say it was touched
                stat = path.lstat()
                found[rel] = f"{hashlib.sha256(path.read_bytes()).hexdigest()} {stat.st_ino} {stat.st_mtime_ns}"
    return found


def _sentinel(root: Path, marker: dict) -> Path:
    root.mkdir()
    (root / "a.txt").write_text("the user's archive")
    (root / "sub").mkdir()
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (root / "config.json").write_text('{"not": "embedtune\'s"}')
    (root / "model.safetensors").write_bytes(b"someone else's weights")
    (root / "marker.json").write_text(json.dumps(marker))
    return root


def _rewrite_marker(out: Path, change) -> None:
    marker = json.loads((out / MARKER_NAME).read_text())
    change(marker)
    (out / MARKER_NAME).write_text(json.dumps(marker))


def _plant(probe: str, out: Path, outside: Path) -> bool:
    """Plant ``probe`` in ``out``; False when it does not apply to this command's folder."""
    files = json.loads((out / MARKER_NAME).read_text())["files"]
    if probe == "owned file linked outside":
        target = out / files[0]
        target.unlink()
        target.symlink_to(outside / "a.txt")
    elif probe == "owned folder moved outside and linked back":
        nested = sorted({f.split("/", 1)[0] for f in files if "/" in f})
        if not nested:
            return False
        archive = outside / "archive"
        archive.mkdir(exist_ok=True)
        (out / nested[0]).rename(archive / nested[0])
        (out / nested[0]).symlink_to(archive / nested[0], target_is_directory=True)
    elif probe == "planted link to an outside file":
        (out / "extra.bin").symlink_to(outside / "sub" / "b.bin")
    elif probe == "planted link to an outside folder":
        (out / "extra").symlink_to(outside / "sub", target_is_directory=True)
    elif probe == "planted link staying inside":
        (out / "alias").symlink_to(out / files[0])
    elif probe == "marker is a link outside":
        (outside / "marker.json").write_text((out / MARKER_NAME).read_text())
        (out / MARKER_NAME).unlink()
        (out / MARKER_NAME).symlink_to(outside / "marker.json")
    elif probe == "marker lists an absolute path":
        _rewrite_marker(out, lambda m: m["files"].extend([str(outside / "a.txt"), str(outside / "sub")]))
    elif probe == "marker lists ../":
        rel = os.path.relpath(outside / "a.txt", out)
        _rewrite_marker(out, lambda m: m["files"].extend([rel, f"x/../{rel}", "../" + out.name + "/" + USER_FILE]))
    elif probe == "marker lists a path through a link":
        (out / "via").symlink_to(outside, target_is_directory=True)
        _rewrite_marker(out, lambda m: m["files"].extend(["via/a.txt", "via/sub/b.bin", "via/sub"]))
    elif probe == "marker lists the folder itself":
        _rewrite_marker(out, lambda m: m["files"].extend([".", "", "./", "./."]))
    else:
        raise ValueError(probe)
    return True


def _judge(argv: list[str], out: Path, outside: Path, capsys) -> tuple[str, str]:
    before = _hash_tree(outside)
    user = (out / USER_FILE).read_text()
    capsys.readouterr()
    try:
        code = main(["-q", *argv])
    except BaseException as error:  # noqa: BLE001 - a crash is an outcome, recorded
        return "unclear failure", f"{type(error).__name__}: {error}"
    err = capsys.readouterr().err
    if _hash_tree(outside) != before or not (out / USER_FILE).is_file() or (out / USER_FILE).read_text() != user:
        return "escaped", err
    if code == 0:
        return "safe success", ""
    if code == 2 and "Traceback" not in err and (str(out) in err or "symbolic link" in err):
        return "refused clearly", err.strip().splitlines()[-1]
    return "unclear failure", err


@pytest.fixture
def vectors(tmp_path):
    """60 unit-norm 24-d docs, 40 queries judged against them, as a BEIR folder plus .npy/.txt files."""
    write_toy_vectors(tmp_path, doc_text=lambda doc_id: f"document number {doc_id[1:]}", dim=D)
    return tmp_path


def _commands(root: Path, tiny_bert_dir: Path) -> dict[str, tuple[list[str], bool]]:
    """Each writing command's arguments (without --out), and whether it resumes its own folder."""
    vec = ["--data", str(root / "toy"), "--doc-embeddings", str(root / "doc.npy"), "--doc-ids", str(root / "doc.txt"),
           "--query-embeddings", str(root / "query.npy"), "--query-ids", str(root / "query.txt")]
    return {
        "compress fit": (["compress", "fit", "--method", "pca", "--dim", "4", "--doc-embeddings", str(root / "doc.npy"),
                          "--doc-ids", str(root / "doc.txt")], False),
        "compress train": (["compress", "train", "--method", "pca", "--dim", "4", "--compare", "", *vec], False),
        "compress plan": (["compress", "plan", *vec, "--target-retention", "0.5", "--methods", "truncate", "--dims", "8",
                           "--precisions", "float32", "--peers", ""], True),
        "index build": (["index", "build", "--embeddings", str(root / "doc.npy"), "--ids", str(root / "doc.txt")], False),
        "embed-corpus": (["embed-corpus", "--data", str(root / "toy" / "corpus.jsonl"), "--model", str(tiny_bert_dir),
                          "--shard-size", "32", "--batch-size", "32"], True),
    }


def test_links_and_hostile_markers_in_out_never_reach_outside(vectors, tiny_bert_dir, one_torch_thread, capsys):
    trials = []
    for command, (argv, resumes) in _commands(vectors, tiny_bert_dir).items():
        slug = command.replace(" ", "-")
        first = vectors / f"{slug}-first"
        assert main(["-q", *argv, "--out", str(first)]) == 0, command
        for number, probe in enumerate(PROBES):
            for overwrite in ([True, False] if resumes else [True]):
                out = vectors / f"{slug}-{number}-{overwrite}" / "out"
                shutil.copytree(first, out, symlinks=True)
                (out / USER_FILE).write_text("kept whatever happens")
                outside = _sentinel(out.parent / "outside", json.loads((first / MARKER_NAME).read_text()))
                if not _plant(probe, out, outside):
                    continue
                outcome, detail = _judge([*argv, "--out", str(out), *(["--overwrite"] if overwrite else [])], out, outside, capsys)
                trials.append((command, probe, "--overwrite" if overwrite else "resume", outcome, detail))
    counts = Counter(outcome for *_, outcome, _ in trials)
    table = "\n".join(f"{c:15} {p:45} {mode:12} {o:16} {d[:140]}" for c, p, mode, o, d in trials)
    print(f"\n{len(trials)} probes: " + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES) + "\n" + table)
    assert len(trials) >= 50
    assert counts["escaped"] == 0 and counts["unclear failure"] == 0, table
    # A link that leaves --out is refused; one that stays inside is not, and neither is a marker entry that is never removed.
    by_probe = {(c, p, m): o for c, p, m, o, _ in trials}
    for (command, probe, mode), outcome in by_probe.items():
        if probe.startswith("planted link to an outside") or probe in ("owned folder moved outside and linked back",
                                                                        "marker lists a path through a link", "marker is a link outside"):
            assert outcome == "refused clearly", (command, probe, mode)
        if probe in ("planted link staying inside", "marker lists the folder itself", "marker lists ../", "marker lists an absolute path"):
            assert outcome == "safe success", (command, probe, mode)
