"""benchmarks/redteam.py --start-at: the rest of a red-team run cut short."""

from __future__ import annotations

import pytest

from benchmarks.redteam import cases_from
from tests.evaluate.redteam import cases_for


def test_start_at_keeps_the_named_case_and_every_case_after_it() -> None:
    cases = cases_for("cuda")
    names = [case.name for case in cases]
    rest = cases_from(cases, names[5])
    assert [case.name for case in rest] == names[5:]
    assert cases_from(cases, "") == cases


def test_an_unknown_case_is_a_clear_error_naming_the_cases() -> None:
    cases = cases_for("cpu")
    with pytest.raises(SystemExit, match=r"no such case.*syntax_error\.py"):
        cases_from(cases, "no_such_case.py")
