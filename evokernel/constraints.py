"""Declared constraints between a candidate's parameters.

A manifest may list Python boolean expressions over its parameter names::

    constraints:
      - "MODE != 'cluster' or CTAS <= 8"
      - "WARPS * STAGES * 8448 <= 232448"

A combination of values is valid when every expression is true. Invalid combinations
are those a kernel family cannot build or launch; declaring them lets the engine
never propose one, instead of paying an evaluation to learn it.

Expressions are a small, checked subset of Python (names, literals, arithmetic,
comparisons, ``and``/``or``/``not``, conditional expressions, tuples for ``in``,
and ``min``/``max``/``abs``), compiled once and evaluated with no builtins.

:func:`repair` turns an invalid combination into a valid one near it (used when an
operator changes some values: the values it chose are kept where possible, the
others adapt); :func:`count_valid` counts the valid combinations of a space without
enumerating its whole product, and :func:`sample_valid` draws from them uniformly.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, Protocol

import numpy as np

Value = int | float | str | bool

_FUNCTIONS: dict[str, Any] = {"min": min, "max": max, "abs": abs}
_ALLOWED_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
    ast.LShift, ast.RShift, ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt,
    ast.GtE, ast.In, ast.NotIn, ast.IfExp, ast.Name, ast.Load, ast.Constant, ast.Tuple,
    ast.List, ast.Call,
)
MAX_ENUMERATION = 40_000_000
"""Most combinations (the product of the choices) of one group of linked parameters that
:func:`count_valid` and :func:`sample_valid` enumerate. The depth-first enumeration
prunes every partial combination a rule already breaks, so its time follows the valid
combinations (a band of cuda_family: 26.5 million, 276 thousand valid, 1.7 s on one core)."""


class ParamChoices(Protocol):
    """What the constraint functions need of a declared parameter."""

    @property
    def choices(self) -> tuple[Value, ...]: ...

    @property
    def initial(self) -> Value: ...


@dataclass(frozen=True)
class Constraint:
    """One compiled expression and the parameter names it reads."""

    text: str
    names: frozenset[str]
    code: CodeType

    def holds(self, values: Mapping[str, Value]) -> bool:
        return bool(eval(self.code, {"__builtins__": {}, **_FUNCTIONS}, dict(values)))


@functools.lru_cache(maxsize=4096)
def parse(text: str) -> Constraint:
    """Compile one expression; ValueError, saying what is wrong, if it is not allowed."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"constraint {text!r} is not a Python expression: {exc.msg}") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"constraint {text!r} uses {type(node).__name__}, which is not allowed")
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS) or node.keywords:
                raise ValueError(f"constraint {text!r} may call only min, max and abs")
        elif isinstance(node, ast.Name) and node.id not in _FUNCTIONS:
            names.add(node.id)
        elif isinstance(node, ast.Constant) and not isinstance(node.value, int | float | str | bool):
            raise ValueError(f"constraint {text!r} has a literal of type {type(node.value).__name__}")
    return Constraint(text, frozenset(names), compile(tree, "<constraint>", "eval"))


def check_declared(texts: Iterable[str], names: Iterable[str]) -> list[Constraint]:
    """Parse every constraint and check it reads only declared parameters."""
    known = set(names)
    out = []
    for text in texts:
        constraint = parse(text)
        unknown = sorted(constraint.names - known)
        if unknown:
            raise ValueError(f"constraint {text!r} names undeclared parameters {unknown}")
        out.append(constraint)
    return out


def violated(constraints: Sequence[Constraint], values: Mapping[str, Value]) -> list[Constraint]:
    """The constraints the values break (an expression that raises counts as broken)."""
    broken = []
    for c in constraints:
        try:
            ok = c.holds(values)
        except Exception:
            ok = False
        if not ok:
            broken.append(c)
    return broken


def repair(
    values: Mapping[str, Value],
    space: Mapping[str, ParamChoices],
    constraints: Sequence[Constraint],
    keep: Iterable[str] = (),
) -> dict[str, Value]:
    """A valid combination near ``values``: the values themselves if they are valid.

    Greedy and deterministic: at each step the single change (of a parameter read by
    a broken constraint, to another of its declared choices) that leaves the fewest
    broken constraints is made; ties go to a parameter's default, then to earlier
    names and choices. Where no single change helps (a constraint that needs two
    parameters changed at once, e.g. ``A != x or (B >= 4 and C == y)``, or a change that
    frees one rule only by breaking another, which a second parameter then mends), the
    best pair of changes is made. Parameters in
    ``keep`` (the values an operator chose) change only if changing the others
    cannot help. ValueError if no valid combination is reached.
    """
    current = dict(values)
    if not violated(constraints, current):
        return current
    keep = set(keep)
    for allowed in (set(space) - keep, set(space)):
        current = _descend(current, space, constraints, allowed)
        if not violated(constraints, current):
            return current
    texts = [c.text for c in violated(constraints, current)]
    raise ValueError(f"no valid parameter combination near {dict(values)}: still breaks {texts}")


def _descend(
    values: dict[str, Value],
    space: Mapping[str, ParamChoices],
    constraints: Sequence[Constraint],
    allowed: set[str],
) -> dict[str, Value]:
    current = dict(values)
    broken = violated(constraints, current)
    for _ in range(2 * len(space) + 1):
        if not broken:
            break
        names = sorted({n for c in broken for n in c.names} & allowed)
        moves = [(name, choice) for name in names
                 for choice in _ordered_choices(space[name]) if choice != current[name]]
        best: tuple[list[Constraint], dict[str, Value]] | None = None
        for name, choice in moves:
            trial = violated(constraints, {**current, name: choice})
            if best is None or len(trial) < len(best[0]):
                best = (trial, {name: choice})
        if best is None or len(best[0]) >= len(broken):
            # pairs: the second change of a parameter the first one's broken rules read
            # (wgmma -> fp8 frees LOAD but breaks "EARLY == 0 or SCORE == 'wgmma'")
            for first, a in moves:
                after = {**current, first: a}
                seconds = sorted(({n for c in violated(constraints, after) for n in c.names} | set(names))
                                 & allowed - {first})
                for second in seconds:
                    for b in _ordered_choices(space[second]):
                        if b == current[second] or (second < first and second in names):
                            continue  # unchanged, or a pair of the first kind already tried
                        trial = violated(constraints, {**after, second: b})
                        if len(trial) < len(broken) and (best is None or len(trial) < len(best[0])):
                            best = (trial, {first: a, second: b})
        if best is None or len(best[0]) >= len(broken):
            break
        broken, changes = best
        current.update(changes)
    return current


def _ordered_choices(param: ParamChoices) -> list[Value]:
    """A parameter's choices, its default first (the preferred change)."""
    return [param.initial, *(c for c in param.choices if c != param.initial)]


def _groups(space: Mapping[str, ParamChoices], constraints: Sequence[Constraint]) -> list[set[str]]:
    """Parameters linked (directly or not) by shared constraints, one set per group."""
    parent = {n: n for n in space}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for c in constraints:
        if not c.names <= set(space):
            raise ValueError(f"constraint {c.text!r} names parameters outside the space: "
                             f"{sorted(c.names - set(space))}")
        if not c.names:
            continue
        first, *rest = sorted(c.names)
        for other in rest:
            parent[root(other)] = root(first)
    groups: dict[str, set[str]] = {}
    for n in space:
        groups.setdefault(root(n), set()).add(n)
    return list(groups.values())


def _valid_in_group(
    space: Mapping[str, ParamChoices], constraints: Sequence[Constraint], group: set[str]
) -> tuple[list[str], list[tuple[Value, ...]] | None]:
    """The group's names and its valid combinations (None: no constraint, all are)."""
    names = sorted(group)
    rules = [c for c in constraints if c.names and c.names <= group]
    if not rules:
        return names, None
    size = math.prod(len(space[n].choices) for n in names)
    if size > MAX_ENUMERATION:
        raise ValueError(f"{size} combinations of {names} are too many to enumerate")
    choices = tuple((n, tuple(space[n].choices)) for n in names)
    return names, list(_enumerate_valid(choices, tuple(sorted(rules, key=lambda c: c.text))))


@functools.lru_cache(maxsize=64)
def _enumerate_valid(choices: tuple[tuple[str, tuple[Value, ...]], ...],
                     rules: tuple[Constraint, ...]) -> tuple[tuple[Value, ...], ...]:
    """Every combination of ``choices`` (name, values), in ``itertools.product`` order,
    that breaks none of ``rules``. Depth first: the parameters most rules read are
    assigned first, and each rule is tried as soon as its last parameter is, so a
    partial combination that breaks one is never extended (a band of cuda_family: 8.8
    million combinations, 194 thousand valid, in a fraction of the time of trying each)."""
    names = [n for n, _ in choices]
    reads = {n: sum(n in c.names for c in rules) for n in names}
    order = sorted(range(len(names)), key=lambda i: (-reads[names[i]], i))
    due: list[list[Constraint]] = [[] for _ in order]  # rules decided at each depth
    assigned: set[str] = set()
    for depth, i in enumerate(order):
        assigned.add(names[i])
        due[depth] = [c for c in rules if c.names <= assigned
                      and not c.names <= assigned - {names[i]}]
    found: list[tuple[int, ...]] = []  # each combination as the positions of its values
    values: dict[str, Value] = {}
    picked: list[int] = [0] * len(names)

    def extend(depth: int) -> None:
        if depth == len(order):
            found.append(tuple(picked))
            return
        i = order[depth]
        name, options = choices[i]
        for k, value in enumerate(options):
            values[name] = value
            if not violated(due[depth], values):
                picked[i] = k
                extend(depth + 1)
        del values[name]

    extend(0)
    found.sort()  # the order itertools.product gives (callers draw from it by index)
    return tuple(tuple(choices[i][1][k] for i, k in enumerate(combo)) for combo in found)


def valid_combinations(space: Mapping[str, ParamChoices], constraints: Sequence[Constraint],
                       ) -> tuple[list[str], list[tuple[Value, ...]]]:
    """The space's names (sorted) and every combination of their choices that breaks none
    of ``constraints``, in ``itertools.product`` order (at most :data:`MAX_ENUMERATION`
    combinations, else ValueError)."""
    names, valid = _valid_in_group(space, constraints, set(space))
    if valid is None:
        return names, list(itertools.product(*(space[n].choices for n in names)))
    return names, valid


def _constant_false(constraints: Sequence[Constraint]) -> bool:
    return any(not c.names and not c.holds({}) for c in constraints)


def count_valid(space: Mapping[str, ParamChoices], constraints: Sequence[Constraint]) -> int:
    """How many combinations of declared choices satisfy every constraint.

    Parameters no constraint links are counted by multiplication, so only each
    group of linked parameters is enumerated (at most :data:`MAX_ENUMERATION`
    combinations per group, else ValueError).
    """
    if _constant_false(constraints):
        return 0
    total = 1
    for group in _groups(space, constraints):
        names, valid = _valid_in_group(space, constraints, group)
        total *= math.prod(len(space[n].choices) for n in names) if valid is None else len(valid)
    return total


def sample_valid(
    space: Mapping[str, ParamChoices], constraints: Sequence[Constraint], rng: np.random.Generator,
    n: int,
) -> list[dict[str, Value]]:
    """``n`` combinations drawn uniformly (with replacement) from the valid ones.

    Each group of linked parameters is drawn from its enumerated valid combinations,
    every other parameter from its choices; deterministic given the generator's state.
    """
    if _constant_false(constraints):
        raise ValueError("a constraint over no parameter is false: nothing is valid")
    groups = [_valid_in_group(space, constraints, g) for g in _groups(space, constraints)]
    for names, valid in groups:
        if valid == []:
            raise ValueError(f"no valid combination of {names}")
    out = []
    for _ in range(n):
        values: dict[str, Value] = {}
        for names, valid in groups:
            if valid is None:
                for name in names:
                    choices = space[name].choices
                    values[name] = choices[int(rng.integers(len(choices)))]
            else:
                values.update(zip(names, valid[int(rng.integers(len(valid)))], strict=True))
        out.append(values)
    return out
