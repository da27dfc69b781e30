"""What solving a batch's later calls ahead gains on this device (red team 4's open case).

    python benchmarks/probe_solves_ahead.py [--rounds 3]

Evaluates the honest vectorised candidate and ``solves_ahead.py`` alternately through the
suite's judge on the two smoke shapes; prints each fitness and writes the ratios
(``redteam.solves_ahead_over_honest``) with the rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.record import write_result
from evokernel.evaluate.options import detect_device
from evokernel.evaluate.sandbox import SandboxEvaluator
from evokernel.workload import load_workload
from tests.evaluate.redteam import config_for, evaluate, planted_secrets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = detect_device()
    shapes = load_workload("dsa_topk").subsets["smoke"][:2]
    ratios = []
    rows = []
    with planted_secrets(), SandboxEvaluator("dsa_topk", work_dir=Path(tempfile.mkdtemp()),
                                             config=config_for(device)) as ev:
        for round_ in range(args.rounds):
            honest = evaluate(ev, "honest_vectorised.py", shapes)
            ahead = evaluate(ev, "solves_ahead.py", shapes)
            print(f"round {round_}: honest {honest.status.value} {honest.fitness}; "
                  f"solves_ahead {ahead.status.value} {ahead.fitness}; {ahead.feedback[:200]}",
                  flush=True)
            rows.append({"round": round_, "honest": honest.status.value,
                         "honest_fitness": honest.fitness, "solves_ahead": ahead.status.value,
                         "solves_ahead_fitness": ahead.fitness, "feedback": ahead.feedback[:300]})
            if honest.fitness and ahead.fitness:
                ratios.append(ahead.fitness / honest.fitness)
        environment = ev.environment()
    metrics = {"redteam.solves_ahead_over_honest": statistics.median(ratios) if ratios else None,
               "redteam.solves_ahead_ratios": ratios}
    print(f"wrote {write_result('solves-ahead', metrics, environment, rows)}")
    if ratios:
        print(f"solves_ahead over honest on {device}: median {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{r:.2f}' for r in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
