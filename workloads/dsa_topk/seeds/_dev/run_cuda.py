import sys, time, torch
from gpu_test import *
mode = sys.argv[1] if len(sys.argv) > 1 else "all"
src = open(os.path.join(SEEDS, "cuda_radix.cu")).read()
host = load("cuda_radix_host")
inputs = {}
for B, P in SHAPES:
    inp = make_inputs(B, P, 11923, seed=B * 100 + P, device="cuda")
    inputs[(B, P)] = (inp, true_scores(*inp[:5]))
print("inputs ready", flush=True)

def check_fast(out, truth):
    from ref import check as _c
    return None

configs = [dict()]
if mode == "all":
    configs += [dict(SCORE_IMPL="simt"), dict(VEC=8), dict(VEC=4), dict(PREFETCH=0), dict(RADIX_BITS=8),
                dict(HIST_AGG=0), dict(SCORE_THREADS=64), dict(SCORE_THREADS=256), dict(SELECT_THREADS=256),
                dict(SELECT_THREADS=1024), dict(PAGES_PER_BLOCK=1), dict(PAGES_PER_BLOCK=2), dict(PAGES_PER_BLOCK=4),
                dict(RADIX_BITS=8, HIST_AGG=0, SELECT_THREADS=1024)]
import ref
for cfg in configs:
    base = dict(PAGES_PER_BLOCK=0, SCORE_IMPL="mma", VEC=16, PREFETCH=1, RADIX_BITS=11, HIST_AGG=1,
                SCORE_THREADS=128, SELECT_THREADS=512, BLOCKS_PER_SM_TARGET=2)
    base.update(cfg)
    kern = Kernels(src, base)
    run = host.build(base, kern)
    bad = 0; times = []
    for (B, P), (inp, truth) in inputs.items():
        inp[5].fill_(-777)
        run(*inp); torch.cuda.synchronize()
        b = ref.check_with_truth(inp[5], truth, tag=f"{cfg} B{B}P{P}")
        bad += b
        times.append(graph_time(run, inp, 100))
    print(cfg, "bad", bad, "us", " ".join(f"{t:.1f}" for t in times), flush=True)
