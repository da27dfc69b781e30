"""``python -m evokernel.evaluate --workload dsa_topk --candidate PATH [--shapes quick]``.

Evaluates one candidate and prints a per-shape table and its fitness. Bad input
(an unknown workload or subset, a missing candidate, an entry point that does not
exist or a callable whose signature does not fit the definition) is a one-line
error and exit status 2; a bad kernel is a status in the table and exit status 1.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evokernel.candidate import Candidate, CandidateFileError, load_candidate
from evokernel.evaluate.baseline import BaselineError
from evokernel.evaluate.result import Evaluation, Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.workload import WorkloadError, load_workload


class UsageError(Exception):
    """Bad input: reported in one line with exit status 2."""


def entry_point_problem(candidate: Candidate) -> str | None:
    """Why the entry point cannot exist, judged from the source without running it."""
    file, _, symbol = candidate.entry_point.partition("::")
    try:
        tree = ast.parse(candidate.sources[file])
    except SyntaxError:
        return None  # a broken kernel, not bad input: the evaluation reports it
    names = {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    names |= {
        t.id for node in tree.body if isinstance(node, ast.Assign)
        for t in node.targets if isinstance(t, ast.Name)
    }
    if symbol not in names:
        return f"{file} defines no top-level {symbol!r} (the entry point {candidate.entry_point})"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m evokernel.evaluate", description=__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--shapes", default="quick", help="a subset name or comma-separated ids")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per candidate")
    parser.add_argument("--batches", type=int, default=3, help="timed batches per shape")
    parser.add_argument("--baseline", default="auto", choices=["auto", "published", "own"],
                        help="the reference speedups are over (published: from $EVOKERNEL_TRACE_ROOT)")
    parser.add_argument("--trace-root", default=None,
                        help="a FlashInfer-Trace folder holding the published definitions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the Evaluation here")
    return parser.parse_args(argv)


def print_table(console: Console, evaluation: Evaluation) -> None:
    table = Table(title=f"candidate {evaluation.candidate_id}")
    columns = ("shape", "status", "latency us", "range us", "CUPTI us", "e2e us", "reference ms",
               "speedup", "CUPTI speedup")
    for column in columns:
        table.add_column(column, justify="right" if column != "status" else "left", no_wrap=True)
    for s in evaluation.shapes:
        t, r = s.timing, s.reference
        table.add_row(
            s.shape[:8],
            s.status.value,
            f"{t.median_ms * 1e3:.2f}" if t else "",
            f"{t.p25_ms * 1e3:.1f}-{t.p75_ms * 1e3:.1f}" if t else "",
            f"{t.cupti_ms * 1e3:.2f}" if t and t.cupti_ms else "",
            f"{t.e2e_ms * 1e3:.1f}" if t else "",
            f"{r.median_ms:.3f}" if r else "",
            f"{s.speedup:.1f}x" if s.speedup else "",
            f"{s.speedup_cupti:.1f}x" if s.speedup_cupti else "",
        )
    console.print(table)
    if evaluation.shapes:
        timed = next((s.timing for s in evaluation.shapes if s.timing), None)
        baseline = evaluation.environment.get("baseline", "")
        method = timed.method if timed else ""
        console.print(f"latency: the judge's clock ({method}); CUPTI: FlashInfer-Bench's kernel "
                      f"span; reference: {baseline}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    terminal = Console()
    # a log or a pipe has no width to fit: keep every column whole there
    console = Console(stderr=False, width=max(terminal.width, 100) if terminal.is_terminal else 160)
    err = Console(stderr=True)
    try:
        workload = load_workload(args.workload)
        shapes = workload.resolve_shapes(args.shapes)
        candidate = load_candidate(args.candidate, workload.name)
        problem = entry_point_problem(candidate)
        if problem:
            raise UsageError(problem)
    except (WorkloadError, CandidateFileError, UsageError) as exc:
        err.print(f"error: {exc}", highlight=False, soft_wrap=True)
        return 2

    config = SandboxConfig(device=args.device, timeout_s=args.timeout, seed=args.seed,
                           batches=args.batches, baseline=args.baseline, trace_root=args.trace_root)
    try:
        evaluator = SandboxEvaluator(workload.name, work_dir=args.work_dir, config=config)
    except BaselineError as exc:
        err.print(f"error: {exc}", highlight=False, soft_wrap=True)
        return 2
    with evaluator:
        device = evaluator.config.device
        if device == "cpu":
            err.print(
                "note: no GPU here; torch candidates run on the CPU (times rank candidates, they "
                "do not report GPU speed), triton and cuda candidates are built where possible "
                "and reported SKIPPED.", highlight=False,
            )
        evaluation = evaluator.evaluate(candidate, shapes)

    if evaluation.status is Status.BUILD_FAILED and evaluation.feedback.startswith("signature:"):
        err.print(f"error: {evaluation.feedback}", highlight=False, soft_wrap=True)
        return 2
    print_table(console, evaluation)
    console.print(f"status: {evaluation.status.value}", highlight=False)
    if evaluation.fitness is not None:
        console.print(
            f"fitness (geometric-mean speedup): {evaluation.fitness:.2f}x   "
            f"mean speedup: {evaluation.mean_speedup:.2f}x", highlight=False,
        )
    if evaluation.status is not Status.PASSED:
        console.print(f"feedback: {evaluation.feedback}", highlight=False, soft_wrap=True)
    if args.json:
        args.json.write_text(json.dumps(evaluation.model_dump(mode="json"), indent=1))
    return 0 if evaluation.status in (Status.PASSED, Status.SKIPPED) else 1


if __name__ == "__main__":
    sys.exit(main())
