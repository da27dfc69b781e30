"""How often the judge's figure for a shape is inflated beside its CUPTI span, by the
shape's position in its evaluation.

    python benchmarks/timing_inflation.py benchmarks/results/raw/landscape-dsa_topk-cuda_radix-judge-issue10-h200-2026-12-06.jsonl.xz

A timed shape counts as inflated where the judge's figure is over ``INFLATED`` times its
CUPTI span, or where no CUPTI figure was believed (the judge disbelieves one under half
its own). Position 0 is the first shape a candidate's process judged, when the replacement
of that process starts beside it (``SandboxConfig.quiet_graphs``). Prints a line per
position and the shares ``evaluator_throughput.py`` records per design.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evokernel.evaluate.replay import LandscapeError, read_landscape
from evokernel.evaluate.result import Evaluation

INFLATED = 2.0
"""A judge figure over this many times the CUPTI span counts as inflated (the launch
gaps a replay holds put an honest ratio at 1.1-1.2 on the H200)."""


def inflated_by_position(evaluations: Iterable[Evaluation]) -> list[tuple[int, int]]:
    """(inflated, timed) shapes at each position of an evaluation's timed shapes."""
    counts: list[list[int]] = []
    for evaluation in evaluations:
        timed = [s.timing for s in evaluation.shapes if s.timing is not None]
        for index, timing in enumerate(timed):
            if index == len(counts):
                counts.append([0, 0])
            cupti = timing.cupti_ms
            counts[index][0] += cupti is None or timing.median_ms > INFLATED * cupti
            counts[index][1] += 1
    return [(bad, total) for bad, total in counts]


def inflated_shares(evaluations: Iterable[Evaluation]) -> dict[str, float | None]:
    """Shares of inflated timed shapes: all, each evaluation's first, and the rest."""
    counts = inflated_by_position(evaluations)

    def share(part: list[tuple[int, int]]) -> float | None:
        total = sum(t for _, t in part)
        return sum(b for b, _ in part) / total if total else None

    return {"inflated_share": share(counts), "inflated_share_first": share(counts[:1]),
            "inflated_share_later": share(counts[1:])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscapes", nargs="+", type=Path, help="landscape files (.jsonl, .jsonl.xz, .jsonl.gz)")
    args = parser.parse_args(argv)
    for path in args.landscapes:
        try:
            evaluations = [evaluation for _, evaluation, _ in read_landscape(path)]
        except LandscapeError as exc:
            print(f"timing_inflation: {exc}", file=sys.stderr)
            return 2
        print(f"{path.name}: {len(evaluations)} evaluations")
        for position, (bad, total) in enumerate(inflated_by_position(evaluations)):
            print(f"  shape {position}: {bad} of {total} inflated ({bad / total:.0%})")
        print("  " + ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -"
                               for k, v in inflated_shares(evaluations).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
