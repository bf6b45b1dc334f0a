"""Benchmark records are keyed by everything that shaped them, and run claims cannot hang the grid.

A results folder re-run with a changed config (split seed, negatives,
mining options, data) must not count stale runs as finished, and a claim whose PID now belongs
to another process (as after a reboot) must be taken over instead of waited for silently.
"""

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_dive_protocol import _toy
from embedtune.bench.dive_protocol import plan_protocol, run_protocol
from embedtune.bench.grid import (
    RunStore,
    StaleRecordsError,
    boot_id,
    input_differences,
    make_spec,
    process_start_time,
    run_grid,
)
from embedtune.bench.protocol_config import BackboneSpec, DatasetSpec, ProtocolConfig, load_protocol_config
from embedtune.io import read_json_verified, write_json_with_digest

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path, model_dir, data, **changes):
    values = dict(
        datasets=[DatasetSpec("toy", str(data))],
        backbones=[BackboneSpec("tiny", str(model_dir), (8,))],
        methods=["pca", "dive"],
        studies=["main"],
        final_seeds=[2027],
        selection_seeds=[2027],
        n_negatives=2,
        method_overrides={"dive": {"epochs": 1, "batch_size": 8}},
        results_dir=str(tmp_path / "results"),
    )
    values.update(changes)
    return ProtocolConfig(**values)


@pytest.fixture
def finished(tmp_path, tiny_bert_dir):
    """A tiny protocol run to completion: PCA (unsupervised) and DIVE (supervised), one seed."""
    data = _toy(tmp_path / "toy")
    config = _config(tmp_path, tiny_bert_dir, data)
    records = run_protocol(config, progress=False)
    assert len(records) == 2
    return config, data, tiny_bert_dir


def _records_on_disk(config):
    return {path: path.read_bytes() for path in sorted((Path(config.results_dir) / "runs").rglob("*.json"))}


def _summary(config):
    return plan_protocol(config)["phase one"]


def test_records_carry_their_inputs_and_the_same_config_finds_them_finished(finished):
    config, _, _ = finished
    for path in _records_on_disk(config):
        record = json.loads(path.read_text())
        assert {"model", "config", "split", "data"} <= set(record["inputs"])
        assert record["inputs"]["split"]["seed"] == 2027
        assert ("mining" in record["inputs"]) == (record["spec"]["method"] == "dive")  # PCA mines nothing
    plan = _summary(config)
    assert (len(plan.finished), len(plan.todo), plan.changed) == (2, 0, {})


@pytest.mark.parametrize("change, field, methods", [
    ({"split_seed": 2028}, "split.seed: 2027 -> 2028", {"pca", "dive"}),
    ({"negatives": "random"}, "mining.negatives: 'hard' -> 'random'", {"dive"}),
    ({"n_negatives": 3}, "mining.n_negatives: 2 -> 3", {"dive"}),
    ({"false_negative_margin": 0.05}, "mining.false_negative_margin: None -> 0.05", {"dive"}),
    ({"max_triplets_per_query": 4}, "mining.max_triplets_per_query: None -> 4", {"dive"}),
])
def test_a_changed_config_stops_naming_the_field_and_runs_nothing(finished, tmp_path, change, field, methods):
    config, data, model_dir = finished
    before = _records_on_disk(config)
    changed = _config(tmp_path, model_dir, data, **change)
    plan = _summary(changed)
    assert {key.split("/")[3] for key in plan.changed} == methods
    assert all(field in differences for differences in plan.changed.values())
    with pytest.raises(StaleRecordsError, match="--rerun-changed") as error:
        run_protocol(changed, progress=False)
    assert field in str(error.value)
    assert _records_on_disk(config) == before  # nothing ran, nothing was rewritten


def test_changed_data_files_are_detected(finished):
    config, data, _ = finished
    with open(data / "corpus.jsonl", "a") as handle:
        handle.write(json.dumps({"_id": "extra", "text": "one more document"}) + "\n")
    plan = _summary(config)
    assert len(plan.changed) == 2
    assert all(any(d.startswith("data.corpus.jsonl:") for d in diffs) for diffs in plan.changed.values())


def test_rerun_changed_recomputes_the_stale_runs(finished, tmp_path):
    config, data, model_dir = finished
    changed = _config(tmp_path, model_dir, data, split_seed=2028)
    records = run_protocol(changed, progress=False, rerun_changed=True)
    assert {r["inputs"]["split"]["seed"] for r in records.values()} == {2028}
    assert {json.loads(p.read_text())["inputs"]["split"]["seed"] for p in _records_on_disk(changed)} == {2028}
    plan = _summary(changed)
    assert (len(plan.finished), len(plan.todo), plan.changed) == (2, 0, {})


def test_older_records_without_inputs_are_checked_against_the_files_beside_them(finished, tmp_path):
    config, data, model_dir = finished
    for path in _records_on_disk(config):  # as written before records carried their inputs
        record, _ = read_json_verified(path, "")
        del record["inputs"]
        write_json_with_digest(path, record)
    plan = _summary(config)
    assert (len(plan.finished), len(plan.legacy), plan.changed) == (2, 2, {})
    plan = _summary(_config(tmp_path, model_dir, data, split_seed=2028, false_negative_margin=0.05))
    dive = next(diffs for key, diffs in plan.changed.items() if "/dive/" in key)
    assert "split.seed: 2027 -> 2028" in dive and "mining.false_negative_margin: None -> 0.05" in dive


def test_a_compressor_config_field_added_later_counts_as_its_default(finished):
    config, _, _ = finished
    path = next(p for p in _records_on_disk(config) if "/dive/" in str(p))
    record, _ = read_json_verified(path, "")
    del record["inputs"]["config"]["epoch_selection"]  # a record from before that field existed
    write_json_with_digest(path, record)
    assert _summary(config).changed == {}
    record["inputs"]["config"]["margin"] = 0.3  # a changed setting is not
    write_json_with_digest(path, record)
    assert list(_summary(config).changed.values()) == [["config.margin: 0.3 -> 0.7"]]


def test_input_differences_compare_only_sections_the_record_holds():
    expected = {"split": {"seed": 1, "counts": {"train": 3}}, "mining": {"negatives": "hard"}, "config": {"dim": 8}}
    assert input_differences({"split": {"seed": 1, "counts": {"train": 3}}}, expected) == []
    assert input_differences({"split": {"seed": 2, "counts": {"train": 4}}}, expected) == [
        "split.counts.train: 4 -> 3", "split.seed: 2 -> 1"]
    assert input_differences({"config": {"dim": 8, "old": 1}}, expected) == ["config.old: 1 -> '<absent>'"]


def test_the_committed_robust_results_are_still_finished_under_their_own_config(monkeypatch):
    """`benchmark dive --config benchmarks/dive_robust.toml` must still say 40 finished, 0 to do."""
    for name in ("scifact", "arguana"):
        if not (REPO.parent / "shared" / "data" / "beir" / name / "corpus.jsonl").is_file():
            pytest.skip("the real datasets are not on this machine")
    monkeypatch.chdir(REPO)  # the config names its datasets and results folder relative to the repository
    config = load_protocol_config("benchmarks/dive_robust.toml", results_dir="benchmarks/results/dive-robust")
    plans = plan_protocol(config)
    one = plans["phase one"]
    assert (len(one.specs), len(one.finished), len(one.todo), one.changed) == (40, 40, 0, {})
    assert len(plans["phase two"].specs) == 0


# -- claims ------------------------------------------------------------------------------------
def _spec(seed=2027):
    return make_spec("toy", "x", "b", "m", "test", "pca", 8, seed)


@pytest.fixture
def other_process():
    """A live process that is not a grid worker (what a reused PID points to)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.2)
    yield process
    process.kill()
    process.wait()


def _write_claim(store, spec, **owner):
    path = store.claim_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": socket.gethostname(), "time": time.time(), **owner}))
    return path


@pytest.mark.skipif(boot_id() is None or process_start_time(os.getpid()) is None, reason="needs Linux /proc")
def test_a_claim_from_before_a_reboot_is_taken_over_with_a_log_line(tmp_path, other_process, caplog):
    store, spec = RunStore(tmp_path), _spec()
    started = process_start_time(other_process.pid)
    _write_claim(store, spec, pid=other_process.pid, boot_id="00000000-0000-0000-0000-000000000000", process_start=started)
    with caplog.at_level(logging.WARNING, logger="embedtune.bench.grid"):
        assert store.claim(spec)
    assert "rebooted" in caplog.text and "taking over" in caplog.text


@pytest.mark.skipif(process_start_time(os.getpid()) is None, reason="needs Linux /proc")
def test_a_claim_whose_pid_now_belongs_to_another_process_is_taken_over(tmp_path, other_process, caplog):
    store, spec = RunStore(tmp_path), _spec()
    started = process_start_time(other_process.pid)
    _write_claim(store, spec, pid=other_process.pid, boot_id=boot_id(), process_start=started - 3600)
    with caplog.at_level(logging.WARNING, logger="embedtune.bench.grid"):
        assert store.claim(spec)
    assert f"PID {other_process.pid} now belongs to another process" in caplog.text
    # A claim written before the PID's process started (older claims record no start time).
    store.release(spec)
    _write_claim(store, spec, pid=other_process.pid, time=started - 3600)
    assert store.claim(spec)


def test_a_live_workers_claim_holds(tmp_path, other_process):
    store, spec = RunStore(tmp_path), _spec()
    _write_claim(store, spec, pid=other_process.pid, boot_id=boot_id(), process_start=process_start_time(other_process.pid))
    assert not store.claim(spec)
    own = RunStore(tmp_path)
    assert own.claim(_spec(2028)) and not RunStore(tmp_path).claim(_spec(2028))  # this process's own claim


def test_a_waiting_worker_says_what_it_waits_for(tmp_path, other_process, caplog):
    store, spec = RunStore(tmp_path), _spec()
    _write_claim(store, spec, pid=other_process.pid, boot_id=boot_id(), process_start=process_start_time(other_process.pid))
    result = {}
    with caplog.at_level(logging.INFO, logger="embedtune.bench.grid"):
        worker = threading.Thread(target=lambda: result.update(run_grid(
            [spec], RunStore(tmp_path), lambda s: {"metrics": {}}, progress=False, poll_seconds=0.02, wait_log_seconds=0.1)))
        worker.start()
        time.sleep(0.5)
        store.save(spec, {"metrics": {"ndcg@10": 0.5}})
        store.claim_path(spec).unlink()
        worker.join(timeout=10)
    assert not worker.is_alive() and result[spec.key]["metrics"]["ndcg@10"] == 0.5
    waiting = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(waiting) >= 2 and spec.key in waiting[0] and f"pid {other_process.pid}" in waiting[0]
