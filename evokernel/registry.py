"""Named extension points: strategies, operators and evaluators are found by name here.

A registry maps a short name (``evolutionary``, ``knob_mutation``, ``sandbox``) to an
object, usually a class. An entry can be the object itself or an import path
``package.module:attribute`` that is imported on first use, so registering the
built-ins costs no import of torch, Ray or the sandbox. Wherever a name is looked
up, an import path works as well: a config may say ``strategy: mypkg.mine:Mine``
without registering anything, which is also how a class defined outside
evokernel reaches Ray workers and resumed runs.

Adding a strategy, an operator or an evaluator is one file plus one call::

    from evokernel.strategies import STRATEGIES
    STRATEGIES.register("annealing", Annealing)
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name no registry entry has; the message lists the known names (one line)."""


def load_object(spec: str) -> Any:
    """Import ``package.module:attribute``; ``ValueError`` (one line) if that fails."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r} is not of the form 'package.module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r}: {str(exc).splitlines()[0]}") from None


class Registry(Generic[T]):
    """Names to objects of one kind (``what`` names the kind in error messages)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, obj: T | str, *, replace: bool = False) -> None:
        """Make ``obj`` (or the import path ``package.module:attribute``) known as ``name``.

        Registering a taken name is an error unless ``replace``: two plugins must not
        silently shadow each other.
        """
        if not name or ":" in name:
            raise ValueError(f"{self.what} name {name!r}: give a plain name (no ':')")
        if name in self._entries and not replace and self._entries[name] is not obj:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = obj

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The object registered as ``name``, or imported from ``name`` if it is a path."""
        if ":" in name:
            return load_object(name)  # type: ignore[no-any-return]
        if name not in self._entries:
            raise UnknownName(f"unknown {self.what} {name!r}; known: {', '.join(self.names())}")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = load_object(entry)
            self._entries[name] = entry
        return entry  # type: ignore[return-value]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
