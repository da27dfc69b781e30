"""The chat client against a real HTTP server: replies, retries, faults, budget, recording."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from evokernel.llm import (
    BudgetSpent,
    ChatClient,
    EndpointError,
    LLMConfig,
    MalformedReply,
    NotRecorded,
    Price,
)
from evokernel.llm.stub import Reply, StubLLMServer

MakeClient = Callable[..., ChatClient]
ASK = [{"role": "user", "content": "hello"}]


def test_reply_usage_and_recording(stub: StubLLMServer, make_client: MakeClient, tmp_path: Path) -> None:
    stub.push(Reply.completion("hi there", prompt_tokens=7, completion_tokens=3))
    client = make_client()
    reply = client.chat(ASK, seed=5)
    assert reply.content == "hi there" and not reply.recorded
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 3)
    assert client.budget.usage.total == 10 and client.budget.calls == 1
    assert stub.requests[0]["seed"] == 5 and stub.requests[0]["model"] == "stub-model"
    stored = json.loads((tmp_path / "llm" / f"{reply.key}.json").read_text())
    assert stored["reply"]["content"] == "hi there" and stored["request"]["messages"] == ASK


def test_key_is_sent_but_never_written(stub: StubLLMServer, make_client: MakeClient, tmp_path: Path) -> None:
    secret = "sk-test-SECRET-0123456789"
    stub.push(Reply.completion("ok"))
    client = make_client(environ={"EVOKERNEL_LLM_API_KEY": secret})
    client.chat(ASK)
    assert {k.lower(): v for k, v in stub.headers[0].items()}["authorization"] == f"Bearer {secret}"
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text()
    assert secret not in repr(client) and secret not in client.config.model_dump_json()


def test_record_mode_never_asks_twice(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.push(Reply.completion("first", prompt_tokens=5, completion_tokens=5))
    make_client().chat(ASK, seed=1)
    resumed = make_client()  # a resumed run: same directory, fresh process
    assert resumed.budget.usage.total == 10  # what was spent before still counts
    reply = resumed.chat(ASK, seed=1)
    assert reply.content == "first" and reply.recorded
    assert len(stub.requests) == 1 and resumed.budget.usage.total == 10  # not charged twice
    resumed.chat(ASK, seed=2)  # a different request does go out
    assert len(stub.requests) == 2


def test_replay_needs_no_endpoint_and_names_misses(stub: StubLLMServer, make_client: MakeClient, tmp_path: Path) -> None:
    stub.push(Reply.completion("recorded answer"))
    make_client().chat(ASK, seed=3)
    stub.stop()
    replay = ChatClient(LLMConfig(mode="replay", model="stub-model"), tmp_path, environ={})
    assert replay.chat(ASK, seed=3).content == "recorded answer"
    assert replay.budget.usage.total == 30
    with pytest.raises(NotRecorded, match="never recorded"):
        replay.chat(ASK, seed=4)
    bare = ChatClient(LLMConfig(mode="replay"), tmp_path, environ={})  # the model comes from the recording
    assert bare.models == ["stub-model"] and bare.chat(ASK, seed=3).recorded
    with pytest.raises(ValueError, match="replay"):
        ChatClient(LLMConfig(mode="replay"), None, environ={})


def test_live_mode_writes_nothing(stub: StubLLMServer, make_client: MakeClient, tmp_path: Path) -> None:
    stub.push(Reply.completion("a"), Reply.completion("b"))
    client = make_client(mode="live")
    assert client.chat(ASK).content == "a" and client.chat(ASK).content == "b"
    assert not (tmp_path / "llm").exists()


@pytest.mark.parametrize(
    "fault",
    [
        Reply.error(429, "slow down"),
        Reply.error(500),
        Reply.error(503),
        Reply.raw(b'{"id": "x", "choices": [{"mess'),  # cut off mid-body
        Reply.raw(b"<html>bad gateway</html>", "text/html"),
        Reply.raw(b"{}"),  # valid JSON, not a completion
        Reply.dropped(),
    ],
    ids=["429", "500", "503", "truncated", "not-json", "empty-object", "dropped"],
)
def test_transient_fault_then_success(stub: StubLLMServer, make_client: MakeClient, sleeps: list[float], fault: Reply) -> None:
    stub.push(fault, Reply.completion("recovered"))
    client = make_client()
    assert client.chat(ASK).content == "recovered"
    assert len(stub.requests) == 2 and client.stats.retries == 1 and sleeps == [0.5]


def test_backoff_doubles_then_gives_up(stub: StubLLMServer, make_client: MakeClient, sleeps: list[float], tmp_path: Path) -> None:
    stub.push(*[Reply.error(500)] * 4)
    client = make_client(max_retries=3)
    with pytest.raises(EndpointError, match="gave up after 4 attempts"):
        client.chat(ASK)
    assert sleeps == [0.5, 1.0, 2.0] and len(stub.requests) == 4
    assert client.stats.failures == {"endpoint_error": 1}
    assert not list((tmp_path / "llm").glob("*.json"))  # nothing recorded for a failure


def test_retry_after_is_honoured(stub: StubLLMServer, make_client: MakeClient, sleeps: list[float]) -> None:
    stub.push(Reply.error(429, retry_after=3), Reply.completion("ok"))
    make_client().chat(ASK)
    assert sleeps == [3.0]


def test_malformed_every_time(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.push(*[Reply.raw(b"{}")] * 3)
    with pytest.raises(MalformedReply):
        make_client().chat(ASK)


def test_client_errors_are_not_retried(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.push(Reply.error(400, "context length exceeded"))
    with pytest.raises(EndpointError, match="400"):
        make_client().chat(ASK)
    assert len(stub.requests) == 1


def test_slow_reply_times_out_then_retry_succeeds(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.push(Reply.completion("late", delay_s=1.5), Reply.completion("on time"))
    client = make_client(timeout_s=0.4)
    started = time.monotonic()
    assert client.chat(ASK).content == "on time"
    assert time.monotonic() - started < 1.4  # the slow reply was abandoned, not awaited


def test_connection_refused(sleeps: list[float], tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = LLMConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=2, backoff_s=0.1)
    client = ChatClient(config, tmp_path, environ={}, sleep=sleeps.append)
    with pytest.raises(EndpointError, match="Connection"):
        client.chat(ASK)
    assert sleeps == [0.1, 0.2]


def test_token_budget_stops_requests(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.responder = lambda request: Reply.completion("x", prompt_tokens=20, completion_tokens=10)
    client = make_client(token_budget=50)
    client.chat(ASK, seed=1)
    client.chat(ASK, seed=2)
    with pytest.raises(BudgetSpent, match="budget"):
        client.chat(ASK, seed=3)
    assert len(stub.requests) == 2 and client.budget.spent and client.budget.left == 0
    assert client.chat(ASK, seed=1).recorded  # answered from the recording even so


def test_cost_estimate(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.push(Reply.completion("x", prompt_tokens=1_000_000, completion_tokens=500_000))
    client = make_client(prices={"stub-model": Price(input_per_mtok=2.0, output_per_mtok=8.0)})
    client.chat(ASK)
    assert client.budget.summary()["cost_usd"] == pytest.approx(6.0)


def test_concurrency_limit(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.responder = lambda request: Reply.completion("x", delay_s=0.2)
    client = make_client(concurrency=2)
    threads = [threading.Thread(target=client.chat, args=(ASK,), kwargs={"seed": i}) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(stub.requests) == 6 and stub.max_in_flight == 2


def test_tool_calls_round_trip(stub: StubLLMServer, make_client: MakeClient) -> None:
    stub.push(Reply.tools(("build", {"diff": "x"})))
    reply = make_client().chat(ASK, tools=[{"type": "function", "function": {"name": "build", "parameters": {}}}])
    assert [(t.name, json.loads(t.arguments)) for t in reply.tool_calls] == [("build", {"diff": "x"})]
    assert reply.assistant_message()["tool_calls"][0]["function"]["name"] == "build"
    assert stub.requests[0]["tools"][0]["function"]["name"] == "build"


def test_torn_record_is_asked_again(stub: StubLLMServer, make_client: MakeClient, tmp_path: Path) -> None:
    stub.push(Reply.completion("first"), Reply.completion("second"))
    key = make_client().chat(ASK).key
    (tmp_path / "llm" / f"{key}.json").write_text('{"version": 1, "key": "')  # killed mid-write elsewhere
    reply = make_client().chat(ASK)
    assert reply.content == "second" and not reply.recorded
    assert make_client().chat(ASK).content == "second"  # and the new answer replaced it
