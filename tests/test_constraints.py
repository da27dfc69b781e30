from __future__ import annotations

import itertools

import pytest

from evokernel.candidate import Param
from evokernel.constraints import check_declared, count_valid, parse, repair, sample_valid, violated

SPACE = {
    "MODE": Param(choices=("a", "b", "c")),
    "N": Param(choices=(1, 2, 4, 8, 16)),
    "W": Param(choices=(2, 4, 8)),
    "S": Param(choices=(1, 2, 3)),
    "FREE": Param(choices=(0, 1)),
}
RULES = check_declared(
    ["MODE != 'c' or N <= 4", "W * S * 8448 <= 120000", "(1 << S) + max(W, 2) < 16"], SPACE)


def brute_force(space: dict[str, Param], rules: list) -> int:  # type: ignore[type-arg]
    names = sorted(space)
    return sum(
        1 for combo in itertools.product(*(space[n].choices for n in names))
        if not violated(rules, dict(zip(names, combo, strict=True)))
    )


def test_count_matches_enumerating_the_whole_product() -> None:
    assert count_valid(SPACE, RULES) == brute_force(SPACE, RULES)
    assert count_valid(SPACE, []) == 3 * 5 * 3 * 3 * 2


def test_a_constant_false_constraint_leaves_nothing() -> None:
    assert count_valid(SPACE, check_declared(["1 > 2"], SPACE)) == 0


def test_parse_reports_names_and_refuses_what_is_not_allowed() -> None:
    assert parse("A in (1, 2) and B != 'x'").names == {"A", "B"}
    for bad in ("__import__('os')", "A[0]", "lambda: 1", "[x for x in A]", "f(A)"):
        with pytest.raises(ValueError):
            parse(bad)


def test_an_expression_that_raises_counts_as_broken() -> None:
    (rule,) = check_declared(["16 // (W - 2) > 0"], SPACE)
    assert violated([rule], {"W": 2}) == [rule]


def test_repair_reaches_a_valid_combination_from_every_start() -> None:
    names = sorted(SPACE)
    for combo in itertools.product(*(SPACE[n].choices for n in names)):
        values = dict(zip(names, combo, strict=True))
        for kept in names:
            fixed = repair(values, SPACE, RULES, keep=[kept])
            assert not violated(RULES, fixed)
            if not violated(RULES, values):
                assert fixed == values


def test_repair_keeps_requested_values_when_others_can_adapt() -> None:
    fixed = repair({"MODE": "c", "N": 16, "W": 2, "S": 1, "FREE": 0}, SPACE, RULES, keep=["MODE"])
    assert fixed["MODE"] == "c" and fixed["N"] in (1, 2, 4)
    fixed = repair({"MODE": "c", "N": 16, "W": 2, "S": 1, "FREE": 0}, SPACE, RULES, keep=["N"])
    assert fixed["N"] == 16 and fixed["MODE"] != "c"


def test_repair_changes_two_parameters_at_once_where_one_alone_cannot_help() -> None:
    """cuda_family's shape: wgmma needs 4+ warps AND cp.async, and EARLY needs wgmma; from
    wgmma with 2 warps, bulk loads and EARLY 1 no single change mends anything (each
    leaves one constraint broken), the pair (warps, loads) does."""
    space = {"SCORE": Param(choices=("fp8", "wgmma")), "WARPS": Param(choices=(2, 4)),
             "LOAD": Param(choices=("cp_async", "bulk")), "EARLY": Param(choices=(0, 1))}
    rules = check_declared(["SCORE != 'wgmma' or (WARPS >= 4 and LOAD == 'cp_async')",
                            "EARLY == 0 or SCORE == 'wgmma'"], space)
    start = {"SCORE": "wgmma", "WARPS": 2, "LOAD": "bulk", "EARLY": 1}
    fixed = repair(start, space, rules, keep=["SCORE", "EARLY"])
    assert fixed == {"SCORE": "wgmma", "WARPS": 4, "LOAD": "cp_async", "EARLY": 1}


def test_repair_pairs_a_change_with_the_mend_of_the_rule_it_breaks() -> None:
    """From wgmma with a bulk load kept: the scorer must leave wgmma (fp8), which breaks
    "EARLY == 0 or SCORE == 'wgmma'", which EARLY, a parameter no broken rule read before,
    then mends. No single change lowers the count of broken rules, and neither does a
    pair of the parameters they read at the start (SCORE, WARPS); this pair does."""
    space = {"SCORE": Param(choices=("wgmma", "fp8")), "WARPS": Param(choices=(4, 2)),
             "LOAD": Param(choices=("cp_async", "bulk")), "EARLY": Param(choices=(1, 0))}
    rules = check_declared(["SCORE != 'wgmma' or (WARPS >= 4 and LOAD == 'cp_async')",
                            "EARLY == 0 or SCORE == 'wgmma'"], space)
    start = {"SCORE": "wgmma", "WARPS": 4, "LOAD": "bulk", "EARLY": 1}
    fixed = repair(start, space, rules, keep=["LOAD"])
    assert fixed == {"SCORE": "fp8", "WARPS": 4, "LOAD": "bulk", "EARLY": 0}


def test_repair_says_when_nothing_is_valid() -> None:
    with pytest.raises(ValueError, match="no valid parameter combination"):
        repair({"W": 2}, {"W": Param(choices=(2, 4))}, check_declared(["W > 4"], {"W": 0}))


def test_samples_are_valid_uniform_and_deterministic() -> None:
    import numpy as np

    draws = sample_valid(SPACE, RULES, np.random.default_rng(1), 3000)
    assert all(not violated(RULES, d) for d in draws)
    assert draws[:5] == sample_valid(SPACE, RULES, np.random.default_rng(1), 5)
    distinct = {tuple(sorted(d.items())) for d in draws}
    assert len(distinct) == count_valid(SPACE, RULES)  # 3000 draws reach every valid one


def test_counting_a_space_without_a_constrained_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="outside the space"):
        count_valid({"W": SPACE["W"]}, RULES)


@pytest.mark.parametrize("texts", [
    ["MODE != 'c' or N <= 4", "W * S * 8448 <= 120000", "(1 << S) + max(W, 2) < 16"],
    ["N // (S - 1) < 8", "MODE == 'a' or W != 4"],  # the first raises where S == 1: broken
    ["FREE == 1 or N == 1", "FREE != 1 or W == 8", "S < W"],
])
def test_the_valid_combinations_are_those_of_the_product_in_its_order(texts: list[str]) -> None:
    """Depth-first enumeration with each rule tried as soon as it is decided gives what
    filtering ``itertools.product`` gives, in the same order (samples draw by index)."""
    from evokernel.constraints import _groups, _valid_in_group

    space = {**SPACE, "FLAG": Param(choices=(True, 1, 0))}  # equal values, distinct choices
    rules = check_declared([*texts, "FLAG != 0 or MODE == 'b'"], space)
    for group in _groups(space, rules):
        names, valid = _valid_in_group(space, rules, group)
        if valid is None:
            continue
        inside = [r for r in rules if r.names <= group]
        expected = [combo for combo in itertools.product(*(space[n].choices for n in names))
                    if not violated(inside, dict(zip(names, combo, strict=True)))]
        assert valid == expected
        assert [[type(v) for v in c] for c in valid] == [[type(v) for v in c] for c in expected]
    from evokernel.constraints import valid_combinations

    names, every = valid_combinations(space, rules)
    assert every == [combo for combo in itertools.product(*(space[n].choices for n in names))
                     if not violated(rules, dict(zip(names, combo, strict=True)))]
