#!/usr/bin/env bash
# Runs on the lent GPU machine (no registries there): installs the carried wheels in
# .whl/, then the named stages. Outputs go to $OUT, one .tgz per stage (or straight to
# benchmarks/results/ without $OUT). STAGE_TIMEOUT=<s> ends a stage early, its files kept.
#   bash benchmarks/gpu_run.sh tests seeds throughput search
#   TESTS=tests/workloads/test_fused_moe.py PYTEST_K=cuda_graph bash benchmarks/gpu_run.sh tests
#   ONLY=cuda_radix SHAPES=quick TAG=seeds-quick-cuda_radix bash benchmarks/gpu_run.sh seeds
#   VARIANT=torch_vectorized:COMPILE=inductor BEST=path/best_candidate.json bash benchmarks/gpu_run.sh seeds
#   bash benchmarks/gpu_run.sh family            # cuda_family through the judge, about 7 minutes
#   DEADLINE=40 DESIGNS=judge,pipelined,legacy bash benchmarks/gpu_run.sh throughput  # side by side
#   PROCESSES=8 bash benchmarks/gpu_run.sh spawn   # a candidate process's start: forked against fresh
#   bash benchmarks/gpu_run.sh launch-cost   # a CUDA kernel launch's host cost and the gap it leaves, old path against new
#   SPANS=16,32,64,128,256 bash benchmarks/gpu_run.sh gather   # dsa_sparse_attention's gathers alone, per span length
#   WORKLOAD=dsa_sparse_attention SEEDS=triton_split,cuda_mma SHAPES=quick BUDGET=280 \
#     [SAMPLE_SEED=2] [SKIP="a.jsonl b.jsonl"] [GRID=MS_SCORE,MS_WARPS,...] [BANK_GB=60] [LANES=1] [QUIET_GRAPHS=1] \
#     [MAX_POINTS=12] [TRITON_STORE=0] [TRITON_WARM=0] bash benchmarks/gpu_run.sh landscape   # TRITON_STORE=0: no store
#     of seed kernels; TRITON_WARM=0: no seed's Triton kernels compiled ahead of its point
#   WORKLOAD=fused_moe TRACE_ROOT=shared/flashinfer-trace bash benchmarks/gpu_run.sh workload-check
#   COMPILE=1 WORKLOAD=fused_moe TRACE_ROOT=.trace bash benchmarks/gpu_run.sh workload-check  # + torch.compile
#   BEST=path/to/best_candidate.json WORKLOAD=fused_moe ... workload-check   # + a best_found column
#   COMPILE=1 TRACE_ROOT=.trace bash benchmarks/gpu_run.sh attn-check   # dsa_sparse_attention
#   BEST=runs/x/best_solution.json BANK_GB=20 SHAPES=all TRACE_ROOT=.trace bash benchmarks/gpu_run.sh attn-check
#   SEED=cuda_family VARIANTS="w16:MS_WARPS=16,ML_WARPS=16" bash benchmarks/gpu_run.sh probe ncu  # NAME:K=V,... each
#   START_AT=holds_device_memory.py bash benchmarks/gpu_run.sh redteam   # the rest of a red team cut short
#   ONLY=triton_split,cuda_mma VARIANTS='cuda_mma:MAX_SPLITS=32' SWEEP_SHAPES=none TRACE_ROOT=.trace \
#     bash benchmarks/gpu_run.sh attn-check   # VARIANTS: auto (default), none, seed:K=V,...;...
#   CHECK=1 SEED=cuda_family VARIANTS="wg:MS_SCORE=wgmma" bash benchmarks/gpu_run.sh probe  # + PASSED/INCORRECT
#   PHASES=1 SEED=cuda_family VARIANTS="wg:MS_SCORE=wgmma" bash benchmarks/gpu_run.sh probe  # + in-kernel phase times
#   WORKLOAD=dsa_sparse_attention SHAPES=quick bash benchmarks/gpu_run.sh bank-profile  # where making banks goes
#   L2=cold,code,warm SEED=cuda_family bash benchmarks/gpu_run.sh probe  # cold caches, warm code only, all warm
# Fetch the wheels first, on a machine with a registry: python scripts/gpu_wheels.py
set -uo pipefail
cd "$(dirname "$0")/.."
# WHEELS: the folder of carried wheels, .whl by default. A device call carries at most
# 64 MiB with the tracked tree (16 MB on 2026-12-06, beside the 43 MB of .whl); should
# they outgrow it, every stage but search runs without Ray, from `python scripts/gpu_wheels.py --only noray --dest .whl-noray`
# (12 MiB; carry ".whl-noray", set WHEELS=.whl-noray), or `--only evaluation` (5 MiB, no
# optuna or deap: not throughput's old design).
wheels="${WHEELS:-.whl}"
if [ -d "$wheels" ]; then
  # not under /tmp: a candidate's process gets a private /tmp; installed once per machine
  # (a second gpu_run.sh in the same device call reuses .site)
  if [ ! -f .site/.installed ] || [ -n "$(find "$wheels" -newer .site/.installed -name '*.whl')" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target .site "$wheels"/*.whl || exit 1
    touch .site/.installed
  fi
  export PYTHONPATH="$PWD/.site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
# the device copy's git may name a stale HEAD: pass the commit measured (EVOKERNEL_COMMIT=...)
export EVOKERNEL_COMMIT="${EVOKERNEL_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
# The published references (the baseline of every speedup) come from a FlashInfer-Trace
# folder: carry one as .trace (mkdir -p .trace && cp -r ../shared/flashinfer-trace/definitions .trace/).
if [ -d .trace/definitions ]; then export EVOKERNEL_TRACE_ROOT="$PWD/.trace"; fi
run_stage() {
  # STAGE_TIMEOUT=<seconds> ends a stage's python early, so that what it wrote is still packed
  local limit="timeout ${STAGE_TIMEOUT:-86400}"
  case "$1" in
    tests) $limit python3 -m pytest ${TESTS:-tests/evaluate/test_gpu.py} -q -rA -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} ;;
    seeds) $limit python3 benchmarks/seeds.py --workload "${WORKLOAD:-dsa_topk}" --shapes "${SHAPES:-all}" \
      ${ONLY:+--only "$ONLY"} ${TAG:+--tag "$TAG"} ${VARIANT:+--variant "$VARIANT"} ${BEST:+--best "$BEST"} ;;
    redteam) $limit python3 benchmarks/redteam.py ${START_AT:+--start-at "$START_AT"} \
      $([ "${QUIET_GRAPHS:-0}" != 0 ] && echo --quiet-graphs) ;;
    solves-ahead) $limit python3 benchmarks/probe_solves_ahead.py --rounds "${ROUNDS:-3}" ;;
    retire-overlap) $limit python3 benchmarks/probe_retire_overlap.py --rounds "${ROUNDS:-3}" ;;
    smoke) $limit python3 benchmarks/judge_smoke.py --timeout 60 ;;
    spawn) $limit python3 benchmarks/spawn_cost.py --processes "${PROCESSES:-8}" --device cuda ;;
    launch-cost) $limit python3 benchmarks/launch_cost.py ;;
    # dsa_sparse_attention's gathers alone (benchmarks/gather_floor.cu): what any kernel of its form could reach
    gather) $limit python3 benchmarks/probe_gather.py --shapes "${SHAPES:-quick}" ${SPANS:+--spans "$SPANS"} \
      ${CALLS:+--calls "$CALLS"} ;;
    graph-cost) $limit python3 benchmarks/probe_graph_cost.py ;;
    bank-profile) $limit python3 benchmarks/profile_bank.py --workload "${WORKLOAD:-dsa_sparse_attention}" \
      --shapes "${SHAPES:-quick}" ;;
    # expandable segments: the 19 fused_moe shapes in one process fragment the cache past 80 GB on an H100
    workload-check) PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}" \
      $limit python3 benchmarks/workload_gpu_check.py --workload "${WORKLOAD:-fused_moe}" \
      --shapes "${SHAPES:-all}" ${COMPILE:+--compile} ${TRACE_ROOT:+--trace-root "$TRACE_ROOT"} \
      ${BEST:+--best "$BEST"} ;;
    attn-check) $limit python3 benchmarks/attn_gpu_check.py --shapes "${SHAPES:-all}" ${COMPILE:+--compile} \
      ${TRACE_ROOT:+--trace-root "$TRACE_ROOT"} --sweep-shapes "${SWEEP_SHAPES:-smoke}" \
      ${ONLY:+--only "$ONLY"} --variants "${VARIANTS:-auto}" ${BEST:+--best "$BEST"} \
      ${BANK_GB:+--bank-memory-gb "$BANK_GB"} ;;
    # QUIET_GRAPHS=1: graph replays wait for starting spares (SandboxConfig.quiet_graphs)
    search) $limit python3 benchmarks/search_improvement.py --workload "${WORKLOAD:-dsa_topk}" --budget "${BUDGET:-150}" \
      --gpu-seconds "${GPU_SECONDS:-200}" $([ "${QUIET_GRAPHS:-0}" != 0 ] && echo --quiet-graphs) ;;
    family) $limit python3 benchmarks/topk_family_gpu.py --shapes "${SHAPES:-quick}" \
      --budget "${BUDGET:-420}" ${SAMPLE_SEED:+--sample-seed "$SAMPLE_SEED"} ${SKIP:+--skip "$SKIP"} ;;
    landscape)
      # SKIP: earlier landscapes (space-separated paths in the carried tree), not measured again
      local skip=(); for f in ${SKIP:-}; do skip+=(--skip "$f"); done
      $limit python3 benchmarks/landscape_gpu.py --workload "${WORKLOAD:?set WORKLOAD}" \
        --seeds "${SEEDS:?set SEEDS}" --shapes "${SHAPES:-quick}" --budget "${BUDGET:-280}" \
        ${TIMEOUT:+--timeout "$TIMEOUT"} ${SAMPLE_SEED:+--sample-seed "$SAMPLE_SEED"} ${GRID:+--grid "$GRID"} \
        ${BANK_GB:+--bank-memory-gb "$BANK_GB"} ${LANES:+--lanes "$LANES"} \
        ${MAX_POINTS:+--max-points "$MAX_POINTS"} $([ "${TRITON_STORE:-1}" = 0 ] && echo --no-triton-store) \
        $([ "${TRITON_WARM:-1}" = 0 ] && echo --no-triton-warm) \
        $([ "${QUIET_GRAPHS:-0}" != 0 ] && echo --quiet-graphs) ${skip[@]+"${skip[@]}"} ;;
    probe) $limit python3 benchmarks/probe_kernels.py --workload "${WORKLOAD:-dsa_topk}" --seed "${SEED:-cuda_family}" \
      --shapes "${SHAPES:-quick}" ${CHECK:+--check} ${PHASES:+--phases} ${L2:+--l2 "$L2"} \
      ${VARIANTS:+$(for v in $VARIANTS; do printf -- '--variant %s ' "$v"; done)} ;;
    launch) $limit python3 benchmarks/probe_launch.py --workload "${WORKLOAD:-dsa_topk}" --seed "${SEED:-cuda_family}" \
      --variant "${VARIANT:-}" --shape "${SHAPE:?set SHAPE}" ;;
    ncu)
      # Nsight Compute over the probe's calls (clocks left alone, METHOD.md); the report and
      # its details/source pages as CSV come back. NCU_KERNELS: a regex of kernel names.
      local rep="$OUT/ncu-${WORKLOAD:-dsa_topk}-${SEED:-cuda_family}"
      $limit ncu --clock-control none --set "${NCU_SET:-detailed}" --import-source yes \
        -k "regex:${NCU_KERNELS:-topk}" --launch-count "${NCU_COUNT:-40}" -f -o "$rep" \
        python3 benchmarks/probe_kernels.py --ncu --calls "${CALLS:-2}" --workload "${WORKLOAD:-dsa_topk}" \
        --seed "${SEED:-cuda_family}" --shapes "${SHAPES:-quick}" \
        ${VARIANTS:+$(for v in $VARIANTS; do printf -- '--variant %s ' "$v"; done)}
      ncu --import "$rep.ncu-rep" --page details --csv >"$rep-details.csv" 2>&1
      ncu --import "$rep.ncu-rep" --page raw --csv >"$rep-raw.csv" 2>&1
      # NVRTC compiled the source as kernel.cu (#line 1 after the parameters): ncu finds it here
      local cu="workloads/${WORKLOAD:-dsa_topk}/seeds/${SEED:-cuda_family}.cu"
      [ -f "$cu" ] && [ ! -e kernel.cu ] && cp "$cu" kernel.cu
      ncu --import "$rep.ncu-rep" --page source --csv --print-source cuda >"$rep-source.csv" 2>&1 || true
      ncu --import "$rep.ncu-rep" --page source --csv --print-source sass >"$rep-sass.csv" 2>&1 || true
      python3 benchmarks/ncu_summary.py "$rep-details.csv" ;;
    # WORKLOAD/SEED_NAME: another workload's seed (its knob grid) through the same judge
    throughput) $limit python3 benchmarks/evaluator_throughput.py --workload "${WORKLOAD:-dsa_topk}" --shapes quick \
      --seed-name "${SEED_NAME:-cuda_radix}" --deadline "${DEADLINE:-90}" --designs "${DESIGNS:-judge,legacy}" \
      $([ "${PROFILE:-0}" != 0 ] && echo --profile) ;;
    *) echo "unknown stage $1"; return 2 ;;
  esac
}

# On the device, $OUT is the folder that comes back (8 files at most): each stage writes
# into a scratch folder, with its printed output and nvidia-smi memory samples, packed
# into one $OUT/<stage>-<time>.tgz when it ends (unpack here with tar xzf into
# benchmarks/results/). Without $OUT, results go straight to benchmarks/results/.
RETURN="${OUT:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  if [ -n "$RETURN" ]; then
    export OUT; OUT="$(mktemp -d)"
    (while true; do echo "$(date +%T) $(nvidia-smi --query-compute-apps=pid,used_memory \
      --format=csv,noheader | tr '\n' ' ')" >>"$OUT/gpu-mem-$stage.log"; sleep 10; done) &
    sampler=$!
  else
    export OUT=benchmarks/results
  fi
  log=/dev/null; [ -n "$RETURN" ] && log="$OUT/$stage.log"
  run_stage "$stage" 2>&1 | tee "$log"
  if [ -n "$RETURN" ]; then
    kill "$sampler" 2>/dev/null
    tar czf "$RETURN/$stage-$(date +%H%M%S).tgz" -C "$OUT" . && rm -rf "$OUT"
  fi
done
echo "=== done $(date +%T)"
