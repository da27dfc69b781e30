#!/usr/bin/env bash
# Diagnosis of the judge on the GPU machine (carry .whl and .trace): per-call figures with
# the candidate's own claim beside them, memory per process, a short throughput run.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD EVOKERNEL_TRACE_ROOT=$PWD/.trace PYTHONUNBUFFERED=1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
timeout 200 python3 benchmarks/seeds.py --workload dsa_topk --shapes quick --only cuda_radix 2>&1 | tail -25
python3 - <<'PY'
import csv, glob
for f in glob.glob(__import__("os").environ["OUT"] + "/seeds-*.csv"):
    for r in csv.DictReader(open(f)):
        print(r["subject"][:18], r["shape"][:8], r.get("latency_us","")[:7], r.get("cupti_us","")[:7], r.get("method",""), "n", r.get("stat_batch_calls",""), "rtt", r.get("stat_round_trip_us","")[:6], "claim", r.get("stat_claimed_call_us","")[:6])
PY
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
timeout 150 python3 benchmarks/evaluator_throughput.py --workload dsa_topk --shapes quick --seed-name cuda_radix --deadline 45 --designs judge 2>&1 | grep -v "^judge " | tail -15
