"""mutate, repair and crossover against scripted replies and endpoint faults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status
from evokernel.llm import ChatClient, LLMConfig
from evokernel.llm.stub import Reply, StubLLMServer
from evokernel.operators import Operator, OperatorContext
from evokernel.operators.llm import (
    LLMCrossover,
    LLMMutate,
    LLMRepair,
    OutcomeRecord,
    make_llm_operators,
    operator_weights,
)

MakeClient = Callable[..., ChatClient]
MakeCtx = Callable[..., OperatorContext]
TORCH = "torch_vectorized"
FILE = "torch_vectorized.py"


def rewritten(seed: Candidate, marker: str = "# faster") -> str:
    return seed.sources[FILE] + f"\n{marker}\n"


def whole(seed: Candidate, marker: str = "# faster") -> str:
    return f"Plan: tidy up.\n\n```python {FILE}\n{rewritten(seed, marker)}```\n"


def failed(candidate: Candidate, status: Status, feedback: str) -> Evaluation:
    return Evaluation(candidate_id=candidate.id, status=status, feedback=feedback)


def test_mutate_whole_file_child_keeps_everything_but_code(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds[TORCH].with_params(knobs={"SELECT": "sort"}, operator="knob_mutation")
    stub.push(Reply.completion(whole(parent)))
    op = LLMMutate(make_client())
    assert isinstance(op, Operator) and op.arity == 1
    (child,) = op.propose([parent], ctx(generation=7))
    assert child.sources[FILE] == rewritten(parent)
    assert (child.language, child.entry_point, child.knob_space, child.knobs, child.launch_space) == (
        parent.language, parent.entry_point, parent.knob_space, parent.knobs, parent.launch_space)
    assert child.parents == (parent.id,) and child.operator == "mutate" and child.generation == 7
    assert op.outcomes == {"child": 1}
    prompt = stub.requests[0]["messages"][1]["content"]
    assert "SELECT = 'sort'" in prompt and f"```python {FILE}" in prompt


def test_mutate_prompt_carries_feedback_and_floor(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds[TORCH]
    evaluation = failed(parent, Status.INCORRECT, "row 3: 17 indices differ")
    stub.push(Reply.completion(whole(parent)))
    LLMMutate(make_client()).propose([parent], ctx(evaluations=[evaluation], floor_ms={"s": 0.1}))
    prompt = stub.requests[0]["messages"][1]["content"]
    assert "status: INCORRECT" in prompt and "row 3: 17 indices differ" in prompt


def test_mutate_diff_mode(stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]) -> None:
    parent = seeds[TORCH]
    line = next(ln for ln in parent.sources[FILE].splitlines() if "def build" in ln)
    diff = f"{FILE}\n<<<<<<< SEARCH\n{line}\n=======\n# tuned\n{line}\n>>>>>>> REPLACE\n"
    stub.push(Reply.completion(diff))
    op = LLMMutate(make_client(), "mutate_diff", diff=True)
    (child,) = op.propose([parent], ctx())
    assert f"# tuned\n{line}" in child.sources[FILE] and child.operator == "mutate_diff"
    assert "<<<<<<< SEARCH" in stub.requests[0]["messages"][1]["content"]


@pytest.mark.parametrize(
    ("reply", "outcome"),
    [
        ("Sorry, I cannot help with that.", "no_code"),
        ("\x00\x01 garbage ]]}{", "no_code"),
        (f"{FILE}\n<<<<<<< SEARCH\nthis line is not there\n=======\nx\n>>>>>>> REPLACE", "diff_not_applied"),
        (f"```python {FILE}\ndef build(params, kern", "truncated"),
        (f"```python {FILE}\nprint('no factory')\n```", "invalid_code"),
    ],
    ids=["refusal", "garbage", "diff-not-applying", "cut-off", "no-factory"],
)
def test_unusable_reply_yields_no_child_and_a_reason(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate], reply: str, outcome: str
) -> None:
    seen: list[OutcomeRecord] = []
    stub.push(Reply.completion(reply))
    op = LLMMutate(make_client())
    assert op.propose([seeds[TORCH]], ctx(on_outcome=seen.append)) == []
    assert op.outcomes == {outcome: 1}
    assert [r.outcome.value for r in seen] == [outcome] and seen[0].tokens == 30 and seen[0].requests


def test_same_code_is_no_child(stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]) -> None:
    parent = seeds[TORCH]
    stub.push(Reply.completion(f"```python {FILE}\n{parent.sources[FILE]}```"))
    op = LLMMutate(make_client())
    assert op.propose([parent], ctx()) == [] and op.outcomes == {"unchanged": 1}


def test_code_that_does_not_build_then_repair(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds[TORCH]
    broken = parent.sources[FILE] + "\nthis is not python\n"
    stub.push(Reply.completion(f"```python {FILE}\n{broken}```"))
    client = make_client()
    (child,) = LLMMutate(client).propose([parent], ctx())  # whether it builds is the evaluator's call
    evaluation = failed(child, Status.BUILD_FAILED, "SyntaxError: invalid syntax (line 84)")
    stub.push(Reply.completion(whole(parent, "# fixed")))
    repair = LLMRepair(client)
    (fixed,) = repair.propose([child], ctx(evaluations=[evaluation]))
    assert fixed.parents == (child.id,) and fixed.operator == "repair"
    assert "# fixed" in fixed.sources[FILE]
    assert "SyntaxError: invalid syntax" in stub.requests[1]["messages"][1]["content"]


def test_repair_skips_a_passing_or_unknown_parent(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    op = LLMRepair(make_client())
    assert op.propose([seeds[TORCH]], ctx()) == []
    skipped = Evaluation(candidate_id=seeds[TORCH].id, status=Status.SKIPPED)
    assert op.propose([seeds[TORCH]], ctx(evaluations=[skipped])) == []
    assert op.outcomes == {"not_applicable": 2} and stub.requests == []


def test_crossover_builds_on_the_fitter_parent(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    a, b = seeds["triton_score"], seeds[TORCH]
    ea = failed(a, Status.INCORRECT, "wrong")
    eb = failed(b, Status.REJECTED, "too fast")  # ranks above INCORRECT: b is the base
    stub.push(Reply.completion(whole(b, "# borrowed from triton")))
    op = LLMCrossover(make_client())
    assert op.arity == 2
    (child,) = op.propose([a, b], ctx(evaluations=[ea, eb]))
    assert child.parents == (b.id, a.id) and child.language == b.language and child.operator == "crossover"
    prompt = stub.requests[0]["messages"][1]["content"]
    assert prompt.index(FILE) < prompt.index("triton_score.py")
    assert op.propose([a, a], ctx()) == [] and op.outcomes["not_applicable"] == 1


def test_retry_succeeds_and_nothing_is_lost(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds[TORCH]
    stub.push(Reply.error(500), Reply.completion(whole(parent)))
    op = LLMMutate(make_client())
    assert len(op.propose([parent], ctx())) == 1 and len(stub.requests) == 2


@pytest.mark.parametrize(
    ("faults", "outcome"),
    [
        ([Reply.error(500), Reply.error(502)], "endpoint_error"),
        ([Reply.error(429), Reply.error(429)], "endpoint_error"),
        ([Reply.completion("late", delay_s=1.0)] * 2, "endpoint_error"),
        ([Reply.raw(b'{"choices": [')] * 2, "malformed_reply"),
        ([Reply.dropped()] * 2, "endpoint_error"),
        ([Reply.error(401, "bad key")], "endpoint_error"),
    ],
    ids=["5xx", "429", "timeout", "truncated-json", "dropped", "401"],
)
def test_endpoint_faults_yield_no_child(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate],
    faults: list[Reply], outcome: str,
) -> None:
    stub.push(*faults)
    op = LLMMutate(make_client(timeout_s=0.3))
    assert op.propose([seeds[TORCH]], ctx()) == [] and op.outcomes == {outcome: 1}


def test_connection_refused_yields_no_child(ctx: MakeCtx, seeds: dict[str, Candidate], tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, backoff_s=0)
    op = LLMMutate(ChatClient(config, tmp_path, environ={}))
    assert op.propose([seeds[TORCH]], ctx()) == [] and op.outcomes == {"endpoint_error": 1}


def test_budget_spent_stops_proposing(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds[TORCH]
    stub.responder = lambda request: Reply.completion(whole(parent), prompt_tokens=900, completion_tokens=200)
    op = LLMMutate(make_client(token_budget=1000))
    assert len(op.propose([parent], ctx(seed=1))) == 1
    assert not op.available
    assert op.propose([parent], ctx(seed=2)) == [] and op.outcomes["budget_spent"] == 1
    assert len(stub.requests) == 1


def test_replay_reproduces_children_without_an_endpoint(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate], tmp_path: Path
) -> None:
    parent = seeds[TORCH]
    stub.responder = lambda request: Reply.completion(whole(parent, f"# seed {request['seed']}"))
    recorded = [LLMMutate(make_client()).propose([parent], ctx(seed=s))[0] for s in (0, 1)]
    assert recorded[0].id != recorded[1].id  # the request seed comes from the run's RNG
    stub.stop()
    replay = ChatClient(LLMConfig(mode="replay", model="stub-model"), tmp_path, environ={})
    again = [LLMMutate(replay).propose([parent], ctx(seed=s))[0] for s in (0, 1)]
    assert [c.id for c in again] == [c.id for c in recorded]
    op = LLMMutate(replay)
    assert op.propose([parent], ctx(seed=2)) == [] and op.outcomes == {"not_recorded": 1}


def test_several_models_share_out_requests(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds[TORCH]
    stub.responder = lambda request: Reply.completion(
        whole(parent, f"# {request['seed']}") if request["model"] == "good" else "no idea", model=request["model"]
    )
    client = make_client(model=None, models=["good", "bad"])
    (op,) = [o for o in make_llm_operators(client.config, client=client) if o.name == "mutate"]
    for seed in range(12):
        op.propose([parent], ctx(seed=seed))
    models = [r["model"] for r in stub.requests]
    assert models.count("good") > models.count("bad") >= 1


def test_factory_presets_and_overrides(make_client: MakeClient) -> None:
    client = make_client()
    ops = make_llm_operators(client.config, client=client)
    assert [o.name for o in ops] == ["mutate", "mutate_diff", "repair", "crossover", "agent"]
    assert all(isinstance(o, Operator) for o in ops)
    assert {o.name: o.arity for o in ops}["crossover"] == 2
    assert sum(operator_weights(ops).values()) == pytest.approx(1.0)
    full = make_llm_operators(LLMConfig(diff_mode="full", operators={"agent": {"weight": 0}}), client=client)
    assert [o.name for o in full] == ["mutate", "repair", "crossover"]
    tiny = make_llm_operators(LLMConfig(preset="tiny", operators={"agent": {"max_turns": 3}}), client=client)
    agent = next(o for o in tiny if o.name == "agent")
    assert getattr(agent, "max_turns", None) == 3 and agent.max_tokens == 384
    with pytest.raises(ValueError, match="preset"):
        make_llm_operators(LLMConfig(preset="nope"), client=client)
    with pytest.raises(ValueError, match="unknown kind"):
        make_llm_operators(LLMConfig(operators={"weird": {}}), client=client)
    with pytest.raises(ValueError, match="repair"):
        make_llm_operators(LLMConfig(operators={"repair": {"max_turn": 1}}), client=client)
