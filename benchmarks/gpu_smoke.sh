#!/usr/bin/env bash
# PACE on a Qwen-VL backbone, GPU smoke check (issue 8): a few Stage I (cosine + LoRA on the LM) and
# Stage II (merged, dot, full LM) steps in bf16 autocast on a tiny random Qwen-VL (FAMILY), printing each
# step's time and the peak GPU memory. Offline; nothing is downloaded.
#
#   bash benchmarks/gpu_smoke.sh [STEPS_PER_STAGE] [HIDDEN_SIZE] [FAMILY]
#
# FAMILY: qwen2_vl (default), qwen2_5_vl, qwen3_vl or qwen3_5 (tiny random model of that family).
#
# Exits 3 with a clear message when no CUDA GPU is visible. EMBEDTUNE_SMOKE_ALLOW_CPU=1 runs the same
# steps on CPU (bf16 autocast) to check the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python
STEPS="${1:-3}" HIDDEN="${2:-256}" FAMILY="${3:-qwen2_vl}" exec "$PYTHON" - <<'PY'
import os, sys, time

import torch

allow_cpu = os.environ.get("EMBEDTUNE_SMOKE_ALLOW_CPU") == "1"
if not torch.cuda.is_available() and not allow_cpu:
    print("gpu_smoke: no CUDA GPU visible (torch.cuda.is_available() is False); nothing was measured.", file=sys.stderr)
    sys.exit(3)
device = "cuda" if torch.cuda.is_available() else "cpu"
steps, hidden, family = int(os.environ["STEPS"]), int(os.environ["HIDDEN"]), os.environ["FAMILY"]

from embedtune.data.mmeb import MMEBTrainExample
from embedtune.encoders.tiny_vl import synthetic_image, tiny_vl_embedder
from embedtune.encoders.vision_language import TASK_INSTRUCTIONS, VLInput
from embedtune.finetune import PACEConfig, StageConfig, train_vl_pace

embedder = tiny_vl_embedder(family, seed=0, hidden_size=hidden).to(device)
examples = [
    MMEBTrainExample(VLInput("a red cat", [synthetic_image(i)], TASK_INSTRUCTIONS["vqa"]),
                     VLInput("red"), [VLInput("", [synthetic_image(100 + i)])])
    for i in range(16)
]
vision_before = {name: p.detach().clone() for name, p in embedder.vision_parameters()}
config = PACEConfig(backbone="vl", seed=0, n_negatives=None, stage2_init="final",
                    stage1=StageConfig(steps=steps, similarity="cosine", parameters="lora", learning_rate=1e-4, temperature=0.02, warmup_ratio=0.0),
                    stage2=StageConfig(steps=steps, similarity="dot", parameters="full", learning_rate=1e-5, temperature=1.0, warmup_ratio=0.0),
                    batch_size=8, lora_rank=8)
if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
start = time.perf_counter()
result = train_vl_pace(embedder, examples, config, autocast_dtype=torch.bfloat16)
total = time.perf_counter() - start
print(f"device={torch.cuda.get_device_name() if device == 'cuda' else 'cpu'} torch={torch.__version__} family={family} hidden={hidden} batch={config.batch_size} dtype=bf16-autocast")
for log in result["logs"]:
    print(f"stage {log.stage} step {log.step}: loss={log.loss:.4f} step_time={log.seconds * 1000:.1f} ms")
for stage in (1, 2):
    times = [log.seconds for log in result["logs"] if log.stage == stage][1:] or [float("nan")]
    print(f"stage {stage}: mean step time after warm-up {1000 * sum(times) / len(times):.1f} ms")
frozen = all(torch.equal(p, vision_before[name]) for name, p in embedder.vision_parameters())
print(f"vision tower + projector unchanged: {frozen}")
if device == "cuda":
    print(f"peak GPU memory allocated: {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
print(f"total: {total:.2f} s")
sys.exit(0 if frozen else 1)
PY
