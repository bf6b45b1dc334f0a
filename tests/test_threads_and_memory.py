"""Thread defaults that do not depend on the load, and a CPU fine-tune whose memory is bounded.

- ``default_threads``: the usable cores (affinity, cgroup quota), at least 1, whatever the load (results must not
  depend on it); ``busy_machine_hint`` advises fewer on a busy machine; ``EMBEDTUNE_THREADS`` and ``--threads``
  override it, and one budget is applied to torch, FAISS and BLAS.
- ``memory_bounded_mini_batch``: on a CPU without a configured ``mini_batch_size``, PACE trains with
  GradCache in mini-batches that keep a step's activations under 1 GiB (MiniLM: 10 texts, where the
  whole batch of 224 held 19.9 GB); a GPU, a configured size or a batch that fits keep the old path.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from embedtune import runtime


@pytest.fixture
def machine(monkeypatch):
    def set_machine(cores: int, load: float, quota: float | None = None) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setattr(runtime, "_busy_cores", lambda: load)
        monkeypatch.setattr(runtime, "_cgroup_cpus", lambda: quota)
        monkeypatch.delenv("EMBEDTUNE_THREADS", raising=False)
    return set_machine


@pytest.mark.parametrize("cores, load, quota, expected", [
    (2, 0.0, None, 2),    # an idle laptop: both cores
    (2, 1.0, None, 2),    # one busy process: still both (the same results as idle)
    (2, 5.5, None, 2),    # the shared benchmark machine
    (16, 3.2, None, 16),
    (16, 0.0, 4.0, 4),    # a container with a 4-CPU quota on a 16-core host
    (16, 0.0, 0.5, 1),    # a quota under one CPU: never below 1
])
def test_default_threads_are_the_usable_cores_whatever_the_load(machine, cores, load, quota, expected):
    machine(cores, load, quota)
    assert runtime.default_threads() == expected


@pytest.mark.parametrize("cores, load, threads, advised", [
    (2, 0.0, 2, None),    # idle: no advice
    (2, 1.0, 2, 1),       # one busy process: the free core
    (2, 5.5, 2, 1),       # never below 1
    (16, 3.2, 16, 13),
    (16, 3.2, 8, None),   # the threads asked for fit in the free cores
])
def test_a_busy_machine_gets_advice_not_another_default(machine, cores, load, threads, advised):
    machine(cores, load)
    hint = runtime.busy_machine_hint(threads)
    if advised is None:
        assert hint is None
    else:
        assert f"--threads {advised} " in hint and "same results" in hint


def test_busy_cores_are_sampled_now_not_read_from_the_load_average(monkeypatch):
    # Two /proc/stat readings 400 jiffies apart on 4 CPUs: 300 idle (250 idle + 50 iowait) -> 1 busy core.
    readings = iter([(1000.0, 5000.0), (1300.0, 5400.0)])
    monkeypatch.setattr(runtime, "_cpu_times", lambda: next(readings))
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runtime.time, "sleep", lambda seconds: None)
    assert runtime._busy_cores() == pytest.approx(1.0)
    # A machine that has just finished a long job: the load average still says 2, the CPUs are idle.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    monkeypatch.setattr(runtime, "_cgroup_cpus", lambda: None)
    monkeypatch.delenv("EMBEDTUNE_THREADS", raising=False)
    monkeypatch.setattr(runtime, "_busy_cores", lambda: 0.05)
    assert runtime.busy_machine_hint(2) is None
    # Without /proc/stat the load average decides.
    monkeypatch.setattr(runtime, "_busy_cores", lambda: None)
    assert "--threads 1 " in runtime.busy_machine_hint(2)


def test_cpu_times_parse_the_cpu_line(monkeypatch, tmp_path):
    import builtins

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(stat if path == "/proc/stat" else path, *a, **k))
    assert runtime._cpu_times() == (840.0, 1000.0)
    stat.write_text("intr 1 2 3\n")
    assert runtime._cpu_times() is None


def test_embedtune_threads_overrides_and_is_checked(machine, monkeypatch):
    machine(2, 0.0)
    monkeypatch.setenv("EMBEDTUNE_THREADS", "3")
    assert runtime.default_threads() == 3
    monkeypatch.setenv("EMBEDTUNE_THREADS", "0")
    with pytest.raises(ValueError, match="EMBEDTUNE_THREADS"):
        runtime.default_threads()


def test_one_budget_for_torch_faiss_and_blas(machine, monkeypatch, toy40, tiny_bert_dir, capsys):
    import faiss
    import torch
    from threadpoolctl import threadpool_info

    import embedtune.cli as cli_module
    from embedtune.cli import main

    saved = torch.get_num_threads()
    try:
        machine(2, 1.3)  # busy: the default is still both cores, with advice for a person at a terminal
        assert main(["split", "--data", str(toy40), "--out", os.devnull, "--overwrite"]) == 0
        assert torch.get_num_threads() == 2 and faiss.omp_get_max_threads() == 2
        assert "--threads 1 " not in capsys.readouterr().err  # a script's stderr: no advice
        monkeypatch.setattr(cli_module, "_on_a_terminal", lambda: True)
        assert main(["split", "--data", str(toy40), "--out", os.devnull, "--overwrite"]) == 0
        assert "--threads 1 " in capsys.readouterr().err
        assert main(["--threads", "1", "split", "--data", str(toy40), "--out", os.devnull, "--overwrite"]) == 0
        assert torch.get_num_threads() == 1 and faiss.omp_get_max_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info() if pool["user_api"] == "blas")
        assert "--threads 1 " not in capsys.readouterr().err  # asked for: no advice
    finally:
        runtime.set_threads(saved)


@pytest.mark.parametrize("cpus, expected", [(0.5, 1), (1.0, 1), (2.0, 2)])
def test_ray_actors_default_to_the_threads_they_reserve(monkeypatch, tmp_path, cpus, expected):
    import sys

    from embedtune.encoders import ray_encode

    seen = {}

    class Mapped:
        def iter_rows(self):
            return iter(())

    class Dataset:
        def map_batches(self, fn, **kwargs):
            seen.update(kwargs["fn_constructor_kwargs"])
            return Mapped()

    context = SimpleNamespace(enable_progress_bars=True, print_on_execution_start=True)
    fake = SimpleNamespace(data=SimpleNamespace(DataContext=SimpleNamespace(get_current=lambda: context),
                                                from_items=lambda items, **k: Dataset(),
                                                ActorPoolStrategy=lambda size: ("pool", size)))
    monkeypatch.setitem(sys.modules, "ray", fake)
    with pytest.raises(Exception):  # nothing was encoded, so the manifest step refuses: the defaults are what is checked
        ray_encode.encode_sharded_ray(["d0"], ["text"], "minilm", tmp_path / "v", shard_size=1, actors=2, num_cpus=cpus)
    assert seen["threads"] == expected


def _model(layers=6, heads=12, hidden=384, intermediate=1536, length=256):
    config = SimpleNamespace(num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden, intermediate_size=intermediate)
    module = SimpleNamespace(auto_model=SimpleNamespace(config=config))
    model = [module]

    class Model(list):
        max_seq_length = length

    return Model(model)


def _config(**overrides):
    values = dict(mini_batch_size=None, deepspeed=None, batch_size=32)
    values.update(overrides)
    return SimpleNamespace(**values)


def test_cpu_fine_tune_bounds_a_steps_activations():
    from embedtune.finetune.backbones.text import CPU_ACTIVATION_BUDGET_BYTES, activation_bytes_per_text, memory_bounded_mini_batch

    minilm = _model()
    per_text = activation_bytes_per_text(minilm)
    assert 90e6 < per_text < 125e6  # 115 MB measured per 256-token text (benchmarks/results/threads-memory.md)
    mini = memory_bounded_mini_batch(minilm, _config(), texts_per_example=7, on_gpu=False)
    assert mini == 10 and mini * per_text <= CPU_ACTIVATION_BUDGET_BYTES
    # A GPU, a configured size, DeepSpeed or a batch that fits: as before.
    assert memory_bounded_mini_batch(minilm, _config(), 7, on_gpu=True) is None
    assert memory_bounded_mini_batch(minilm, _config(mini_batch_size=8), 7, on_gpu=False) == 8
    assert memory_bounded_mini_batch(minilm, _config(deepspeed="ds.json"), 7, on_gpu=False) is None
    assert memory_bounded_mini_batch(_model(length=32), _config(batch_size=4), 7, on_gpu=False) is None
    # mpnet-sized (12 layers, 768-d, 384 tokens): a few texts at a time, never 0.
    assert 1 <= memory_bounded_mini_batch(_model(12, 12, 768, 3072, 384), _config(), 7, on_gpu=False) <= 4


def test_a_cpu_fine_tune_over_the_budget_trains_with_gradcache(toy40, tiny_bert_dir, tmp_path, monkeypatch, caplog):
    import logging

    from embedtune.finetune import preset_config, train_pace
    from embedtune.finetune.backbones import text

    monkeypatch.setattr(text, "CPU_ACTIVATION_BUDGET_BYTES", 1)  # any batch is over it: mini-batches of 1 text
    built = []
    original = text.build_loss
    monkeypatch.setattr(text, "build_loss", lambda *a, **k: built.append(a[4] if len(a) > 4 else k.get("mini_batch_size")) or original(*a, **k))
    config = preset_config("pace", stage1_steps=1, stage2_steps=1, stage2_init=1, model=str(tiny_bert_dir), data=str(toy40),
                           train_split="test", batch_size=4, n_negatives=2, hard_pool=5, save_steps=1, lora_rank=4,
                           output_dir=str(tmp_path / "pace"), auto_temperature_samples=4)
    with caplog.at_level(logging.INFO, logger="embedtune.finetune.backbones.text"):
        result = train_pace(config)
    assert built == [1, 1] and "GradCache in mini-batches of 1 texts" in caplog.text
    assert os.path.isdir(result.model_dir)


def test_a_long_stage_says_up_front_how_long_it_will_take(monkeypatch, caplog):
    import logging
    from types import SimpleNamespace

    from embedtune.finetune import trainer

    clock = iter([0.0, 150.0])
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: next(clock))
    callback = trainer.StepProgressCallback("PACE stage1", enabled=False)
    state = SimpleNamespace(is_world_process_zero=True, max_steps=29, global_step=0)
    callback.on_train_begin(None, state, None)
    state.global_step = 1
    with caplog.at_level(logging.INFO, logger="embedtune.finetune.trainer"):
        callback.on_step_end(None, state, None)
    assert "the first step took 2:30 min; the 29 steps will take about 1:12 h" in caplog.text
    assert trainer._duration(95) == "1:35 min"


def test_pca_axes_are_the_same_bits_on_one_thread_and_on_two(monkeypatch):
    """The scatter's blocks are computed side by side and added in block order: the axes of one thread, on any count."""
    import embedtune.compress.pca as pca

    monkeypatch.setattr(pca, "_BLOCK_ROWS", 500)  # 9 blocks, the last one short
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4321, 48)) * np.geomspace(1.0, 0.01, 48) + 0.3).astype(np.float32)
    before = runtime.thread_budget()
    try:
        fits = []
        for threads in (1, 2):
            runtime.set_threads(threads)
            fits.append(pca.principal_axes(x, 8))
    finally:
        runtime.set_threads(before)
    for one, two in zip(*fits):
        assert np.array_equal(one, two)
    mean = x.astype(np.float64).mean(axis=0)
    with runtime.single_threaded():  # the same sum, block after block
        scatter = sum(((x[lo : lo + 500] - mean).T @ (x[lo : lo + 500] - mean) for lo in range(0, len(x), 500)), np.zeros((48, 48)))
    assert np.allclose(fits[0][2], np.sort(np.linalg.eigvalsh(scatter))[::-1][:8] / (len(x) - 1))
