"""Built-in operators: valid children, parents untouched, reproducible from the RNG."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evokernel.candidate import Language
from evokernel.operators import KnobCrossover, KnobMutation, Operator, OperatorContext
from evokernel.testing import fake_candidate


def ctx(seed: int = 0) -> OperatorContext:
    return OperatorContext(rng=np.random.default_rng(seed), workload="fake", budget_left=10)


def test_operators_satisfy_the_protocol() -> None:
    assert isinstance(KnobMutation(), Operator)
    assert isinstance(KnobCrossover(), Operator)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), changes=st.integers(1, 3))
def test_mutation_changes_1_to_n_knobs_to_declared_choices(seed: int, changes: int) -> None:
    parent = fake_candidate()
    before = parent.model_dump()
    (child,) = KnobMutation(max_changes=changes).propose([parent], ctx(seed))
    assert parent.model_dump() == before  # the parent is unchanged
    changed = {k for k in parent.knob_space if child.params[k] != parent.params[k]}
    assert 1 <= len(changed) <= changes
    for k in changed:
        assert child.params[k] in parent.knob_space[k].choices
    assert child.parents == (parent.id,) and child.operator == "knob_mutation"
    assert child.launch == parent.launch  # knobs only by default


def test_mutation_prefers_ordinal_neighbours() -> None:
    parent = fake_candidate(TILE=64)  # index 2 of (16, 32, 64, 128, 256)
    op = KnobMutation(max_changes=1, neighbour_p=1.0)
    rng_ctx = ctx(1)
    tiles = []
    for _ in range(200):
        (child,) = op.propose([parent], rng_ctx)
        if child.params["TILE"] != 64:
            tiles.append(child.params["TILE"])
    assert tiles and set(tiles) <= {32, 128}


def test_mutation_is_reproducible_and_can_touch_launch() -> None:
    parent = fake_candidate()
    op = KnobMutation(max_changes=4, spaces=("knobs", "launch"))
    a = [op.propose([parent], ctx(7))[0].id for _ in range(3)]
    b = [op.propose([parent], ctx(7))[0].id for _ in range(3)]
    assert a == b
    c = ctx(3)
    assert any(op.propose([parent], c)[0].launch for _ in range(30))


def test_mutation_of_a_knobless_candidate_proposes_nothing() -> None:
    bare = fake_candidate().model_copy(update={"knob_space": {}, "knobs": {}}).revalidated()
    assert KnobMutation().propose([bare], ctx()) == []


def test_crossover_same_code_takes_values_from_both() -> None:
    a = fake_candidate(TILE=16, ALGO="radix", UNROLL=1)
    b = fake_candidate(TILE=256, ALGO="bitonic", UNROLL=8)
    c = ctx(0)
    children = [ch for _ in range(30) for ch in KnobCrossover().propose([a, b], c)]
    assert children
    for ch in children:
        assert ch.code_id == a.code_id
        assert set(ch.parents) == {a.id, b.id}
        for k in a.knob_space:
            assert ch.params[k] in (a.params[k], b.params[k])


def test_crossover_different_code_keeps_one_code_and_compatible_knobs() -> None:
    a = fake_candidate("a", 1.0, TILE=16)
    b = fake_candidate("b", 2.0, language=Language.TORCH, TILE=256, UNROLL=8)
    b = b.model_copy(update={"knob_space": {"TILE": b.knob_space["TILE"]}, "knobs": {"TILE": 256}}).revalidated()
    c = ctx(5)
    seen_codes = set()
    for _ in range(40):
        for ch in KnobCrossover().propose([a, b], c):
            seen_codes.add(ch.code_id)
            assert ch.code_id in (a.code_id, b.code_id)
            assert set(ch.params) == set(a.params if ch.code_id == a.code_id else b.params)
    assert seen_codes == {a.code_id, b.code_id}
