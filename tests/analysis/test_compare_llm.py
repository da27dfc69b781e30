"""A comparison with LLM operators: every run asks the (scripted, loopback) model and records
its replies in one place; the comparison then replays with no server at all."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from evokernel.analysis import compare
from evokernel.llm.stub import StubLLMServer
from evokernel.testing import fake_llm_responder

RATES = "operators.rates={llm_mutate: 1, llm_mutate_diff: 1, llm_repair: 1, llm_crossover: 1, llm_agent: 1}"
ARGS = ["--workload", "fake", "--set", "workload_loader=evokernel.testing:load_fake_workload",
        "--set", "evaluator.factory=fake", "--set", "operators.kind=llm", "--set", RATES,
        "--set", "llm.max_retries=0", "--set", "llm.timeout_s=20", "--strategies", "evolutionary,greedy",
        "--seeds", "2", "--budget", "16", "--runtime", "local", "--quiet", "--no-report"]
LLM_OPERATORS = {"mutate", "mutate_diff", "repair", "crossover", "agent"}


def outcomes(run: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in (run / "llm_outcomes.jsonl").read_text().splitlines()]


def test_compare_with_llm_operators_records_then_replays_without_a_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EVOKERNEL_LLM_BASE_URL", "EVOKERNEL_LLM_MODEL", "EVOKERNEL_LLM_API_KEY", "OPENAI_API_KEY",
                 "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    recorded = tmp_path / "recorded"
    with StubLLMServer(responder=fake_llm_responder) as stub:
        monkeypatch.setenv("EVOKERNEL_LLM_BASE_URL", stub.base_url)
        monkeypatch.setenv("EVOKERNEL_LLM_MODEL", "stub-model")
        assert compare.main([*ARGS, "--out", str(recorded)]) == 0
        asked = len(stub.requests)
    monkeypatch.delenv("EVOKERNEL_LLM_BASE_URL")
    monkeypatch.delenv("EVOKERNEL_LLM_MODEL")
    assert asked > 10  # the model was asked, by every run
    manifest = json.loads((recorded / "comparison.json").read_text())
    for run in manifest["runs"]:
        config = (recorded / run["dir"] / "config.yaml").read_text()
        assert "kind: llm" in config and f"recording_dir: {(recorded / 'llm').absolute()}" in config
        made = Counter(o["operator"] for o in outcomes(recorded / run["dir"]))
        assert made, run
        journal = [json.loads(x) for x in (recorded / run["dir"] / "journal.jsonl").read_text().splitlines()]
        assert {j["candidate"]["operator"] for j in journal} & LLM_OPERATORS  # LLM children were judged
    assert len(list((recorded / "llm").glob("*.json"))) == asked  # one recording for the comparison

    replayed = tmp_path / "replayed"
    code = compare.main([*ARGS, "--out", str(replayed), "--set", "llm.mode=replay",
                         "--set", f"llm.recording_dir={recorded / 'llm'}"])
    assert code == 0
    assert (replayed / "evaluations.csv").read_text() == (recorded / "evaluations.csv").read_text()
    for run in manifest["runs"]:
        def strip(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
            return [{k: v for k, v in r.items() if k not in ("time", "evaluations", "agent_evaluations")}
                    for r in rows]

        assert strip(outcomes(replayed / run["dir"])) == strip(outcomes(recorded / run["dir"]))
    assert not (replayed / "llm").exists()  # replay writes no recording of its own
