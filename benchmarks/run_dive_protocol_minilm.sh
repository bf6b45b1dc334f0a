#!/usr/bin/env bash
# The DIVE protocol for the MiniLM backbone on SciFact + ArguAna, main comparison first.
# Resumable: re-running skips finished runs. Pass dataset names to restrict, e.g. `scifact`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
CONFIG=benchmarks/dive_paper.toml
DATASETS=${*:-scifact arguana}
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
echo "[$(stamp)] main comparison: $DATASETS"
/usr/bin/time -f "main: %e s wall" $BIN/embedtune benchmark dive --config $CONFIG --backbones minilm --datasets $DATASETS --studies main --no-report
echo "[$(stamp)] ablation (3 seeds)"
$BIN/embedtune benchmark dive --config $CONFIG --backbones minilm --datasets $DATASETS --studies ablation --no-report
echo "[$(stamp)] head count and learning-rate audit (validation seed 2027)"
$BIN/embedtune benchmark dive --config $CONFIG --backbones minilm --datasets $DATASETS --studies heads lr_audit --selection-seeds 2027 --no-report
echo "[$(stamp)] report"
$BIN/embedtune report dive --results benchmarks/results/dive
echo "[$(stamp)] done"
