"""Where a graph-replayed call's time goes, for one candidate on one shape (GPU, trusted).

    python benchmarks/probe_graph_cost.py [--seed cuda_radix] [--shape 30cecff1-...]

The judge's per-call figure for cuda_radix on a no-scoring shape was ~7 us of graph
replay per call (the candidate's own claim) against CUPTI's 1.4 us span of one eager
call. This times, in one process with no judge: one eager call by CUPTI; graphs of N
calls by events around the replay and by the host around ``replay()``; and CUPTI's
kernel durations inside a replay; with a trivial torch op beside it for comparison.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from evokernel.evaluate.build import arch_for_capability, build_runner
from evokernel.workload import load_workload


def graph_of(fn, n: int):  # type: ignore[no-untyped-def]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    torch.cuda.synchronize()
    return graph


def time_graph(graph, reps: int = 20) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(median ms by events, median ms of the host's replay() call)."""
    graph.replay()
    torch.cuda.synchronize()
    events, host = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        graph.replay()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        torch.cuda.synchronize()
        events.append(start.elapsed_time(end))
    return statistics.median(events), statistics.median(host)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", default="cuda_radix")
    parser.add_argument("--shape", default="30cecff1-7ea4-474b-90fc-7f4a87206d8e")
    args = parser.parse_args()
    wl = load_workload("dsa_topk")
    seed = next(s for s in wl.seeds() if s.name == args.seed)
    device = torch.device("cuda")
    arch = arch_for_capability(*torch.cuda.get_device_capability())
    run, _ = build_runner(seed, Path(tempfile.mkdtemp()), arch=arch,
                          arguments=[*wl.input_names, *wl.output_names])
    inputs = wl.make_inputs(args.shape, 0, device)
    (out,) = wl.allocate_outputs(args.shape, device)

    def call() -> None:
        run(*inputs.values(), out)

    x = torch.randn(1 << 12, device=device)

    def tiny() -> None:
        x.mul_(1.0001)

    from evokernel.evaluate.timing import CuptiSpans, L2Flusher

    spans = CuptiSpans()
    flush = L2Flusher(device)
    metrics: dict[str, float | None] = {}
    if spans.available:
        eager = [s for s in spans.measure([call] * 20, flush) if s]
        metrics["graph_cost.eager_cupti_us"] = statistics.median(eager) * 1e3
        print(f"eager call, CUPTI span: median {statistics.median(eager) * 1e3:.2f} us")
    for name, fn in (("candidate", call), ("x.mul_", tiny)):
        for n in (1, 16, 64, 256):
            graph = graph_of(fn, n)
            events_ms, host_ms = time_graph(graph)
            key = f"graph_cost.{name.replace('.', '_')}.graph_{n}"
            metrics[f"{key}.events_us_per_call"] = events_ms / n * 1e3
            metrics[f"{key}.replay_host_us"] = host_ms * 1e3
            print(f"{name:10s} graph of {n:4d}: {events_ms / n * 1e3:8.2f} us/call by events, "
                  f"replay() host {host_ms * 1e3:8.1f} us ({host_ms / n * 1e3:.2f} us/call)", flush=True)
            if spans.available and n == 64:
                got = spans.measure([graph.replay], lambda: None)
                print(f"{'':10s} CUPTI span of the whole replay: {got[0] and got[0] * 1e3:.1f} us", flush=True)
                metrics[f"{key}.cupti_span_us"] = got[0] * 1e3 if got[0] else None
    from benchmarks.record import write_result
    from evokernel.evaluate.environment import fingerprint

    print(f"wrote {write_result('graph-cost', metrics, fingerprint(device))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
