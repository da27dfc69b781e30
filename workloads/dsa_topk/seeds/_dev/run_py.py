import torch
from gpu_test import *
import ref
tv = load("torch_vectorized"); ts = load("triton_score")
for B, P in [(31, 91), (1, 91), (7, 40), (31, 32), (3, 33)]:
    inp = make_inputs(B, P, 11923, seed=B * 100 + P, device="cuda")
    truth = true_scores(*inp[:5])
    runs = [("torch", tv.build({}, None))]
    for bt, f8, nw in itertools.product([32, 64, 128], [False, True], [4, 8]):
        runs.append((f"triton bt{bt} fp8{int(f8)} w{nw}",
                     ts.build(dict(BLOCK_TOKENS=bt, DOT_FP8=f8, num_warps=nw), None)))
    for name, run in runs:
        try:
            inp[5].fill_(-777); run(*inp); torch.cuda.synchronize()
            bad = ref.check_with_truth(inp[5], truth, tag=name)
            t = graph_time(run, inp, 50)
            print(f"B{B} P{P} {name}: bad {bad} {t:.1f} us", flush=True)
        except Exception as e:
            print(f"B{B} P{P} {name}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
