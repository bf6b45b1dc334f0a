"""`compress apply --ray-address` on a real two-node Ray cluster, both nodes started on this machine.

Each node is a `ray start --block` process with its own temporary folder and ports; the teardown
ends exactly the processes these two commands started (by process id, not `ray stop`, which would
stop every Ray on the machine). Where a second node cannot start here, the test is skipped and says why.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import embedtune
from embedtune.compress import TrainingData, make_compressor

START_SECONDS = 60


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _ray_cli() -> list[str]:
    script = Path(sys.executable).with_name("ray")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "ray.scripts.scripts"]


def _node_flags() -> list[str]:
    """Ports of one node, all free now: two raylets on one machine must not share any."""
    node, objects, agent, agent_grpc, metrics, runtime_env, low = _free_ports(7)
    return ["--num-cpus=1", "--node-ip-address=127.0.0.1", f"--node-manager-port={node}", f"--object-manager-port={objects}",
            f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
            f"--runtime-env-agent-port={runtime_env}", "--object-store-memory=100000000", "--disable-usage-stats", "--block"]


def _stop(process: subprocess.Popen) -> None:
    """End ``process`` and every process below it, by id (SIGTERM, then SIGKILL for what is left)."""
    import psutil

    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for proc in tree:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=8)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture
def two_node_cluster(tmp_path, monkeypatch):
    """The GCS address of a running head node (1 CPU) joined by a second node (1 CPU)."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("psutil")
    if ray.is_initialized():
        pytest.skip("this process already runs a Ray")
    # A private cluster on 127.0.0.1: no token (Ray 2.60 turns token auth on where it finds one, and
    # a node started by `ray start --address` then cannot join); this process's Ray settings follow.
    from ray._raylet import Config

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    Config.initialize("")
    # Short socket paths: a Unix socket path must stay under 108 bytes.
    temp_dirs = [tempfile.mkdtemp(prefix="rh", dir="/tmp"), tempfile.mkdtemp(prefix="rw", dir="/tmp")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(embedtune.__file__).parents[1]), os.environ.get("PYTHONPATH")])),
           "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    (gcs_port,) = _free_ports(1)
    address = f"127.0.0.1:{gcs_port}"
    logs = [tmp_path / "head.log", tmp_path / "worker.log"]
    processes: list[subprocess.Popen] = []
    try:
        head = [*_ray_cli(), "start", "--head", f"--port={gcs_port}", "--include-dashboard=false", f"--temp-dir={temp_dirs[0]}",
                f"--ray-client-server-port={_free_ports(1)[0]}", *_node_flags()]
        with open(logs[0], "wb") as log:
            processes.append(subprocess.Popen(head, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        # A node that is not the head shares the head's session folder; --temp-dir is its own root for the rest.
        worker = [*_ray_cli(), "start", f"--address={address}", f"--temp-dir={temp_dirs[1]}", *_node_flags()]
        deadline = time.monotonic() + START_SECONDS
        started_worker = False
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in processes):
                break
            if not started_worker and "Ray runtime started" in logs[0].read_text(errors="replace"):
                with open(logs[1], "wb") as log:
                    processes.append(subprocess.Popen(worker, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
                started_worker = True
            if started_worker and "Ray runtime started" in logs[1].read_text(errors="replace"):
                break
            time.sleep(0.5)
        if len(processes) < 2 or any(p.poll() is not None for p in processes) or "Ray runtime started" not in logs[1].read_text(errors="replace"):
            tails = " | ".join(f"{log.name}: {log.read_text(errors='replace')[-1500:]!r}" for log in logs if log.exists())
            pytest.skip(f"a two-node Ray cluster could not start on this machine within {START_SECONDS} s ({tails})")
        yield address
    finally:
        for process in reversed(processes):
            _stop(process)
        for folder in temp_dirs:
            subprocess.run(["rm", "-rf", folder], check=False)
        monkeypatch.undo()
        Config.initialize("")


@pytest.mark.slow
def test_compress_apply_on_a_two_node_cluster_equals_the_local_apply(two_node_cluster, tmp_path):
    import ray

    from embedtune.cli import main

    rng = np.random.default_rng(7)
    n = 2 * 4096 + 300
    X = rng.normal(size=(n, 32)).astype(np.float32)
    np.save(tmp_path / "in.npy", X)
    ids = [str(i) for i in range(500)]
    make_compressor("pca", dim=8).fit(TrainingData(ids[:1], X[:1], ids, X[:500], {})).save(tmp_path / "adapter")
    apply = ["compress", "apply", "--adapter", str(tmp_path / "adapter"), "--input", str(tmp_path / "in.npy")]
    assert main([*apply, "--out", str(tmp_path / "local.npy")]) == 0
    ray.init(address=two_node_cluster, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        nodes = [node for node in ray.nodes() if node["Alive"]]
        assert len(nodes) == 2 and sum(node["Resources"].get("CPU", 0) for node in nodes) == 2
    finally:
        ray.shutdown()
    # One CPU per actor on two one-CPU nodes: one actor on each node. The command runs as a user runs it, in a
    # process of its own (Ray Data keeps per-process state from any Ray this test process ran before).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(embedtune.__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "embedtune", *apply, "--out", str(tmp_path / "cluster.npy"), "--ray-address", two_node_cluster,
                           "--ray-actors", "2", "--cpus-per-actor", "1", "--chunk-size", "4096"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"backend": "ray (2 actors)"' in done.stdout
    assert (tmp_path / "cluster.npy").read_bytes() == (tmp_path / "local.npy").read_bytes()
