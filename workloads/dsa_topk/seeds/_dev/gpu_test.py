import importlib.util, itertools, os, re, sys, time
import numpy as np, torch, cupy
from cupy.cuda import nvrtc
HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from ref import make_inputs, check, true_scores

def defines(p):
    out = []
    for k, v in sorted(p.items()):
        if isinstance(v, bool): out.append(f"#define {k} {int(v)}")
        elif isinstance(v, int): out.append(f"#define {k} {v}")
        else: out.append(f"#define {k}_{str(v).upper()} 1")
    return out

class Kernels:
    def __init__(self, src, params):
        full = "\n".join([*defines(params), "#line 1", src])
        prog = nvrtc.createProgram(full, "k.cu", [], [])
        try:
            nvrtc.compileProgram(prog, ["-arch=sm_90a", "-std=c++17", "-default-device", "-lineinfo"])
        except nvrtc.NVRTCError:
            print(nvrtc.getProgramLog(prog)); raise
        cubin = bytes(nvrtc.getCUBIN(prog))
        self.mod = cupy.cuda.function.Module(); self.mod.load(cubin); self.f = {}
    def __getitem__(self, name):
        fn = self.f.setdefault(name, self.mod.get_function(name))
        def launch(grid, block, *args, shared_mem=0):
            conv = []
            for a in args:
                if isinstance(a, torch.Tensor): conv.append(np.uint64(a.data_ptr()))
                elif isinstance(a, int): conv.append(np.int32(a))
                elif isinstance(a, float): conv.append(np.float32(a))
                else: conv.append(a)
            st = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
            if shared_mem > 48 * 1024: fn.max_dynamic_shared_size_bytes = shared_mem
            fn(tuple(grid), tuple(block), tuple(conv), shared_mem=shared_mem, stream=st)
        return launch

def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SEEDS, name + ".py"))
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

def graph_time(run, inp, iters=200):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): run(*inp)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(*inp)
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(iters): g.replay()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters * 1000  # us

SHAPES = [(1, 91), (31, 91), (7, 40), (16, 33), (5, 36), (31, 45), (3, 20), (31, 32), (1, 1), (12, 85), (2, 37)]
