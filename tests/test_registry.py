"""The registry every extension point uses: names, import paths, one-line errors."""

from __future__ import annotations

import pytest

from evokernel.registry import Registry, UnknownName
from evokernel.runtime import EVALUATORS, evaluator_factory
from evokernel.testing import FakeEvaluator


def test_names_import_paths_and_lazy_entries() -> None:
    things: Registry[object] = Registry("thing")
    things.register("fake", FakeEvaluator)
    things.register("lazy", "evokernel.testing:FakeWorkload")
    assert things.get("fake") is FakeEvaluator
    assert things.get("lazy").__name__ == "FakeWorkload"  # type: ignore[attr-defined]
    assert things.get("evokernel.testing:fake_candidate").__name__ == "fake_candidate"  # type: ignore[attr-defined]
    assert things.names() == ["fake", "lazy"] and "fake" in things
    with pytest.raises(UnknownName, match=r"unknown thing 'fak'; known: fake, lazy"):
        things.get("fak")
    with pytest.raises(ValueError, match="already registered"):
        things.register("fake", object())
    things.register("fake", int, replace=True)
    assert things.get("fake") is int
    with pytest.raises(ValueError, match="plain name"):
        things.register("a:b", int)


def test_evaluators_by_name() -> None:
    assert {"sandbox", "replay", "fake"} <= set(EVALUATORS.names())
    evaluator = evaluator_factory("fake", "fake", {"device_s": 2.0})()
    assert isinstance(evaluator, FakeEvaluator) and evaluator.device_s == 2.0
