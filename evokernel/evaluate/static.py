"""The static screen: a pass over a candidate's sources before anything of it runs.

It is advisory: the defence is the runtime boundary (a confined process that holds
nothing which decides its verdict or its time; see judge.py and isolation.py). The
screen only turns away early, with a clear reason an LLM operator can act on, what
no honest kernel needs: starting processes, opening connections, loading code by
name (``importlib``, ``runpy``, ``exec``, ``eval``, ``compile``, ``__import__``),
foreign-function access (``ctypes``, ``cffi``), reaching into the interpreter or the
evaluator (frames, ``sys.modules``, builtins, ``evokernel``), attribute access by a
computed name (``getattr(torch, "to" + "pk")``), and whatever the workload forbids
(vendor kernel libraries) or a run's policies add.

Python sources are parsed (every import form is seen, ``import a, b`` included);
the workload's patterns are matched on every source as text.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence

from evokernel.candidate import Candidate
from evokernel.workload import Workload

FORBIDDEN_MODULES = {
    "subprocess": "spawning processes is not allowed",
    "multiprocessing": "spawning processes is not allowed",
    "concurrent": "spawning processes is not allowed",
    "pty": "spawning processes is not allowed",
    "socket": "opening network connections is not allowed",
    "ssl": "opening network connections is not allowed",
    "urllib": "opening network connections is not allowed",
    "http": "opening network connections is not allowed",
    "requests": "opening network connections is not allowed",
    "httpx": "opening network connections is not allowed",
    "importlib": "loading code by name is not allowed",
    "runpy": "loading code by name is not allowed",
    "pickle": "loading code by name is not allowed",
    "marshal": "loading code by name is not allowed",
    "ctypes": "foreign-function access is not allowed",
    "cffi": "foreign-function access is not allowed",
    "inspect": "reaching into the interpreter is not allowed",
    "gc": "reaching into the interpreter is not allowed",
    "builtins": "reaching into the interpreter is not allowed",
    "traceback": "reaching into the interpreter is not allowed",
    "evokernel": "a candidate may not import or patch the evaluator",
}
FORBIDDEN_CALLS = {
    "exec": "executing generated code is not allowed",
    "eval": "executing generated code is not allowed",
    "compile": "executing generated code is not allowed",
    "__import__": "loading code by name is not allowed",
    "globals": "reaching into the interpreter is not allowed",
    "vars": "reaching into the interpreter is not allowed",
    "breakpoint": "reaching into the interpreter is not allowed",
}
FORBIDDEN_ATTRIBUTES = {
    "system": "process control from a kernel is not allowed",
    "popen": "process control from a kernel is not allowed",
    "fork": "process control from a kernel is not allowed",
    "forkpty": "process control from a kernel is not allowed",
    "kill": "process control from a kernel is not allowed",
    "killpg": "process control from a kernel is not allowed",
    "_exit": "process control from a kernel is not allowed",
    "setns": "process control from a kernel is not allowed",
    "setsid": "process control from a kernel is not allowed",
    "setpgid": "process control from a kernel is not allowed",
    "ftruncate": "resizing files or shared memory is not allowed",
    "truncate": "resizing files or shared memory is not allowed",
    "modules": "reaching into the interpreter is not allowed",
    "_getframe": "reaching into the interpreter is not allowed",
    "f_back": "reaching into the interpreter is not allowed",
    "f_globals": "reaching into the interpreter is not allowed",
    "f_locals": "reaching into the interpreter is not allowed",
    "gi_frame": "reaching into the interpreter is not allowed",
    "tb_frame": "reaching into the interpreter is not allowed",
    "__globals__": "reaching into the interpreter is not allowed",
    "__builtins__": "reaching into the interpreter is not allowed",
    "__subclasses__": "reaching into the interpreter is not allowed",
    "__code__": "reaching into the interpreter is not allowed",
}
_PROCESS_PREFIXES = ("exec", "spawn", "posix_spawn")
_DYNAMIC = {"getattr", "setattr", "delattr", "hasattr"}


def _findings(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in FORBIDDEN_MODULES:
                    yield node.lineno, FORBIDDEN_MODULES[root], f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            root = (node.module or "").split(".")[0]
            if root in FORBIDDEN_MODULES:
                yield node.lineno, FORBIDDEN_MODULES[root], f"from {node.module} import"
            for alias in node.names:  # from os import fork, execv
                if alias.name in FORBIDDEN_ATTRIBUTES:
                    yield node.lineno, FORBIDDEN_ATTRIBUTES[alias.name], f"import {alias.name}"
                elif root == "os" and alias.name.startswith(_PROCESS_PREFIXES):
                    yield (node.lineno, "process control from a kernel is not allowed",
                           f"import {alias.name}")
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if name in FORBIDDEN_ATTRIBUTES:
                yield node.lineno, FORBIDDEN_ATTRIBUTES[name], f".{name}"
            elif name.startswith(_PROCESS_PREFIXES) and isinstance(node.value, ast.Name) \
                    and node.value.id == "os":
                yield node.lineno, "process control from a kernel is not allowed", f"os.{name}"
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__import__"):
            yield node.lineno, "reaching into the interpreter is not allowed", node.id
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in FORBIDDEN_CALLS:
                yield node.lineno, FORBIDDEN_CALLS[name], f"{name}(...)"
            elif name in _DYNAMIC and len(node.args) >= 2 and not (
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            ):
                yield node.lineno, "attribute access by a computed name is not allowed", f"{name}(...)"
            elif name in _DYNAMIC and len(node.args) >= 2:
                attr = node.args[1].value  # type: ignore[attr-defined]
                if attr in FORBIDDEN_ATTRIBUTES:
                    yield node.lineno, FORBIDDEN_ATTRIBUTES[attr], f"{name}(..., {attr!r})"


def policy_rules(workload: Workload, policies: Sequence[str]) -> list[tuple[re.Pattern[str], str]]:
    """The rules of the named policies; an unknown name is a ValueError."""
    unknown = [p for p in policies if p not in workload.policies]
    if unknown:
        known = ", ".join(sorted(workload.policies)) or "none"
        raise ValueError(f"workload {workload.name} has no policy {unknown[0]!r} (known: {known})")
    return [rule for p in policies for rule in workload.policies[p]]


def static_violations(
    candidate: Candidate, workload: Workload, policies: Sequence[str] = ()
) -> list[str]:
    """Why the candidate is turned away before it runs; empty if it is not."""
    found = []
    rules = [*workload.forbidden, *policy_rules(workload, policies)]
    for path, source in sorted(candidate.sources.items()):
        if path.endswith(".py"):
            try:
                tree = ast.parse(source)
            except SyntaxError:
                tree = None  # the build reports it, with the line
            if tree is not None:
                for line, why, what in sorted(set(_findings(tree))):
                    found.append(f"{path}:{line}: {why} ({what})")
        for pattern, why in rules:
            match = pattern.search(source)
            if match:
                line = source.count("\n", 0, match.start()) + 1
                found.append(f"{path}:{line}: {why} ({match.group(0)!r})")
    return found
