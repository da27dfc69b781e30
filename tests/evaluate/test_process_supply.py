"""ProcessSupply's judgement of a stopped fork server (no processes started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evokernel.evaluate.isolation import Isolation
from evokernel.evaluate.process import CandidateHandle
from evokernel.evaluate.process_supply import ProcessSupply


class StoppedServer:
    class proc:  # stands in for the server's Popen
        @staticmethod
        def poll() -> int | None:
            return -9


class RunningServer:
    class proc:
        @staticmethod
        def poll() -> int | None:
            return None


def forked_from(server: Any) -> CandidateHandle:
    handle = CandidateHandle.__new__(CandidateHandle)  # no process: only what is asked of it
    handle.server = server
    return handle


@pytest.mark.parametrize(("namespaces", "unprivileged", "again"), [
    (True, True, True), (True, False, True), (False, True, True), (False, False, False)])
def test_a_stopped_server_reruns_only_where_the_candidate_could_not_have_stopped_it(
        tmp_path: Path, namespaces: bool, unprivileged: bool, again: bool) -> None:
    supply = ProcessSupply("cpu", Isolation(namespaces, unprivileged, None), tmp_path, 1)
    assert supply.server_stopped(forked_from(RunningServer())) is False
    assert supply.describe() == "fork server (not started yet)"
    assert supply.server_stopped(forked_from(StoppedServer())) is again
    # stopped, it is off either way: fresh interpreters from now on, and the record says why
    assert supply.describe() == "fresh interpreters (the fork server stopped)"
    assert supply.server_stopped(forked_from(None)) is False  # a fresh interpreter has no server
