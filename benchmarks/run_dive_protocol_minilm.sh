#!/usr/bin/env bash
# The DIVE protocol for the MiniLM backbone on SciFact + ArguAna, in the order that matters
# most (main comparison first). Resumable: re-running skips finished runs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
CONFIG=benchmarks/dive_paper.toml
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
echo "[$(stamp)] main comparison"
/usr/bin/time -f "main: %e s wall" $BIN/embedtune benchmark dive --config $CONFIG --backbones minilm --studies main --no-report
echo "[$(stamp)] ablation (3 seeds)"
$BIN/embedtune benchmark dive --config $CONFIG --backbones minilm --studies ablation --no-report
echo "[$(stamp)] head count and learning-rate audit (validation seed 2027)"
$BIN/embedtune benchmark dive --config $CONFIG --backbones minilm --studies heads lr_audit --selection-seeds 2027 --no-report
echo "[$(stamp)] report"
$BIN/embedtune report dive --results benchmarks/results/dive
echo "[$(stamp)] done"
