"""A scripted OpenAI-compatible chat server on loopback, for tests and dry runs.

The ``openai`` 3.x client talks through httpx2, which the usual httpx mocks do not
intercept, so tests run a real HTTP server instead: each request to
``/v1/chat/completions`` takes the next scripted :class:`Reply` (or asks a
responder function when the script is empty). Replies can be good completions,
tool calls, HTTP errors, slow answers, broken bodies or dropped connections.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer. Build them with the class methods."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    """Close the connection without answering."""

    @classmethod
    def completion(
        cls,
        content: str | None = "",
        *,
        tool_calls: list[dict[str, Any]] | None = None,
        prompt_tokens: int = 10,
        completion_tokens: int = 20,
        model: str = "stub-model",
        finish_reason: str | None = None,
        delay_s: float = 0.0,
    ) -> Reply:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.get("id", f"call_{i}"),
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": call["arguments"]
                        if isinstance(call["arguments"], str)
                        else json.dumps(call["arguments"]),
                    },
                }
                for i, call in enumerate(tool_calls)
            ]
        payload = {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return cls(body=json.dumps(payload).encode(), delay_s=delay_s)

    @classmethod
    def tools(cls, *calls: tuple[str, dict[str, Any]], content: str | None = None) -> Reply:
        return cls.completion(
            content, tool_calls=[{"name": n, "arguments": a} for n, a in calls]
        )

    @classmethod
    def error(cls, status: int, message: str = "scripted error", retry_after: float | None = None) -> Reply:
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        body = json.dumps({"error": {"message": message, "type": "stub", "code": status}})
        return cls(status=status, body=body.encode(), headers=headers)

    @classmethod
    def raw(cls, body: bytes, content_type: str = "application/json") -> Reply:
        return cls(body=body, content_type=content_type)

    @classmethod
    def dropped(cls) -> Reply:
        return cls(drop=True)


Responder = Callable[[dict[str, Any]], Reply]


class StubLLMServer:
    """``with StubLLMServer() as s: s.push(Reply.completion("..."))``; ``s.base_url``."""

    def __init__(self, responder: Responder | None = None, host: str = "127.0.0.1") -> None:
        self.script: deque[Reply] = deque()
        self.responder = responder or (lambda request: Reply.completion("no script left"))
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.script.extend(replies)

    def _next(self, request: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self._lock:
            self.requests.append(request)
            self.headers.append(headers)
            if self.script:
                return self.script.popleft()
        return self.responder(request)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                return

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(Reply.raw(json.dumps({"object": "list", "data": [{"id": "stub-model", "object": "model"}]}).encode()))
                else:
                    self._send(Reply.error(404, f"no route {self.path}"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(Reply.error(404, f"no route {self.path}"))
                    return
                try:
                    request = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(Reply.error(400, "request body is not JSON"))
                    return
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._send(server._next(request, dict(self.headers.items())))
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _send(self, reply: Reply) -> None:
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.drop:
                    self.close_connection = True
                    self.connection.close()
                    return
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(reply.body)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to do

        return Handler

    def start(self) -> StubLLMServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> StubLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
