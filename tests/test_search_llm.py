"""The search command with LLM operators, against a scripted model on loopback.

The model is ``evokernel.testing.fake_llm_responder`` behind a ``StubLLMServer``: its
answers depend only on the prompt, so every run here is deterministic; the evaluator
is the fake one (``tests/fake_run.yaml``), so a search takes seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from evokernel.llm.record import request_key
from evokernel.llm.stub import StubLLMServer
from evokernel.testing import FakeEvaluator, FakeWorkload, fake_llm_responder

REPO = Path(__file__).resolve().parent.parent
FAKE = str(REPO / "tests" / "fake_run.yaml")
LLM_OPS = {"mutate", "mutate_diff", "repair", "crossover", "agent"}
EVEN = "operators.rates={llm_mutate: 1, llm_mutate_diff: 1, llm_repair: 1, llm_crossover: 1, llm_agent: 1}"
FAST = ["--set", "llm.max_retries=0", "--set", "llm.timeout_s=20"]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any LLM endpoint or key, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EVOKERNEL_LLM_") and k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return {**env, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", **extra}


def search(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evokernel.search", "--quiet", *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env or clean_env(),
    )


def endpoint(stub: StubLLMServer) -> dict[str, str]:
    return clean_env(EVOKERNEL_LLM_BASE_URL=stub.base_url, EVOKERNEL_LLM_MODEL="stub-model")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def without_clock(obj: Any) -> Any:
    """``obj`` with every wall-clock field dropped (they differ between any two runs)."""
    if isinstance(obj, dict):
        return {k: without_clock(v) for k, v in obj.items() if k not in ("time", "wall_s")}
    if isinstance(obj, list):
        return [without_clock(v) for v in obj]
    return obj


@pytest.fixture
def stub() -> Iterator[StubLLMServer]:
    with StubLLMServer(responder=fake_llm_responder) as server:
        yield server


def llm_run(stub: StubLLMServer, run: Path, *extra: str, budget: int = 30) -> subprocess.CompletedProcess[str]:
    return search("--config", FAKE, "--operators", "llm", "--budget", str(budget), "--run-dir", str(run),
                  "--set", EVEN, *FAST, *extra, env=endpoint(stub))


# -- (a) a search with LLM operators --------------------------------------------------------

def test_llm_search_asks_every_operator_and_journals_their_children(stub: StubLLMServer, tmp_path: Path) -> None:
    run = tmp_path / "r"
    out = llm_run(stub, run)
    assert out.returncode == 0, out.stderr
    outcomes = lines(run / "llm_outcomes.jsonl")
    asked = Counter(o["operator"] for o in outcomes)
    assert set(asked) == LLM_OPS, asked
    assert all(o["requests"] for o in outcomes if o["outcome"] == "child")
    # every request reached the stub once and is recorded under its hash
    assert len(stub.requests) == len({request_key(r) for r in stub.requests}) == len(list((run / "llm").glob("*.json")))
    # children of LLM replies were evaluated and journaled, within the budget
    journal = lines(run / "journal.jsonl")
    assert len(journal) == 30
    made = {o["child"]: o["operator"] for o in outcomes if o["child"]}
    evaluated = {j["id"]: j for j in journal}
    for op in LLM_OPS:
        assert any(cid in evaluated and evaluated[cid]["candidate"]["operator"] == op
                   for cid, name in made.items() if name == op), op
    statuses = Counter(j["evaluation"]["status"] for j in journal)
    assert statuses["BUILD_FAILED"] and statuses["PASSED"] > 10
    repaired = [o for o in outcomes if o["operator"] == "repair" and o["child"]]
    failed = {j["id"] for j in journal if j["evaluation"]["status"] == "BUILD_FAILED"}
    assert repaired and all(o["parents"][0] in failed for o in repaired)
    # the agent's own tool evaluations are journaled with its outcome, not charged
    agent = [o for o in outcomes if o["operator"] == "agent"]
    assert any(o["agent_evaluations"] for o in agent)
    assert sum(o["evaluations"] for o in agent) > 0
    # the run config fixes the endpoint and model the environment gave, never a key
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["operators"]["kind"] == "llm"
    assert config["llm"]["base_url"] == stub.base_url and config["llm"]["models"] == ["stub-model"]
    assert "LLM operators: agent:" in out.stdout


def test_mixed_operators_in_greedy_and_evolutionary(stub: StubLLMServer, tmp_path: Path) -> None:
    for strategy in ("greedy", "evolutionary"):
        run = tmp_path / strategy
        out = search("--config", FAKE, "--operators", "mixed", "--strategy", strategy, "--budget", "24",
                     "--run-dir", str(run), *FAST, env=endpoint(stub))
        assert out.returncode == 0, out.stderr
        ops = Counter(j["candidate"]["operator"] for j in lines(run / "journal.jsonl"))
        builtin = ops["greedy_mutation"] + ops["knob_mutation"] + ops["knob_crossover"]
        llm = sum(ops[name] for name in LLM_OPS)
        assert builtin and llm, ops
        if strategy == "greedy":
            assert not ops["crossover"]  # greedy mutates the incumbent: one-parent operators only


def test_rates_switch_operators_off_and_unknown_names_are_one_line(stub: StubLLMServer, tmp_path: Path) -> None:
    out = search("--config", FAKE, "--operators", "llm", "--budget", "16", "--run-dir", str(tmp_path / "r"),
                 "--set", "operators.rates={llm_mutate: 1, llm_mutate_diff: 0, llm_crossover: 0, llm_agent: 0, llm_repair: 0}",
                 *FAST, env=endpoint(stub))
    assert out.returncode == 0, out.stderr
    assert {o["operator"] for o in lines(tmp_path / "r" / "llm_outcomes.jsonl")} == {"mutate"}

    sent = len(stub.requests)
    out = search("--config", FAKE, "--operators", "mixed", "--run-dir", str(tmp_path / "bad"),
                 "--set", "operators.rates.llm_mutat=1", env=endpoint(stub))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "unknown operator 'llm_mutat'" in out.stderr and "llm_mutate" in out.stderr
    out = search("--config", FAKE, "--operators", "llm", "--strategy", "random", "--run-dir", str(tmp_path / "bad"),
                 env=endpoint(stub))
    assert out.returncode == 2 and "needs strategy evolutionary, greedy or map_elites, not 'random'" in out.stderr
    assert not (tmp_path / "bad").exists() and len(stub.requests) == sent


# -- (b) no endpoint -----------------------------------------------------------------------

def test_no_endpoint_explains_and_falls_back_to_builtins(tmp_path: Path) -> None:
    run = tmp_path / "r"
    out = search("--config", FAKE, "--operators", "llm", "--budget", "12", "--run-dir", str(run))
    assert out.returncode == 0, out.stderr
    assert "EVOKERNEL_LLM_BASE_URL" in out.stderr and "llm.fallback_to_builtin" in out.stderr
    assert "Continuing with the built-in operators only" in out.stderr
    ops = {j["candidate"]["operator"] for j in lines(run / "journal.jsonl")}
    assert ops <= {"seed", "knob_mutation", "knob_crossover"} and len(lines(run / "journal.jsonl")) == 12
    assert yaml.safe_load((run / "config.yaml").read_text())["operators"]["kind"] == "builtin"
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["operators"]["requested"] == "llm" and manifest["operators"]["used"] == "builtin"
    assert not (run / "llm_outcomes.jsonl").exists()
    # the fallback run is the built-in run of the same seed
    plain = tmp_path / "plain"
    assert search("--config", FAKE, "--budget", "12", "--run-dir", str(plain)).returncode == 0
    assert [j["id"] for j in lines(run / "journal.jsonl")] == [j["id"] for j in lines(plain / "journal.jsonl")]


def test_no_endpoint_without_fallback_exits_2(tmp_path: Path) -> None:
    out = search("--config", FAKE, "--operators", "mixed", "--run-dir", str(tmp_path / "r"),
                 "--set", "llm.fallback_to_builtin=false")
    assert out.returncode == 2
    assert "No LLM endpoint is configured" in out.stderr and "Stopping" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r").exists()


def test_builtin_ignores_the_llm_config(tmp_path: Path) -> None:
    out = search("--config", FAKE, "--budget", "10", "--run-dir", str(tmp_path / "r"), "--llm", "replay")
    assert out.returncode == 0 and "LLM" not in out.stderr + out.stdout, out.stderr


# -- (c) replay ------------------------------------------------------------------------------

def test_a_recorded_run_replays_to_the_same_journal_with_no_network(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    with StubLLMServer(responder=fake_llm_responder) as stub:
        out = llm_run(stub, old)
        assert out.returncode == 0, out.stderr
        asked = len(stub.requests)
    assert asked > 10
    # the server is gone and no endpoint is configured: only the recording can answer
    out = search("--config", FAKE, "--operators", "llm", "--budget", "30", "--run-dir", str(new), "--set", EVEN,
                 *FAST, "--llm", "replay", "--set", f"llm.recording_dir={old / 'llm'}")
    assert out.returncode == 0, out.stderr
    assert without_clock(lines(new / "journal.jsonl")) == without_clock(lines(old / "journal.jsonl"))
    # the same proposals with the same outcomes; the agent's tool results came from the
    # recording, so it ran none itself
    strip = lambda rows: [{k: v for k, v in without_clock(r).items() if k != "evaluations"} for r in rows]  # noqa: E731
    assert strip(lines(new / "llm_outcomes.jsonl")) == strip(lines(old / "llm_outcomes.jsonl"))
    assert sum(o["evaluations"] for o in lines(new / "llm_outcomes.jsonl")) == 0
    assert not (new / "llm").exists()


def test_replay_without_a_recording_is_one_line(tmp_path: Path) -> None:
    out = search("--config", FAKE, "--operators", "llm", "--llm", "replay", "--run-dir", str(tmp_path / "r"))
    assert out.returncode == 2 and "no recording" in out.stderr and len(out.stderr.strip().splitlines()) == 1


# -- (d) kill and resume --------------------------------------------------------------------

@pytest.mark.slow
def test_kill_and_resume_never_asks_an_answered_request_again(stub: StubLLMServer, tmp_path: Path) -> None:
    full = tmp_path / "full"
    assert llm_run(stub, full).returncode == 0
    full_requests = len(stub.requests)

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "evokernel.search", "--quiet", "--config", FAKE, "--operators", "llm",
         "--budget", "30", "--run-dir", str(cut), "--set", EVEN, *FAST,
         "--set", "evaluator.options.delay_s=0.1"],
        cwd=REPO, env=endpoint(stub), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    journal = cut / "journal.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # well into the run, mid-generation
        if journal.exists() and len(journal.read_bytes().splitlines()) >= 14:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 14 <= len(lines(journal)) < 30
    answered = {p.stem for p in (cut / "llm").glob("*.json")}
    before = len(stub.requests)
    assert answered

    out = search("--resume", str(cut), env=endpoint(stub))
    assert out.returncode == 0, out.stderr
    again = {request_key(r) for r in stub.requests[before:]}
    assert again and not again & answered  # nothing answered before the kill went to the model again
    assert len(stub.requests) - before + len(answered) == full_requests  # and nothing else extra
    # the resumed run is the uninterrupted one
    assert [j["id"] for j in lines(journal)] == [j["id"] for j in lines(full / "journal.jsonl")]
    strip = lambda rows: [{k: v for k, v in without_clock(r).items() if k != "evaluations"} for r in rows]  # noqa: E731
    assert strip(lines(cut / "llm_outcomes.jsonl")) == strip(lines(full / "llm_outcomes.jsonl"))


# -- the strategies alone ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["evolutionary", "greedy"])
def test_state_round_trip_with_llm_operators(stub: StubLLMServer, tmp_path: Path, name: str) -> None:
    """state()/from_state() are exact with LLM operators, which are rebuilt, not pickled."""
    from evokernel.llm import LLMConfig
    from evokernel.operators.llm import make_llm_operators
    from evokernel.strategies import RunServices, StrategyEnv, make_strategy, strategy_from_state

    config = LLMConfig(base_url=stub.base_url, model="stub-model", max_retries=0, timeout_s=10)
    seeds, ev = FakeWorkload().seeds(), FakeEvaluator()
    evaluations: dict[str, Any] = {}

    def env(folder: str) -> StrategyEnv:
        ops = make_llm_operators(config, tmp_path / folder, environ={})
        return StrategyEnv(seeds, 5, "fake", run_dir=tmp_path / folder, services=RunServices(
            llm_operators=ops, evaluation_of=evaluations.get,
            evaluate=lambda c, shapes: ev.evaluate(c, shapes), agent_shapes=["s0"],
        ))

    def tell(strategy: Any, candidate: Any) -> None:
        evaluations[candidate.id] = ev.evaluate(candidate, ["s0"])
        strategy.tell(candidate, evaluations[candidate.id])

    options = {"operators": {"kind": "mixed", "rates": {"llm_repair": 2.0}}}
    a = make_strategy(name, env("a"), options)
    for s in seeds:
        tell(a, s)
    for _ in range(4):
        for c in a.ask(4):
            tell(a, c)
    state = json.loads(json.dumps(a.state()))  # what a snapshot holds
    assert "llm_operators" not in json.dumps(state) and state["mixer"]["failures"] is not None
    counts = lambda s: Counter({op.name: sum(op.outcomes.values()) for op in s.mixer.llm_ops})  # noqa: E731
    at_state = counts(a)
    b = strategy_from_state(state, env("a"))  # new operators, new client, same recording
    assert b.state() == a.state()
    sent = len(stub.requests)
    for _ in range(3):
        ca, cb = a.ask(4), b.ask(4)
        assert [c.id for c in ca] == [c.id for c in cb]
        for x, y in zip(ca, cb, strict=True):
            tell(a, x)
            tell(b, y)
    assert a.state() == b.state()
    # b's requests were a's: answered from the recording, never sent twice
    keys = [request_key(r) for r in stub.requests[sent:]]
    assert len(keys) == len(set(keys))
    assert counts(a)["repair"] and counts(a)["mutate"], counts(a)  # failures were repaired along the way
    assert counts(b) == counts(a) - at_state and counts(b)  # b made a's proposals after the state
