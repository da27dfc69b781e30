#!/usr/bin/env bash
# Rebuilds the populations shipped in populations/ (README: "Populations"), through the
# same commands a user would run. Each takes a few minutes on a 2-core CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. dsa_topk-radix-h200: the best cuda_radix variants measured on an H200. An evolutionary
#    search replays the recorded landscape (workloads/dsa_topk/landscapes/), then its run
#    is resumed only to save its elites.
rm -rf populations/dsa_topk-radix-h200
$PY -m evokernel.analysis.compare --workload dsa_topk --strategies evolutionary --seeds 1 --budget 32 \
  --runtime local --out "$tmp/cmp" --quiet --no-report
$PY -m evokernel.search --resume "$tmp/cmp/runs/evolutionary-s0" --quiet --set output.top=8 \
  --save-population dsa_topk-radix-h200

# 2. dsa_topk-cpu-smoke: the main command on a CPU (no GPU): torch variants timed on the
#    CPU, CUDA and Triton variants built and SKIPPED, so a GPU run seeded with it starts
#    from all three seeds' families.
rm -rf populations/dsa_topk-cpu-smoke
$PY -m evokernel.search --workload dsa_topk --runtime local --budget 12 --shapes smoke --seed 0 \
  --run-dir "$tmp/cpu" --quiet --set output.top=8 --save-population dsa_topk-cpu-smoke
