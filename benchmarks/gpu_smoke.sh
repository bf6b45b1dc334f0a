#!/usr/bin/env bash
# The device script for a lent GPU (issue 31): PACE from an unconverged readout, and the Qwen-VL smoke check.
# Everything is in benchmarks/pace_gpu_study.py (its docstring has the details); this wrapper finds a Python
# with embedtune on its path and installs the carried wheels the GPU machine lacks. Offline; nothing is fetched.
#
#   bash benchmarks/gpu_smoke.sh bundle                   # here (CPU): runs/gpu-bundle, to carry (≈ 24 MiB)
#   bash benchmarks/gpu_smoke.sh run [--pack FILE.tar.gz] # GPU: arms A–E × seeds 2027, 2028 × readouts mean, lasttoken,
#                                                         #      one JSON per run, + a tiny Qwen2-VL PACE step (≤ 10 min)
#   bash benchmarks/gpu_smoke.sh --dry-run                # CPU, tiny: one step per arm, the same code path (CI: tests/test_gpu_study.py)
#   bash benchmarks/gpu_smoke.sh vl [STEPS] [HIDDEN] [FAMILY]   # the tiny Qwen-VL smoke check alone (issue 8)
#   bash benchmarks/gpu_smoke.sh [STEPS] [HIDDEN] [FAMILY]      # the same, as this script took them before
#
# On the device (one call, carry ["runs/gpu-bundle"], timeout_s 600):
#   bash benchmarks/gpu_smoke.sh run --pack "$OUT/pace-gpu-study.tar.gz" 2>&1 | tee "$OUT/log.txt"
#
# FAMILY: qwen2_vl (default), qwen2_5_vl, qwen3_vl or qwen3_5 (tiny random model of that family).
# Exits 3 with a clear message when no CUDA GPU is visible (run, vl); EMBEDTUNE_SMOKE_ALLOW_CPU=1 runs the
# VL steps on CPU (bf16 autocast) to check the script itself, as --dry-run does for the whole study.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3 || command -v python)"
if ! "$PYTHON" -c "import embedtune" 2>/dev/null; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
WHEELS="${EMBEDTUNE_BUNDLE:-runs/gpu-bundle}/wheels"
if [ -d "$WHEELS" ] && ! "$PYTHON" -c "import datasets, pytrec_eval" 2>/dev/null; then
    SITE="${TMPDIR:-/tmp}/embedtune-gpu-site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PYTHON" benchmarks/pace_gpu_study.py "$@"
