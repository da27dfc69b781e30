"""Why a CUDA seed's launch is refused: its kernels' attributes, then launches to compare.

    python benchmarks/probe_launch.py --seed cuda_family --variant MS_SCORE=wgmma \\
        --shape d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d

For each kernel of the built variant it prints what the driver says about the
function (registers, static and largest dynamic shared memory, threads per block,
binary and PTX versions), then calls the seed's ``run`` once with launches blocking
and reports each launch (grid, block, shared memory asked) and the first error. A
diagnostic for the GPU machine, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")

import torch
import yaml

from evokernel.evaluate import build
from evokernel.workload import load_workload

ATTRIBUTES = ("NUM_REGS", "SHARED_SIZE_BYTES", "MAX_DYNAMIC_SHARED_SIZE_BYTES",
              "MAX_THREADS_PER_BLOCK", "BINARY_VERSION", "PTX_VERSION", "LOCAL_SIZE_BYTES")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="dsa_topk")
    parser.add_argument("--seed", default="cuda_family")
    parser.add_argument("--variant", default="", metavar="KNOB=VALUE[,...]")
    parser.add_argument("--shape", required=True)
    args = parser.parse_args()
    from cupy.cuda import driver

    workload = load_workload(args.workload)
    seed = {s.name: s for s in workload.seeds()}[args.seed]
    values = {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in args.variant.split(",") if p)}
    subject = seed.with_params(knobs={k: v for k, v in values.items() if k in seed.knob_space},
                               launch={k: v for k, v in values.items() if k in seed.launch_space},
                               operator="probe")
    arch = build.arch_for_capability(*torch.cuda.get_device_capability())
    print(f"arch {arch}; params {dict(subject.params)}", flush=True)

    launches: list[str] = []
    original = build.CudaKernels.__getitem__

    def traced(self: Any, name: str) -> Any:
        launch = original(self, name)
        fn = self._functions[name]
        for attr in ATTRIBUTES:
            try:
                got = driver.funcGetAttribute(getattr(driver, f"CU_FUNC_ATTRIBUTE_{attr}"), fn.ptr)
            except Exception as exc:
                got = f"error {exc}"
            print(f"  {name}.{attr} = {got}", flush=True)

        def wrapped(grid: Any, block: Any, *rest: Any, shared_mem: int = 0) -> None:
            launches.append(f"{name} grid {grid} block {block} shared_mem {shared_mem}")
            print(f"launch {launches[-1]}", flush=True)
            launch(grid, block, *rest, shared_mem=shared_mem)

        return wrapped

    build.CudaKernels.__getitem__ = traced  # type: ignore[method-assign]
    run, facts = build.build_runner(subject, Path(tempfile.mkdtemp()), arch=arch,
                                    arguments=[*workload.input_names, *workload.output_names])
    print(f"build facts {facts}", flush=True)
    device = torch.device("cuda")
    inputs = workload.make_inputs(args.shape, 0, device)
    outputs = workload.allocate_outputs(args.shape, device)
    try:
        run(*inputs.values(), *outputs)
        torch.cuda.synchronize()
        print("run: OK", flush=True)
        return 0
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
