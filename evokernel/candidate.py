"""Candidate kernels: frozen, content-hashed, with their declared parameter spaces.

A candidate is everything needed to rebuild one kernel variant: its sources, the
entry point, and the values chosen for its declared parameters. Two kinds of
parameters exist, with the same representation but different owners:

* ``knobs`` shape the algorithm (tile sizes, top-k algorithm, split thresholds);
  the built-in mutation and crossover operators change them.
* ``launch`` are launch parameters (threads per block, CTAs per row); Optuna tunes
  them for one candidate without changing its code.

The id is a hash of the content, so equal content means equal id and a cache keyed
by id never returns another kernel's result.

A manifest may also declare ``constraints`` between parameters (see
evokernel/constraints.py): a candidate whose values break one is refused, and
``with_params`` repairs a combination an operator asks for into a valid one near
it, so no operator ever proposes what the family cannot build.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evokernel import constraints as rules

ParamValue = int | float | str | bool

_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Language(str, Enum):
    """How a candidate's sources are built."""

    TORCH = "torch"
    TRITON = "triton"
    CUDA = "cuda"


class Param(BaseModel):
    """One declared parameter: an ordered list of allowed values and a default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    choices: tuple[ParamValue, ...] = Field(min_length=1)
    default: ParamValue | None = None

    @model_validator(mode="after")
    def _default_in_choices(self) -> Param:
        if self.default is not None and self.default not in self.choices:
            raise ValueError(f"default {self.default!r} is not one of {list(self.choices)}")
        return self

    @property
    def initial(self) -> ParamValue:
        return self.choices[0] if self.default is None else self.default


ParamSpace = dict[str, Param]


def _check_values(space: Mapping[str, Param], values: Mapping[str, ParamValue], kind: str) -> None:
    unknown = set(values) - set(space)
    if unknown:
        raise ValueError(f"{kind} {sorted(unknown)} are not declared in the {kind} space")
    for name, value in values.items():
        if value not in space[name].choices:
            raise ValueError(
                f"{kind} {name}={value!r} is not one of {list(space[name].choices)}"
            )


class Candidate(BaseModel):
    """One kernel variant. Never mutated: operators build new candidates."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: str
    name: str = "candidate"
    language: Language
    sources: dict[str, str] = Field(min_length=1)
    """Relative file path -> file content. Python files are imported, ``.cu`` compiled."""
    entry_point: str
    """``<file.py>::<factory>``: ``factory(params, kernels)`` returns the DPS callable."""
    knob_space: ParamSpace = Field(default_factory=dict)
    knobs: dict[str, ParamValue] = Field(default_factory=dict)
    launch_space: ParamSpace = Field(default_factory=dict)
    launch: dict[str, ParamValue] = Field(default_factory=dict)
    constraints: tuple[str, ...] = ()
    """Python boolean expressions over parameter names that the values must satisfy.
    Not part of the id: they restrict which values exist, not what a kernel does."""
    parents: tuple[str, ...] = ()
    operator: str = "seed"
    generation: int = 0

    @field_validator("sources")
    @classmethod
    def _safe_paths(cls, sources: dict[str, str]) -> dict[str, str]:
        for path in sources:
            parts = Path(path).parts
            if not parts or Path(path).is_absolute() or ".." in parts:
                raise ValueError(f"source path {path!r} must be relative, without '..'")
        return sources

    @model_validator(mode="after")
    def _consistent(self) -> Candidate:
        file, sep, symbol = self.entry_point.partition("::")
        if not sep or "::" in symbol or not symbol:
            raise ValueError(f"entry_point {self.entry_point!r} must be '<file.py>::<symbol>'")
        if file not in self.sources:
            raise ValueError(f"entry_point file {file!r} is not among the sources")
        if not file.endswith(".py"):
            raise ValueError(f"entry_point file {file!r} must be a Python file")
        for name in [*self.knob_space, *self.launch_space]:
            if not _SAFE_NAME.match(name):
                raise ValueError(f"parameter name {name!r} must be an identifier")
        clash = set(self.knob_space) & set(self.launch_space)
        if clash:
            raise ValueError(f"parameters {sorted(clash)} are both knobs and launch parameters")
        _check_values(self.knob_space, self.knobs, "knobs")
        _check_values(self.launch_space, self.launch, "launch parameters")
        declared = rules.check_declared(self.constraints, [*self.knob_space, *self.launch_space])
        broken = rules.violated(declared, self.params)
        if broken:
            raise ValueError(f"parameters break constraint {broken[0].text!r}: "
                             f"{ {n: self.params[n] for n in sorted(broken[0].names)} }")
        return self

    # -- derived views -------------------------------------------------------------

    @property
    def params(self) -> dict[str, ParamValue]:
        """Every declared parameter with its value (chosen, else the default)."""
        values = {n: p.initial for n, p in {**self.knob_space, **self.launch_space}.items()}
        values.update(self.knobs)
        values.update(self.launch)
        return values

    @property
    def content_key(self) -> dict[str, Any]:
        """What the id hashes: what decides the kernel's behaviour, not its history."""
        return {
            "workload": self.workload,
            "language": self.language.value,
            "sources": dict(sorted(self.sources.items())),
            "entry_point": self.entry_point,
            "params": dict(sorted(self.params.items())),
        }

    @property
    def id(self) -> str:
        blob = json.dumps(self.content_key, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def code_id(self) -> str:
        """Hash of the code alone: candidates differing only in parameters share it."""
        key = {k: v for k, v in self.content_key.items() if k != "params"}
        blob = json.dumps(key, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def space(self) -> ParamSpace:
        """Every declared parameter, knobs and launch parameters together."""
        return {**self.knob_space, **self.launch_space}

    def with_params(
        self,
        *,
        knobs: Mapping[str, ParamValue] | None = None,
        launch: Mapping[str, ParamValue] | None = None,
        operator: str,
        generation: int | None = None,
    ) -> Candidate:
        """A child with some parameter values replaced; lineage points at this one.

        Where the requested values break a declared constraint, other parameters
        change to the nearest valid combination (constraints.repair); the requested
        ones change only if nothing else helps. Values that are not declared choices
        are an error, as before.
        """
        requested = {**(knobs or {}), **(launch or {})}
        _check_values(self.knob_space, knobs or {}, "knobs")
        _check_values(self.launch_space, launch or {}, "launch parameters")
        values = {**self.params, **requested}
        if self.constraints:
            declared = rules.check_declared(self.constraints, self.space)
            changed = [n for n, v in requested.items() if self.params.get(n) != v]
            values = rules.repair(values, self.space, declared, keep=changed)
        new_knobs = {**self.knobs, **{n: values[n] for n in self.knob_space
                                      if n in self.knobs or n in requested or values[n] != self.params[n]}}
        new_launch = {**self.launch, **{n: values[n] for n in self.launch_space
                                        if n in self.launch or n in requested or values[n] != self.params[n]}}
        return self.model_copy(
            update={
                "knobs": new_knobs,
                "launch": new_launch,
                "parents": (self.id,),
                "operator": operator,
                "generation": self.generation + 1 if generation is None else generation,
            }
        ).revalidated()

    def revalidated(self) -> Candidate:
        """Run the validators again (``model_copy`` skips them)."""
        return Candidate.model_validate(self.model_dump())


# -- loading from disk ---------------------------------------------------------------


class CandidateFileError(ValueError):
    """A candidate file that is missing, unreadable or malformed."""


def _language_of(source: str, path: Path) -> Language:
    if path.suffix == ".cu":
        return Language.CUDA
    if re.search(r"^\s*(import triton|from triton)", source, re.MULTILINE):
        return Language.TRITON
    return Language.TORCH


def load_candidate(path: str | Path, workload: str) -> Candidate:
    """Load a candidate from a manifest (``.yaml``/``.json``) or a single ``.py`` file.

    A manifest names its sources relative to itself::

        name: cuda_radix
        language: cuda
        entry_point: host.py::build
        sources: [host.py, kernel.cu]
        knob_space: {TOPK_ALGO: {choices: [radix, bitonic]}}

    A bare ``.py`` file is a one-file candidate whose entry point is ``build``. A manifest
    whose ``sources`` is a mapping of file name to text holds its sources inline: the
    candidate JSON a search writes (``best_candidate.json``), read back as it was.
    """
    path = Path(path)
    if not path.is_file():
        raise CandidateFileError(f"candidate {path} does not exist or is not a file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CandidateFileError(f"cannot read candidate {path}: {exc}") from exc

    if path.suffix == ".py":
        language = _language_of(text, path)
        try:
            return Candidate(
                workload=workload,
                name=path.stem,
                language=language,
                sources={path.name: text},
                entry_point=f"{path.name}::build",
            )
        except ValueError as exc:
            raise CandidateFileError(f"{path}: {exc}") from exc

    if path.suffix not in {".yaml", ".yml", ".json"}:
        raise CandidateFileError(
            f"candidate {path} must be a .py file or a .yaml/.json manifest"
        )
    try:
        manifest = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CandidateFileError(f"{path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise CandidateFileError(f"{path} must hold a mapping, not {type(manifest).__name__}")
    manifest = dict(manifest)
    files = manifest.pop("sources", None)
    if isinstance(files, dict):  # sources inline
        if manifest.get("workload", workload) != workload:
            raise CandidateFileError(f"{path} is a candidate for {manifest['workload']}, not {workload}")
        try:
            return Candidate.model_validate({"workload": workload, **manifest, "sources": files})
        except ValueError as exc:
            raise CandidateFileError(f"{path}: {exc}") from exc
    if not isinstance(files, list) or not files:
        raise CandidateFileError(f"{path}: 'sources' must be a non-empty list of file names "
                                 "(or a mapping of names to sources)")
    sources: dict[str, str] = {}
    for rel in files:
        file = path.parent / str(rel)
        try:
            sources[str(rel)] = file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise CandidateFileError(f"{path}: cannot read source {rel}: {exc}") from exc
    manifest.setdefault("workload", workload)
    manifest.setdefault("name", path.stem)
    try:
        return Candidate.model_validate({**manifest, "sources": sources})
    except ValueError as exc:
        raise CandidateFileError(f"{path}: {exc}") from exc
