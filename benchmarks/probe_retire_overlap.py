"""The round trip a candidate's timed batches subtract, measured while the last process
is still being retired (the order before red team 5) and once it is over (the order now),
side by side, after an honest candidate and after one that leaves its device busy.

    python benchmarks/probe_retire_overlap.py [--rounds 3]

Per round and per predecessor (``torch_loop.py``, then ``leaves_device_busy.py`` with the
static screen off): evaluate it; at once take the next process and calibrate it while
the predecessor is killed and its chunks scrubbed in the background (``during``); wait
for that to end and calibrate again (``after``). Then the honest candidate is judged
right after the attacker as a search would (the suite's ``then``), and its fitness is
compared with its fitness alone. Records ``retire_overlap.<device>.*``: medians of both
round trips per predecessor (us) and the follower's fitness over the honest one alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.record import write_result
from evokernel.evaluate.sandbox import SandboxEvaluator, detect_device
from evokernel.workload import load_workload
from tests.evaluate.redteam import HONEST, config_for, evaluate, planted_secrets, screen

ATTACKER = "leaves_device_busy.py"


def _trips(ev: SandboxEvaluator) -> tuple[float, float, bool]:
    """(round trip measured during the retire, measured after it, in seconds; whether
    the retire was still running when the first calibration began)."""
    handle = ev._fresh_process(0)
    try:
        overlapped = any(lane.retiring() for lane in ev._lanes)
        handle.calibrate(ev.judge.before_batch)
        during = handle.rtt_s or 0.0
        ev.wait_retired()
        handle.calibrate(ev.judge.before_batch)
        return during, handle.rtt_s or 0.0, overlapped
    finally:
        ev._retire(handle)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = detect_device()
    workload = load_workload("dsa_topk")
    shapes = workload.subsets["smoke"][:2]
    found: dict[str, dict[str, list[float]]] = {}
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="retire-overlap-"))
    with planted_secrets(), SandboxEvaluator(workload.name, work_dir=work,
                                             config=config_for(device)) as ev:
        alone = [evaluate(ev, HONEST, shapes).fitness or 0.0 for _ in range(2)]
        for round_ in range(args.rounds):
            for name in (HONEST, ATTACKER):
                with screen(ev, "off"):
                    status = evaluate(ev, name, shapes).status.value
                during, after, overlapped = _trips(ev)
                entry = found.setdefault(name, {"during": [], "after": []})
                entry["during"].append(during * 1e6)
                entry["after"].append(after * 1e6)
                rows.append({"round": round_, "predecessor": name, "status": status,
                             "overlapped": overlapped, "during_us": round(during * 1e6, 1), "after_us": round(after * 1e6, 1)})
                print(f"{round_} after {name:24s} {status:8s} round trip during the retire "
                      f"{during * 1e6:9.1f} us, after it {after * 1e6:8.1f} us"
                      f"{'' if overlapped else ' (the retire was over: no overlap)'}", flush=True)
            with screen(ev, "off"):
                evaluate(ev, ATTACKER, shapes)
            follower = evaluate(ev, HONEST, shapes)  # at once, as in a search
            ratio = (follower.fitness or 0.0) / statistics.median(alone) if alone[0] else 0.0
            rows.append({"round": round_, "follower_status": follower.status.value,
                         "follower_over_alone": round(ratio, 3)})
            print(f"{round_} honest right after the attacker: {follower.status.value}, "
                  f"fitness {ratio:.2f}x its own alone", flush=True)
        environment = ev.environment()
    slug = device if device == "cpu" else "gpu"
    metrics: dict[str, Any] = {}
    for name, entry in found.items():
        key = Path(name).stem
        metrics[f"retire_overlap.{slug}.{key}.during_us"] = round(statistics.median(entry["during"]), 1)
        metrics[f"retire_overlap.{slug}.{key}.after_us"] = round(statistics.median(entry["after"]), 1)
    ratios = [r["follower_over_alone"] for r in rows if "follower_over_alone" in r]
    metrics[f"retire_overlap.{slug}.follower_over_alone"] = ratios
    print(metrics)
    print(f"wrote {write_result('retire_overlap', metrics, environment, rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
