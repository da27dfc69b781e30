"""The web app over real HTTP (uvicorn on loopback): routes, the event stream, bad files."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from evokernel.dashboard.server import clean, plotly_js

from .conftest import LiveServer, copy_run, tree_fingerprint


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
            kind = resp.headers.get("content-type", "")
            return resp.status, json.loads(body) if "json" in kind else body
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def events(url: str, count: int, timeout: float = 20) -> list[dict[str, Any]]:
    """The first ``count`` ``state`` events of the stream at ``url``."""
    out = []
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        event = None
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "state":
                out.append(json.loads(line[6:]))
                if len(out) == count:
                    return out
    return out


def test_the_page_and_its_scripts_come_from_this_server(islands_run: Path) -> None:
    with LiveServer(islands_run) as server:
        status, page = get(server.url + "/")
        assert status == 200
        html = page.decode()
        assert 'src="/static/plotly.min.js"' in html and 'src="/static/app.js"' in html
        assert "http://" not in html and "https://" not in html  # nothing from the network
        status, plotly = get(server.url + "/static/plotly.min.js")
        assert status == 200 and plotly == plotly_js().read_bytes()
        status, script = get(server.url + "/static/app.js")
        assert status == 200 and b"EventSource" in script and b"https://" not in script


def test_state_node_and_errors(islands_run: Path) -> None:
    before = tree_fingerprint(islands_run)
    with LiveServer(islands_run) as server:
        status, state = get(server.url + "/api/state")
        assert status == 200 and state["kind"] == "run" and state["evaluations"] > 0
        best = state["best"]["id"]
        status, node = get(server.url + f"/api/node?id={best}")
        assert status == 200 and node["id"] == best and node["evaluation"]["status"] == "PASSED"
        status, missing = get(server.url + "/api/node?id=0123456789abcdef")
        assert status == 404 and "0123456789abcdef" in missing["error"]
        status, bad = get(server.url + "/api/node?id=..%2Frun.json")
        assert status == 404 and "not a candidate id" in bad["error"]
    assert tree_fingerprint(islands_run) == before


def test_a_torn_and_a_corrupt_journal_are_messages_never_server_errors(islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    lines = (run / "journal.jsonl").read_bytes().splitlines(keepends=True)
    with LiveServer(run) as server:
        (run / "journal.jsonl").write_bytes(b"".join(lines[:6]) + lines[6][: len(lines[6]) // 2])
        status, state = get(server.url + "/api/state")
        assert status == 200 and state["evaluations"] == 6
        assert any("partly written line" in n for n in state["notices"])
        (run / "journal.jsonl").write_bytes(b"".join(lines[:6]) + b'{"seq": 6, "gen": \n' + b"".join(lines[7:9]))
        status, state = get(server.url + "/api/state")
        assert status == 200 and state["evaluations"] == 8
        assert any("corrupt line" in n and "line 7" in n for n in state["notices"])
        (run / "journal.jsonl").write_bytes(b"\x00\xff" * 50)
        status, state = get(server.url + "/api/state")
        assert status == 200 and state["evaluations"] == 0
        assert any("partly written line (100 bytes)" in n for n in state["notices"])


def test_the_stream_sends_a_new_state_when_the_journal_grows(islands_run: Path, tmp_path: Path) -> None:
    import threading

    run = copy_run(islands_run, tmp_path)
    lines = (run / "journal.jsonl").read_bytes().splitlines(keepends=True)
    (run / "journal.jsonl").write_bytes(b"".join(lines[:5]))

    def grow() -> None:
        for line in lines[5:8]:
            threading.Event().wait(0.6)
            with open(run / "journal.jsonl", "ab") as f:
                f.write(line)

    with LiveServer(run, poll_s=0.1) as server:
        writer = threading.Thread(target=grow)
        writer.start()
        seen = events(server.url + "/api/events", 4)
        writer.join()
    counts = [s["evaluations"] for s in seen]
    assert counts == [5, 6, 7, 8]
    assert [s["version"] for s in seen] == sorted({s["version"] for s in seen})


def test_a_comparison_serves_its_runs_by_key_only(comparison: Path) -> None:
    with LiveServer(comparison) as server:
        status, state = get(server.url + "/api/state")
        assert status == 200 and state["kind"] == "comparison"
        key = state["runs"][-1]["key"]
        status, chosen = get(server.url + "/api/state?run=" + urllib.request.quote(key))
        assert chosen["selected"]["label"] == key
        best = chosen["selected"]["best"]["id"]
        status, node = get(server.url + f"/api/node?id={best}&run=" + urllib.request.quote(key))
        assert status == 200 and node["run"] == key
        status, refused = get(server.url + f"/api/node?id={best}&run=..")
        assert status == 404 and "no run" in refused["error"]


def test_a_directory_that_is_not_yet_a_run_waits(tmp_path: Path) -> None:
    with LiveServer(tmp_path) as server:
        status, state = get(server.url + "/api/state")
        assert status == 200 and state["kind"] == "waiting" and "waiting" in state["notices"][0]


def test_json_has_no_nan_or_infinity() -> None:
    assert clean({"a": [math.nan, 1.5, {"b": math.inf}], "c": (1, -math.inf)}) == {
        "a": [None, 1.5, {"b": None}], "c": [1, None]}
