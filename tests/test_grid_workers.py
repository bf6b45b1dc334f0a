"""Several workers on one results folder: claim files, stale claims, waiting, and equal records."""

import json
import subprocess
import sys
import threading
import time

from test_dive_protocol import _config, _toy

from embedtune.bench.dive_protocol import run_protocol
from embedtune.bench.grid import RunStore, make_spec, run_grid
from embedtune.bench.protocol_config import DatasetSpec


def _specs(n):
    return [make_spec("toy", "x", "b", "m", "test", "pca", 8, 2027 + i) for i in range(n)]


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_claim_is_exclusive_until_released(tmp_path):
    spec = _specs(1)[0]
    first, second = RunStore(tmp_path), RunStore(tmp_path)
    assert first.claim(spec)
    assert not second.claim(spec)  # this process is alive, so its claim holds
    first.release(spec)
    assert second.claim(spec)


def test_a_claim_left_by_a_dead_process_is_taken_over(tmp_path):
    import socket

    spec = _specs(1)[0]
    store = RunStore(tmp_path)
    path = store.claim_path(spec)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "time": 0}))
    assert store.claim(spec)
    assert json.loads(path.read_text())["pid"] != 0


def test_a_worker_skips_runs_claimed_by_others_and_waits_for_them(tmp_path):
    specs = _specs(3)
    store = RunStore(tmp_path)
    held = specs[1]
    assert store.claim(held)  # "another worker" (a live pid) is running it
    executed = []

    def execute(spec):
        executed.append(spec.key)
        return {"metrics": {"ndcg@10": spec.seed / 10_000}}

    result = {}
    worker = threading.Thread(target=lambda: result.update(run_grid(specs, RunStore(tmp_path), execute, progress=False, poll_seconds=0.02)))
    worker.start()
    time.sleep(0.5)
    assert worker.is_alive(), "the worker must wait for the claimed run instead of returning"
    store.save(held, {"metrics": {"ndcg@10": 0.5}})
    store.release(held)
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert executed == [specs[0].key, specs[2].key]
    assert set(result) == {s.key for s in specs} and result[held.key]["metrics"]["ndcg@10"] == 0.5
    assert not list((tmp_path / "claims").rglob("*.claim"))


def test_two_workers_give_the_same_records_as_one(tmp_path, tiny_bert_dir):
    data = DatasetSpec("toy", str(_toy(tmp_path / "toy")))
    studies, methods = ("main", "heads"), ("frozen", "truncate", "pca", "dive")
    serial = _config(tmp_path / "serial", tiny_bert_dir, [data], studies=studies, methods=methods)
    parallel = _config(tmp_path / "parallel", tiny_bert_dir, [data], studies=studies, methods=methods)
    one = run_protocol(serial, progress=False)
    two = run_protocol(parallel, progress=False, workers=2)
    assert set(one) == set(two) and len(one) > 4
    for key in one:
        assert one[key].get("metrics") == two[key].get("metrics"), key
        assert one[key].get("per_query") == two[key].get("per_query"), key
    assert len(list((tmp_path / "parallel" / "results" / "runs").rglob("*.json"))) == len(one)
    assert not list((tmp_path / "parallel" / "results").rglob("*.claim"))
