#!/usr/bin/env bash
# Runs the PACE convergence study one configuration at a time and commits each result JSON as it lands.
# Resumable: rerun the same command; finished configurations are skipped, a killed one resumes from its checkpoint.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CONFIGS=${*:-step-cost frozen infonce-lora pace st-hardness@hard_negatives:5 direct-dot-full no-focal no-dot}
for config in $CONFIGS; do
    HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 "$PY" benchmarks/pace_convergence.py "$config" || { echo "FAILED $config"; continue; }
    git add benchmarks/results/pace-convergence/ && git commit -q -m "results: PACE convergence study, $config" -- benchmarks/results/pace-convergence/ || true
done
