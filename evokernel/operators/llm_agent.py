"""The agent operator: a bounded multi-turn loop in which the model edits a draft and
evaluates it with tools (``build``, ``check``, ``time``) through the chat API's tool calls.

The tools call ``ctx.evaluate(candidate, shapes) -> Evaluation`` on
``ctx.agent_shapes``; one evaluation per
distinct draft serves all three tools, which differ only in what they report. The
loop ends when the model answers without a tool call, or at ``max_turns``,
``token_limit`` or ``max_evaluations``; an LLM failure midway ends it too, and the
best draft so far is still returned. With a recording, the tools' evaluations are
kept with the replies so that a replayed agent sends the very same requests.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, Status
from evokernel.llm.client import ChatClient, Message, ToolCall
from evokernel.llm.edits import EditError, apply_edits, apply_reply, parse_edits
from evokernel.llm.errors import LLMError
from evokernel.llm.prompts import describe_candidate, describe_evaluation, render
from evokernel.operators.base import Evaluate, OperatorContext
from evokernel.operators.llm_base import Attempt, Failed, LLMOperator, Outcome, derive

_CHANGES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "files": {
            "type": "object",
            "description": "file name -> complete new content of that file",
            "additionalProperties": {"type": "string"},
        },
        "diff": {"type": "string", "description": "SEARCH/REPLACE blocks to apply to the draft"},
    },
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": name, "description": what, "parameters": _CHANGES}}
    for name, what in (
        ("build", "Apply the changes, then build the draft: compiler errors and resources."),
        ("check", "Apply the changes, then check the draft's correctness on the quick shapes."),
        ("time", "Apply the changes, then time the draft on the quick shapes against the reference."),
    )
]
_HEADLINE = {
    "build": lambda e: "build failed" if e.status is Status.BUILD_FAILED else "built",
    "check": lambda e: "correct on every shape" if e.status is Status.PASSED else f"not correct: {e.status.value}",
    "time": lambda e: "timed" if e.status is Status.PASSED else f"cannot be timed: {e.status.value}",
}


class LLMAgent(LLMOperator):
    """Arity 1: returns the best draft it evaluated (else its last draft), if it differs."""

    name = "agent"
    arity = 1
    spec_options: ClassVar[tuple[str, ...]] = ("max_turns", "token_limit", "max_evaluations")

    def __init__(
        self,
        client: ChatClient,
        name: str | None = None,
        *,
        max_turns: int = 6,
        token_limit: int = 60_000,
        max_evaluations: int = 6,
        **options: Any,
    ) -> None:
        super().__init__(client, name, **options)
        self.max_turns = max_turns
        self.token_limit = token_limit
        self.max_evaluations = max_evaluations
        self.last_evaluations: dict[str, Evaluation] = {}
        """The tools' evaluations from the last proposal, by candidate id (on the agent's shapes)."""

    def _propose(
        self, parents: Sequence[Candidate], ctx: OperatorContext, attempt: Attempt
    ) -> tuple[Candidate, str]:
        (parent,) = parents
        evaluate, shapes = ctx.evaluate, tuple(ctx.agent_shapes)
        if evaluate is None or not shapes:
            raise Failed(Outcome.NOT_APPLICABLE, "the agent needs ctx.evaluate and ctx.agent_shapes")
        session = _Session(self, parent, ctx, attempt, evaluate, shapes)
        stop = session.run()
        self.last_evaluations = {cid: ev for cid, (_, ev) in session.evaluated.items()}
        return session.result(stop)


class _Session:
    """One agent proposal: the conversation, the draft and what was evaluated."""

    def __init__(self, op: LLMAgent, parent: Candidate, ctx: OperatorContext, attempt: Attempt,
                 evaluate: Evaluate, shapes: tuple[str, ...]) -> None:
        self.op, self.parent, self.ctx, self.attempt = op, parent, ctx, attempt
        self.evaluate, self.shapes = evaluate, shapes
        self.draft = parent
        self.evaluated: dict[str, tuple[Candidate, Evaluation]] = {}
        self.messages: list[Message] = [
            {"role": "system", "content": render("system") + "\n" + render("agent_system", turns=op.max_turns)},
            {"role": "user", "content": render(
                "agent_task", workload=op._brief(ctx), candidate=describe_candidate(parent),
                evaluation=describe_evaluation(op._evaluation(ctx, 0), ctx.floor_ms),
            )},
        ]

    def run(self) -> str:
        """Talk until done; returns why it stopped."""
        for _ in range(self.op.max_turns):
            if self.attempt.tokens >= self.op.token_limit:
                return "token limit"
            try:
                reply = self.op._ask(self.messages, self.ctx, self.attempt, tools=TOOLS)
            except LLMError as exc:
                if not self.evaluated and self.draft is self.parent:
                    raise
                return exc.reason
            self.messages.append(reply.assistant_message())
            if not reply.tool_calls:
                self._final(reply.content)
                return "done"
            for call in reply.tool_calls:
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": self._tool(call)})
        return "turn limit"

    def _final(self, content: str) -> None:
        # a closing remark without code leaves the drafts so far as they are
        with contextlib.suppress(EditError, Failed):
            sources = apply_reply(content, self.draft.sources, self.parent.entry_point)
            self.draft = derive(self.parent, sources, self.op.name, self.ctx)

    def _tool(self, call: ToolCall) -> str:
        if call.name not in _HEADLINE:
            return f"error: unknown tool {call.name!r}; the tools are build, check and time"
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"error: the arguments are not valid JSON ({exc.msg}); nothing was changed"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object; nothing was changed"
        try:
            draft = self._apply(args)
        except (EditError, Failed) as exc:
            return f"error: {exc}; the draft is unchanged"
        self.draft = draft
        evaluation = self._evaluate(draft)
        if evaluation is None:
            return "error: this agent's evaluations are spent; reply without a tool call to finish"
        report = describe_evaluation(evaluation, self.ctx.floor_ms)
        return f"{call.name}: {_HEADLINE[call.name](evaluation)}\n{report}"

    def _apply(self, args: dict[str, Any]) -> Candidate:
        sources = dict(self.draft.sources)
        files = args.get("files") or {}
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise EditError("invalid_code", "'files' must map file names to their complete content")
        unknown = sorted(set(files) - set(sources))
        if unknown:
            raise EditError("invalid_code", f"unknown files {unknown}; the files are {sorted(sources)}")
        sources.update(files)
        diff = args.get("diff")
        if isinstance(diff, str) and diff.strip():
            edits = parse_edits(diff, list(sources))
            if not edits:
                raise EditError("diff_not_applied", "'diff' holds no SEARCH/REPLACE block")
            sources = apply_edits(sources, edits)
        if sources == self.draft.sources:
            return self.draft
        try:
            return derive(self.parent, sources, self.op.name, self.ctx)
        except Failed as exc:
            if exc.outcome is Outcome.UNCHANGED:
                return self.parent
            raise

    def _evaluate(self, candidate: Candidate) -> Evaluation | None:
        if candidate.id in self.evaluated:
            return self.evaluated[candidate.id][1]
        recording = self.op.client.recording
        evaluation = None if recording is None else recording.get_evaluation(candidate.id, self.shapes)
        if evaluation is None:
            if self.attempt.evaluations >= self.op.max_evaluations:
                return None
            self.attempt.evaluations += 1
            try:
                evaluation = self.evaluate(candidate, self.shapes)
            except Exception as exc:  # the evaluator's own failure: report it, keep going
                evaluation = Evaluation(candidate_id=candidate.id, status=Status.RUNTIME_ERROR,
                                        feedback=f"the evaluator failed: {type(exc).__name__}: {exc}")
            if recording is not None:
                recording.put_evaluation(self.shapes, evaluation)
        self.evaluated[candidate.id] = (candidate, evaluation)
        return evaluation

    def result(self, stop: str) -> tuple[Candidate, str]:
        tried = [(c, e) for c, e in self.evaluated.values() if c.code_id != self.parent.code_id]
        if tried:
            best, ev = max(tried, key=lambda ce: ce[1].rank_key())
            return best, f"best of {len(tried)} evaluated draft(s): {ev.status.value}; stopped: {stop}"
        if self.draft.code_id != self.parent.code_id:
            return self.draft, f"final draft, not evaluated; stopped: {stop}"
        raise Failed(Outcome.UNCHANGED, f"the agent produced no new draft; stopped: {stop}")
