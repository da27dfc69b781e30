"""A chat client over any OpenAI-compatible endpoint, with record/replay and a budget.

``openai``'s own retries are off (``max_retries=0``): this module retries 429s,
5xx, timeouts, dropped connections and malformed replies itself, with exponential
backoff through an injectable ``sleep``, so the behaviour is deterministic and
testable. A semaphore bounds requests in flight. Every reply is charged to the
run's :class:`TokenBudget`; in ``record`` mode it is also stored, and any request
already stored is answered from disk without contacting the endpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from evokernel.llm.budget import TokenBudget, Usage
from evokernel.llm.config import NO_KEY, LLMConfig
from evokernel.llm.errors import BudgetSpent, EndpointError, LLMError, MalformedReply, NotRecorded
from evokernel.llm.record import Recording, request_key

Message = dict[str, Any]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The raw JSON text the model wrote (may be invalid: the caller decides)."""


@dataclass(frozen=True)
class ChatReply:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    model: str = ""
    usage: Usage = field(default_factory=Usage)
    key: str = ""
    recorded: bool = False
    """Answered from the recording rather than the endpoint."""

    def to_json(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "tool_calls": [{"id": t.id, "name": t.name, "arguments": t.arguments} for t in self.tool_calls],
            "finish_reason": self.finish_reason,
            "model": self.model,
            "usage": {"prompt_tokens": self.usage.prompt_tokens, "completion_tokens": self.usage.completion_tokens},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], key: str, recorded: bool) -> ChatReply:
        usage = data.get("usage") or {}
        return cls(
            content=data.get("content") or "",
            tool_calls=tuple(ToolCall(t["id"], t["name"], t["arguments"]) for t in data.get("tool_calls") or []),
            finish_reason=data.get("finish_reason"),
            model=data.get("model") or "",
            usage=Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))),
            key=key,
            recorded=recorded,
        )

    def assistant_message(self) -> Message:
        """This reply as the assistant turn of a follow-up request."""
        msg: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for t in self.tool_calls
            ]
        return msg


def _parse_completion(raw: Any, fallback_model: str) -> ChatReply:
    """Our reply type from whatever ``openai`` returned; MalformedReply if it is not one."""
    choices = getattr(raw, "choices", None)
    if not choices:
        raise MalformedReply(f"the endpoint answered with no choices: {str(raw)[:200]!r}")
    message = getattr(choices[0], "message", None)
    if message is None:
        raise MalformedReply("the endpoint's first choice has no message")
    calls = []
    for i, call in enumerate(getattr(message, "tool_calls", None) or []):
        fn = getattr(call, "function", None)
        if fn is None:
            continue
        calls.append(ToolCall(call.id or f"call_{i}", fn.name or "", fn.arguments or ""))
    usage = getattr(raw, "usage", None)
    return ChatReply(
        content=message.content or "",
        tool_calls=tuple(calls),
        finish_reason=getattr(choices[0], "finish_reason", None),
        model=getattr(raw, "model", None) or fallback_model,
        usage=Usage(
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(usage, "completion_tokens", 0) or 0),
        ),
    )


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = None if response is None else response.headers.get("retry-after")
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _transient(exc: Exception) -> bool:
    if isinstance(exc, openai.APIConnectionError | MalformedReply | json.JSONDecodeError):
        return True  # APITimeoutError is an APIConnectionError
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


@dataclass
class ClientStats:
    requests: int = 0
    """Requests sent to the endpoint (retries included)."""
    retries: int = 0
    recorded_hits: int = 0
    failures: dict[str, int] = field(default_factory=dict)


class ChatClient:
    """``chat(messages, tools=...) -> ChatReply``; raises only :class:`LLMError` subclasses."""

    def __init__(
        self,
        config: LLMConfig,
        run_dir: str | Path | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        budget: TokenBudget | None = None,
    ) -> None:
        self.config = config
        self.mode = config.mode
        folder = config.recordings(run_dir)
        if self.mode == "replay" and folder is None:
            raise ValueError("llm.mode 'replay' needs a run directory or llm.recording_dir")
        self.recording = None if self.mode == "live" or folder is None else Recording(folder)
        self.models = config.resolved_models(environ)
        if not self.models and self.mode == "replay" and self.recording is not None:
            self.models = self.recording.models()  # replay needs no flags beyond --llm replay
        self.models = self.models or ["default"]
        self.budget = budget or TokenBudget(config.token_budget, config.prices)
        if self.mode == "record" and self.recording is not None:
            self._charge_existing()
        self.sleep = sleep
        self.stats = ClientStats()
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._lock = threading.Lock()
        self._openai: openai.OpenAI | None = None
        if self.mode != "replay":
            self._openai = openai.OpenAI(
                base_url=config.resolved_base_url(environ),
                api_key=config.api_key(environ) or NO_KEY,
                timeout=config.timeout_s,
                max_retries=0,
            )

    def __repr__(self) -> str:  # never shows the key
        return f"ChatClient(mode={self.mode!r}, models={self.models!r}, budget={self.budget.summary()!r})"

    def _charge_existing(self) -> None:
        """A resumed recording run: what it already spent counts against its budget."""
        assert self.recording is not None
        for key in self.recording.stored_keys():
            record = self.recording.get(key)
            if record is not None:
                reply = ChatReply.from_json(record["reply"], key, recorded=True)
                self.budget.charge(key, reply.model, reply.usage)

    # -- the one public call ---------------------------------------------------------
    def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> ChatReply:
        request: dict[str, Any] = {
            "model": model or self.models[0],
            "messages": [dict(m) for m in messages],
            "temperature": self.config.temperature if temperature is None else temperature,
            "max_tokens": max_tokens or self.config.max_tokens,
        }
        if tools:
            request["tools"] = [dict(t) for t in tools]
        if seed is not None:
            request["seed"] = int(seed)
        key = request_key(request)
        try:
            return self._answer(key, request)
        except LLMError as exc:
            with self._lock:
                self.stats.failures[exc.reason] = self.stats.failures.get(exc.reason, 0) + 1
            raise

    def complete(self, prompt: str, **kwargs: Any) -> str:
        """The text-in, text-out form of ``OperatorContext.llm``."""
        return self.chat([{"role": "user", "content": prompt}], **kwargs).content

    def _answer(self, key: str, request: dict[str, Any]) -> ChatReply:
        if self.recording is not None:
            record = self.recording.get(key)
            if record is not None:
                reply = ChatReply.from_json(record["reply"], key, recorded=True)
                self.budget.charge(key, reply.model, reply.usage)
                with self._lock:
                    self.stats.recorded_hits += 1
                return reply
        if self.mode == "replay":
            folder = self.recording.directory if self.recording else None
            raise NotRecorded(
                f"replay: request {key} was never recorded in {folder}; "
                "record it first (llm.mode: record) or replay the run it came from"
            )
        if self.budget.spent:
            raise BudgetSpent(
                f"the LLM token budget ({self.budget.limit}) is spent: "
                f"{self.budget.usage.total} tokens used"
            )
        started = time.monotonic()
        reply, attempts = self._ask(request)
        reply = dataclasses.replace(reply, key=key)
        self.budget.charge(key, reply.model, reply.usage)
        if self.recording is not None:
            self.recording.put(
                key, request, reply.to_json(),
                latency_s=round(time.monotonic() - started, 3), attempts=attempts,
                recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            )
        return reply

    def _ask(self, request: dict[str, Any]) -> tuple[ChatReply, int]:
        assert self._openai is not None
        body = dict(request)
        if not self.config.send_seed:
            body.pop("seed", None)
        last: Exception | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                delay = self._delay(attempt, last)
                logger.info("LLM request failed (%s); retry %d of %d in %.1f s", type(last).__name__, attempt,
                            self.config.max_retries, delay)
                self.sleep(delay)
                with self._lock:
                    self.stats.retries += 1
            with self._lock:
                self.stats.requests += 1
            try:
                with self._slots:
                    raw = self._openai.chat.completions.create(**body)
                return _parse_completion(raw, request["model"]), attempt + 1
            except Exception as exc:
                if isinstance(exc, LLMError) and not isinstance(exc, MalformedReply):
                    raise
                if not _transient(exc):
                    raise EndpointError(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
                last = exc
        assert last is not None
        error = MalformedReply if isinstance(last, MalformedReply | json.JSONDecodeError) else EndpointError
        raise error(
            f"gave up after {self.config.max_retries + 1} attempts: {type(last).__name__}: {str(last)[:300]}"
        ) from last

    def _delay(self, attempt: int, exc: Exception | None) -> float:
        delay = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** (attempt - 1))
        hint = None if exc is None else _retry_after(exc)
        if hint is not None:
            delay = min(self.config.backoff_max_s, max(delay, hint))
        return float(delay)
