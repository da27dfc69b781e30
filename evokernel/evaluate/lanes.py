"""Lanes: sets of shared chunks that consecutive candidates take in turn.

A candidate's process can write every chunk it mapped until it is dead, and a process
with a CUDA context takes a while to die (the driver tears the context down). With one
set of chunks, the next candidate may load only after that death and the scrub behind
it, and the device idles meanwhile. With ``lanes`` sets, candidate ``i`` uses lane
``i % lanes``: its process maps that lane's chunks and no other, and the lane's last
user died lanes-1 candidates ago. So it loads, binds and makes its checked calls while
the candidate before it, in another lane, is still dying; the judge waits for that
death only before its first clocked batch (``SandboxEvaluator._quiet``: a warm-up batch
sizing the timed ones), so that nothing of an earlier candidate runs on the device, and
no scrub, while one is clocked. It waits before it writes that batch's inputs: written
first, they would sit in the slots through the wait, for the process to solve unclocked.

A lane owns its spare processes (started with its chunks mapped and its slots bound)
and the background thread retiring its last process. Which banks belong to a lane is
the bank store's business (bank_store.py): every shape has one bank per lane, twins
sharing the judge's private inputs and expected outputs (``ShapeBank.twin``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from evokernel.evaluate.process import SparePool

log = logging.getLogger(__name__)


class Lane:
    """One set of chunks' spare processes and the retiring of its last used process."""

    def __init__(self, index: int, pool: SparePool) -> None:
        self.index = index
        self.pool = pool
        self.outlived = False
        """A process of this lane outlived its kill: its chunks must serve no one again."""
        self._retired_in: dict[str, float] = {}
        self._retiring: threading.Thread | None = None
        self._failure: BaseException | None = None

    def retire_behind(self, steps: Callable[[dict[str, float]], None]) -> None:
        """Run ``steps`` (kill a used process, scrub the chunks it mapped) in the
        background. ``steps`` records its seconds per step in the dict it is given. The
        lane's previous retiring is waited for first (and its failure raised)."""
        self.await_retired()
        spent: dict[str, float] = {}

        def work() -> None:
            try:
                steps(spent)
            except BaseException as exc:  # raised by the next await_retired
                self._failure = exc
            finally:
                self._retired_in = spent

        retiring = threading.Thread(target=work, name=f"retire-lane-{self.index}", daemon=True)
        try:
            retiring.start()
        except RuntimeError:
            # no thread to be had (the host's tasks taken, by the very process to kill:
            # red team 8's takes_every_task.py): retire it here and now; an unstarted
            # thread kept here would fail every later wait, and the process would live
            log.warning("no thread could be started to retire lane %d's process; retiring "
                        "it before going on", self.index)
            work()
            return
        self._retiring = retiring

    def retiring(self) -> bool:
        """Whether a retiring is under way."""
        return self._retiring is not None and self._retiring.is_alive()

    def take_retired_in(self) -> dict[str, float]:
        """Seconds per step of the last finished retiring (``retire_behind``'s ``steps``),
        once: for the throughput breakdown of the candidate that waited for it."""
        spent, self._retired_in = self._retired_in, {}
        return spent

    def await_retired(self) -> float:
        """Return once this lane's last used process is gone and its chunks scrubbed, with
        the seconds waited; raise if that failed (then no one may use the chunks)."""
        started = time.perf_counter()
        if self._retiring is not None:
            self._retiring.join()
            self._retiring = None
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise RuntimeError(f"scrubbing after a candidate failed: {failure}") from failure
        return time.perf_counter() - started


class Settling:
    """Evaluations past their candidate's last clocked step whose checks still run in the
    judge's process. The next candidate takes its process, loads and makes its untimed
    calls meanwhile; it is clocked, a bank is dropped and a round trip measured only once
    they are over (``wait``): the checks' device work would lengthen a clocked batch, and
    they read banks' private stores."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around one evaluation's checks (entered before the next candidate may start)."""
        with self._changed:
            self._running += 1
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def count(self) -> int:
        with self._changed:
            return self._running

    def wait(self) -> float:
        """Return once no evaluation's checks run, with the seconds waited. Never called
        from inside ``running`` (it would wait for itself)."""
        started = time.perf_counter()
        with self._changed:
            self._changed.wait_for(lambda: self._running == 0)
        return time.perf_counter() - started
