"""The device script for a lent GPU: its CPU dry run, its bundle format, its data and arms,
and the readout override of benchmarks/pace_convergence.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import pace_gpu_study as study  # noqa: E402
from readout_model import copy_with_pooling  # noqa: E402

ARM_FILES = {"frozen", "A", "B", "C", "D", "E"}


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


@pytest.mark.slow
def test_gpu_smoke_dry_run_on_cpu(tmp_path):
    """`benchmarks/gpu_smoke.sh --dry-run`: one step per arm, both readouts, the VL step, one JSON per run, on CPU."""
    results = tmp_path / "results"
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_smoke.sh"), "--dry-run", "--out", str(results), "--work", str(tmp_path / "work"),
                           "--pack", str(tmp_path / "out" / "pace-gpu-study.tar.gz")],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    vl = json.loads((results / "vl_step.json").read_text())
    assert vl["vision_frozen"] is True and {row["stage"] for row in vl["steps"]} == {1, 2}
    for readout in ("mean", "lasttoken"):
        files = {path.name.split("+")[0] for path in (results / readout).glob("*.json")}
        assert files == ARM_FILES, (readout, files)
        for arm in ARM_FILES:
            record = json.loads((results / readout / f"{arm}+seed2027.json").read_text())
            assert record["readout"] == readout and record["dry_run"] is True and record["n_negatives"] == 5
            assert set(record["test"]["scifact"]["subsets"]) >= {"all", "seen", "unseen"}
            assert record["test"]["scifact"]["per_query_ndcg@10"]
            assert "normalize_stripped" in record["diagnostics"] and record["curve"]
            if arm != "frozen":
                assert all(stage["step_seconds"]["n_steps"] == 1 for stage in record["stages"])
        pace = json.loads((results / readout / "C+seed2027.json").read_text())
        assert [s["similarity"] for s in pace["stages"]] == ["cosine", "dot"] and pace["config"]["stop_stage1_at_init"] is True
        no_dot = json.loads((results / readout / "E+seed2027.json").read_text())
        assert [s["similarity"] for s in no_dot["stages"]] == ["cosine", "cosine"]
        # a cosine model is saved with Normalize and diagnosed without it
        assert json.loads((results / readout / "A+seed2027.json").read_text())["diagnostics"]["normalize_stripped"] is True
    summary = json.loads((results / "summary.json").read_text())
    assert set(summary["table"]) == {"mean", "lasttoken"} and not summary["skipped"]
    assert (tmp_path / "out" / "pace-gpu-study.tar.gz").stat().st_size > 0


def test_vl_smoke_keeps_its_former_arguments():
    """`gpu_smoke.sh [STEPS] [HIDDEN] [FAMILY]` still runs the VL smoke check alone; without a GPU it says so (exit 3)."""
    env = {k: v for k, v in _env().items() if k != "EMBEDTUNE_SMOKE_ALLOW_CPU"}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_smoke.sh"), "1", "32"], env=env, capture_output=True, text=True, timeout=300)
    import torch

    if not torch.cuda.is_available():
        assert done.returncode == 3 and "no CUDA GPU visible" in done.stderr


def test_bundle_weights_round_trip(tmp_path):
    """bf16 byte-planes + xz: large tensors come back as their bf16 rounding, small ones exactly, dropped rows as zeros."""
    import torch
    from safetensors.torch import load_file, save_file

    source = tmp_path / "model"
    source.mkdir()
    torch.manual_seed(0)
    state = {"embeddings.word_embeddings.weight": torch.randn(500, 256), "encoder.dense.weight": torch.randn(400, 300),
             "encoder.dense.bias": torch.randn(300)}
    save_file(state, str(source / "model.safetensors"))
    (source / "config.json").write_text("{}")
    (source / "1_Pooling").mkdir()
    (source / "1_Pooling" / "config.json").write_text("{}")
    keep = np.array([0, 3, 7, 499])
    study.pack_model(source, tmp_path / "packed", keep)
    assert not (tmp_path / "packed" / "model.safetensors").exists()
    restored = load_file(str(study.unpack_model(tmp_path / "packed", tmp_path / "restored") / "model.safetensors"))
    assert (tmp_path / "restored" / "1_Pooling" / "config.json").is_file()
    assert torch.equal(restored["encoder.dense.bias"], state["encoder.dense.bias"])
    assert torch.equal(restored["encoder.dense.weight"], state["encoder.dense.weight"].to(torch.bfloat16).float())
    embeddings = restored["embeddings.word_embeddings.weight"]
    stored = {entry["name"]: entry["stored"] for entry in json.loads((tmp_path / "packed" / "weights.json").read_text())["tensors"]}
    assert stored["embeddings.word_embeddings.weight"] == "float32"  # 4 rows kept: a small tensor now
    assert torch.equal(embeddings[keep], state["embeddings.word_embeddings.weight"][keep])
    dropped = np.setdiff1d(np.arange(500), keep)
    assert float(embeddings[dropped].abs().max()) == 0.0


def test_settings_are_those_of_pace_convergence():
    import pace_convergence

    for name in ("SEED", "MAX_SEQ", "HARD_POOL", "FN_MARGIN", "FN_REFERENCE", "VAL_FRACTION", "VAL_POOL", "STAGE2_INIT"):
        assert getattr(study, name) == getattr(pace_convergence, name), name


def test_committed_data_is_the_study_split_with_five_negatives():
    from embedtune.data.beir import load_beir
    from embedtune.data.splits import train_qrels_split

    rows = json.loads((study.DATA_DIR / "train_tuples.json").read_text())
    manifest = json.loads((study.DATA_DIR / "validation.json").read_text())
    assert len(rows["tuples"]) == 736 and all(len(negatives) == 5 for _, _, negatives in rows["tuples"])
    split = train_qrels_split(load_beir("scifact", "train"), load_beir("scifact", "test"), val_fraction=study.VAL_FRACTION, seed=study.SEED)
    assert manifest["query_ids"] == split.val and manifest["train_query_ids"] == split.train
    assert {q for q, _, _ in rows["tuples"]} <= set(split.train)
    assert rows["meta"]["false_negative_margin"] == study.FN_MARGIN and rows["meta"]["hard_pool"] == study.HARD_POOL


@pytest.mark.parametrize("arm, expected", [
    ("A", ("infonce-lora", [200], None)),
    ("B", ("direct-dot-full", [200], None)),
    ("C", ("pace", [200, 200], 50)),
    ("D", ("direct-dot-full", [250], None)),
    ("E", ("no-dot", [200, 200], 50)),
])
def test_arms_follow_the_papers_protocol(tmp_path, arm, expected):
    settings = {"data": "scifact", "max_seq_length": 256, "batch_size": 32, "n_negatives": 5, "precision": "auto"}
    config = study.arm_config(arm, tmp_path / "model", tmp_path / "out", 200, 2028, settings)
    preset, steps, init_step = expected
    stages = [stage for stage in (config.stage1, config.stage2) if stage is not None]
    assert config.preset == preset and [stage.steps for stage in stages] == steps and config.seed == 2028
    assert config.batch_size == 32 and config.n_negatives == 5
    if init_step is not None:  # Stage I on a T schedule, stopped at 0.25 T; Stage II T updates on top
        assert config.stop_stage1_at_init and config.stage2_init_step(config.stage1.steps) == init_step
        assert config.stage2.learning_rate == 2e-6
    assert study.arm_config("C@s2lr2e-5", tmp_path, tmp_path, 200, 2027, settings).stage2.learning_rate == 2e-5


def test_readout_copy_sets_last_token_pooling(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    before = (tiny_bert_dir / "1_Pooling" / "config.json").read_text()
    out = copy_with_pooling(tiny_bert_dir, tmp_path / "lasttoken", "lasttoken")
    config = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert config["pooling_mode_lasttoken"] is True and config["pooling_mode_mean_tokens"] is False
    assert (tiny_bert_dir / "1_Pooling" / "config.json").read_text() == before  # the source is untouched
    assert SentenceTransformer(str(out), device="cpu")[1].get_config_dict()["pooling_mode"] == "lasttoken"


def test_pace_convergence_model_override(tmp_path):
    """--model / PACE_MODEL trains from another readout on the same data: shared data folder, own runs and results."""
    import pace_convergence

    argv = ["pace_convergence.py", "--model", "runs/minilm-lasttoken", "frozen", "pace"]
    env_before = os.environ.get("PACE_MODEL")
    try:
        pace_convergence.take_model_flag(argv)
        assert argv == ["pace_convergence.py", "frozen", "pace"] and os.environ["PACE_MODEL"] == "runs/minilm-lasttoken"
    finally:
        if env_before is None:
            os.environ.pop("PACE_MODEL", None)
        else:
            os.environ["PACE_MODEL"] = env_before
    code = ("import pace_convergence as p, json; print(json.dumps([str(p.MODEL), str(p.DATA), str(p.ROOT), str(p.RESULTS), "
            "p.COMMON['model'], p.MINING_MODEL]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True, text=True, timeout=300,
                          env=_env(PACE_MODEL=str(tmp_path / "minilm-lasttoken"), PACE_RUNS=str(tmp_path / "runs")))
    assert done.returncode == 0, done.stderr[-3000:]
    model, data, root, results, common_model, mining = json.loads(done.stdout.strip().splitlines()[-1])
    assert model == common_model == str(tmp_path / "minilm-lasttoken") and mining == "minilm"
    assert data == str(tmp_path / "runs" / "data") and root == str(tmp_path / "runs" / "minilm-lasttoken")
    assert results.endswith("benchmarks/results/pace-convergence/minilm-lasttoken")
