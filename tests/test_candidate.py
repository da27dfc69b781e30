from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evokernel.candidate import Candidate, CandidateFileError, Language, Param, load_candidate


def make(**overrides: object) -> Candidate:
    base: dict[str, object] = {
        "workload": "w",
        "language": "torch",
        "sources": {"k.py": "def build(p, k):\n    return None\n"},
        "entry_point": "k.py::build",
        "knob_space": {"TILE": {"choices": [16, 32, 64], "default": 32}},
        "launch_space": {"THREADS": {"choices": [128, 256]}},
    }
    base.update(overrides)
    return Candidate.model_validate(base)


def test_params_fill_defaults_and_choices() -> None:
    c = make()
    assert c.params == {"TILE": 32, "THREADS": 128}
    assert make(knobs={"TILE": 64}).params["TILE"] == 64


def test_id_depends_on_content_not_lineage() -> None:
    a = make()
    b = make(parents=("x",), operator="mutate", generation=3)
    assert a.id == b.id
    assert make(knobs={"TILE": 16}).id != a.id
    assert make(knobs={"TILE": 16}).code_id == a.code_id
    assert make(sources={"k.py": "def build(p, k):\n    return 1\n"}).id != a.id


@given(st.sampled_from([16, 32, 64]), st.sampled_from([128, 256]))
def test_explicit_default_equals_implicit(tile: int, threads: int) -> None:
    explicit = make(knobs={"TILE": tile}, launch={"THREADS": threads})
    child = make().with_params(knobs={"TILE": tile}, launch={"THREADS": threads}, operator="t")
    assert explicit.id == child.id
    assert child.parents == (make().id,)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"knobs": {"TILE": 48}}, "not one of"),
        ({"knobs": {"NOPE": 1}}, "not declared"),
        ({"entry_point": "k.py"}, "must be"),
        ({"entry_point": "other.py::build"}, "not among the sources"),
        ({"sources": {"../k.py": "x"}, "entry_point": "../k.py::build"}, "relative"),
        ({"launch_space": {"TILE": {"choices": [1]}}}, "both knobs and launch"),
    ],
)
def test_invalid_candidates_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**overrides)


def test_frozen() -> None:
    c = make()
    with pytest.raises(ValueError):
        c.name = "other"  # type: ignore[misc]


def test_with_params_validates() -> None:
    with pytest.raises(ValueError, match="not one of"):
        make().with_params(knobs={"TILE": 7}, operator="t")


def test_param_default_must_be_a_choice() -> None:
    with pytest.raises(ValueError, match="default"):
        Param(choices=(1, 2), default=3)


def test_load_single_file_and_manifest(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import triton\ndef build(p, k):\n    return None\n")
    single = load_candidate(tmp_path / "a.py", "w")
    assert single.language is Language.TRITON and single.entry_point == "a.py::build"
    (tmp_path / "k.cu").write_text('extern "C" __global__ void f() {}\n')
    (tmp_path / "m.yaml").write_text(
        "language: cuda\nentry_point: a.py::build\nsources: [a.py, k.cu]\n"
        "knob_space: {V: {choices: [1, 2]}}\n"
    )
    manifest = load_candidate(tmp_path / "m.yaml", "w")
    assert manifest.language is Language.CUDA and set(manifest.sources) == {"a.py", "k.cu"}


def test_load_a_searchs_candidate_json(tmp_path: Path) -> None:
    """The JSON a search writes (sources inline) reads back as the same candidate, with
    its parameters and lineage; one for another workload is refused."""
    found = make().with_params(knobs={"TILE": 64}, operator="mutate_knobs")
    (tmp_path / "best_candidate.json").write_text(found.model_dump_json(indent=1))
    again = load_candidate(tmp_path / "best_candidate.json", found.workload)
    assert again.id == found.id and again.params == found.params
    assert again.parents == found.parents and again.operator == "mutate_knobs"
    with pytest.raises(CandidateFileError, match="not other_workload"):
        load_candidate(tmp_path / "best_candidate.json", "other_workload")


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("m.yaml", "sources: {a.py: 1}\nlanguage: torch\nentry_point: a.py::b\n", "m.yaml"),
        ("m.yaml", "sources: [missing.py]\nlanguage: torch\nentry_point: missing.py::b\n", "cannot read"),
        ("m.yaml", "[1, 2", "not valid YAML"),
        ("m.yaml", "- a\n- b\n", "must hold a mapping"),
        ("m.txt", "x", "must be a .py"),
    ],
)
def test_bad_candidate_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(CandidateFileError, match=message):
        load_candidate(tmp_path / name, "w")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CandidateFileError, match="does not exist"):
        load_candidate(tmp_path / "nope.py", "w")


# -- declared constraints ------------------------------------------------------------


def constrained(**overrides: object) -> Candidate:
    """TILE x THREADS with one declared invalid corner (TILE 64 needs 256 threads)."""
    return make(constraints=("TILE != 64 or THREADS == 256",), **overrides)


def test_a_candidate_breaking_a_constraint_is_refused() -> None:
    with pytest.raises(ValueError, match="break constraint"):
        constrained(knobs={"TILE": 64}, launch={"THREADS": 128})
    assert constrained(knobs={"TILE": 64}, launch={"THREADS": 256}).params["TILE"] == 64


@pytest.mark.parametrize(
    "expression, message",
    [
        ("TILE < NOPE", "undeclared"),
        ("TILE <", "not a Python expression"),
        ("TILE.real > 2", "Attribute"),
        ("open('x') or True", "only min, max and abs"),
    ],
)
def test_a_bad_constraint_is_refused(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(constraints=(expression,))


def test_with_params_keeps_the_requested_value_and_repairs_the_others() -> None:
    child = constrained().with_params(knobs={"TILE": 64}, operator="t")
    assert child.params == {"TILE": 64, "THREADS": 256}
    tuned = constrained(knobs={"TILE": 64}, launch={"THREADS": 256}).with_params(
        launch={"THREADS": 128}, operator="t")
    assert tuned.params == {"TILE": 32, "THREADS": 128}  # the launch value asked for stays


def test_with_params_changes_a_requested_value_only_when_nothing_else_helps() -> None:
    both = constrained().with_params(knobs={"TILE": 64}, launch={"THREADS": 128}, operator="t")
    assert both.params["TILE"] != 64 or both.params["THREADS"] == 256


@given(st.sampled_from([16, 32, 64]), st.sampled_from([128, 256]), st.sampled_from([16, 32, 64]))
def test_no_operator_request_yields_an_invalid_child(tile: int, threads: int, other: int) -> None:
    start = constrained(knobs={"TILE": other}, launch={"THREADS": 256})
    child = start.with_params(knobs={"TILE": tile}, launch={"THREADS": threads}, operator="t")
    assert child.params["TILE"] != 64 or child.params["THREADS"] == 256


def test_constraints_do_not_change_the_id() -> None:
    assert constrained().id == make().id


def test_a_manifest_declares_constraints(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_text("def build(p, k):\n    return None\n")
    (tmp_path / "m.yaml").write_text(
        "entry_point: k.py::build\nlanguage: torch\nsources: [k.py]\n"
        "knob_space: {A: {choices: [1, 2]}, B: {choices: [x, y]}}\n"
        "constraints: [\"A == 1 or B == 'y'\"]\n")
    c = load_candidate(tmp_path / "m.yaml", "w")
    assert c.constraints == ("A == 1 or B == 'y'",)
    assert c.with_params(knobs={"A": 2}, operator="t").params == {"A": 2, "B": "y"}
    (tmp_path / "bad.yaml").write_text(
        "entry_point: k.py::build\nlanguage: torch\nsources: [k.py]\n"
        "knob_space: {A: {choices: [1, 2], default: 2}, B: {choices: [x, y]}}\n"
        "constraints: [\"A == 1 or B == 'y'\"]\n")
    with pytest.raises(CandidateFileError, match="break constraint"):
        load_candidate(tmp_path / "bad.yaml", "w")
