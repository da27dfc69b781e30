"""Where making the judge's banks goes: per shape, each step of a bank timed, and a profile.

The judge makes one bank a shape (evaluate/bank.py: base inputs, an altered base, the
shared chunks, expected outputs for the first variants, every variant and its least
bytes) before it times the baseline. On the GPU that cost 215 s for the 23 shapes of
dsa_sparse_attention (attn-check, H100, 2026-12-07) against 2 s a shape on this
project's CPU machine; this says which step pays for it.

    python benchmarks/profile_bank.py --workload dsa_sparse_attention --shapes quick [--device cuda]

Writes ``bank-profile-<workload>-<device>-<date>.json`` (per shape and step, seconds)
and the profile's 40 costliest functions (cumulative) as ``.txt`` beside it, to $OUT or
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.evaluate.bank import BankConfig, ShapeBank
from evokernel.evaluate.environment import fingerprint
from evokernel.workload import Workload, load_workload


class _Steps:
    """Seconds per named step, the device synchronised at each boundary."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.spent: dict[str, float] = {}
        self._at = time.perf_counter()

    def mark(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.spent[name] = round(now - self._at, 4)
        self._at = now


def profile_shape(workload: Workload, shape: str, config: BankConfig, device: torch.device) -> dict[str, float]:
    """One shape's bank made step by step as ``BankStore._make_pair`` makes it."""
    steps = _Steps(device)
    bank = ShapeBank(workload, shape, config, device, workload.expected_outputs, 0)
    steps.mark("construct_s")
    bank.warm(16 if device.type == "cuda" else 2)
    steps.mark("warm_s")
    for index in range(bank.variant_count):
        bank.variant(index)
    steps.mark("variants_s")
    for index in range(bank.variant_count):
        bank.floor_bytes(bank.variant(index))
    steps.mark("floor_bytes_s")
    twin = bank.twin(2)
    steps.mark("twin_s")
    twin.close()
    bank.close()
    return {**steps.spent, "variant_count": float(bank.variant_count), "slot_count": float(bank.slot_count)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="dsa_sparse_attention")
    parser.add_argument("--shapes", default="quick", help="a shape set or comma-separated ids")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--slots", type=int, default=None, help="the sandbox's: 256 on a GPU, 64 on the CPU")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    workload = load_workload(args.workload)
    shapes = workload.resolve_shapes(args.shapes)
    config = BankConfig(seed=0, salt="profile", slots=args.slots or (256 if device.type == "cuda" else 64),
                        memory_bytes=2 << 30)
    profiler = cProfile.Profile()
    per_shape: dict[str, dict[str, float]] = {}
    profiler.enable()
    for shape in shapes:
        per_shape[shape] = profile_shape(workload, shape, config, device)
        print(shape[:8], per_shape[shape], flush=True)
    profiler.disable()
    totals: dict[str, float] = {}
    for spent in per_shape.values():
        for step, seconds in spent.items():
            if step.endswith("_s"):
                totals[step] = round(totals.get(step, 0.0) + seconds, 3)
    print("total over", len(shapes), "shapes:", totals)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    metrics = {f"{args.workload}.total.{step}": seconds for step, seconds in totals.items()}
    metrics[f"{args.workload}.shapes"] = len(shapes)
    rows = [{"shape": shape, **spent} for shape, spent in per_shape.items()]
    path = write_result(f"bank-profile-{args.workload}", metrics, fingerprint(device), rows)
    path.with_suffix(".txt").write_text(text.getvalue())
    print(f"wrote {path}")
    print(text.getvalue()[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
