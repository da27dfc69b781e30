"""The judge's deferred checks (``Answers``): kept outputs are checked together later."""

from __future__ import annotations

import pytest
import torch

from evokernel.evaluate.bank import GUARD, BankConfig, ShapeBank, Variant
from evokernel.evaluate.judge import Answers, Verdict
from evokernel.evaluate.result import Status
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
