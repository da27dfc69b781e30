"""A run's configuration: pydantic models, YAML presets, CLI overrides.

Defaults live here, in code; ``configs/default.yaml`` spells them out and the
presets in ``configs/`` override a few. Values written ``auto`` depend on the
machine and are fixed when the run starts (``resolve``): with no CUDA device the
budget is 12 evaluations on the ``smoke`` shapes, so that the main command ends
in minutes on a CPU; with a GPU it is 200 evaluations on ``quick``. The run
directory stores the resolved config, so a resumed run never re-decides them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evokernel.llm.config import LLMConfig
from evokernel.populations.map_elites import DEFAULT_AXES, Axis

Auto = Literal["auto"]
Positive = Annotated[int, Field(ge=1)]

# (evaluations, shape subset, batch size) for ``auto``
CPU_DEFAULTS: tuple[int, str, int] = (12, "smoke", 4)
GPU_DEFAULTS: tuple[int, str, int] = (200, "quick", 8)


class ConfigError(ValueError):
    """A config that cannot be used; the message is one line naming the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class BudgetConfig(_Model):
    evaluations: Positive | Auto | None = "auto"
    """Evaluations (seeds included); ``auto``: 12 without a GPU, 200 with one."""
    gpu_seconds: float | None = Field(default=None, gt=0)
    """Device seconds (``Evaluation.device_s``); the run stops at whichever comes first."""

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetConfig:
        if self.evaluations is None and self.gpu_seconds is None:
            raise ValueError("set budget.evaluations or budget.gpu_seconds (or both)")
        return self


class RuntimeConfig(_Model):
    kind: Literal["ray", "local"] = "ray"
    address: str | None = None
    """An existing Ray cluster (``ray://host:10001`` or ``auto``); None starts a local one."""
    evaluators: Positive | Auto = "auto"
    """Evaluator actors: ``auto`` is one per GPU, else one."""
    num_cpus: int | None = Field(default=None, ge=1)
    object_store_mb: int = Field(default=256, ge=64)


class EvaluatorConfig(_Model):
    factory: str = "sandbox"
    """``sandbox`` or ``package.module:Class`` called as ``Class(workload, **options)``."""
    options: dict[str, Any] = Field(default_factory=lambda: {"timeout_s": 300.0})


class PopulationConfig(_Model):
    islands: int = Field(default=2, ge=1)
    island_size: int = Field(default=16, ge=1)
    kind: Literal["pool", "map_elites"] = "pool"
    axes: list[Axis] = Field(default_factory=lambda: list(DEFAULT_AXES))
    """MAP-Elites axes (``kind: map_elites``): build resources or declared parameters."""
    migration_interval: int = Field(default=5, ge=0)
    migrants: int = Field(default=1, ge=0)
    archive_size: int = Field(default=10, ge=1)
    tournament_size: int = Field(default=3, ge=1)


class EvolutionaryConfig(_Model):
    crossover_p: float = Field(default=0.3, ge=0, le=1)
    max_changes: int = Field(default=2, ge=1)
    neighbour_p: float = Field(default=0.7, ge=0, le=1)
    mutate_launch: bool = True
    tune_trials: int = Field(default=0, ge=0)
    """Optuna launch trials for each new champion (0: off)."""


class GreedyConfig(_Model):
    max_changes: int = Field(default=1, ge=1)
    neighbour_p: float = Field(default=0.8, ge=0, le=1)


class OptunaConfig(_Model):
    n_startup_trials: int = Field(default=8, ge=0)


class OperatorsConfig(_Model):
    """Which variation operators make children, and how often each is chosen."""

    kind: Literal["builtin", "llm", "mixed"] = "builtin"
    """``builtin``: knob mutation and crossover only (as configured under ``evolutionary``);
    ``llm``: the LLM operators of ``llm.preset``; ``mixed``: both, by ``rates``."""
    rates: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    """Relative rate by operator: ``knob_mutation``, ``knob_crossover`` and ``llm_<name>`` for
    each LLM operator of the preset (``llm_mutate``, ``llm_mutate_diff``, ``llm_repair``,
    ``llm_crossover``, ``llm_agent``). Unnamed ones keep their default: the built-ins split
    1 by ``evolutionary.crossover_p``, the LLM operators split 1 by their preset weights,
    and with ``kind: llm`` the built-ins get 0. Repair is only drawn while a recent failure
    waits; when no LLM operator can run (token budget spent) the built-ins take over."""
    fill_with_builtin: bool = True
    """A child slot whose LLM proposal yields no child gets a knob mutation of the same parent."""
    failure_memory: int = Field(default=8, ge=1)
    """Recent failed candidates (build, runtime, correctness, timeout) kept for repair."""
    agent_shapes: str | None = None
    """The shape subset the agent's tools evaluate on (default: the run's ``shapes``);
    these evaluations are journaled in ``llm_outcomes.jsonl`` but not charged to the budget."""

    def strategy_options(self) -> dict[str, Any]:
        return self.model_dump(exclude={"agent_shapes"})


class OutputConfig(_Model):
    top: int = Field(default=10, ge=1)
    finalists: int = Field(default=3, ge=0)
    """After the budget: the best this many candidates of the search, with the best seed,
    are measured again and the best found is named from those figures (``finalists.py``);
    0: the search's own figures name it."""
    finalist_rounds: int = Field(default=3, ge=1)
    """Fresh evaluations of each finalist; its confirmed fitness is their median."""
    progress: bool = True
    author: str = "evokernel"


class RunConfig(_Model):
    workload: str = "dsa_topk"
    workload_loader: str = "evokernel.workload:load_workload"
    strategy: str = Field(default="evolutionary", min_length=1)
    """A name registered in ``evokernel.strategies.STRATEGIES`` (evolutionary, random,
    greedy, optuna, ...) or an import path ``package.module:Class``."""
    strategy_options: dict[str, Any] = Field(default_factory=dict)
    """Constructor arguments of the strategy, over what it reads from its own section
    (``evolutionary``, ``greedy``, ``optuna``): the way to configure a strategy that has
    no section here."""
    seed: int = 0
    seeds_from: str | None = None
    """A saved population (``populations/<name>`` or its name) whose members are the run's
    seeds instead of the workload's; they are evaluated again like any seed."""
    shapes: str = "auto"
    """A named shape subset of the workload; ``auto``: ``smoke`` on CPU, ``quick`` on GPU."""
    batch_size: Positive | Auto = "auto"
    """Candidates asked per generation and evaluated in parallel; ``auto``: 4 on the CPU,
    8 on a GPU, and at least twice the runtime's evaluators."""
    max_stall: int = Field(default=20, ge=1)
    pipeline: bool | Auto = "auto"
    """Ask the next generation while the current one is evaluated (with results one
    generation old), so that evaluators never wait for a generation's slowest
    evaluation. Off: every generation is told before the next is asked. ``auto``: on
    with several evaluators, off with one (where it would gain nothing). Either way a
    run is reproducible and resumes exactly."""
    run_dir: str | None = None
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig)
    population: PopulationConfig = Field(default_factory=PopulationConfig)
    evolutionary: EvolutionaryConfig = Field(default_factory=EvolutionaryConfig)
    greedy: GreedyConfig = Field(default_factory=GreedyConfig)
    optuna: OptunaConfig = Field(default_factory=OptunaConfig)
    operators: OperatorsConfig = Field(default_factory=OperatorsConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    def resolved(self, cuda: bool, evaluators: int | None = 1) -> RunConfig:
        """Replace every ``auto`` with this machine's value. ``evaluators`` is how many
        evaluations the runtime runs at once; None leaves the values that depend on it
        (``batch_size``, ``pipeline``) as they are, for a runtime not started yet."""
        evaluations, shapes, batch = GPU_DEFAULTS if cuda else CPU_DEFAULTS
        out = self.model_copy(deep=True)
        if out.budget.evaluations == "auto":
            out.budget.evaluations = evaluations
        if out.shapes == "auto":
            out.shapes = shapes
        if evaluators is None:
            return out
        if out.batch_size == "auto":  # every evaluator busy through two rounds a generation
            out.batch_size = max(batch, 2 * evaluators)
        if out.pipeline == "auto":  # overlap generations only where evaluators could wait
            out.pipeline = evaluators > 1
        return out


_TYPE_TAGS = {"int", "float", "str", "bool", "none", "dict", "list"}


def _where(loc: tuple[int | str, ...]) -> str:
    """A dotted key path, without pydantic's union-member tags (``constrained-int``...)."""
    keep = [str(x) for x in loc if not (isinstance(x, str) and (not x.isidentifier() or x in _TYPE_TAGS))]
    return ".".join(keep)


def describe(exc: ValidationError, source: str) -> str:
    """One line for the first problem (and how many other keys have one)."""
    errors = exc.errors()
    first = errors[0]
    where = _where(first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        msg = f"{source}: unknown key {where!r}"
    else:
        msg = f"{source}: {where}: {first['msg']} (got {first.get('input')!r})"
    others = {_where(e["loc"]) for e in errors} - {_where(first["loc"])}
    if others:
        msg += f" (and {len(others)} more)"
    return msg


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must hold a mapping, not {type(data).__name__}")
    return data


def build(layers: list[tuple[str, dict[str, Any]]]) -> RunConfig:
    """Validate the merge of ``(source name, partial dict)`` layers, later ones winning."""
    merged: dict[str, Any] = {}
    for source, layer in layers:
        try:  # validate each layer alone first, so an error names the file or flag it came from
            RunConfig.model_validate(merge(merged, layer))
        except ValidationError as exc:
            raise ConfigError(describe(exc, source)) from None
        merged = merge(merged, layer)
    return RunConfig.model_validate(merged)


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value


def sets_layer(items: list[str]) -> dict[str, Any]:
    """The config layer of ``--set KEY=VALUE`` items (values read as YAML, else text)."""
    layer: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        set_path(layer, key, value)
    return layer


def dump(config: RunConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")
