"""Island-model evolution on DEAP's tools, with Optuna launch tuning of new champions.

Per generation and island: parents by tournament (DEAP ``selTournament``), then
variation in DEAP's ``varOr`` style (crossover with probability ``crossover_p``,
else mutation), children sent home to their island. Islands exchange their best
along a ring every ``migration_interval`` generations. A global hall of fame
(DEAP ``HallOfFame``) and a ``Logbook`` of per-generation statistics are kept.
When a candidate becomes the overall champion its launch parameters are tuned by
Optuna for ``tune_trials`` evaluations, inside the same ask/tell loop and budget.
With ``operators`` of kind ``llm`` or ``mixed`` each child's operator is drawn by rate
from the knob operators and the LLM operators instead (``strategies/mixing.py``).
No DEAP ``creator`` classes are used: individuals are plain classes that pickle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from deap import tools

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation
from evokernel.operators import KnobCrossover, KnobMutation, Operator, OperatorContext
from evokernel.populations import Axis, Islands, MapElites, Population, TournamentPool
from evokernel.populations.map_elites import DEFAULT_AXES
from evokernel.strategies.base import Strategy, StrategyEnv, operator_options
from evokernel.strategies.mixing import make_mixer
from evokernel.tuning import LaunchTuner

if TYPE_CHECKING:
    from evokernel.config import RunConfig


class Evolutionary(Strategy):
    name: ClassVar[str] = "evolutionary"
    uses_operators: ClassVar[bool] = True

    @classmethod
    def options_from(cls, config: RunConfig) -> dict[str, Any]:
        p = config.population
        return {
            "islands": p.islands, "island_size": p.island_size, "island_kind": p.kind,
            "axes": list(p.axes), "tournament_size": p.tournament_size,
            "migration_interval": p.migration_interval, "migrants": p.migrants,
            "archive_size": p.archive_size, **config.evolutionary.model_dump(), **operator_options(config),
        }

    def __init__(
        self,
        env: StrategyEnv,
        islands: int = 2,
        island_size: int = 16,
        island_kind: Literal["pool", "map_elites"] = "pool",
        axes: list[Axis] | None = None,
        tournament_size: int = 3,
        migration_interval: int = 5,
        migrants: int = 1,
        crossover_p: float = 0.3,
        max_changes: int = 2,
        neighbour_p: float = 0.7,
        mutate_launch: bool = True,
        tune_trials: int = 0,
        archive_size: int = 10,
        attempts: int = 8,
        operators: dict[str, Any] | None = None,
        build_islands: bool = True,
    ) -> None:
        super().__init__(env, archive_size)
        self.options: dict[str, Any] = {
            "islands": islands, "island_size": island_size, "island_kind": island_kind,
            "axes": [a.model_dump(mode="json") for a in (axes or [])],
            "tournament_size": tournament_size, "migration_interval": migration_interval,
            "migrants": migrants, "crossover_p": crossover_p, "max_changes": max_changes,
            "neighbour_p": neighbour_p, "mutate_launch": mutate_launch, "tune_trials": tune_trials,
            "archive_size": archive_size, "attempts": attempts,
        }
        if operators is not None:
            self.options["operators"] = dict(operators)
        spaces = ("knobs", "launch") if mutate_launch else ("knobs",)
        self.mutation: Operator = KnobMutation(max_changes, neighbour_p, spaces=spaces)  # type: ignore[arg-type]
        self.crossover: Operator = KnobCrossover(spaces=spaces)  # type: ignore[arg-type]
        self.crossover_p = crossover_p
        self.mixer = make_mixer(
            env, operators, {"knob_mutation": self.mutation, "knob_crossover": self.crossover},
            {"knob_mutation": 1.0 - crossover_p, "knob_crossover": crossover_p},
        )
        self.tune_trials = tune_trials
        self.attempts = attempts
        self.logbook = tools.Logbook()
        self.logbook.header = ["gen", "told", "passed", "best", "mean"]
        self._told_this_gen: list[Evaluation] = []
        self.tuners: list[LaunchTuner] = []
        self.tuned: set[str] = set()
        if build_islands:
            pools = [env.host(self._island_builder()) for _ in range(islands)]
            self.islands = Islands(pools, migration_interval, migrants)

    def _island_builder(self) -> Any:
        o = self.options
        if o["island_kind"] == "map_elites":
            axes = [Axis.model_validate(a) for a in o["axes"]]
            return lambda: MapElites(axes)
        size, tsize = o["island_size"], o["tournament_size"]
        return lambda: TournamentPool(size, tsize)

    # -- ask -------------------------------------------------------------------------
    def ask(self, n: int) -> list[Candidate]:
        self._close_generation()
        self.generation += 1
        self.islands.maybe_migrate(self.generation)
        out: list[Candidate] = []
        batch: set[str] = set()
        for tuner in self.tuners:  # launch tuning of champions first
            while len(out) < n and (child := tuner.ask(self.generation)) is not None:
                out.append(child)
                batch.add(child.id)
        n_islands = len(self.islands.islands)
        slot = 0
        while len(out) < n:
            island = slot % n_islands
            slot += 1
            child = self._offspring(island, batch)
            if child is None:
                continue
            self.islands.assign(child, island)
            out.append(child)
            batch.add(child.id)
            if slot > n * self.attempts * 4:
                break  # the space is (nearly) exhausted: ask returns fewer
        return out

    def _offspring(self, island: int, batch: set[str]) -> Candidate | None:
        if self.mixer is not None:
            return self.mixer.propose(
                self.rng, lambda k: self._parents(island, k), generation=self.generation,
                budget_left=self.budget_left, attempts=self.attempts,
                fresh=lambda c: c.id not in self.seen and c.id not in batch,
            )
        child = None
        for _ in range(self.attempts):
            use_cx = self.rng.random() < self.crossover_p
            op = self.crossover if use_cx else self.mutation
            parents = self.islands.select_from(island, op.arity, self.rng)
            if len(parents) < op.arity:
                parents = self.archive.select(op.arity, self.rng) or [self.seeds[0]] * op.arity
            ctx = OperatorContext(
                rng=self.rng, workload=self.env.workload, budget_left=self.budget_left,
                generation=self.generation,
            )
            proposals = op.propose(parents, ctx)
            if not proposals and op is self.crossover:
                proposals = self.mutation.propose(parents[:1], ctx)
            if not proposals:
                continue
            child = proposals[0]
            if child.id not in self.seen and child.id not in batch:
                return child
        return child

    def _parents(self, island: int, k: int) -> list[Candidate]:
        parents = self.islands.select_from(island, k, self.rng)
        if len(parents) < k:
            parents = self.archive.select(k, self.rng) or [self.seeds[0]] * k
        return parents

    # -- tell ------------------------------------------------------------------------
    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        before = self.archive.best()
        self._tell_common(candidate, evaluation)
        if self.mixer is not None:
            self.mixer.note(candidate, evaluation)
        self._told_this_gen.append(evaluation)
        for tuner in self.tuners:
            if tuner.owns(candidate):
                tuner.tell(candidate, evaluation)
                break
        self.islands.add(candidate, evaluation)
        champion = before is None or evaluation.rank_key() > before[1].rank_key()
        if champion and evaluation.fitness is not None:
            self._maybe_tune(candidate)
        self.tuners = [t for t in self.tuners if not t.finished]

    def _maybe_tune(self, candidate: Candidate) -> None:
        key = f"{candidate.code_id}:{sorted(candidate.knobs.items())}"
        if self.tune_trials <= 0 or not candidate.launch_space or key in self.tuned:
            return
        self.tuned.add(key)
        storage = None if self.env.run_dir is None else self.env.run_dir / "optuna"
        seed = int(self.rng.integers(2**31))
        self.tuners.append(LaunchTuner(candidate, self.tune_trials, seed, storage))

    def _close_generation(self) -> None:
        if not self._told_this_gen:
            return
        fits = [e.fitness for e in self._told_this_gen if e.fitness is not None]
        best = self.archive.best()
        self.logbook.record(
            gen=self.generation, told=len(self._told_this_gen), passed=len(fits),
            best=None if best is None else best[1].fitness,
            mean=float(np.mean(fits)) if fits else None,
        )
        self._told_this_gen = []

    # -- state -----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        self._close_generation()
        out = {
            **self._base_state(),
            "options": self.options,
            "islands": self.islands.state(),
            "logbook": list(self.logbook),
            "tuners": [t.state() for t in self.tuners],
            "tuned": sorted(self.tuned),
        }
        if self.mixer is not None:
            out["mixer"] = self.mixer.state()
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any], env: StrategyEnv) -> Evolutionary:
        options = dict(state["options"])
        options["axes"] = [Axis.model_validate(a) for a in options["axes"]]
        obj = cls(env, **options, build_islands=False)
        obj._load_base(state)
        obj.islands = Islands.from_state(state["islands"], host=env.host)
        for record in state["logbook"]:
            obj.logbook.record(**record)
        storage = None if env.run_dir is None else env.run_dir / "optuna"
        obj.tuners = [LaunchTuner.from_state(t, storage) for t in state["tuners"]]
        obj.tuned = set(state["tuned"])
        if obj.mixer is not None:
            obj.mixer.load(state.get("mixer", {}))
        return obj

    def population(self) -> Population:
        return self.islands


class MapElitesIslands(Evolutionary):
    """The same evolution with MAP-Elites archives for islands (``population.axes``: build
    resources or declared parameters) instead of tournament pools: parents are drawn from
    every occupied cell alike, so a kernel unlike the leaders keeps breeding. Registered
    as ``map_elites``; ``--strategy evolutionary --set population.kind=map_elites`` is the
    same search."""

    name: ClassVar[str] = "map_elites"

    def __init__(self, env: StrategyEnv, **options: Any) -> None:
        if options.setdefault("island_kind", "map_elites") != "map_elites":
            raise ValueError(f"map_elites keeps MAP-Elites islands, not {options['island_kind']!r}")
        if not options.get("axes"):
            options["axes"] = list(DEFAULT_AXES)
        super().__init__(env, **options)

    @classmethod
    def options_from(cls, config: RunConfig) -> dict[str, Any]:
        return {**super().options_from(config), "island_kind": "map_elites"}
