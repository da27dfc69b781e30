"""Optuna-only: TPE over the seeds' code choice and every declared parameter, one study.

No population and no variation operators: the baseline that asks whether
evolution adds anything over a model-based optimiser on the same space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import optuna

from evokernel.candidate import Candidate, ParamValue
from evokernel.evaluate.result import Evaluation
from evokernel.strategies.base import Strategy, StrategyEnv
from evokernel.tuning import StudyLog, categorical, trial_value

if TYPE_CHECKING:
    from evokernel.config import RunConfig


class OptunaSearch(Strategy):
    name: ClassVar[str] = "optuna"

    @classmethod
    def options_from(cls, config: RunConfig) -> dict[str, Any]:
        return config.optuna.model_dump()

    def __init__(self, env: StrategyEnv, n_startup_trials: int = 8, study: StudyLog | None = None) -> None:
        super().__init__(env)
        self.n_startup_trials = n_startup_trials
        path = None if env.run_dir is None else env.run_dir / "optuna" / "strategy.log"
        self.log = study or StudyLog("strategy", env.seed, path, n_startup_trials)
        self._trials: dict[str, list[int]] = {}

    def _space(self, i: int) -> dict[str, Any]:
        seed = self.seeds[i]
        return {f"s{i}.{k}": p for k, p in sorted({**seed.knob_space, **seed.launch_space}.items())}

    def _build(self, i: int, params: dict[str, Any]) -> Candidate:
        seed = self.seeds[i]
        values = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(f"s{i}.")}
        knobs: dict[str, ParamValue] = {k: v for k, v in values.items() if k in seed.knob_space}
        launch: dict[str, ParamValue] = {k: v for k, v in values.items() if k in seed.launch_space}
        return seed.with_params(knobs=knobs, launch=launch, operator="optuna", generation=self.generation)

    def ask(self, n: int) -> list[Candidate]:
        self.generation += 1
        out = []
        for _ in range(n):
            def suggest(trial: optuna.Trial) -> dict[str, Any]:
                params: dict[str, Any] = {}
                i = 0
                if len(self.seeds) > 1:
                    i = params["code"] = trial.suggest_categorical("code", list(range(len(self.seeds))))
                for name, p in self._space(int(i)).items():
                    params[name] = trial.suggest_categorical(name, list(p.choices))
                return params

            number, params = self.log.ask(suggest)
            child = self._build(int(params.get("code", 0)), params)
            self._trials.setdefault(child.id, []).append(number)
            out.append(child)
        return out

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        self._tell_common(candidate, evaluation)
        value = trial_value(evaluation)
        numbers = self._trials.get(candidate.id)
        if numbers:
            self.log.tell(numbers.pop(0), value)
            if not numbers:
                del self._trials[candidate.id]
            return
        # Not proposed by the study (a seed): teach it anyway, if it is in the space.
        for i, seed in enumerate(self.seeds):
            if seed.code_id == candidate.code_id:
                space = self._space(i)
                values = candidate.params
                params: dict[str, Any] = {n: values[n.split(".", 1)[1]] for n in space}
                dists = {n: categorical(p.choices) for n, p in space.items()}
                if len(self.seeds) > 1:
                    params["code"], dists["code"] = i, categorical(tuple(range(len(self.seeds))))
                self.log.add(params, dists, value)  # type: ignore[arg-type]
                return

    def state(self) -> dict[str, Any]:
        out = {**self._base_state(), "n_startup_trials": self.n_startup_trials, "study": self.log.state()}
        if self._trials:  # asked ahead of the snapshot (pipelined): their trial numbers
            out["trials"] = {cid: list(numbers) for cid, numbers in sorted(self._trials.items())}
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any], env: StrategyEnv) -> OptunaSearch:
        path = None if env.run_dir is None else env.run_dir / "optuna" / "strategy.log"
        obj = cls(env, state["n_startup_trials"], study=StudyLog.from_state(state["study"], path))
        obj._load_base(state)
        obj._trials = {cid: list(numbers) for cid, numbers in state.get("trials", {}).items()}
        return obj
