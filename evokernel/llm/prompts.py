"""Prompt text: templates from ``operators/prompts/`` and renderings of candidates and results.

Templates are data (``$name`` placeholders, ``string.Template``) so that a researcher
changes what the model is told without touching code; a template that names an
unknown placeholder fails loudly on first use rather than sending a broken prompt.
"""

from __future__ import annotations

import os
import string
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status

OPERATORS_DIR = Path(__file__).resolve().parent.parent.parent / "operators"
FEEDBACK_CHARS = 1500
"""Feedback text kept per evaluation: compiler errors lead, long logs do not fit a prompt."""


def operators_root() -> Path:
    return Path(os.environ.get("EVOKERNEL_OPERATORS", OPERATORS_DIR))


@lru_cache(maxsize=64)
def _template(path: Path) -> string.Template:
    return string.Template(path.read_text())


def render(name: str, root: Path | None = None, **values: Any) -> str:
    """Fill ``<root>/prompts/<name>.md``; KeyError names a placeholder left unfilled."""
    path = (root or operators_root()) / "prompts" / f"{name}.md"
    return _template(path).substitute({k: str(v) for k, v in values.items()}).strip() + "\n"


def _fence_lang(path: str) -> str:
    return {".py": "python", ".cu": "cuda", ".cuh": "cuda", ".h": "cuda"}.get(Path(path).suffix, "")


def describe_candidate(candidate: Candidate) -> str:
    """Language, parameters (declared choices and current values) and every source file."""
    lines = [f"language: {candidate.language.value}; entry point: {candidate.entry_point}"]
    values = candidate.params
    for kind, space in (("knob", candidate.knob_space), ("launch", candidate.launch_space)):
        for name, param in sorted(space.items()):
            choices = ", ".join(repr(c) for c in param.choices)
            lines.append(f"- {kind} parameter {name} = {values[name]!r} (choices: {choices})")
    for path, text in candidate.sources.items():
        lines.append(f"\n```{_fence_lang(path)} {path}\n{text.rstrip()}\n```")
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def describe_evaluation(
    evaluation: Evaluation | None, floor_ms: Mapping[str, float] | None = None
) -> str:
    """Status, per-shape timings against the reference (and the memory floor where known),
    resources and the head of the feedback text."""
    if evaluation is None:
        return "not evaluated yet"
    floors = floor_ms or {}
    lines = [f"status: {evaluation.status.value}"]
    if evaluation.fitness is not None:
        lines[0] += f"; speedup over the reference (geometric mean): {evaluation.fitness:.3f}x"
    if evaluation.shapes:
        header = "shape | status | ms | reference ms | speedup"
        lines.append(header + (" | floor ms" if floors else ""))
        for s in evaluation.shapes:
            sp = s.speedup
            row = [
                s.shape[:8], s.status.value,
                _ms(s.timing.median_ms if s.timing else None),
                _ms(s.reference.median_ms if s.reference else None),
                "-" if sp is None else f"{sp:.3f}x",
            ]
            if floors:
                row.append(_ms(floors.get(s.shape)))
            if s.status is not Status.PASSED and s.message:
                row.append(s.message.splitlines()[0][:160])
            lines.append(" | ".join(row))
    if evaluation.resources:
        lines.append("resources: " + ", ".join(f"{k}={v:g}" for k, v in sorted(evaluation.resources.items())))
    if evaluation.feedback.strip():
        text = evaluation.feedback.strip()
        if len(text) > FEEDBACK_CHARS:
            text = text[:FEEDBACK_CHARS] + "\n[... feedback cut ...]"
        lines.append("feedback:\n" + text)
    return "\n".join(lines)


def workload_brief(workload: Any) -> str:
    """What the kernel computes, from a workload's definition (any object with one)."""
    definition = getattr(workload, "definition", None)
    if definition is None:
        return f"workload {getattr(workload, 'name', workload)}"
    lines = [f"{definition.name}: {definition.description or definition.op_type}"]
    const = ", ".join(f"{n}={v}" for n, v in definition.const_axes().items())
    if const:
        lines.append(f"constant axes: {const}")
    for role, specs in (("input", definition.inputs), ("output", definition.outputs)):
        for name, spec in specs.items():
            shape = ", ".join(spec.shape or [])
            note = f": {spec.description}" if getattr(spec, "description", None) else ""
            lines.append(f"- {role} {name} [{shape}] {spec.dtype}{note}")
    return "\n".join(lines)
