"""The fork server (evokernel/evaluate/zygote.py): a process it forks is confined exactly
as a fresh interpreter is, holds nothing of the server, dies with its namespace, and the
judge falls back to fresh interpreters, saying so, where the server cannot run."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from evokernel.candidate import load_candidate
from evokernel.evaluate import isolation, process_supply
from evokernel.evaluate.isolation import namespaces_permitted, probe
from evokernel.evaluate.process import CandidateHandle, ForkServer, ForkServerDown
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxEvaluator

from .redteam import CANDIDATES, HONEST, PLANTED, config_for, planted_secrets

SHAPE = "30cecff1-7ea4-474b-90fc-7f4a87206d8e"
MARK = "EVOKERNEL-OBSERVED "
confined_here = pytest.mark.skipif(not namespaces_permitted() or os.geteuid() != 0,
                                   reason="needs root and permission to create namespaces")


def _observed(work_dir: Path) -> dict:  # type: ignore[type-arg]
    lines = [line for log in (work_dir / "logs").glob("*.log")
             for line in log.read_text(errors="replace").splitlines() if line.startswith(MARK)]
    assert len(lines) == 1, lines
    return json.loads(lines[0][len(MARK):])  # type: ignore[no-any-return]


def _dead(pid: int) -> bool:
    """Gone, or a zombie left for whoever reaps orphans here."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@confined_here
def test_a_forked_process_is_confined_like_a_fresh_one(tmp_path: Path) -> None:
    """The candidate's own code, run where the fork server put it, sees what a fresh
    interpreter's confined process sees (test_isolation.py): nobody, alone in its PID
    namespace, no network, no secret, only its private folders writable; and of
    descriptors, only its channel to the judge (not the server's control socket)."""
    config = config_for("cpu", static_screen="off")
    mounts = Path("/proc/self/mountinfo").read_text()
    with planted_secrets(), SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        result = ev.evaluate(load_candidate(CANDIDATES / "reports_confinement.py", "dsa_topk"), [SHAPE])
        assert ev.environment()["spawn"] == "fork server"
        # its private mounts stayed in its namespace (they are made private first)
        assert Path("/proc/self/mountinfo").read_text() == mounts
    assert result.status is Status.INCORRECT, result.feedback  # loaded and called
    seen = _observed(tmp_path)
    assert seen["uid"] == seen["euid"] == 65534
    assert seen["pid"] == 1 and seen["visible_processes"] == 1
    assert seen["interfaces"] in (["lo"], [])
    assert not set(PLANTED) & set(seen["environment"])
    assert seen["writable"] == ["/tmp", "/dev/shm"]
    assert seen["oom_score_adj"] == isolation.OOM_SCORE_ADJ
    assert seen["keyring"] in ("refused", "not known on this machine")
    assert seen["user_namespace"] == "refused" or seen["keyring"] == "not known on this machine"
    assert seen["file_locks"] == "none"
    assert len(seen["ptys"]) <= 1, seen["ptys"]
    if isolation.task_limit_permitted():
        assert seen["threads"] < isolation.TASK_LIMIT
    assert seen["sockets"] == [3], seen["sockets"]  # the channel alone
    assert seen["arguments"] == ["3", "cpu"]  # as a fresh candidate_main's: its channel, its device
    listing = seen["root_home_listing"] or []
    assert len(listing) <= 1 and all(name in (".pyenv", ".local", ".venv") for name in listing)


@confined_here
def test_a_killed_process_takes_its_namespace_and_the_server_forks_on(tmp_path: Path) -> None:
    confinement = probe(True, 8.0)
    server = ForkServer("cpu", confinement, tmp_path / "server.log")
    try:
        first = CandidateHandle("cpu", confinement, tmp_path / "a.log", forks=server)
        first.ready(60)
        assert first.forked and first._first is not None
        inner = Path(f"/proc/{first.proc.pid}/task/{first.proc.pid}/children").read_text().split()
        assert len(inner) == 1  # the namespace's first process, under its keeper
        assert first.kill(10)
        assert _dead(int(inner[0]))
        assert first.exit_code() == -9  # the keeper ends as the candidate did
        second = CandidateHandle("cpu", confinement, tmp_path / "b.log", forks=server)
        second.ready(60)
        assert "error" not in second.request("ping", 10)
        assert set(second.start_steps_s) == {"spare_fork_s", "spare_namespaces_s", "spare_confine_s"}
        assert second.kill(10)
    finally:
        server.close()


@confined_here
def test_the_processes_it_forked_die_with_the_server(tmp_path: Path) -> None:
    confinement = probe(True, 8.0)
    server = ForkServer("cpu", confinement, tmp_path / "server.log")
    handle = CandidateHandle("cpu", confinement, tmp_path / "a.log", forks=server)
    handle.ready(60)
    inner = int(Path(f"/proc/{handle.proc.pid}/task/{handle.proc.pid}/children").read_text().split()[0])
    held = [os.pidfd_open(handle.proc.pid), os.pidfd_open(inner)]  # the keeper, the candidate
    server.proc.kill()
    server.proc.wait()
    for fd in held:  # the candidate too, nobody by then (a change of user clears its death signal)
        assert select.select([fd], [], [], 10)[0], "a forked process outlived its server"
        os.close(fd)
    handle.kill(10)
    server.close()


@confined_here
def test_no_exit_code_of_an_earlier_candidate_reaches_a_later_one(tmp_path: Path) -> None:
    """An exit code is the candidate's to choose: a server that kept them would hand every
    later fork (a copy of its memory) a message from each earlier candidate. Its code
    reaches the judge through a pipe, and the next fork finds none in the server's state
    (red team of 2026-12-06: ``gc.get_objects()`` found them)."""
    config = config_for("cpu", static_screen="off", trials=1, batches=1)
    (tmp_path / "sends.py").write_text("import os\nos._exit(77)\n")
    (tmp_path / "reads.py").write_text(
        "import gc, json\n"
        "found = [{k: v for k, v in vars(o).items() if isinstance(v, dict)} for o in gc.get_objects()\n"
        "         if type(o).__name__ == '_Server']\n"
        f"print({MARK!r} + json.dumps(found), flush=True)\n"
        + (CANDIDATES / HONEST).read_text())
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "run", config=config) as ev:
        sent = ev.evaluate(load_candidate(tmp_path / "sends.py", "dsa_topk"), [SHAPE])
        ev.evaluate(load_candidate(tmp_path / "reads.py", "dsa_topk"), [SHAPE])
    assert sent.status is Status.BUILD_FAILED and "exit code 77" in sent.feedback, sent.feedback
    (state,) = _observed(tmp_path / "run")
    assert all(not table for table in state.values()), state  # no pid, no code


def _fork_unsafe_beside_a_thread(sleeping_s: float, wait_s: float) -> str:
    """What ``fork_unsafe(wait_s)`` says in a fresh process with one more thread, asleep."""
    script = ("import threading, time\n"
              f"threading.Thread(target=time.sleep, args=({sleeping_s},), daemon=True).start()\n"
              "from evokernel.evaluate.zygote import fork_unsafe\n"
              f"print(fork_unsafe(wait_s={wait_s}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    return done.stdout.strip() + done.stderr


def test_it_will_not_fork_beside_another_thread() -> None:
    """Only the forking thread survives a fork (with the locks the others held): a
    server that finds a second thread refuses, and says which; one that ends within the
    wait (a library's, for a moment) is waited for."""
    assert "runs 2 threads (python, python)" in _fork_unsafe_beside_a_thread(30, 0.0)
    assert _fork_unsafe_beside_a_thread(0.2, 5.0) == "None"


def test_the_judge_starts_fresh_interpreters_when_the_server_cannot_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*args: object, **kwargs: object) -> ForkServer:
        raise ForkServerDown("the fork server cannot fork: planted")

    monkeypatch.setattr(process_supply, "ForkServer", refuse)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", trials=1, batches=1)) as ev:
        result = ev.evaluate(load_candidate(CANDIDATES / HONEST, "dsa_topk"), [SHAPE])
        spawn = ev.environment()["spawn"]
    assert result.status is Status.PASSED, result.feedback
    assert spawn.startswith("fresh interpreters") and "planted" in spawn
    assert "spare_import_s" in result.overheads  # the interpreter's own start
    assert "fresh interpreters" in caplog.text


def test_a_server_that_stops_leaves_the_judge_running(tmp_path: Path) -> None:
    """Killed mid-run, the server's next fork fails; the judge goes on with fresh
    interpreters and records why."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", trials=1, batches=1)) as ev:
        first = ev.evaluate(load_candidate(CANDIDATES / HONEST, "dsa_topk"), [SHAPE])
        assert ev._supply._forks is not None
        ev._supply._forks.proc.kill()
        ev._supply._forks.proc.wait()
        deadline = time.monotonic() + 60
        second = ev.evaluate(load_candidate(CANDIDATES / HONEST, "dsa_topk"), [SHAPE])
        while time.monotonic() < deadline and not ev.environment()["spawn"].startswith("fresh"):
            ev.evaluate(load_candidate(CANDIDATES / HONEST, "dsa_topk"), [SHAPE])
        spawn = ev.environment()["spawn"]
    assert first.status is Status.PASSED and second.status is Status.PASSED, second.feedback
    assert spawn.startswith("fresh interpreters"), spawn


def test_forks_that_keep_failing_to_start_turn_the_server_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked processes that die before they answer (here: an environment their
    confinement cannot read) are retried, and after a few in a row the judge starts fresh
    interpreters, saying why, rather than failing every evaluation."""
    spawn = ForkServer.spawn

    def broken(self: ForkServer, channel_fd: int, log_fd: int, env: dict[str, str], threads: int) -> Any:
        return spawn(self, channel_fd, log_fd, {**env, isolation.CONFINE_VARIABLE: "{not json"}, threads)

    monkeypatch.setattr(ForkServer, "spawn", broken)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", trials=1, batches=1)) as ev:
        result = ev.evaluate(load_candidate(CANDIDATES / HONEST, "dsa_topk"), [SHAPE])
        spawn_record = ev.environment()["spawn"]
    assert result.status is Status.PASSED, result.feedback
    assert spawn_record.startswith("fresh interpreters") and "in a row failed to start" in spawn_record


@pytest.mark.parametrize("during", ["baseline", "candidate"])
def test_a_server_that_stops_mid_evaluation_costs_the_candidate_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, during: str) -> None:
    """The server dies after a process was taken (its forks die with it), while the
    baseline is timed or the candidate judged: that one is run again in a fresh
    interpreter, rather than the run failing or the candidate being failed."""
    round_trip = SandboxEvaluator._round_trip
    killed: list[bool] = []

    def then_kill_the_server(self: SandboxEvaluator, handle: Any, lane: int = 0) -> Any:
        handle = round_trip(self, handle, lane)
        if not killed and handle.server is not None:
            handle.server.proc.kill()
            handle.server.proc.wait()
            deadline = time.monotonic() + 30
            while handle.alive() and time.monotonic() < deadline:  # it dies with its server
                time.sleep(0.01)
            killed.append(not handle.alive())
        return handle

    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", trials=1, batches=1)) as ev:
        if during == "candidate":
            ev.baseline_timings([SHAPE])
        monkeypatch.setattr(SandboxEvaluator, "_round_trip", then_kill_the_server)
        result = ev.evaluate(load_candidate(CANDIDATES / HONEST, "dsa_topk"), [SHAPE])
        spawn = ev.environment()["spawn"]
    assert killed == [True]
    assert result.status is Status.PASSED, result.feedback
    assert spawn.startswith("fresh interpreters") and "stopped" in spawn, spawn
