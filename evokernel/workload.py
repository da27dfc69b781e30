"""Workloads: a FlashInfer-Bench definition, its concrete shapes, a reference,
an input generator and a checker, read from a folder under ``workloads/``.

A new workload is a new folder, not a release: ``workload.yaml`` names the files.
The definition follows the FlashInfer-Bench trace schema (axes, ordered inputs and
outputs; their order is the call signature). flashinfer-bench 0.1.2 on PyPI could
parse it, but it lacks the DSA evaluator and pulls a 1.6 GB dependency, so the
schema is modelled here and checked against the published files in the tests.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evokernel.candidate import Candidate, CandidateFileError, load_candidate

WORKLOADS_DIR = Path(__file__).resolve().parent.parent / "workloads"

DTYPES = {
    "float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "bool": "bool",
}


class WorkloadError(ValueError):
    """A workload that does not exist or whose files are inconsistent."""


class Axis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["const", "var"]
    value: int | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _const_has_value(self) -> Axis:
        if (self.type == "const") != (self.value is not None):
            raise ValueError("a const axis needs a value and a var axis must not have one")
        return self


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    shape: list[str] | None
    dtype: str
    description: str | None = None

    @model_validator(mode="after")
    def _known_dtype(self) -> TensorSpec:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        return self


class Definition(BaseModel):
    """The FlashInfer-Bench definition schema (the fields evokernel uses)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    op_type: str
    description: str | None = None
    tags: list[str] = Field(default_factory=list)
    axes: dict[str, Axis]
    constraints: list[str] = Field(default_factory=list)
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str | None = None

    @model_validator(mode="after")
    def _axes_declared(self) -> Definition:
        overlap = set(self.inputs) & set(self.outputs)
        if overlap:
            raise ValueError(f"names used as both input and output: {sorted(overlap)}")
        for name, spec in {**self.inputs, **self.outputs}.items():
            for axis in spec.shape or []:
                if axis not in self.axes:
                    raise ValueError(f"{name} uses undeclared axis {axis!r}")
        return self

    def const_axes(self) -> dict[str, int]:
        return {n: a.value for n, a in self.axes.items() if a.value is not None}


class Shape(BaseModel):
    """One concrete workload: an id and a value for every var axis."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    uuid: str
    axes: dict[str, int]


class ForbiddenPattern(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    pattern: str
    why: str


class Manifest(BaseModel):
    """``workload.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    definition: str
    shapes: str
    reference: str
    inputs: str
    checker: str | None = None
    seeds: str | None = None
    baselines: str | None = None
    """A folder of candidates to compare against that are never a search's starting point
    (what users run today); loaded and judged exactly like seeds."""
    tolerance: dict[str, float] = Field(default_factory=lambda: {"atol": 1e-2, "rtol": 1e-2})
    forbidden: list[ForbiddenPattern] = Field(default_factory=list)
    policies: dict[str, list[ForbiddenPattern]] = Field(default_factory=dict)
    """Named optional rule sets (e.g. forbidding library top-k) a run can switch on."""
    subsets: dict[str, list[str]] = Field(default_factory=dict)
    rows: str | None = None
    """An axis along which calls are independent, if there is one: stacking several calls'
    inputs along it (the inputs without it shared) gives the reference their stacked
    outputs, and the checker's verdict on stacked outputs is that of every call's. The
    judge then checks many calls in one checker call. Leave it unset where the rule looks
    at a whole output (fused_moe's "90% of elements")."""


def _import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def available_workloads(root: Path | None = None) -> list[str]:
    root = root or workloads_root()
    return sorted(p.parent.name for p in root.glob("*/workload.yaml"))


def workloads_root() -> Path:
    return Path(os.environ.get("EVOKERNEL_WORKLOADS", WORKLOADS_DIR))


class Workload:
    """One workload folder, loaded and validated."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        manifest_path = directory / "workload.yaml"
        try:
            self.manifest = Manifest.model_validate(yaml.safe_load(manifest_path.read_text()))
            self.definition = Definition.model_validate_json(
                (directory / self.manifest.definition).read_text()
            )
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise WorkloadError(f"workload {directory.name}: {exc}") from exc
        self.name = self.manifest.name
        self.shapes = self._read_shapes(directory / self.manifest.shapes)
        self.subsets = {"all": list(self.shapes), **self.manifest.subsets}
        for subset, ids in self.subsets.items():
            missing = [i for i in ids if i not in self.shapes]
            if missing:
                raise WorkloadError(f"subset {subset!r} names unknown shapes {missing[:3]}")
        self.row_axis = self.manifest.rows
        if self.row_axis is not None:
            firsts = [spec.shape[0] if spec.shape else None for spec in self.definition.outputs.values()]
            if self.row_axis not in self.definition.axes or any(f != self.row_axis for f in firsts):
                raise WorkloadError(f"workload {directory.name}: rows {self.row_axis!r} must be an "
                                    "axis of the definition and the first axis of every output")
        self.forbidden = [(re.compile(f.pattern), f.why) for f in self.manifest.forbidden]
        self.policies = {
            name: [(re.compile(f.pattern), f.why) for f in rules]
            for name, rules in self.manifest.policies.items()
        }

    def _read_shapes(self, path: Path) -> dict[str, Shape]:
        var_axes = [n for n, a in self.definition.axes.items() if a.type == "var"]
        try:
            rows = list(csv.DictReader(path.open()))
        except OSError as exc:
            raise WorkloadError(f"workload {self.directory.name}: {exc}") from exc
        shapes = {}
        for row in rows:
            missing = [a for a in var_axes if a not in row]
            if missing:
                raise WorkloadError(f"{path.name}: no column for var axes {missing}")
            axes = {a: int(row[a]) for a in var_axes}
            # Further whole-number columns (a published per-workload constant such as
            # fused_moe's local_expert_offset) reach make_inputs with the axes.
            for column, value in row.items():
                if column not in axes and column != "uuid" and value and value.lstrip("-").isdigit():
                    axes[column] = int(value)
            shapes[row["uuid"]] = Shape(uuid=row["uuid"], axes=axes)
        if not shapes:
            raise WorkloadError(f"{path.name} lists no shapes")
        return shapes

    # -- the workload's code ------------------------------------------------------------

    @cached_property
    def _inputs_module(self) -> ModuleType:
        return _import_file(self.directory / self.manifest.inputs, f"evk_{self.name}_inputs")

    @cached_property
    def _checker_module(self) -> ModuleType | None:
        if self.manifest.checker is None:
            return None
        return _import_file(self.directory / self.manifest.checker, f"evk_{self.name}_check")

    @cached_property
    def reference_source(self) -> str:
        return (self.directory / self.manifest.reference).read_text()

    @cached_property
    def reference(self) -> Callable[..., tuple[Any, ...]]:
        module = _import_file(self.directory / self.manifest.reference, f"evk_{self.name}_ref")
        run = getattr(module, "run", None)
        if not callable(run):
            raise WorkloadError(f"{self.manifest.reference} defines no run()")
        return run  # type: ignore[no-any-return]

    @property
    def input_names(self) -> list[str]:
        return list(self.definition.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.definition.outputs)

    def axes_of(self, shape_id: str) -> dict[str, int]:
        return {**self.definition.const_axes(), **self.shape(shape_id).axes}

    def shape(self, shape_id: str) -> Shape:
        try:
            return self.shapes[shape_id]
        except KeyError:
            raise WorkloadError(f"workload {self.name} has no shape {shape_id!r}") from None

    def resolve_shapes(self, names: str | Sequence[str]) -> list[str]:
        """Subset names and shape ids (a list, or one string separated by commas) to shape
        ids, in order, each once."""
        items = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        out: list[str] = []
        for item in items:
            if item in self.subsets:
                out.extend(self.subsets[item])
            elif item in self.shapes:
                out.append(item)
            else:
                raise WorkloadError(
                    f"workload {self.name} has no shape subset {item!r} "
                    f"(subsets: {', '.join(sorted(self.subsets))})"
                )
        return list(dict.fromkeys(out))

    def make_inputs(self, shape_id: str, seed: int, device: Any = "cpu") -> dict[str, Any]:
        inputs: dict[str, Any] = self._inputs_module.make_inputs(
            self.axes_of(shape_id), seed, device
        )
        if list(inputs) != self.input_names:
            raise WorkloadError(f"make_inputs returned {list(inputs)}, expected {self.input_names}")
        return inputs

    def allocate_outputs(self, shape_id: str, device: Any) -> list[Any]:
        """Output buffers for destination-passing calls (uninitialised)."""
        import torch

        axes = self.axes_of(shape_id)
        return [
            torch.empty(
                [axes[a] for a in spec.shape or []], dtype=getattr(torch, spec.dtype), device=device
            )
            for spec in self.definition.outputs.values()
        ]

    @property
    def checker(self) -> Callable[..., Any] | None:
        """The workload's own ``check(outputs, expected, inputs, *, atol, rtol)``, if it has one.

        Without one, the judge compares element by element (evaluate/check.py).
        """
        module = self._checker_module
        return None if module is None else module.check  # type: ignore[no-any-return]

    @property
    def expected_outputs(self) -> Callable[..., tuple[Any, ...]]:
        """What the judge computes expected outputs with: the checker module's
        ``expected(*inputs)`` where it has one (a faster function whose outputs the checker
        accepts wherever it accepts the reference's; a test of the workload's shows it),
        else the reference."""
        fast = getattr(self._checker_module, "expected", None)
        return fast if fast is not None else self.reference  # type: ignore[no-any-return]

    @property
    def row_inputs(self) -> list[str]:
        """Inputs whose first axis is ``row_axis`` (stacked when calls are); none without one."""
        if self.row_axis is None:
            return []
        return [n for n, spec in self.definition.inputs.items()
                if spec.shape and spec.shape[0] == self.row_axis]

    @property
    def tolerance(self) -> dict[str, float]:
        return dict(self.manifest.tolerance)

    def vary_inputs(
        self, shape_id: str, inputs: Mapping[str, Any], seed: int, device: Any = "cpu"
    ) -> dict[str, Any] | None:
        """Fresh values for the workload's cheap-to-vary inputs, or None if it declares none.

        ``inputs.py`` may define ``vary_inputs(inputs, axes, seed, device)`` returning new
        tensors (same shapes and dtypes) for a subset of the inputs; the judge gives every
        timed call such a variant, so that no result can be served from a cache.
        """
        fn = getattr(self._inputs_module, "vary_inputs", None)
        if fn is None:
            return None
        varied: dict[str, Any] = dict(fn(inputs, self.axes_of(shape_id), seed, device))
        unknown = [n for n in varied if n not in self.definition.inputs]
        if unknown:
            raise WorkloadError(f"vary_inputs returned unknown inputs {unknown}")
        for name, value in varied.items():
            if tuple(value.shape) != tuple(inputs[name].shape) or value.dtype != inputs[name].dtype:
                raise WorkloadError(f"vary_inputs changed the shape or dtype of {name}")
        return varied

    def cost(self, inputs: Mapping[str, Any]) -> dict[str, float] | None:
        """Least bytes and flops for these inputs, if the workload models them."""
        fn = getattr(self._inputs_module, "cost", None)
        return None if fn is None else dict(fn(inputs))

    # -- seeds --------------------------------------------------------------------------

    def seeds(self) -> list[Candidate]:
        """Seed candidates: every manifest, and every .py file no manifest claims."""
        return self._candidates(self.manifest.seeds, "seed")

    def baselines(self) -> list[Candidate]:
        """Baseline candidates (never seeds), found in their folder as seeds are in theirs."""
        return self._candidates(self.manifest.baselines, "baseline")

    def _candidates(self, folder_name: str | None, kind: str) -> list[Candidate]:
        if folder_name is None:
            return []
        folder = self.directory / folder_name
        manifests = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
        claimed: set[str] = set()
        for path in manifests:
            data = yaml.safe_load(path.read_text()) or {}
            claimed.update(str(s) for s in data.get("sources", []))
        singles = [p for p in sorted(folder.glob("*.py")) if p.name not in claimed]
        out = []
        for path in [*manifests, *singles]:
            try:
                out.append(load_candidate(path, self.name))
            except CandidateFileError as exc:
                raise WorkloadError(f"{kind} {path.name}: {exc}") from exc
        return out


def load_workload(name: str, root: Path | None = None) -> Workload:
    """Load ``workloads/<name>``; an unknown name is a WorkloadError listing the known ones."""
    root = root or workloads_root()
    directory = root / name
    if not (directory / "workload.yaml").is_file():
        known = ", ".join(available_workloads(root)) or "none"
        raise WorkloadError(f"unknown workload {name!r} (known: {known})")
    return Workload(directory)
