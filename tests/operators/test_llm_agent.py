"""The agent: tool calls to build/check/time through an injected evaluator, bounded loops."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.llm import ChatClient, LLMConfig
from evokernel.llm.stub import Reply, StubLLMServer
from evokernel.operators import OperatorContext
from evokernel.operators.llm import LLMAgent

MakeClient = Callable[..., ChatClient]
MakeCtx = Callable[..., OperatorContext]
FILE = "torch_vectorized.py"
SHAPES = ["s0", "s1"]


class FakeEvaluator:
    """PASSED with speedup = the number of '# fast' lines; BUILD_FAILED if 'syntax error' appears."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        self.calls.append(candidate.id)
        text = candidate.sources[FILE]
        if "syntax error" in text:
            return Evaluation(candidate_id=candidate.id, status=Status.BUILD_FAILED, feedback="SyntaxError at line 3")
        speed = 1 + text.count("# fast")

        def timing(ms: float) -> Timing:
            return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=5, method="cpu-wallclock")

        return Evaluation(
            candidate_id=candidate.id, status=Status.PASSED,
            shapes=tuple(ShapeResult(shape=s, status=Status.PASSED, timing=timing(1.0 / speed), reference=timing(1.0))
                         for s in shapes),
        )


def diff(search: str, replace: str) -> str:
    return f"{FILE}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def agent_ctx(ctx: MakeCtx, evaluate: FakeEvaluator, seed: int = 0) -> OperatorContext:
    return ctx(seed=seed, evaluate=evaluate, agent_shapes=SHAPES)


def test_agent_edits_evaluates_and_returns_its_best(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds["torch_vectorized"]
    line = next(ln for ln in parent.sources[FILE].splitlines() if "def build" in ln)
    evaluate = FakeEvaluator()
    stub.push(
        Reply.tools(("build", {"diff": diff(line, f"# fast\n{line}")})),
        Reply.tools(("check", {}), ("time", {})),  # same draft: one evaluation serves both
        Reply.tools(("time", {"diff": diff(line, "syntax error")})),  # worse: must not be returned
        Reply.tools(("build", {"diff": diff("not in the file", "x")}), ("nonsense", {}), ("time", "{not json")),
        Reply.completion("Done: marked the build function fast."),
    )
    op = LLMAgent(make_client(), max_turns=8)
    (child,) = op.propose([parent], agent_ctx(ctx, evaluate))
    assert child.sources[FILE].count("# fast") == 1 and child.parents == (parent.id,) and child.operator == "agent"
    assert len(evaluate.calls) == 2 and len(op.last_evaluations) == 2
    record = op.history[-1]
    assert record.outcome.value == "child" and record.evaluations == 2 and len(record.requests) == 5
    # the tool results went back to the model with the right ids
    last = stub.requests[-1]["messages"]
    tool_msgs = [m for m in last if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs][:3] == ["call_0", "call_0", "call_1"]
    assert "correct on every shape" in tool_msgs[1]["content"] and "2.000x" in tool_msgs[2]["content"]
    assert "cannot be timed: BUILD_FAILED" in tool_msgs[3]["content"]
    assert "is not in" in tool_msgs[4]["content"] and "unknown tool" in tool_msgs[5]["content"]
    assert "not valid JSON" in tool_msgs[6]["content"]
    assert stub.requests[0]["tools"][0]["function"]["name"] == "build"


def test_agent_bounded_by_turns_and_evaluations(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds["torch_vectorized"]
    counter = iter(range(100))
    stub.responder = lambda request: Reply.tools(
        ("time", {"files": {FILE: parent.sources[FILE] + "# fast\n" * (1 + next(counter))}})
    )
    evaluate = FakeEvaluator()
    op = LLMAgent(make_client(), max_turns=4, max_evaluations=2)
    (child,) = op.propose([parent], agent_ctx(ctx, evaluate))
    assert len(stub.requests) == 4 and len(evaluate.calls) == 2
    assert child.sources[FILE].count("# fast") == 2  # the best of the two it could evaluate
    assert "turn limit" in op.history[-1].detail
    assert "evaluations are spent" in stub.requests[-1]["messages"][-1]["content"]


def test_agent_keeps_its_best_when_the_endpoint_dies(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds["torch_vectorized"]
    stub.push(Reply.tools(("time", {"files": {FILE: parent.sources[FILE] + "# fast\n"}})), Reply.error(500), Reply.error(500))
    op = LLMAgent(make_client())
    (child,) = op.propose([parent], agent_ctx(ctx, FakeEvaluator()))
    assert "# fast" in child.sources[FILE] and "endpoint_error" in op.history[-1].detail


def test_agent_without_tools_or_progress(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate]
) -> None:
    parent = seeds["torch_vectorized"]
    op = LLMAgent(make_client())
    assert op.propose([parent], ctx()) == [] and op.outcomes == {"not_applicable": 1}
    stub.push(Reply.completion("I would not change anything."))
    assert op.propose([parent], agent_ctx(ctx, FakeEvaluator())) == [] and op.outcomes["unchanged"] == 1
    stub.push(Reply.error(500), Reply.error(500))  # a new seed: the same request would be answered from the recording
    assert op.propose([parent], agent_ctx(ctx, FakeEvaluator(), seed=1)) == [] and op.outcomes["endpoint_error"] == 1
    # a model that ignores the tools but answers with code still gives a (not yet evaluated) child
    stub.push(Reply.completion(f"```python {FILE}\n{parent.sources[FILE]}# fast\n```"))
    (child,) = op.propose([parent], agent_ctx(ctx, FakeEvaluator(), seed=2))
    assert child.sources[FILE].endswith("# fast\n")


def test_agent_replays_exactly(
    stub: StubLLMServer, make_client: MakeClient, ctx: MakeCtx, seeds: dict[str, Candidate], tmp_path: Path
) -> None:
    parent = seeds["torch_vectorized"]
    stub.push(
        Reply.tools(("time", {"files": {FILE: parent.sources[FILE] + "# fast\n"}})),
        Reply.completion("done"),
    )
    (recorded,) = LLMAgent(make_client()).propose([parent], agent_ctx(ctx, FakeEvaluator()))
    stub.stop()
    evaluate = FakeEvaluator()
    replay = ChatClient(LLMConfig(mode="replay", model="stub-model"), tmp_path, environ={})
    (again,) = LLMAgent(replay).propose([parent], agent_ctx(ctx, evaluate))
    assert again.id == recorded.id and evaluate.calls == []  # tool results came from the recording
