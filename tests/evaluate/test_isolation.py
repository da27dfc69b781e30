"""Confinement of candidate processes: what a confined child sees on this machine."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from evokernel.evaluate import isolation
from evokernel.evaluate.isolation import (
    Isolation,
    child_environment,
    command,
    namespaces_permitted,
    probe,
)


def confined_report(isolation: Isolation, extra_env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    env = child_environment(isolation, extra_env)
    proc = subprocess.run(command(isolation, "evokernel.evaluate.isolation"), env=env,
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_environment_is_allow_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("SOMETHING_HARMLESS", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = child_environment(Isolation(False, False, None))
    assert "OPENAI_API_KEY" not in env and "SOMETHING_HARMLESS" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "EVOKERNEL_CONFINE" in env


def test_probe_says_what_is_missing(monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    none = probe(want=False)
    assert not none.namespaces and "NO namespaces" in none.describe()
    monkeypatch.setattr(isolation, "namespaces_permitted", lambda: False)
    refused = probe()
    assert not refused.namespaces and "NO namespaces" in refused.describe()
    assert "only partly confined" in caplog.text  # a warning, never a silent fallback
    assert "NO seccomp filter" in none.describe()


def test_probe_records_whether_the_call_filter_is_known_here(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The seccomp filter needs this machine's system call numbers: where they are not
    known, the environment record says so and a warning is logged (and a child told to
    filter refuses to run unfiltered)."""
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert probe().call_filter and "seccomp filter" in probe().describe()
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    unknown = probe()
    assert not unknown.call_filter and "NO seccomp filter" in unknown.describe()
    assert "only partly confined" in caplog.text


@pytest.mark.skipif(not namespaces_permitted() or os.geteuid() != 0,
                    reason="needs root and permission to create namespaces")
def test_confined_child_sees_nothing_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOKERNEL_LLM_API_KEY", "sk-planted")
    master, slave = os.openpty()  # a pty of the host's, open while the child looks
    try:
        seen = confined_report(probe())
    finally:
        os.close(master)
        os.close(slave)
    assert seen["uid"] == seen["euid"] == 65534  # nobody
    assert seen["pid"] == 1 and seen["visible_processes"] == 1  # only itself
    assert seen["interfaces"] in (["lo"], [])  # no way out
    assert "EVOKERNEL_LLM_API_KEY" not in seen["environment"]
    # ptys of its own: no other process's shows (one left answers in them for the next)
    assert len(seen["ptys"]) <= 1, seen["ptys"]
    # nor the keyring its user shares with every other candidate's process
    assert seen["keyring"] in ("refused", "not known on this machine")
    # and a lock it takes on a shared file locks nothing another process could see
    assert seen["file_locks"] == "none"
    # nor watch another process's opens and closes of shared files
    assert seen["inotify"] == "refused" or seen["keyring"] == "not known on this machine"
    # fanotify neither, which an unprivileged process may use too (red team 9)
    assert seen["fanotify"] in ("refused", "not known on this machine")
    assert seen["io_uring"] in ("refused", "not known on this machine")
    # nor make a user namespace, where it could mount a tmpfs with no bound (red team 9)
    assert seen["user_namespace"] == "refused" or seen["keyring"] == "not known on this machine"
    # and its tasks are bounded: the host's are one count the judge needs too (red team 8)
    if isolation.task_limit_permitted():
        assert seen["threads"] < isolation.TASK_LIMIT, seen["threads"]
    # and the OOM killer takes it before the judge (its children's memory is unbounded)
    assert seen["oom_score_adj"] == isolation.OOM_SCORE_ADJ
    # and files in its tmpfs are bounded in number (each is kernel memory, freed as it dies)
    assert 0 < seen["shm_files"] <= 64 * 1024
    # nothing it writes can outlive it: only its private tmpfs folders are writable
    assert seen["writable"] == ["/tmp", "/dev/shm"]
    # the judge's home is masked: at most the folder Python is installed in shows
    listing = seen["root_home_listing"] or []
    assert len(listing) <= 1 and all(name in (".pyenv", ".local", ".venv") for name in listing)


def test_probe_records_whether_tasks_are_limited(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A PID namespace gets a pid_max of its own only on Linux 6.14+: elsewhere the
    environment record says NO task limit and a warning is logged."""
    monkeypatch.setattr(isolation, "namespaces_permitted", lambda: True)
    monkeypatch.setattr(isolation, "task_limit_permitted", lambda: False)
    refused = probe()
    assert not refused.task_limit and "NO task limit" in refused.describe()
    assert "only partly confined" in caplog.text
    monkeypatch.setattr(isolation, "task_limit_permitted", lambda: True)
    assert probe().task_limit and f"at most {isolation.TASK_LIMIT} tasks" in probe().describe()


def test_without_isolation_the_child_still_runs_and_says_so() -> None:
    seen = confined_report(Isolation(False, False, None))
    assert seen["uid"] == os.getuid()
    assert seen["oom_score_adj"] == isolation.OOM_SCORE_ADJ  # unconfined, still the first to go
