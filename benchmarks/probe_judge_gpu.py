"""Probe, on the GPU machine, the primitives the judge's trust boundary rests on.

    python benchmarks/probe_judge_gpu.py      # prints, and records probe-judge-<device>-<date>.json

Self-contained (no evokernel imports), so it answers before the judge exists:
- which way to share device memory with an isolated child process works: legacy CUDA IPC
  (cudaIpcGetMemHandle through CuPy) or the virtual-memory API with a POSIX file
  descriptor passed over a Unix socket (cuMemExportToShareableHandle through cuda.bindings);
- whether it still works when the child runs in its own PID, mount and network
  namespaces, as an unprivileged user, with a private /dev/shm;
- whether cupti-python records kernel spans;
- what one round trip judge -> child -> judge costs, and how a batch of small kernels
  replayed by the child and timed by the parent's clock compares with CUPTI's span.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHILD = r'''
import json, os, socket, sys, time, ctypes
sock = socket.socket(fileno=int(sys.argv[1]))
mode = sys.argv[2]
if mode == "isolated":
    libc = ctypes.CDLL(None, use_errno=True)
    for target in (b"/dev/shm", b"/tmp"):
        if libc.mount(b"tmpfs", target, b"tmpfs", 0, b"mode=1777") != 0:
            print("mount failed", target, ctypes.get_errno(), flush=True)
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
report = {"uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid()}
try:
    report["proc_entries"] = len([p for p in os.listdir("/proc") if p.isdigit()])
except OSError as exc:
    report["proc_entries"] = str(exc)
import torch
torch.zeros(1, device="cuda")
msg, fds, _, _ = socket.recv_fds(sock, 4096, 4)
spec = json.loads(msg)
def wrap(ptr, nbytes):
    class A: pass
    a = A(); a.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}
    return torch.as_tensor(a, device="cuda")
for backend in ("legacy", "vmm"):
    t0 = time.perf_counter()
    try:
        if backend == "legacy":
            import cupy
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(spec["legacy"]), 1)
        else:
            from cuda.bindings import driver as d
            fd = fds[0]
            err, h = d.cuMemImportFromShareableHandle(fd, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            assert err == 0, err
            err, ptr = d.cuMemAddressReserve(spec["size"], 0, 0, 0); assert err == 0, err
            err, = d.cuMemMap(ptr, spec["size"], 0, h, 0); assert err == 0, err
            acc = d.CUmemAccessDesc(); acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            acc.location.id = 0; acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            err, = d.cuMemSetAccess(ptr, spec["size"], [acc], 1); assert err == 0, err
            ptr = int(ptr)
        t = wrap(int(ptr), spec["size"])
        seen = int(t[: 1 << 20].to(torch.int64).sum())
        t[1 << 20 : 2 << 20].fill_(7)
        torch.cuda.synchronize()
        report[backend] = {"ok": seen == spec["expect"], "seen": seen, "open_ms": (time.perf_counter() - t0) * 1e3}
    except Exception as exc:
        report[backend] = {"ok": False, "error": repr(exc)[:300]}
# round trips and a batch timed by the parent
x = torch.randn(1 << 16, device="cuda")
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    for _ in range(3): x.mul_(1.0001)
torch.cuda.synchronize()
with torch.cuda.graph(g):
    for _ in range(200): x.mul_(1.0001)
sock.sendall(json.dumps(report).encode())
while True:
    cmd = sock.recv(64)
    if not cmd or cmd == b"quit": break
    if cmd == b"ping":
        sock.sendall(b"pong")
    elif cmd == b"batch":
        g.replay(); torch.cuda.synchronize(); sock.sendall(b"done")
'''


def cupti_probe() -> dict[str, object]:
    import torch
    try:
        from cupti import cupti
    except Exception as exc:
        return {"ok": False, "error": repr(exc)}
    kernels: list[tuple[int, int]] = []

    def requested() -> tuple[int, int]:
        return 8 << 20, 0

    def completed(activities: list[object]) -> None:
        for a in activities:
            if a.kind == cupti.ActivityKind.CONCURRENT_KERNEL:  # type: ignore[attr-defined]
                kernels.append((a.start, a.end))  # type: ignore[attr-defined]

    x = torch.randn(1 << 16, device="cuda")
    try:
        cupti.activity_register_callbacks(requested, completed)
        cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
        for _ in range(200):
            x.mul_(1.0001)
        torch.cuda.synchronize()
        cupti.activity_flush_all(1)
        cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
    except Exception as exc:
        return {"ok": False, "error": repr(exc)}
    spans = sorted((e - s) / 1e3 for s, e in kernels)
    total = (kernels[-1][1] - kernels[0][0]) / 1e3 if kernels else 0.0
    return {"ok": bool(kernels), "kernels": len(kernels),
            "median_kernel_us": spans[len(spans) // 2] if spans else None,
            "first_to_last_us": total}


def run_child(mode: str, legacy_handle: str, fd: int, size: int, expect: int) -> dict[str, object]:
    parent, child = socket.socketpair()
    prefix: list[str] = []
    if mode == "isolated":
        prefix = ["unshare", "--pid", "--fork", "--mount", "--net", "--mount-proc", "--kill-child"]
    script = Path("/tmp/probe_child.py")
    script.write_text(CHILD)
    proc = subprocess.Popen([*prefix, sys.executable, str(script), str(child.fileno()), mode],
                            pass_fds=[child.fileno()])
    child.close()
    socket.send_fds(parent, [json.dumps({"legacy": legacy_handle, "size": size,
                                         "expect": expect}).encode()], [fd])
    parent.settimeout(120)
    try:
        report = json.loads(parent.recv(65536))
    except Exception as exc:
        proc.kill()
        return {"error": repr(exc)}
    rtts = []
    for _ in range(50):
        t0 = time.perf_counter()
        parent.sendall(b"ping")
        parent.recv(16)
        rtts.append((time.perf_counter() - t0) * 1e6)
    batches = []
    for _ in range(10):
        t0 = time.perf_counter()
        parent.sendall(b"batch")
        parent.recv(16)
        batches.append((time.perf_counter() - t0) * 1e6)
    parent.sendall(b"quit")
    proc.wait(timeout=60)
    rtts.sort()
    batches.sort()
    report["rtt_us_min_median"] = [rtts[0], rtts[len(rtts) // 2]]
    report["batch200_us_min_median"] = [batches[0], batches[len(batches) // 2]]
    return report


def main() -> None:
    import cupy
    import torch
    from cuda.bindings import driver as d

    result: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "unshare": shutil.which("unshare"), "uid": os.getuid(),
        "dev_nvidia": {p: oct(os.stat(f"/dev/{p}").st_mode & 0o777)
                       for p in os.listdir("/dev") if p.startswith("nvidia")},
    }
    torch.zeros(1, device="cuda")
    size = 64 << 20
    # legacy IPC: a cudaMalloc'd buffer
    ptr = cupy.cuda.runtime.malloc(size)
    handle = cupy.cuda.runtime.ipcGetMemHandle(ptr)
    # VMM with a POSIX fd
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    _, gran = d.cuMemGetAllocationGranularity(
        prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    _, h = d.cuMemCreate(size, prop, 0)
    _, fd = d.cuMemExportToShareableHandle(
        h, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
    _, vptr = d.cuMemAddressReserve(size, 0, 0, 0)
    d.cuMemMap(vptr, size, 0, h, 0)
    acc = d.CUmemAccessDesc()
    acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    acc.location.id = 0
    acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    d.cuMemSetAccess(vptr, size, [acc], 1)
    result["vmm_granularity"] = int(gran)

    class Arr:
        def __init__(self, p: int) -> None:
            self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                             "data": (p, False), "version": 3}

    legacy = torch.as_tensor(Arr(int(ptr)), device="cuda")
    vmm = torch.as_tensor(Arr(int(vptr)), device="cuda")
    legacy.fill_(3)
    vmm.fill_(3)
    torch.cuda.synchronize()
    expect = 3 << 20
    for mode in ("plain", "isolated"):
        result[mode] = run_child(mode, bytes(handle).hex(), int(fd), size, expect)
        result[mode + "_wrote_back"] = {
            "legacy": int(legacy[1 << 20 : 2 << 20].to(torch.int64).sum()) == 7 << 20,
            "vmm": int(vmm[1 << 20 : 2 << 20].to(torch.int64).sum()) == 7 << 20,
        }
        legacy.fill_(3)
        vmm.fill_(3)
        torch.cuda.synchronize()
    result["cupti"] = cupti_probe()
    print(json.dumps(result, indent=1))
    from benchmarks.record import write_result

    env = {"device": str(result["gpu"]), "torch": str(result["torch"])}
    print(f"wrote {write_result('probe-judge', {'probe': result}, env)}")


if __name__ == "__main__":
    main()
