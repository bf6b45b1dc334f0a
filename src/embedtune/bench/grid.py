"""A resumable grid of protocol runs: one atomic JSON file per finished run.

A run is identified by its :class:`RunSpec` key. Finished runs are skipped on re-run, so a
``kill -9`` mid-grid loses at most the run in flight.

Several workers (processes, or machines sharing the folder) can run one grid together: a
worker claims a run by creating ``claims/<key>.claim`` (slashes as ``__``) exclusively before starting it, so no
run is done twice. A claim whose process died on this host (``kill -9``) is stale and is taken
over; a worker that runs out of unclaimed runs waits for the others' claimed runs to finish, so
every worker returns the complete set of records.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from embedtune import __version__
from embedtune.io import IntegrityError, read_json_verified, write_json_with_digest

logger = logging.getLogger(__name__)

__all__ = ["RunSpec", "RunStore", "run_grid"]


def _slug(overrides: dict[str, Any]) -> str:
    if not overrides:
        return "default"
    text = ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    return re.sub(r"[^A-Za-z0-9=.,_+-]", "_", text)


@dataclass(frozen=True)
class RunSpec:
    """One fit-and-evaluate: ``stage`` is ``val`` (fit train, score val) or ``test`` (fit train+val, score test)."""

    dataset: str
    dataset_path: str
    backbone: str
    model: str
    stage: str
    method: str
    dim: int
    seed: int
    overrides: tuple[tuple[str, Any], ...] = ()
    studies: tuple[str, ...] = field(default=(), compare=False, hash=False)

    @property
    def overrides_dict(self) -> dict[str, Any]:
        return dict(self.overrides)

    @property
    def variant(self) -> str:
        return _slug(self.overrides_dict)

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.backbone}/{self.stage}/{self.method}/{self.variant}/k{self.dim}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["overrides"] = self.overrides_dict
        values["studies"] = list(self.studies)
        values["key"] = self.key
        return values


def make_spec(dataset, dataset_path, backbone, model, stage, method, dim, seed, overrides=None, study="") -> RunSpec:
    return RunSpec(dataset, dataset_path, backbone, model, stage, method, dim, seed, tuple(sorted((overrides or {}).items())), (study,) if study else ())


class RunStore:
    """Finished runs as ``<root>/runs/<key>.json``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, spec: RunSpec) -> Path:
        return self.root / "runs" / f"{spec.key}.json"

    def load(self, spec: RunSpec) -> dict[str, Any] | None:
        path = self.path(spec)
        if not path.is_file():
            return None
        record = read_record(path, "The run is treated as unfinished and redone.")
        if record is None:
            return None
        return record if record.get("spec", {}).get("key") == spec.key and "metrics" in record else None

    def save(self, spec: RunSpec, record: dict[str, Any]) -> Path:
        """Write the record with the digest of its content (:func:`embedtune.io.write_json_with_digest`)."""
        return write_json_with_digest(self.path(spec), {"spec": spec.to_dict(), "embedtune_version": __version__, **record})

    def claim_path(self, spec: RunSpec) -> Path:
        # Flat names: claims are transient, and nested folders would outlive them.
        return self.root / "claims" / (spec.key.replace("/", "__") + ".claim")

    def claim(self, spec: RunSpec) -> bool:
        """Claim ``spec`` for this process; False when a live worker holds it.

        The claim file is created with ``O_EXCL``, so two workers can never both succeed.
        A claim left by a dead process of this host is removed and claimed again.
        """
        path = self.claim_path(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        owner = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._stale(path):
                    return False
                path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(owner)
            return True
        return False

    def release(self, spec: RunSpec) -> None:
        self.claim_path(spec).unlink(missing_ok=True)

    @staticmethod
    def _stale(path: Path) -> bool:
        try:
            owner = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return True
        except (json.JSONDecodeError, UnicodeDecodeError):
            # Being written right now, or garbage: judge by age.
            try:
                return time.time() - path.stat().st_mtime > 60
            except FileNotFoundError:
                return True
        if owner.get("host") != socket.gethostname():
            return False  # another machine's worker: its liveness cannot be checked from here
        try:
            os.kill(int(owner["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, KeyError, ValueError, TypeError):
            return False
        return False

    def all_records(self) -> list[dict[str, Any]]:
        records = []
        for path in sorted((self.root / "runs").rglob("*.json")):
            record = read_record(path, "Skipping it; re-run the grid to redo it.")
            if record is not None:
                records.append(record)
        return records


def read_record(path: Path, fix: str) -> dict[str, Any] | None:
    """A run record, its content digest checked; None, with a warning ending in ``fix``, when damaged."""
    try:
        return read_json_verified(path, fix)[0]
    except (IntegrityError, OSError) as error:
        logger.warning("%s", error)
        return None


def dedupe(specs: Iterable[RunSpec]) -> list[RunSpec]:
    """Merge equal runs requested by several studies, keeping first-seen order."""
    merged: dict[str, RunSpec] = {}
    for spec in specs:
        if spec.key in merged:
            old = merged[spec.key]
            merged[spec.key] = RunSpec(*[getattr(old, f) for f in ("dataset", "dataset_path", "backbone", "model", "stage", "method", "dim", "seed", "overrides")],
                                       studies=tuple(dict.fromkeys(old.studies + spec.studies)))
        else:
            merged[spec.key] = spec
    return list(merged.values())


def run_grid(
    specs: list[RunSpec],
    store: RunStore,
    execute: Callable[[RunSpec], dict[str, Any]],
    progress: bool = True,
    poll_seconds: float = 2.0,
) -> dict[str, dict[str, Any]]:
    """Execute every unfinished spec (grouped by dataset and backbone); return all records by key.

    Runs claimed by another live worker are waited for (polling every ``poll_seconds``), so
    the returned records are complete whichever worker ran them.
    """
    from tqdm.auto import tqdm

    specs = dedupe(specs)
    records: dict[str, dict[str, Any]] = {}
    todo = []
    for spec in specs:
        record = store.load(spec)
        if record is None:
            todo.append(spec)
            continue
        stored_studies = record["spec"].get("studies", [])
        merged = list(dict.fromkeys([*stored_studies, *spec.studies]))
        if merged != stored_studies:
            # A finished run now also serves another study: record that, so reports see it.
            record["spec"]["studies"] = merged
            write_json_with_digest(store.path(spec), record)
        records[spec.key] = record
    logger.info("grid: %d runs, %d already finished, %d to do", len(specs), len(records), len(todo))
    todo.sort(key=lambda s: (s.backbone, s.dataset))
    bar = tqdm(total=len(todo), desc="protocol grid", unit="run", disable=not progress)
    pending = todo
    while pending:
        held_by_others = []
        for spec in pending:
            if not store.claim(spec):
                held_by_others.append(spec)
                continue
            try:
                # Checked under the claim: another worker may have finished it meanwhile.
                record = store.load(spec)
                if record is None:
                    bar.set_postfix_str(spec.key[-60:])
                    start = time.perf_counter()
                    record = execute(spec)
                    record["wall_seconds"] = time.perf_counter() - start
                    store.save(spec, record)
                    record = {"spec": spec.to_dict(), **record}
            finally:
                store.release(spec)
            records[spec.key] = record
            bar.update(1)
        if len(held_by_others) == len(pending):
            time.sleep(poll_seconds)  # nothing left to claim: wait for the other workers
        pending = held_by_others
    bar.close()
    return records
