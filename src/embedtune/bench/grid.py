"""A resumable grid of protocol runs: one atomic JSON file per finished run.

A run is identified by its :class:`RunSpec` key. Finished runs are skipped on re-run, so a
``kill -9`` mid-grid loses at most the run in flight.

Several workers (processes, or machines sharing the folder) can run one grid together: a
worker claims a run by creating ``claims/<key>.claim`` (slashes as ``__``) exclusively before starting it, so no
run is done twice. A claim records the worker's host, boot id, PID and process start time; it
is stale, and taken over with a log line, when its process is gone, when the host has rebooted
since, or when its PID now belongs to another process (started after the claim). A worker that
runs out of unclaimed runs waits for the others' claimed runs to finish, logging what it waits
for, so every worker returns the complete set of records.

A record is keyed by everything that shaped it, not only by its path: with a ``check``
(:class:`RecordCheck`), :func:`run_grid` compares each finished record's inputs (the resolved
config, the split manifest, the data fingerprints, the mining) with the current ones, and a
record made with other inputs stops the grid with :class:`StaleRecordsError` naming the fields
that differ (``rerun_changed=True`` runs such records again instead), so a results folder
never mixes configs. :func:`plan_grid` says what would run, without running anything.
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
from typing import Any, Callable, Iterable, Protocol

from embedtune import __version__
from embedtune.errors import EmbedtuneError
from embedtune.io import IntegrityError, read_json_verified, write_json_with_digest
from embedtune.runtime import progress_bar

logger = logging.getLogger(__name__)

__all__ = ["RunSpec", "RunStore", "run_grid", "plan_grid", "GridPlan", "RecordCheck", "StaleRecordsError", "input_differences",
           "boot_id", "process_start_time"]


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
        A stale claim (see :meth:`stale_reason`) is removed, with a log line, and claimed again.
        """
        path = self.claim_path(spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        owner = json.dumps({"pid": pid, "host": socket.gethostname(), "time": time.time(), "boot_id": boot_id(),
                            "process_start": process_start_time(pid)})
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                reason = self.stale_reason(path)
                if reason is None:
                    return False
                logger.warning("%s: taking over the stale claim of run %s: %s", path, spec.key, reason)
                path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(owner)
            return True
        return False

    def release(self, spec: RunSpec) -> None:
        self.claim_path(spec).unlink(missing_ok=True)

    @staticmethod
    def stale_reason(path: Path) -> str | None:
        """Why the claim at ``path`` is stale, or None while its worker may still be running.

        Stale: the file is gone; it is unreadable and older than a minute; it was written on this
        host before the host last booted (boot id); its process is gone; or its PID now belongs to
        another process (one that started after the claim, or at another time than recorded).
        A claim of another host is never judged stale: its liveness cannot be seen from here.
        """
        try:
            owner = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(owner, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return "the claim is gone"
        except (ValueError, UnicodeDecodeError):
            # Being written right now, or garbage: judge by age.
            try:
                age = time.time() - path.stat().st_mtime
            except FileNotFoundError:
                return "the claim is gone"
            return f"unreadable claim, {age:.0f} s old" if age > 60 else None
        if owner.get("host") != socket.gethostname():
            return None  # another machine's worker: its liveness cannot be checked from here
        recorded_boot, current_boot = owner.get("boot_id"), boot_id()
        if recorded_boot and current_boot and recorded_boot != current_boot:
            return f"written before this host rebooted (boot id {recorded_boot} then, {current_boot} now)"
        try:
            pid = int(owner["pid"])
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"process {owner.get('pid')} is gone"
        except (KeyError, ValueError, TypeError):
            return "the claim names no process id"
        except PermissionError:
            pass  # alive, another user's process: its start time still tells whether it is the claimant
        started = process_start_time(pid)
        if started is None:
            return None
        recorded_start = owner.get("process_start")
        if isinstance(recorded_start, (int, float)):
            if abs(started - recorded_start) > _START_TOLERANCE_S:
                return f"PID {pid} now belongs to another process (started {_ago(started)}; the claimant started {_ago(recorded_start)})"
        elif isinstance(owner.get("time"), (int, float)) and started > owner["time"] + _START_TOLERANCE_S:
            return f"PID {pid} now belongs to another process, started {_ago(started)}, after the claim was written {_ago(owner['time'])}"
        return None

    def claim_owner(self, spec: RunSpec) -> str:
        """Who holds the claim of ``spec``, in words (for the waiting log)."""
        try:
            owner = json.loads(self.claim_path(spec).read_text(encoding="utf-8"))
            return f"pid {owner.get('pid')} on {owner.get('host')}, claimed {_ago(float(owner.get('time')))}"
        except (OSError, ValueError, TypeError):
            return "owner unknown"

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


# A process's start time is read in clock ticks; two readings of one process agree to well under this.
_START_TOLERANCE_S = 2.0


def boot_id() -> str | None:
    """This host's boot id (Linux ``/proc/sys/kernel/random/boot_id``): it changes at every reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started, as a Unix time (Linux ``/proc``); None when unknown or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        # Field 22 (starttime, in clock ticks since boot) counts from after the ")" ending the command name.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        boot_time = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        return boot_time + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _ago(timestamp: float) -> str:
    seconds = max(0.0, time.time() - timestamp)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.1f} h ago"


class RecordCheck(Protocol):
    """What :func:`run_grid` asks to tell a finished record made with the current inputs from a stale one.

    ``expected_inputs(spec)``: the inputs a run of ``spec`` would have now (JSON-safe), e.g.
    ``{"config": ..., "split": ..., "data": ..., "mining": ...}``.
    ``recorded_inputs(spec, record)``: the inputs ``record`` was made with: its own ``inputs``
    field, or, for records written before it existed, what can be derived from files beside
    them. A section it cannot tell is left out, and not compared.
    """

    source: str

    def expected_inputs(self, spec: RunSpec) -> dict[str, Any]: ...

    def recorded_inputs(self, spec: RunSpec, record: dict[str, Any]) -> dict[str, Any]: ...


class StaleRecordsError(EmbedtuneError):
    """Finished records of a results folder were made with other inputs than the current config."""

    def __init__(self, root: Path, changed: dict[str, list[str]], source: str | None = None) -> None:
        self.root, self.changed = root, changed
        super().__init__(
            f"{root}: {len(changed)} finished run(s) were made with other inputs than {source or 'this config'}, so this "
            f"results folder would mix configs. Differing fields: {summarize_differences(changed)}. Fix: write to a new "
            "--out folder, restore the config, or pass --rerun-changed to run those runs again."
        )


@dataclass
class GridPlan:
    """What :func:`run_grid` would do: finished records kept, runs to do, and finished runs whose inputs changed.

    ``changed`` maps a run key to its differing fields (``"split.seed: 2027 -> 2028"``); with
    ``rerun_changed`` those runs are in ``todo`` too. ``legacy``: finished records written before
    records carried their inputs (their inputs were derived).
    """

    specs: list[RunSpec]
    finished: dict[str, dict[str, Any]]
    todo: list[RunSpec]
    changed: dict[str, list[str]]
    legacy: list[str]

    def summary(self) -> str:
        text = f"{len(self.specs)} runs, {len(self.finished)} already finished, {len(self.todo)} to do"
        if self.changed:
            text += f", {len(self.changed)} made with other inputs ({summarize_differences(self.changed, limit=5)})"
        return text


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def _short(value: Any) -> str:
    text = repr(value)
    return text[:14] + "…'" if isinstance(value, str) and len(value) == 64 else text  # a sha256


def input_differences(recorded: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """``"field: recorded -> expected"`` for every differing field, over the sections both hold.

    Values are compared after a JSON round trip (tuples as lists). A top-level section missing
    from ``recorded`` (not derivable for an old record) is not compared.
    """
    expected = json.loads(json.dumps(expected, sort_keys=True))
    recorded = json.loads(json.dumps(recorded, sort_keys=True))
    differences = []
    for section in sorted(set(expected) | set(recorded)):
        if section not in recorded:
            continue
        old, new = _flatten(recorded[section], section), _flatten(expected.get(section, {}), section)
        for name in sorted(set(old) | set(new)):
            if old.get(name, "<absent>") != new.get(name, "<absent>"):
                differences.append(f"{name}: {_short(old.get(name, '<absent>'))} -> {_short(new.get(name, '<absent>'))}")
    return differences


def summarize_differences(changed: dict[str, list[str]], limit: int = 10) -> str:
    """Differing fields across runs: ``field: old -> new (N runs, e.g. KEY)``, most frequent first."""
    by_field: dict[str, list[str]] = {}
    for key, differences in changed.items():
        for difference in differences:
            by_field.setdefault(difference, []).append(key)
    ordered = sorted(by_field.items(), key=lambda item: (-len(item[1]), item[0]))
    parts = [f"{difference} ({len(keys)} run{'s' if len(keys) > 1 else ''}, e.g. {keys[0]})" for difference, keys in ordered[:limit]]
    if len(ordered) > limit:
        parts.append(f"and {len(ordered) - limit} more")
    return "; ".join(parts)


def record_differences(spec: RunSpec, record: dict[str, Any], check: RecordCheck) -> list[str]:
    """How ``record``'s inputs differ from what ``spec`` would be run with now (empty: it is current)."""
    return input_differences(check.recorded_inputs(spec, record), check.expected_inputs(spec))


def plan_grid(specs: Iterable[RunSpec], store: RunStore, check: RecordCheck | None = None,
              rerun_changed: bool = False) -> GridPlan:
    """Which runs are finished, which are to do, and which finished runs were made with other inputs.

    Reads the results folder only; nothing is written or run.
    """
    specs = dedupe(specs)
    finished: dict[str, dict[str, Any]] = {}
    todo: list[RunSpec] = []
    changed: dict[str, list[str]] = {}
    legacy: list[str] = []
    for spec in specs:
        record = store.load(spec)
        if record is None:
            todo.append(spec)
            continue
        if check is not None:
            if "inputs" not in record:
                legacy.append(spec.key)
            differences = record_differences(spec, record, check)
            if differences:
                changed[spec.key] = differences
                if rerun_changed:
                    todo.append(spec)
                continue
        finished[spec.key] = record
    if legacy:
        logger.info("%s: %d finished records predate recorded run inputs; their inputs were read from the split and "
                    "triplet files beside them", store.root, len(legacy))
    return GridPlan(specs, finished, todo, changed, legacy)


def upgrade_legacy_records(store: RunStore, check: RecordCheck | None) -> int:
    """Write the derived inputs into every record of ``store`` that lacks them (once; before new runs
    can rewrite the split and triplet files those inputs are derived from). Returns how many."""
    if check is None:
        return 0
    upgraded = 0
    for path in sorted((store.root / "runs").rglob("*.json")):
        record = read_record(path, "Skipping it; re-run the grid to redo it.")
        if record is None or "inputs" in record or "spec" not in record:
            continue
        try:
            spec = spec_from_record(record["spec"])
            inputs = check.recorded_inputs(spec, record)
        except (KeyError, TypeError, ValueError) as error:  # e.g. a method no longer registered
            logger.debug("%s: inputs not derivable (%s)", path, error)
            continue
        if inputs:
            write_json_with_digest(path, {**record, "inputs": inputs})
            upgraded += 1
    if upgraded:
        logger.info("%s: wrote the derived inputs into %d older records (once)", store.root, upgraded)
    return upgraded


def spec_from_record(values: dict[str, Any]) -> RunSpec:
    """The :class:`RunSpec` a record's ``spec`` field describes."""
    return make_spec(values["dataset"], values["dataset_path"], values["backbone"], values["model"], values["stage"], values["method"],
                     int(values["dim"]), int(values["seed"]), dict(values.get("overrides") or {}))


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
    check: "RecordCheck | None" = None,
    rerun_changed: bool = False,
    wait_log_seconds: float = 60.0,
    desc: str = "protocol grid",
) -> dict[str, dict[str, Any]]:
    """Execute every unfinished spec (grouped by dataset and backbone); return all records by key.

    Runs claimed by another live worker are waited for (polling every ``poll_seconds``, and
    logging what is waited for every ``wait_log_seconds``), so the returned records are complete
    whichever worker ran them.

    With ``check``, a finished record whose inputs differ from the current ones raises
    :class:`StaleRecordsError` naming the differing fields, before anything runs;
    ``rerun_changed=True`` runs those records again instead.
    """
    plan = plan_grid(specs, store, check, rerun_changed)
    if plan.changed and not rerun_changed:
        raise StaleRecordsError(store.root, plan.changed, getattr(check, "source", None))
    if plan.changed:
        logger.warning("%s: %d finished runs were made with other inputs and run again (--rerun-changed): %s",
                       store.root, len(plan.changed), summarize_differences(plan.changed, limit=5))
        upgrade_legacy_records(store, check)
    elif plan.todo and plan.legacy and check is not None:
        # New runs may rewrite the split and triplet files that older records' inputs are read from.
        upgrade_legacy_records(store, check)
    specs = plan.specs
    records: dict[str, dict[str, Any]] = {}
    todo = list(plan.todo)
    waiting_since: float | None = None  # when this worker ran out of runs to claim
    last_wait_log = float("-inf")
    for spec in specs:
        record = plan.finished.get(spec.key)
        if record is None:
            continue
        stored_studies = record["spec"].get("studies", [])
        merged = list(dict.fromkeys([*stored_studies, *spec.studies]))
        if merged != stored_studies:
            # A finished run now also serves another study: record that, so reports see it.
            record["spec"]["studies"] = merged
            write_json_with_digest(store.path(spec), record)
        records[spec.key] = record
    logger.log(logging.INFO if specs else logging.DEBUG, "%s: %d runs, %d already finished, %d to do", desc, len(specs), len(records), len(todo))
    todo.sort(key=lambda s: (s.backbone, s.dataset))
    bar = progress_bar(len(todo), desc, unit="run", enabled=progress)  # nothing to do: no bar
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
                if record is None or (check is not None and record_differences(spec, record, check)):
                    bar.set_postfix_str(spec.key[-60:], refresh=False)
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
            # Nothing left to claim: wait for the other workers, and say so.
            now = time.monotonic()
            if waiting_since is None:
                waiting_since, last_wait_log = now, float("-inf")
            if now - last_wait_log >= wait_log_seconds:
                last_wait_log = now
                logger.info("%s: waiting %.0f s so far for %d run(s) claimed by other workers: %s", store.root,
                            now - waiting_since, len(held_by_others),
                            "; ".join(f"{s.key} ({store.claim_owner(s)})" for s in held_by_others[:3]))
            time.sleep(poll_seconds)
        else:
            waiting_since = None
        pending = held_by_others
    bar.close()
    return records
