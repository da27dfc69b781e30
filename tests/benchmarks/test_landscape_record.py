"""benchmarks/landscape_record.py: the budget, the measuring loop, the landscape file."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from benchmarks.landscape_points import Point, landscape_points
from benchmarks.landscape_record import (
    Budget,
    LandscapeFile,
    PointRun,
    evaluation_rows,
    free_path,
    latency_figures,
)
from evokernel.analysis.landscape import Landscape
from evokernel.candidate import Candidate
from evokernel.evaluate.replay import ReplayEvaluator
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.workload import load_workload

WORKLOAD = "dsa_sparse_attention"


def timing(us: float, cupti_us: float | None = None) -> Timing:
    ms = us / 1e3
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=10, method="cuda-graph",
                  cupti_ms=None if cupti_us is None else cupti_us / 1e3)


def passed(c: Candidate, shapes: Sequence[str], us: float, cupti_us: float | None = None) -> Evaluation:
    return Evaluation(candidate_id=c.id, status=Status.PASSED, device_s=0.5, shapes=tuple(
        ShapeResult(shape=s, status=Status.PASSED, timing=timing(us, cupti_us), reference=timing(100 * us))
        for s in shapes))


class Clock:
    """A clock the fake judge moves forward."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Limit:
    timeout_s: float


@dataclass
class FakeJudge:
    """Evaluation i takes ``seconds[i]`` (the last one from then on) on the clock, and
    comes back TIMEOUT at the limit when that is longer."""

    clock: Clock
    seconds: list[float]
    config: Limit = field(default_factory=lambda: Limit(60.0))
    limits: list[float] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)
    evaluated: list[str] = field(default_factory=list)

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        self.prepared += [c.id for c in candidates]

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        assert candidate.id in self.prepared  # handed to the compilers before its turn
        self.limits.append(self.config.timeout_s)
        self.evaluated.append(candidate.id)
        needed = self.seconds[min(len(self.evaluated), len(self.seconds)) - 1]
        if needed > self.config.timeout_s:
            self.clock.now += self.config.timeout_s
            return Evaluation(candidate_id=candidate.id, status=Status.TIMEOUT, feedback="hung")
        self.clock.now += needed
        return passed(candidate, shapes, 10.0)


@pytest.fixture(scope="module")
def seeds() -> list[Candidate]:
    by_name = {s.name: s for s in load_workload(WORKLOAD).seeds()}
    return [by_name["triton_split"], by_name["cuda_mma"]]


@pytest.fixture(scope="module")
def shapes() -> list[str]:
    return load_workload(WORKLOAD).resolve_shapes("smoke")


def test_the_budget_gives_the_full_timeout_then_what_is_left_while_it_is_worth_it() -> None:
    clock = Clock()
    budget = Budget(total_s=100, timeout_s=30, reserve_s=10, clock=clock)
    assert budget.limit_for_next() == 30
    clock.now += 60  # 30 s left before the reserve
    assert budget.limit_for_next() == 30
    clock.now += 5
    assert budget.limit_for_next() == pytest.approx(25)  # nothing measured yet: what is left
    budget.record(10.0)
    assert budget.limit_for_next() == pytest.approx(25)  # at least twice the median
    budget.record(20.0)
    budget.record(20.0)
    assert budget.limit_for_next() is None
    clock.now += 25
    assert Budget(total_s=100, timeout_s=30, clock=clock, started=clock.now).limit_for_next() == 30
    assert budget.limit_for_next() is None


def test_the_run_stops_inside_the_budget_and_reports_why(seeds: list[Candidate], shapes: list[str]) -> None:
    clock = Clock()
    judge = FakeJudge(clock, seconds=[7.0])
    budget = Budget(total_s=60, timeout_s=20, reserve_s=10, clock=clock)
    run = PointRun(judge, shapes, budget, lookahead=4)
    measured = list(run.measure(landscape_points(seeds, 0)))
    # full limit at 0, 7, ..., 28 s; at 35 s 15 s are left (>= 2 x 7): one more; at 42 s, none
    assert len(measured) == 6 and [m.index for m in measured] == list(range(6))
    assert judge.limits == [20, 20, 20, 20, 20, pytest.approx(15)]
    assert clock.now - 1000 <= 60 - 10
    assert run.stopped.startswith("budget of 60 s reached")
    assert [m.point.label for m in measured[:2]] == ["triton_split.default", "cuda_mma.default"]
    assert measured[-1].elapsed_s == pytest.approx(42)
    # lazy: the points list is endless, only the look-ahead beyond the last one was drawn
    assert len(judge.prepared) == len(set(judge.prepared)) <= 6 + 1 + 4


def test_an_evaluation_cut_short_by_the_budget_is_not_recorded(seeds: list[Candidate], shapes: list[str]) -> None:
    clock = Clock()
    judge = FakeJudge(clock, seconds=[12.0])
    run = PointRun(judge, shapes, Budget(total_s=25, timeout_s=30, reserve_s=10, clock=clock))
    measured = list(run.measure(landscape_points(seeds, 0)))
    # the first gets the 15 s left and needs 12; then 3 s are left, under 2 x 12
    assert len(measured) == 1 and judge.limits == [pytest.approx(15)]
    assert run.stopped == "budget of 25 s reached"

    judge = FakeJudge(clock := Clock(), seconds=[20.0])
    run = PointRun(judge, shapes, Budget(total_s=25, timeout_s=30, reserve_s=10, clock=clock))
    assert list(run.measure(landscape_points(seeds, 0))) == []  # 15 s given, 20 needed
    assert len(judge.evaluated) == 1
    assert run.stopped == ("budget of 25 s reached (triton_split.default was cut short at 15 s "
                           "and is not recorded)")
    assert clock.now - 1000 <= 25 - 10


def test_a_timeout_at_the_full_limit_is_a_row_and_a_cut_one_is_not(seeds: list[Candidate], shapes: list[str]) -> None:
    clock = Clock()
    judge = FakeJudge(clock, seconds=[5.0, 5.0, 25.0])  # the third and later hang past 20 s
    run = PointRun(judge, shapes, Budget(total_s=55, timeout_s=20, reserve_s=10, clock=clock))
    measured = list(run.measure(landscape_points(seeds, 0)))
    # 0 and 5 s: passed; 10 s: the full 20-s limit, TIMEOUT, recorded (failures are data);
    # 30 s: 15 s left (>= 2 x the median 5), TIMEOUT at 15 s: cut by the budget, not recorded
    assert [m.evaluation.status for m in measured] == [Status.PASSED, Status.PASSED, Status.TIMEOUT]
    assert judge.limits == [20, 20, 20, pytest.approx(15)]
    assert "cut short at 15 s" in run.stopped and clock.now - 1000 == pytest.approx(45)


def test_the_run_ends_when_the_points_do(seeds: list[Candidate], shapes: list[str]) -> None:
    clock = Clock()
    points = list(itertools.islice(landscape_points(seeds, 0), 5))
    run = PointRun(FakeJudge(clock, seconds=[1.0]), shapes, Budget(total_s=600, timeout_s=20, clock=clock))
    assert len(list(run.measure(points))) == 5 and run.stopped == "every listed point measured"


def _record(path: Path, points: Iterator[Point], shapes: list[str]) -> list[tuple[Candidate, Evaluation]]:
    out = []
    with LandscapeFile(path) as landscape:
        for i, point in enumerate(points):
            c = point.candidate
            if i % 3 == 0:
                evaluation = passed(c, shapes, 10.0 + i, cupti_us=8.0 + i)
            elif i % 3 == 1:
                evaluation = Evaluation(candidate_id=c.id, status=Status.INCORRECT, feedback="wrong", shapes=(
                    ShapeResult(shape=shapes[0], status=Status.INCORRECT, message="row 0 differs"),))
            else:
                evaluation = Evaluation(candidate_id=c.id, status=Status.BUILD_FAILED, feedback="nvcc said no")
            landscape.add(c, evaluation, shapes)
            out.append((c, evaluation))
            # flushed at once: a run killed now keeps every record so far
            assert len(ReplayEvaluator.from_file(path)) == i + 1
    return out


def test_the_landscape_is_what_replay_and_compare_read(seeds: list[Candidate], shapes: list[str],
                                                       tmp_path: Path) -> None:
    path = tmp_path / "landscape.jsonl"
    recorded = _record(path, itertools.islice(landscape_points(seeds, 4), 60), shapes)

    replay = ReplayEvaluator.from_file(path)
    for candidate, evaluation in recorded:
        assert replay.evaluate(candidate, shapes) == evaluation
    landscape = Landscape.load(path)
    assert landscape.shapes == tuple(shapes) and len(landscape) == 60
    best = max((e.fitness or 0.0, c.id) for c, e in recorded)
    assert landscape.best_fitness == pytest.approx(best[0])

    # the comparison's search space: each seed restricted to the values recorded; a
    # candidate proposed from it with recorded values gets the recorded evaluation
    restricted = {s.name: s for s in landscape.seeds(load_workload(WORKLOAD).seeds())}
    assert set(restricted) == {"triton_split", "cuda_mma"}
    mma_points = [(c, e) for c, e in recorded if c.name == "cuda_mma"]
    for name, param in restricted["cuda_mma"].space.items():
        assert set(param.choices) == {c.params[name] for c, _ in mma_points}
    candidate, evaluation = mma_points[-1]
    proposed = restricted["cuda_mma"].with_params(
        knobs={k: candidate.params[k] for k in candidate.knob_space},
        launch={k: candidate.params[k] for k in candidate.launch_space}, operator="mutate")
    assert proposed.id == candidate.id and replay.evaluate(proposed, shapes) == evaluation


def test_nothing_is_overwritten(tmp_path: Path) -> None:
    first = tmp_path / "landscape-x.jsonl"
    assert free_path(first) == first
    first.write_text("earlier\n")
    second = free_path(first)
    assert second.name == "landscape-x-2.jsonl"
    with LandscapeFile(second):
        pass
    assert free_path(first).name == "landscape-x-3.jsonl" and first.read_text() == "earlier\n"
    with pytest.raises(FileExistsError):
        LandscapeFile(first)


def test_rows_and_figures_of_an_evaluation(seeds: list[Candidate], shapes: list[str]) -> None:
    workload = load_workload(WORKLOAD)
    axes = {s: workload.shapes[s].axes for s in shapes}
    ok = passed(seeds[0], shapes, 20.0, cupti_us=10.0)
    rows = evaluation_rows({"label": "x"}, ok, axes, lambda s: {"tag": s[:4]})
    assert [r["shape"] for r in rows] == shapes and {r["status"] for r in rows} == {"PASSED"}
    assert rows[0]["latency_us"] == pytest.approx(20.0) and rows[0]["cupti_us"] == pytest.approx(10.0)
    assert rows[0]["speedup"] == pytest.approx(100.0) and rows[0]["tag"] == shapes[0][:4]
    assert rows[0]["num_tokens"] == axes[shapes[0]]["num_tokens"] and rows[0]["label"] == "x"
    figures = latency_figures(ok)
    assert figures["mean_latency_us"] == pytest.approx(20.0)
    assert figures["mean_latency_us_cupti"] == pytest.approx(10.0)
    assert figures["mean_speedup"] == pytest.approx(100.0)

    failed = Evaluation(candidate_id="y", status=Status.BUILD_FAILED, feedback="no")
    assert evaluation_rows({"label": "y"}, failed, axes) == [{"label": "y", "status": "BUILD_FAILED", "message": "no"}]
    partial_cupti = Evaluation(candidate_id="z", status=Status.PASSED, shapes=(
        ShapeResult(shape=shapes[0], status=Status.PASSED, timing=timing(5.0, 4.0)),
        ShapeResult(shape=shapes[1], status=Status.PASSED, timing=timing(7.0))))
    figures = latency_figures(partial_cupti)
    assert figures["mean_latency_us"] == pytest.approx(6.0) and figures["mean_latency_us_cupti"] is None
    assert figures["cupti_shapes"] == 1 and figures["mean_speedup"] is None  # no reference timed
