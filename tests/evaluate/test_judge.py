"""The judge's deferred checks (``Answers``, ``Deferred``): kept outputs are checked together
later, a shape's at the end of the shape or, deferred, after the candidate's last shape."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from evokernel.evaluate.bank import GUARD, BankConfig, ShapeBank, Variant
from evokernel.evaluate.judge import Answers, Deferred, Judge, JudgeConfig, Verdict
from evokernel.evaluate.result import ShapeResult, Status, Timing
from evokernel.workload import load_workload

WL = load_workload("dsa_topk")
SHAPE = "d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d"


@pytest.fixture(scope="module")
def bank() -> ShapeBank:
    config = BankConfig(seed=4, salt="judge", bases=2, slots=4, variants=32)
    return ShapeBank(WL, SHAPE, config, torch.device("cpu"), WL.expected_outputs, chunk_id=9)


def _write_answers(bank: ShapeBank, first: int, wrong_slot: int | None) -> dict[int, Variant]:
    assignment = {s: bank.variant(first + 2 * s) for s in range(4)}  # one base
    bank.write(assignment)
    for slot, variant in assignment.items():
        source = bank.variant(first + 2 * ((slot + 1) % 4)) if slot == wrong_slot else variant
        answer = WL.reference(*bank.inputs_of(source).values())
        for row, value in zip(bank.output_rows, answer, strict=True):
            row[slot, GUARD : row.shape[1] - GUARD] = value.reshape(-1)
    return assignment


def test_kept_answers_outlive_the_next_write_and_pass(bank: ShapeBank) -> None:
    answers = Answers()
    for step, first in enumerate((0, 1)):
        assignment = _write_answers(bank, first, None)
        answers.keep(bank, bank.snapshot(), assignment, f"batch {step}", [0, 2, 3])
    bank.write({0: bank.variant(8)})  # the outputs are poisoned again: the copies are not
    stats = answers.settle(bank)
    assert isinstance(stats, dict)
    assert answers.settle(bank) == {}  # settled once: nothing left


def test_a_wrong_kept_answer_fails_the_shape_named_by_its_step(bank: ShapeBank) -> None:
    answers = Answers()
    assignment = _write_answers(bank, 0, None)
    answers.keep(bank, bank.snapshot(), assignment, "warm-up batch", [0, 1])
    assignment = _write_answers(bank, 1, wrong_slot=2)
    answers.keep(bank, bank.snapshot(), assignment, "timed batch 1", [1, 2])
    with pytest.raises(Verdict) as failed:
        answers.settle(bank)
    assert failed.value.status is Status.INCORRECT
    assert failed.value.message.startswith("timed batch 1: ")


OTHER = "30cecff1-7ea4-474b-90fc-7f4a87206d8e"


@pytest.fixture(scope="module")
def other() -> ShapeBank:
    config = BankConfig(seed=4, salt="judge", bases=2, slots=4, variants=32)
    return ShapeBank(WL, OTHER, config, torch.device("cpu"), WL.expected_outputs, chunk_id=19)


def _passed(shape: str) -> ShapeResult:
    return ShapeResult(shape=shape, status=Status.PASSED, baseline="own",
                       timing=Timing(median_ms=1.0, p25_ms=1.0, p75_ms=1.0, e2e_ms=1.0,
                                     samples=3, method="judge-cpu"))


def test_a_deferred_wrong_answer_fails_its_shape_and_drops_the_shapes_after(
        bank: ShapeBank, other: ShapeBank) -> None:
    """``Judge.settle``: answers left by ``judge_shape`` for after the last shape are
    checked shape by shape; a wrong one fails its shape as a check there would have
    (named by its step), and judging is as if it had stopped there."""
    judge = Judge(JudgeConfig(), torch.device("cpu"))
    later = Deferred()
    for shape_bank, wrong in ((other, None), (bank, 2)):
        kept = Answers()
        assignment = _write_answers(shape_bank, 0, None)
        kept.keep(shape_bank, shape_bank.snapshot(), assignment, "warm-up batch", [0, 1])
        assignment = _write_answers(shape_bank, 1, wrong_slot=wrong)
        kept.keep(shape_bank, shape_bank.snapshot(), assignment, "timed batch 1", [1, 2])
        later.add(shape_bank, kept)
    results = [_passed(OTHER), _passed(SHAPE), _passed("a-third-shape")]
    out = judge.settle(later, results)
    # as it was, with the error statistics its checks found (it had none)
    assert out[0].model_copy(update={"stats": {}}) == results[0]
    assert set(out[0].stats) == {"max_abs_error", "max_rel_error"}
    assert out[1].status is Status.INCORRECT and out[1].timing is None
    assert out[1].message.startswith("timed batch 1: ") and out[1].baseline == "own"
    assert len(out) == 2 and not later

    later.add(other, Answers())  # nothing kept, nothing wrong: results as they were
    assert judge.settle(later, results) == results


def test_right_deferred_answers_leave_the_results_as_they_were(bank: ShapeBank) -> None:
    judge = Judge(JudgeConfig(), torch.device("cpu"))
    later = Deferred()
    kept = Answers()
    assignment = _write_answers(bank, 2, None)
    kept.keep(bank, bank.snapshot(), assignment, "timed batch 0", [0, 1, 2, 3])
    later.add(bank, kept)
    assert later.nbytes() == 4 * bank.output_rows[0][0, GUARD:-GUARD].nbytes
    results = [_passed(SHAPE).model_copy(update={"stats": {"max_abs_error": 7.0}})]
    out = judge.settle(later, results)  # statistics it had are kept; the others added
    assert out[0].model_copy(update={"stats": {}}) == results[0].model_copy(update={"stats": {}})
    assert out[0].stats["max_abs_error"] == 7.0 and "max_rel_error" in out[0].stats


def test_a_wrong_checked_call_found_during_the_capture_ends_the_process(bank: ShapeBank) -> None:
    """On a GPU the checked calls are checked while the process captures its graph; a
    wrong one kills it there (a failure is final), not after its capture."""
    from types import SimpleNamespace

    killed: list[bool] = []
    asked: Any = SimpleNamespace(handle=SimpleNamespace(kill=lambda: killed.append(True)))
    trials = Answers()
    assignment = _write_answers(bank, 1, wrong_slot=0)
    trials.keep(bank, bank.snapshot(), assignment, "trial 0", [0])
    with pytest.raises(Verdict, match=r"^trial 0: "):
        Judge._settle_while(asked, trials, bank)
    assert killed == [True]
    assert Judge._settle_while(asked, Answers(), bank) == {} and killed == [True]


def test_a_graph_of_launch_bound_calls_is_captured_longer_than_the_eager_batch() -> None:
    """Eager calls of a fast kernel are mostly launches, which a replay drops: its graph
    gets GRAPH_HEADROOM times the calls (capped by the slots), so that it is not captured
    too short and then again; calls slow enough to be the kernel's get what they asked."""
    from evokernel.evaluate.judge import GRAPH_GAIN_BELOW_S, GRAPH_HEADROOM

    target = 0.002
    fast = int(target / (GRAPH_GAIN_BELOW_S / 2))  # 25 us a call: launch-bound
    assert Judge._graph_calls(fast, target, 4096) == fast * GRAPH_HEADROOM
    assert Judge._graph_calls(fast, target, 256) == 256
    slow = int(target / (GRAPH_GAIN_BELOW_S * 4))  # 200 us a call
    assert Judge._graph_calls(slow, target, 256) == slow
    assert Judge._graph_calls(1, target, 256) == 1  # one call outlasts the target
