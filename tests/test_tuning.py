"""Optuna launch tuning of one candidate: budgeted, reproducible, stored in the run dir."""

from __future__ import annotations

from pathlib import Path

import optuna

from evokernel.testing import FakeEvaluator, fake_candidate
from evokernel.tuning import LaunchTuner, tune


def test_tune_returns_the_best_child_within_budget(tmp_path: Path) -> None:
    ev = FakeEvaluator()
    parent = fake_candidate()
    calls: list[str] = []

    def evaluate(c):  # type: ignore[no-untyped-def]
        calls.append(c.id)
        assert c.code_id == parent.code_id and c.knobs == parent.knobs  # only launch changes
        return ev.evaluate(c, ["s0"])

    best = tune(parent, evaluate, n_trials=6, seed=1, storage_dir=tmp_path)
    assert best is not None and len(calls) == 6
    assert best[1].fitness == max(ev.evaluate(parent.with_params(launch={"THREADS": t}, operator="x"), ["s0"]).fitness
                                  for t in {ev_c for ev_c in (64, 128, 256, 512, 1024)}
                                  if parent.with_params(launch={"THREADS": t}, operator="x").id in calls)
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / f"tune-{parent.id}.log"))
    )
    study = optuna.load_study(study_name=f"tune-{parent.id}", storage=storage)
    assert len(study.trials) == 6


def test_tuner_is_reproducible_and_resumes_from_state(tmp_path: Path) -> None:
    ev = FakeEvaluator()
    parent = fake_candidate()
    a = LaunchTuner(parent, 8, seed=5, storage_dir=tmp_path / "a")
    for _ in range(3):
        c = a.ask()
        assert c is not None
        a.tell(c, ev.evaluate(c, ["s0"]))
    b = LaunchTuner.from_state(a.state(), tmp_path / "b")
    while (ca := a.ask()) is not None:
        cb = b.ask()
        assert cb is not None and cb.id == ca.id
        a.tell(ca, ev.evaluate(ca, ["s0"]))
        b.tell(cb, ev.evaluate(cb, ["s0"]))
    assert b.ask() is None and a.state() == b.state()
