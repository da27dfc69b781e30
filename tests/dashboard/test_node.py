"""A candidate's panel: source, diff against its parent, evaluation and LLM exchange."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evokernel.dashboard.node import UnknownNode, describe, diff
from evokernel.dashboard.run_view import RunView
from evokernel.journal import RunDir
from evokernel.testing import fake_candidate


def test_diff_shows_changed_parameters_and_changed_code() -> None:
    parent = fake_candidate("a", 1.0)
    child = parent.with_params(knobs={"TILE": 128}, operator="knob_mutation")
    text = diff(parent, child)
    assert "-TILE = 32\n" in text and "+TILE = 128\n" in text and " UNROLL = 1\n" in text
    assert "kernel.py" not in text  # the code did not change
    rewritten = child.model_copy(update={"sources": {"kernel.py": child.sources["kernel.py"].replace(
        "SPEED = 1.0", "SPEED = 2.5")}, "parents": (child.id,)})
    text = diff(child, rewritten)
    assert f"--- {child.id}/kernel.py" in text and "-SPEED = 1.0\n" in text and "+SPEED = 2.5\n" in text
    assert diff(parent, parent).startswith("(no difference")


def test_a_knob_child_has_its_evaluation_and_a_diff_against_its_parent(islands_run: Path) -> None:
    view = RunView(islands_run)
    view.refresh()
    records = RunDir.open(islands_run).records()
    child = next(r for r in records if r.candidate["operator"] == "knob_mutation")
    node = describe(view, child.candidate_id)
    assert node["operator"] == "knob_mutation" and node["parents"] == child.candidate["parents"]
    assert [s["shape"] for s in node["evaluation"]["shapes"]] == [s.shape for s in child.evaluation.shapes]
    assert node["evaluation"]["fitness"] == child.evaluation.fitness
    assert node["diffs"][0]["parent"] == child.candidate["parents"][0]
    changed = [line for line in node["diffs"][0]["text"].splitlines() if line.startswith(("+", "-"))
               and not line.startswith(("+++", "---"))]
    assert changed, "a knob mutation changes at least one parameter value"
    assert node["llm"] == []


def test_an_llm_child_shows_the_recorded_request_and_reply(llm_run: Path) -> None:
    view = RunView(llm_run)
    view.refresh()
    outcomes = [json.loads(x) for x in (llm_run / "llm_outcomes.jsonl").read_text().splitlines()]
    made = next(o for o in outcomes if o["outcome"] == "child" and o["requests"] and o["operator"] == "mutate")
    node = describe(view, made["child"])
    assert node["operator"] == "mutate"
    # a proposal with the same content may come again later: every one that made it is listed
    assert len(node["llm"]) == sum(o["child"] == made["child"] for o in outcomes)
    call = next(c for c in node["llm"] if c["exchanges"][0]["key"] == made["requests"][0])
    assert call["operator"] == "mutate" and call["model"] == "stub-model"
    exchange = call["exchanges"][0]
    recorded = json.loads((llm_run / "llm" / f"{made['requests'][0]}.json").read_text())
    assert [m["content"] for m in exchange["messages"]] == [m["content"] for m in recorded["request"]["messages"]]
    assert exchange["reply"] == recorded["reply"]["content"]
    assert "SPEED" in node["diffs"][0]["text"]  # the model rewrote the speed line


def test_unknown_ids_are_refused_by_name(islands_run: Path) -> None:
    view = RunView(islands_run)
    with pytest.raises(UnknownNode, match="not a candidate id"):
        describe(view, "../run.json")
    with pytest.raises(UnknownNode, match="does not exist"):
        describe(view, "0123456789abcdef")
