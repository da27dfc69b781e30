"""Optuna tuning of one candidate's launch parameters, as ask/tell.

The study lives in the run directory (Optuna JournalStorage, one file per study)
so it can be inspected with Optuna's own tools. What decides the future, though,
is the list of told trials kept in our state: on resume the storage is rebuilt
from it (atomically), so trials that were asked but never told before a kill do
not leak into the resumed run. Each ask uses a fresh TPE sampler seeded from the
run seed and the trial number, which makes a study reproducible without saving
Optuna's private RNG.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    distribution_to_json,
    json_to_distribution,
)
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState, create_trial

from evokernel.candidate import Candidate, ParamValue
from evokernel.evaluate.result import Evaluation, Status

optuna.logging.set_verbosity(optuna.logging.WARNING)

Suggest = Callable[[optuna.Trial], dict[str, Any]]


def _derive(seed: int, *parts: object) -> int:
    blob = ":".join(str(p) for p in (seed, *parts)).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "little")


def trial_value(evaluation: Evaluation) -> float | None:
    """What Optuna maximises: fitness if PASSED, 0 for a failure, None (FAIL) if SKIPPED."""
    if evaluation.status is Status.SKIPPED:
        return None
    return evaluation.fitness or 0.0


def _dists(data: dict[str, Any]) -> dict[str, BaseDistribution]:
    return {k: json_to_distribution(v) for k, v in data.items()}


@dataclass
class _Pending:
    params: dict[str, Any]
    distributions: dict[str, BaseDistribution]
    trial: int = -1
    """The trial's number in the live study (set when the study is opened)."""


class StudyLog:
    """An Optuna study driven by ask/tell whose decision-relevant history is our state."""

    def __init__(
        self,
        name: str,
        seed: int,
        storage_path: Path | None = None,
        n_startup_trials: int = 8,
        told: list[dict[str, Any]] | None = None,
        pending: list[dict[str, Any]] | None = None,
    ) -> None:
        self.name = name
        self.seed = seed
        self.storage_path = storage_path
        self.n_startup_trials = n_startup_trials
        self.told: list[dict[str, Any]] = list(told or [])
        self._pending: dict[int, _Pending] = {
            int(p["number"]): _Pending(p["params"], _dists(p["distributions"])) for p in pending or []
        }
        """Trials asked and not yet told, by their number here (``len(told) + len(pending)``
        when asked); a snapshot may hold some (a pipelined run asks ahead)."""
        self._study: optuna.Study | None = None

    @property
    def study(self) -> optuna.Study:
        """Opened on first use, so that rebuilding state touches no file until it is used."""
        if self._study is None:
            self._study = self._open()
        return self._study

    def _open(self) -> optuna.Study:
        if self.storage_path is None:
            study = optuna.create_study(direction="maximize", study_name=self.name)
            self._replay(study)
            return study
        self.storage_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.storage_path.with_name(f".{self.storage_path.name}.tmp")
        tmp.unlink(missing_ok=True)
        storage = JournalStorage(JournalFileBackend(str(tmp)))
        study = optuna.create_study(direction="maximize", study_name=self.name, storage=storage)
        self._replay(study)
        os.replace(tmp, self.storage_path)
        storage = JournalStorage(JournalFileBackend(str(self.storage_path)))
        study = optuna.load_study(study_name=self.name, storage=storage)
        self._reopen_pending(study)
        return study

    def _replay(self, study: optuna.Study) -> None:
        for t in self.told:
            dists = _dists(t["distributions"])
            value = t["value"]
            study.add_trial(
                create_trial(
                    params=t["params"],
                    distributions=dists,
                    value=value,
                    state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
                )
            )
        if self.storage_path is None:
            self._reopen_pending(study)

    def _reopen_pending(self, study: optuna.Study) -> None:
        """Trials asked before a snapshot and not yet told: running again, same values."""
        for pending in sorted(self._pending.items()):
            study.enqueue_trial(pending[1].params, skip_if_exists=False)
            pending[1].trial = study.ask(fixed_distributions=pending[1].distributions).number

    def ask(self, suggest: Suggest) -> tuple[int, dict[str, Any]]:
        number = len(self.told) + len(self._pending)
        self.study.sampler = optuna.samplers.TPESampler(
            seed=_derive(self.seed, self.name, number), n_startup_trials=self.n_startup_trials
        )
        trial = self.study.ask()
        params = suggest(trial)
        self._pending[number] = _Pending(params, dict(trial.distributions), trial.number)
        return number, params

    def tell(self, number: int, value: float | None) -> None:
        study = self.study  # opened first: it numbers the pending trials it reopens
        pending = self._pending.pop(number)
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL
        study.tell(pending.trial, value if value is not None else None, state=state)
        self._record(pending.params, pending.distributions, value)

    def add(self, params: dict[str, Any], dists: dict[str, BaseDistribution], value: float | None) -> None:
        """Record a trial Optuna did not propose (a seed, a candidate from elsewhere)."""
        self.study.add_trial(
            create_trial(
                params=params,
                distributions=dists,
                value=value,
                state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
            )
        )
        self._record(params, dists, value)

    def _record(self, params: dict[str, Any], dists: dict[str, BaseDistribution], value: float | None) -> None:
        self.told.append(
            {
                "params": params,
                "distributions": {k: distribution_to_json(d) for k, d in dists.items()},
                "value": value,
            }
        )

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "seed": self.seed, "n_startup_trials": self.n_startup_trials,
                               "told": self.told}
        if self._pending:
            out["pending"] = [{"number": n, "params": p.params,
                               "distributions": {k: distribution_to_json(d) for k, d in p.distributions.items()}}
                              for n, p in sorted(self._pending.items())]
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any], storage_path: Path | None = None) -> StudyLog:
        return cls(state["name"], state["seed"], storage_path, state["n_startup_trials"], state["told"],
                   state.get("pending"))


class LaunchTuner:
    """Tunes ``candidate.launch_space`` for a fixed candidate: ``n_trials`` children at most."""

    def __init__(
        self,
        candidate: Candidate,
        n_trials: int,
        seed: int,
        storage_dir: Path | None = None,
        study: StudyLog | None = None,
        best: tuple[Candidate, Evaluation] | None = None,
    ) -> None:
        self.candidate = candidate
        self.n_trials = n_trials
        path = None if storage_dir is None else storage_dir / f"tune-{candidate.id}.log"
        self.log = study or StudyLog(f"tune-{candidate.id}", seed, path, n_startup_trials=min(4, n_trials))
        self._trial_of: dict[str, list[int]] = {}
        self._best = best

    @property
    def asked(self) -> int:
        return len(self.log.told) + len(self.log._pending)

    @property
    def done(self) -> bool:
        return self.asked >= self.n_trials or not self.candidate.launch_space

    def ask(self, generation: int | None = None) -> Candidate | None:
        if self.done:
            return None
        space = self.candidate.launch_space

        def suggest(trial: optuna.Trial) -> dict[str, Any]:
            return {n: trial.suggest_categorical(n, list(p.choices)) for n, p in sorted(space.items())}

        number, params = self.log.ask(suggest)
        launch: dict[str, ParamValue] = dict(params)
        child = self.candidate.with_params(launch=launch, operator="optuna_launch", generation=generation)
        self._trial_of.setdefault(child.id, []).append(number)
        return child

    @property
    def finished(self) -> bool:
        """Every trial asked and told: the tuner can be dropped."""
        return self.done and not self._trial_of

    def owns(self, candidate: Candidate) -> bool:
        return bool(self._trial_of.get(candidate.id))

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        number = self._trial_of[candidate.id].pop(0)
        if not self._trial_of[candidate.id]:
            del self._trial_of[candidate.id]
        self.log.tell(number, trial_value(evaluation))
        if self._best is None or evaluation.rank_key() > self._best[1].rank_key():
            self._best = (candidate, evaluation)

    def best(self) -> tuple[Candidate, Evaluation] | None:
        return self._best

    def state(self) -> dict[str, Any]:
        from evokernel.populations.base import dump_entry

        return {
            "candidate": self.candidate.model_dump(mode="json"),
            "n_trials": self.n_trials,
            "study": self.log.state(),
            "best": None if self._best is None else dump_entry(*self._best),
            "trial_of": {cid: list(numbers) for cid, numbers in sorted(self._trial_of.items())},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], storage_dir: Path | None = None) -> LaunchTuner:
        from evokernel.populations.base import load_entry

        candidate = Candidate.model_validate(state["candidate"])
        path = None if storage_dir is None else storage_dir / f"tune-{candidate.id}.log"
        study = StudyLog.from_state(state["study"], path)
        best = None if state["best"] is None else load_entry(state["best"])
        tuner = cls(candidate, state["n_trials"], study.seed, storage_dir, study=study, best=best)
        tuner._trial_of = {cid: list(numbers) for cid, numbers in state.get("trial_of", {}).items()}
        return tuner


def tune(
    candidate: Candidate,
    evaluate: Callable[[Candidate], Evaluation],
    n_trials: int,
    seed: int = 0,
    storage_dir: Path | None = None,
) -> tuple[Candidate, Evaluation] | None:
    """Blocking convenience: tune one candidate with ``evaluate`` and return the best child."""
    tuner = LaunchTuner(candidate, n_trials, seed, storage_dir)
    while (child := tuner.ask()) is not None:
        tuner.tell(child, evaluate(child))
    return tuner.best()


def categorical(choices: tuple[ParamValue, ...]) -> CategoricalDistribution:
    return CategoricalDistribution(list(choices))
