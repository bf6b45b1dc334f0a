"""Two processes (gloo, CPU) give the loss and gradients of one process on the same global batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

# Only torch is imported here, so the spawned workers start quickly.
from embedtune.finetune.losses.focal_embedding import FocalEmbeddingLoss, focal_embedding_loss

WORLD = 2
PER_RANK = 3
N_NEGATIVES = 2
D_IN, D_OUT = 6, 5


def _global_inputs() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    # Columns: anchor, positive, negative_1, negative_2; each (WORLD * PER_RANK, D_IN).
    return [torch.randn(WORLD * PER_RANK, D_IN, generator=generator, dtype=torch.float64) for _ in range(2 + N_NEGATIVES)]


def _encoder() -> nn.Module:
    torch.manual_seed(5)
    return nn.Linear(D_IN, D_OUT).double()


def _loss_and_grads(model: nn.Module, columns: list[torch.Tensor], **options) -> tuple[float, list[torch.Tensor]]:
    n = len(columns[0])
    embeddings = model(torch.cat(columns)).split(n)  # one forward, like s-t's merged columns
    loss = FocalEmbeddingLoss(model, **options)
    value = loss.compute_loss_from_embeddings(list(embeddings), None)
    value.backward()
    return value.item(), [p.grad.detach().clone() for p in model.parameters()]


OPTIONS = dict(similarity="dot", temperature=2.0, weight_temperature=0.1, gamma=2.0)
NORMALIZATIONS = ("global", "local")


def _worker(rank: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # A file rendezvous, not a TCP port: a port picked free can be taken before gloo binds it.
    dist.init_process_group("gloo", init_method=f"file://{Path(out_dir) / 'rendezvous'}", rank=rank, world_size=WORLD)
    try:
        local = [column[rank * PER_RANK : (rank + 1) * PER_RANK] for column in _global_inputs()]
        results = {}
        for normalize in NORMALIZATIONS:
            model = DistributedDataParallel(_encoder())
            value, grads = _loss_and_grads(model, local, normalize=normalize, **OPTIONS)
            results[normalize] = {"loss": value, "grads": grads}
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_equal_one_process(tmp_path):
    """Global weight normalisation across 2 processes (DDP, gloo) = 1 process on the same global batch;
    ``local`` equals one process normalising within each process's block of queries."""
    import torch.multiprocessing as mp

    for attempt in range(2):
        out = tmp_path / f"attempt{attempt}"
        out.mkdir()
        try:
            mp.spawn(_worker, args=(str(out),), nprocs=WORLD, join=True)
            break
        except mp.ProcessExitedException as error:
            # A worker killed by a signal (gloo aborted once on a loaded 2-core machine): one fresh try. A worker that
            # raised, or results that differ, still fail.
            if attempt or error.exit_code is None or error.exit_code >= 0:
                raise
    results = [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]
    columns = _global_inputs()
    references = {"global": _loss_and_grads(_encoder(), columns, normalize="global", **OPTIONS)}
    model = _encoder()
    embeddings = model(torch.cat(columns)).split(len(columns[0]))
    out = focal_embedding_loss(embeddings[0], torch.cat(embeddings[1:]), normalize="local", groups=WORLD, **OPTIONS)
    out.loss.backward()
    references["local"] = (out.loss.item(), [p.grad for p in model.parameters()])
    for normalize in NORMALIZATIONS:
        reference_loss, reference_grads = references[normalize]
        for result in results:
            assert result[normalize]["loss"] == pytest.approx(reference_loss, rel=1e-10)
            for got, expected in zip(result[normalize]["grads"], reference_grads):
                torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


def test_global_and_local_normalisation_differ_across_processes():
    columns = _global_inputs()
    model = _encoder()
    embeddings = model(torch.cat(columns)).split(len(columns[0]))
    kwargs = dict(similarity="dot", temperature=2.0, gamma=2.0, groups=WORLD)
    global_loss = focal_embedding_loss(embeddings[0], torch.cat(embeddings[1:]), normalize="global", **kwargs).loss
    local_loss = focal_embedding_loss(embeddings[0], torch.cat(embeddings[1:]), normalize="local", **kwargs).loss
    assert global_loss.item() != pytest.approx(local_loss.item(), rel=1e-6)


ACCELERATE_SCRIPT = """
import json, os, sys
os.environ["EMBEDTUNE_CACHE"] = sys.argv[4]
import torch
torch.set_num_threads(1)
from embedtune.finetune import preset_config, train_pace
config = preset_config("pace", stage1_steps=2, stage2_steps=1, model=sys.argv[1], data=sys.argv[2], train_split="test",
                       output_dir=sys.argv[3], batch_size=2, n_negatives=2, hard_pool=5, save_steps=1, lora_rank=2,
                       stage2_init=1, auto_temperature_samples=4)
result = train_pace(config)
if int(os.environ.get("RANK", "0")) == 0:
    with open(os.path.join(sys.argv[3], "launch.json"), "w") as handle:
        json.dump({"world_size": int(os.environ.get("WORLD_SIZE", "1")), "stages": [s.steps_run for s in result.stages],
                   "init": result.stages[1].init_checkpoint, "losses": [[h["loss"] for h in s.log_history if "loss" in h] for s in result.stages]}, handle)
"""


@pytest.mark.slow
def test_accelerate_launch_two_processes_runs_both_stages(tmp_path, tiny_bert_dir, toy_beir):
    """`accelerate launch --num_processes 2` on CPU (gloo) trains Stage I and Stage II on a tiny model.

    accelerate 1.x starts several CPU processes through torch.distributed.run only with ``--multi_gpu``
    (``--cpu`` alone runs one process unless an MPI hostfile is given); without CUDA the processes use gloo.
    """
    import json

    pytest.importorskip("accelerate")
    script = tmp_path / "launch_pace.py"
    script.write_text(ACCELERATE_SCRIPT)
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
               str(script), str(tiny_bert_dir), str(toy_beir), str(out), str(tmp_path / "cache")]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    summary = json.loads((out / "launch.json").read_text())
    assert summary["world_size"] == 2
    assert summary["stages"] == [2, 1]
    assert summary["init"].endswith("checkpoint-1")
    assert all(len(losses) >= 1 for losses in summary["losses"])
    assert (out / "model" / "modules.json").is_file()
