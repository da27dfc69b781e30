"""The static screen: every import form, calls that load code, computed attribute names."""

from __future__ import annotations

import pytest

from evokernel.candidate import Candidate, Language
from evokernel.evaluate.static import static_violations
from evokernel.workload import available_workloads, load_workload

WL = load_workload("dsa_topk")


def screen(source: str, policies: tuple[str, ...] = ()) -> list[str]:
    candidate = Candidate(workload="dsa_topk", language=Language.TORCH, sources={"k.py": source},
                          entry_point="k.py::build")
    return static_violations(candidate, WL, policies)


@pytest.mark.parametrize("source, says", [
    ("import json, subprocess", "spawning processes"),
    ("from subprocess import run", "spawning processes"),
    ("import socket as s", "network"),
    ("import runpy", "loading code by name"),
    ("import importlib.util", "loading code by name"),
    ("import ctypes", "foreign-function"),
    ("x = __import__('os')", "loading code by name"),
    ("exec('print(1)')", "executing generated code"),
    ("eval(code)", "executing generated code"),
    ("compile(src, 'f', 'exec')", "executing generated code"),
    ("import torch\nf = getattr(torch, 'to' + 'pk')", "computed name"),
    ("import os\nos.system('true')", "process control"),
    ("import os\nos.execv('/bin/sh', [])", "process control"),
    ("import os\ngetattr(os, '_exit')(3)", "process control"),
    ("import sys\nsys._getframe(1)", "interpreter"),
    ("def f():\n    return f.__globals__", "interpreter"),
    ("import evokernel.evaluate.judge", "evaluator"),
    ("import flashinfer", "vendor kernel libraries"),
])
def test_forbidden_forms_are_found(source: str, says: str) -> None:
    found = screen(source)
    assert found and any(says in f for f in found), found


def test_policies_add_rules_and_a_syntax_error_is_left_to_the_build() -> None:
    assert screen("import torch\nv = torch.topk(x, 4)") == []
    assert screen("import torch\nv = torch.topk(x, 4)", ("no_library_topk",))
    assert screen("def broken(:\n") == []


@pytest.mark.parametrize("name", available_workloads())
def test_every_workloads_seeds_pass(name: str) -> None:
    workload = load_workload(name)
    for seed in workload.seeds():
        assert static_violations(seed, workload) == [], seed.name
