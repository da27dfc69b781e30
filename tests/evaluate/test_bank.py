"""The judge's inputs for a shape: variants, bases switched in place, slots, screens."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from evokernel.evaluate.bank import GUARD, BankConfig, ShapeBank, derived_seed, uncovered
from evokernel.evaluate.check import Verdict as CheckVerdict
from evokernel.evaluate.check import check_outputs
from evokernel.evaluate.shared import Layout
from evokernel.evaluate.timing import poison_value
from evokernel.workload import Workload, load_workload

WL = load_workload("dsa_topk")
SHAPE = "d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d"  # 4 rows, 34 pages: scoring needed


@pytest.fixture(scope="module")
def bank() -> ShapeBank:
    config = BankConfig(seed=1, salt="test", bases=2, slots=6, variants=32)
    return ShapeBank(WL, SHAPE, config, torch.device("cpu"), WL.reference, chunk_id=3)


def test_inputs_split_into_fixed_and_varying(bank: ShapeBank) -> None:
    assert bank.fixed == ["k_index_cache_fp8"]
    assert set(bank.varying) == {"q_index_fp8", "weights", "seq_lens", "block_table"}
    assert {spec.chunk for specs in bank.slot_specs for spec in specs} == {3, 4}
    assert {i: writable for i, (_, writable) in bank.chunks.items()} == {3: False, 4: True}


def test_bases_differ_in_an_eighth_of_the_pages(bank: ShapeBank) -> None:
    first, second = (b["k_index_cache_fp8"].view(11923, -1) for b in bank.bases)
    changed = (first != second).any(dim=1).sum().item()
    assert 0 < changed <= 11923 // 8


def test_switching_bases_writes_in_place(bank: ShapeBank) -> None:
    view = bank.fixed_views["k_index_cache_fp8"]
    address = view.data_ptr()
    bank.use_base(1)
    assert view.data_ptr() == address and torch.equal(view, bank.bases[1]["k_index_cache_fp8"])
    bank.use_base(0)
    assert torch.equal(view, bank.bases[0]["k_index_cache_fp8"])


def test_variants_change_the_answer_and_are_drawn_fresh(bank: ShapeBank) -> None:
    a, b = bank.variant(0), bank.variant(2)  # both of base 0
    assert not torch.equal(a.values["q_index_fp8"].view(torch.uint8),
                           b.values["q_index_fp8"].view(torch.uint8))
    assert not torch.equal(bank.expected(a)[0], bank.expected(b)[0])
    order = bank.draw(random.Random(5))
    assert sorted(order) == list(range(bank.variant_count))


def test_slots_get_their_variant_and_poisoned_outputs(bank: ShapeBank) -> None:
    assignment = {s: bank.variant(2 * s) for s in range(3)}
    bank.write(assignment)
    assert bank.active_base == 0
    for s, v in assignment.items():
        assert torch.equal(bank.varying_views["weights"][s], v.values["weights"])
    snapshot = bank.snapshot()
    assert bank.screen(snapshot, [0, 1, 2]) == {s: "some outputs were never written" for s in range(3)}


def test_screen_finds_guard_writes_and_duplicates(bank: ShapeBank) -> None:
    assignment = {s: bank.variant(2 * s) for s in range(3)}
    bank.write(assignment)
    for s, v in assignment.items():
        out = bank.output_rows[0][s, GUARD : GUARD + 4 * 2048].view(4, 2048)
        out.copy_(bank.expected(v)[0])
    snapshot = bank.snapshot()
    assert bank.screen(snapshot, [0, 1, 2]) == {}
    assert bank.duplicates(snapshot, [0, 1, 2]) == []
    verdict = check_outputs(WL, bank.outputs_of(snapshot, 1), bank.expected(assignment[1]),
                            bank.inputs_of(assignment[1]))
    assert verdict.ok, verdict.message
    bank.output_rows[0][2, GUARD:].copy_(bank.output_rows[0][1, GUARD:])  # slot 2 copies slot 1
    bank.output_rows[0][0, GUARD - 1] = 7  # slot 0 writes before its output
    snapshot = bank.snapshot()
    assert bank.duplicates(snapshot, [0, 1, 2]) == [[1, 2]]
    assert "outside its output buffer" in bank.screen(snapshot, [0, 1, 2])[0]


def test_inputs_are_read_only_to_another_process(bank: ShapeBank) -> None:
    """The candidate's mapping of the input chunk cannot write (sealed on the CPU)."""
    import mmap
    import os

    fd = os.dup(bank.input_chunk.fd)
    with pytest.raises(PermissionError):
        mmap.mmap(fd, bank.input_chunk.size)  # a writable shared mapping is refused
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 1)  # and so is a resize
    os.close(fd)


def test_scrub_leaves_nothing_for_the_next_process(bank: ShapeBank) -> None:
    bank.write({0: bank.variant(0)})
    bank.output_rows[0][0, GUARD : GUARD + 10] = 5
    bank.scrub()
    assert not bank.varying_views["weights"].any()
    assert bank.screen(bank.snapshot(), [0]) == {0: "some outputs were never written"}


def test_padding_between_fixed_inputs_is_found_and_scrubbed(bank: ShapeBank) -> None:
    """fused_moe's fixed inputs include two 4-byte scalars: 252 bytes of padding between
    them that a GPU candidate can write and nothing compares; the scrub zeroes them."""
    layout = Layout(0)
    specs = [layout.add((4,), torch.float32), layout.add((1,), torch.int32),
             layout.add((1,), torch.float32)]
    assert uncovered(specs, layout.size) == [(16, 256), (260, 512)]
    assert uncovered(specs[:1], 16) == []
    assert bank.fixed_gaps == []  # dsa_topk: one fixed input, nothing between
    saved = bank.fixed_gaps
    bank.fixed_gaps = [(3, 9)]  # as if padding sat there (it holds key bytes here)
    try:
        bank.input_chunk.raw[3:9] = 7
        bank.scrub()
        assert not bank.input_chunk.raw[3:9].any()
    finally:
        bank.fixed_gaps = saved
        bank.use_base(bank.active_base)


def test_changed_inputs_are_seen_and_restored(bank: ShapeBank) -> None:
    assignment = {0: bank.variant(0)}
    bank.write(assignment)
    bank.varying_views["weights"][0, 0, 0] += 1
    assert bank.inputs_changed(assignment) == ["weights"]
    # on a GPU nothing seals the fixed inputs: the judge compares them
    bank.inputs_sealed = False
    try:
        bank.fixed_views["k_index_cache_fp8"].view(-1)[123] += 1
        assert bank.restore_fixed() == ["k_index_cache_fp8"]
        assert bank.fixed_changed() == []
    finally:
        bank.inputs_sealed = True


def test_a_write_to_a_slot_never_reaches_the_variant_store(bank: ShapeBank) -> None:
    """Variants are views into one store tensor per input; a slot is a separate shared
    chunk. A candidate overwriting every varying input of its slots (possible on a GPU)
    changes neither the store nor what the judge writes or checks next."""
    assignment = {s: bank.variant(2 * s + 4) for s in range(3)}
    kept = {s: {n: t.clone() for n, t in v.values.items()} for s, v in assignment.items()}
    bank.write(assignment)
    for name in bank.varying:
        bank.varying_views[name].view(torch.uint8).fill_(0x5A)
    assert bank.inputs_changed(assignment) == sorted(bank.varying)
    for s, variant in assignment.items():
        for name, tensor in variant.values.items():
            assert torch.equal(tensor.view(torch.uint8), kept[s][name].view(torch.uint8)), name
    bank.write(assignment)  # the next write puts the judge's own values back
    assert bank.inputs_changed(assignment) == []


def test_a_write_mixing_bases_is_refused(bank: ShapeBank) -> None:
    with pytest.raises(ValueError, match="one base"):
        bank.write({0: bank.variant(0), 1: bank.variant(1)})


def _stacking_case(name: str) -> tuple[Workload, str]:
    """A workload that declares ``rows``, and its smoke shape with the most rows."""
    workload = load_workload(name)
    shape = max(workload.subsets["smoke"], key=lambda s: workload.axes_of(s)[workload.row_axis])
    return workload, shape


def _answer(bank: ShapeBank, slot: int, variant: int) -> list[torch.Tensor]:
    """Write the reference's answer for ``variant`` into ``slot``'s outputs; return them."""
    answer = bank.workload.reference(*bank.inputs_of(bank.variant(variant)).values())
    for row, value in zip(bank.output_rows, answer, strict=True):
        row[slot, GUARD : row.shape[1] - GUARD] = value.reshape(-1)
    return list(answer)


@pytest.mark.parametrize("name", ["dsa_topk", "dsa_sparse_attention"])
@pytest.mark.parametrize("wrong_slot", [None, 0, 4])
def test_a_stacked_check_gives_every_slots_verdict(name: str, wrong_slot: int | None) -> None:
    """Every workload that declares ``rows``: one checker call on six stacked slots says
    what six calls say, and a wrong row in one slot is reported as that slot's own check
    reports it."""
    workload, shape = _stacking_case(name)
    config = BankConfig(seed=2, salt="stack", bases=2, slots=6, variants=32)
    bank = ShapeBank(workload, shape, config, torch.device("cpu"), workload.expected_outputs,
                     chunk_id=5)
    assignment = {s: bank.variant(2 * s) for s in range(6)}
    bank.write(assignment)
    for s in assignment:
        _answer(bank, s, 2 * s)
    if wrong_slot is not None:  # its last row answers another variant's question
        other = workload.reference(*bank.inputs_of(bank.variant(13)).values())
        for row, value in zip(bank.output_rows, other, strict=True):
            body = row[wrong_slot, GUARD : row.shape[1] - GUARD].view(value.shape)
            body[-1] = value[-1]
    assert len(bank.stacks(list(assignment.values()))) == 1  # one checker call for all six
    snapshot = bank.snapshot()
    verdict = bank.check(snapshot, assignment, sorted(assignment))
    alone = [check_outputs(workload, bank.outputs_of(snapshot, s), bank.expected(v),
                           bank.inputs_of(v)) for s, v in assignment.items()]
    assert verdict.ok == all(v.ok for v in alone) == (wrong_slot is None)
    if wrong_slot is not None:
        assert verdict.message == alone[wrong_slot].message


def test_variants_of_two_bases_are_not_stacked(bank: ShapeBank) -> None:
    groups = bank.stacks([bank.variant(i) for i in range(6)])
    assert sorted(len(g) for g in groups) == [3, 3]
    assert all(len({v.base for v in g}) == 1 for g in groups)


@pytest.mark.parametrize("wrong", [None, 1, 4])
def test_answers_of_both_bases_are_checked_and_the_wrong_one_named(wrong: int | None) -> None:
    """``check_answers`` on pairs kept from several writes (two bases, so two stacks):
    all right passes; one wrong pair is named by its position, with its own verdict."""
    workload, shape = _stacking_case("dsa_topk")
    config = BankConfig(seed=3, salt="answers", bases=2, slots=6, variants=32)
    bank = ShapeBank(workload, shape, config, torch.device("cpu"), workload.expected_outputs,
                     chunk_id=7)
    variants = [bank.variant(i) for i in (0, 1, 2, 3, 4, 5)]  # bases alternate
    pairs = [(v, [t.clone() for t in workload.reference(*bank.inputs_of(v).values())])
             for v in variants]
    if wrong is not None:  # answers another variant's question
        pairs[wrong] = (pairs[wrong][0], pairs[(wrong + 2) % len(pairs)][1])
    assert len(bank.stacks(variants)) == 2
    position, verdict = bank.check_answers(pairs)
    assert position == wrong
    assert verdict.ok == (wrong is None)
    if wrong is not None:
        v, outputs = pairs[wrong]
        assert verdict.message == check_outputs(workload, outputs, bank.expected(v),
                                                bank.inputs_of(v)).message


def test_answers_that_pass_report_the_worst_error_of_every_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every stack passes, the verdict's statistics are the largest any checker
    call found, not the last call's (which could be the smallest)."""
    workload, shape = _stacking_case("dsa_topk")
    config = BankConfig(seed=3, salt="worst", bases=2, slots=6, variants=32)
    bank = ShapeBank(workload, shape, config, torch.device("cpu"), workload.expected_outputs,
                     chunk_id=9)
    variants = [bank.variant(i) for i in range(4)]  # two bases: two checker calls
    pairs = [(v, bank.expected(v)) for v in variants]
    found = iter([{"max_abs_error": 0.5, "max_rel_error": 0.001},
                  {"max_abs_error": 0.1, "max_rel_error": 0.004}])
    monkeypatch.setattr(bank, "_check_stack", lambda _pairs: CheckVerdict(True, stats=next(found)))
    position, verdict = bank.check_answers(pairs)
    assert position is None and verdict.ok
    assert verdict.stats == {"max_abs_error": 0.5, "max_rel_error": 0.004}


def test_made_variants_sit_in_the_store_and_write_from_it() -> None:
    config = BankConfig(seed=6, salt="store", bases=2, slots=4, variants=12)
    bank = ShapeBank(WL, SHAPE, config, torch.device("cpu"), WL.reference, chunk_id=11)
    bank.make_variants()
    assert all(v is not None for v in bank._variants)
    made = [bank.variant(i) for i in range(bank.variant_count)]
    again = WL.vary_inputs(SHAPE, bank.bases[made[5].base],
                           derived_seed(6, "store", SHAPE, "variant", 5), torch.device("cpu"))
    assert again is not None
    for name in bank.varying:  # the store holds what the generator made, bit for bit
        assert torch.equal(made[5].values[name].view(torch.uint8), again[name].view(torch.uint8))
    assignment = {0: made[4], 3: made[2]}
    bank.write(assignment)
    for slot, variant in assignment.items():
        for name in bank.varying:
            assert torch.equal(bank.varying_views[name][slot].view(torch.uint8),
                               variant.values[name].view(torch.uint8))
    assert bank.inputs_changed(assignment) == []


def test_a_variant_answered_twice_is_checked_twice() -> None:
    """Kept answers are paired with their variant by position: where one variant was
    answered twice (a re-verification, say), the first answer is checked as well as the
    second; keyed by the variant alone, a wrong first answer went unchecked."""
    workload, shape = _stacking_case("dsa_topk")
    config = BankConfig(seed=3, salt="twice", bases=2, slots=6, variants=32)
    bank = ShapeBank(workload, shape, config, torch.device("cpu"), workload.expected_outputs,
                     chunk_id=9)
    same, other = bank.variant(0), bank.variant(2)
    right = [t.clone() for t in workload.reference(*bank.inputs_of(same).values())]
    wrong = [t.clone() for t in workload.reference(*bank.inputs_of(other).values())]
    position, verdict = bank.check_answers([(same, wrong), (other, wrong), (same, right)])
    assert position == 0 and not verdict.ok


class HostReads:
    """Counts the ways a tensor's values reach the host (each a device sync on a GPU)."""

    NAMES = ("tolist", "item", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in self.NAMES:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, "equal", self._counting(torch.equal))

    def _counting(self, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(*args, **kwargs)
        return counted


def test_examine_reads_the_device_once_and_finds_what_the_three_checks_find(
        bank: ShapeBank, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge's look at a batch (screen, inputs unchanged, equal outputs) is one host
    sync whatever it finds, and finds what ``screen``, ``inputs_changed`` and
    ``duplicates`` find one by one."""
    assignment = {s: bank.variant(2 * s + 1) for s in range(4)}  # base 1
    bank.write(assignment)
    for slot, variant in assignment.items():
        answer = WL.reference(*bank.inputs_of(variant).values())[0].reshape(-1)
        bank.output_rows[0][slot, GUARD : GUARD + answer.numel()] = answer
    bank.output_rows[0][3, GUARD:-GUARD] = bank.output_rows[0][1, GUARD:-GUARD]  # a copy
    bank.output_rows[0][2, GUARD + 5] = poison_value(bank.output_rows[0].dtype)  # one unwritten
    bank.output_rows[0][0, 3] = 7  # a guard written
    bank.varying_views["weights"][1].zero_()  # an input changed
    snapshot = bank.snapshot()
    expected = (bank.screen(snapshot, sorted(assignment)), bank.inputs_changed(assignment),
                bank.duplicates(snapshot, sorted(assignment)))
    reads = HostReads(monkeypatch)
    seen = bank.examine(snapshot, assignment, duplicates=True)
    assert reads.count == 1
    assert (seen.bad, seen.changed, seen.groups) == expected
    assert seen.bad == {0: "the candidate wrote outside its output buffer",
                        2: "some outputs were never written"}
    assert seen.changed == ["weights"] and seen.groups == [[1, 3]]
    monkeypatch.undo()
    bank.write(assignment)  # the judge's own inputs back for the tests after


def test_made_variants_know_their_least_bytes(bank: ShapeBank, monkeypatch: pytest.MonkeyPatch) -> None:
    """``make_variants`` (a run's set-up on a GPU) also works out each variant's least
    bytes, so that the speed-of-light test of a candidate costs no host sync a variant."""
    bank.make_variants()
    reads = HostReads(monkeypatch)
    floors = [bank.floor_bytes(bank.variant(i)) for i in range(bank.variant_count)]
    assert reads.count == 0 and all(f is not None and f > 0 for f in floors)


def test_variants_are_all_made_before_any_cost_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """``make_variants`` queues every variant before it reads the first cost back, so a
    cost that syncs does not wait each time for the kernels making its own variant."""
    bank = ShapeBank(WL, SHAPE, BankConfig(seed=3, salt="order", bases=2, slots=4, variants=12),
                     torch.device("cpu"), WL.reference, chunk_id=50)
    events: list[str] = []
    vary, cost = WL.vary_inputs, WL.cost

    def logged_vary(*args: Any, **kwargs: Any) -> Any:
        events.append("vary")
        return vary(*args, **kwargs)

    def logged_cost(*args: Any, **kwargs: Any) -> Any:
        events.append("cost")
        return cost(*args, **kwargs)

    monkeypatch.setattr(bank.workload, "vary_inputs", logged_vary)
    monkeypatch.setattr(bank.workload, "cost", logged_cost)
    try:
        bank.make_variants()
        assert events.count("vary") == bank.variant_count and events.count("cost") == bank.variant_count
        assert events.index("cost") == bank.variant_count  # every vary before the first cost
    finally:
        bank.close()


def test_a_twin_shares_the_judges_stores_and_nothing_a_process_maps() -> None:
    """A lane's twin (lanes.py): the same variants and expected outputs (made once), its
    own chunks, so that writing or scrubbing one bank's slots leaves the other's alone."""
    config = BankConfig(seed=2, salt="twin", bases=2, slots=4, variants=16)
    first = ShapeBank(WL, SHAPE, config, torch.device("cpu"), WL.expected_outputs, chunk_id=40)
    twin = first.twin(42)
    try:
        assert set(twin.chunks) == {42, 43} and set(first.chunks) == {40, 41}
        assert twin.slots_json != first.slots_json  # views into its own chunks
        variant = first.variant(3)
        assert twin.variant(3) is variant  # one store of variants
        expected = first.expected(variant)
        assert twin.has_expected(variant) and twin.expected(variant) is expected
        assert twin.private_bytes() == first.private_bytes()
        assert twin.active_base == 0 and not twin.fixed_changed()

        first.write({0: variant})
        twin.write({1: twin.variant(5)})
        assert twin.inputs_changed({1: twin.variant(5)}) == []  # first's write went elsewhere
        first.output_rows[0].fill_(7)
        assert (twin.output_rows[0] == poison_value(twin.output_rows[0].dtype)).all()
        twin.scrub()
        assert (first.output_rows[0] == 7).all()  # a twin's scrub is its own
    finally:
        first.close()
        twin.close()
