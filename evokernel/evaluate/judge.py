"""The judge: one candidate's process, one shape, from first call to verdict and time.

Per shape, in the judge's process, with the candidate's process reached only
through its socket (process.py) and seeing only its slots (bank.py):

1. **Checked calls.** ``trials`` calls, each on a fresh variant: the judge writes the
   inputs, poisons the outputs, asks for one call, copies the outputs the moment the
   reply arrives and checks guards and inputs (bit for bit); then the workload's rule,
   on all trials' outputs together, against expected outputs it computed itself: on a
   process's first shape before anything is timed (on a GPU while the process captures
   its graph); on its later shapes, given a ``Deferred``, with the rest after its last
   shape (``checked_later``).
2. **Warm-up and batch size.** Batches on fresh variants, verified like timed ones,
   until a batch of ``n`` calls lasts about ``target_batch_s`` (on a GPU one eager batch,
   then the captured graph's replay sizes it, the graph captured with ``GRAPH_HEADROOM``
   times the calls where the eager ones were launch-bound; ``SIZING_BATCHES``); then a random number
   of untimed calls more. Sizing on fresh inputs matters: on repeated inputs a
   candidate that remembers its last answer looks free, gets the largest batch, and
   is then timed warm, back to back, where an honest slow one is timed cold.
3. **Timed batches.** Each slot gets a fresh variant, the judge flushes the L2, starts
   its clock, asks for the batch (one CUDA-graph replay if the calls could be captured,
   else eager calls), stops its clock at the reply. Per call: (elapsed - round trip
   measured before any candidate code loaded) / n. Every slot's output is screened
   (guards, never-written elements), inputs are checked unchanged, and a random sample
   (``sample_checks`` slots, the same for any batch size) plus random pairs of slots
   whose outputs are equal, is kept and checked in full at the end of the shape, or
   (given a ``Deferred``) after the candidate's last shape, all steps' samples
   together, on the judge's copies, while the process reports CUPTI and is killed (a
   pair holding a copied answer fails unless both slots' right answers agree). A
   candidate faking a share ``f`` of its calls passes a shape with probability at most
   ``(1 - f) ** K``, ``K`` the slots checked in full over the batches it fakes in (it
   can tell warm-up batches from timed ones): the batch size does not enter, so ``K``
   is what to raise.
4. **CUPTI.** On a GPU, fresh variants again and the FlashInfer-Bench measurement in
   the candidate's process; its outputs are judged like a batch, and its spans count
   only where they agree with the judge's clock.
5. **Speed of light.** A time below the workload's bytes over the datasheet bandwidth
   is re-verified on fresh inputs and then rejected as impossible.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evokernel.evaluate.bank import Examined, ShapeBank, Variant
from evokernel.evaluate.channel import ChannelClosed, ChannelTimeout, ProtocolError
from evokernel.evaluate.process import CandidateHandle
from evokernel.evaluate.result import ShapeResult, Status, Timing
from evokernel.evaluate.timing import L2Flusher

log = logging.getLogger(__name__)

SIZING_BATCHES = 3
"""Most warm-up batches spent sizing the timed batch (each on fresh, verified inputs).
On a GPU the first is the only one before the capture: the batch is sized again on its
graph (``Judge._grow_graph``), and the others are spent only where no graph was captured."""
GRAPH_HEADROOM = 4
"""On a GPU, a graph is first captured with this many times the calls the eager sizing
batch asked for, where those calls were launch-bound (``GRAPH_GAIN_BELOW_S``): its replay
runs them several times faster (no launches), and a graph sized on eager calls came out
too short to time, and was captured again, on most fast kernels (two captures a shape,
the largest part of the judge's wall time on an H200 after the checks)."""
GRAPH_GAIN_BELOW_S = 50e-6
"""Eager seconds a call under which a replay is expected to be faster (launch overhead
dominates); above it, the graph is sized as the eager batch was."""
DUPLICATE_PICKS = 4
"""Per timed batch, how many slots with a duplicated output are checked (with a partner)."""
CUPTI_SPREAD = 4.0
"""Spans of one candidate's calls (same work, cold L2 each) within this factor of their
median; wider, one call did the others' work and the median is not the kernel's."""
LEAST_SPAN_S = 0.5e-6
"""A kernel span below this is not believed where the device's own least span (a
one-element kernel, measured before candidate code loads) is unknown."""
CUPTI_AGREEMENT = 0.5
CUPTI_LAUNCH_SLACK_S = 4e-6
"""A CUPTI median (reported by the candidate's process) is believed when it is at least
``CUPTI_AGREEMENT`` times the judge's per-call figure less ``CUPTI_LAUNCH_SLACK_S``: the
judge's figure includes the launch gaps between the kernels of a replayed batch (about
1-2 us each on an H200), which a kernel span does not. A kernel that takes tens of
microseconds by the judge's clock cannot claim a span of one."""
COLLECT_WAIT_S = 20.0
"""Longest wait for a process's CUPTI records after its last shape (flushing them takes
milliseconds): a process that stalls there loses its CUPTI figures, not the judge's time."""


Quiet = Callable[[bool], float]
"""Waits until nothing but the judged process may run on the device (no earlier process
dying, no scrub) and, given ``True`` (a batch of eager calls, whose time holds the
candidate's host work: its launches, its syncs), until no spare process is starting
either; returns the seconds waited, which the time limit does not count. Called before a
clocked batch's inputs are written, never between the write and the request: inputs that
sat in the slots through the wait could be solved unclocked."""
UnseenBatch = Callable[[list[int], str, bool], tuple[float, dict[str, Any], list[Variant]]]
"""One untimed batch on fresh variants, verified: (slots, what, graph) -> (seconds, reply,
variants)."""


ERROR_CHARS = 16384
"""Most characters of an error a candidate's process reports that a verdict keeps: the
process formats it, and an exception of tens of MB (one line, under the channel's
limit) would otherwise reach every record of the evaluation."""


def bounded(text: str, limit: int = ERROR_CHARS) -> str:
    """``text``, or its head and tail where it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"{text[: limit // 2]} ... [{cut} characters cut] ... {text[-(limit // 2):]}"


def _finite_number(value: Any) -> bool:
    """A number a candidate's reply may carry into a record: JSON also carries NaN and
    Infinity, which no figure of ours should hold."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def believe_cupti(spans: Any, elapsed: float, judge_median: float,
                  least_span_s: float | None) -> tuple[float | None, str]:
    """The median of the spans a candidate's process reported for its CUPTI calls, in ms,
    where it agrees with the judge's clock: ``elapsed`` is what those calls took by it,
    ``judge_median`` the judge's per-call figure from the timed batches. Otherwise None
    and why it is not believed."""
    if not isinstance(spans, list) or not spans:
        return None, "no CUPTI spans"
    if any(isinstance(s, int | float) and not isinstance(s, bool) and not math.isfinite(s)
           for s in spans):
        # the reply is JSON, which carries NaN and Infinity: a NaN compares false with
        # everything, so it would pass the sum and spread tests below (all NaN: a NaN
        # figure, believed)
        return None, "a CUPTI span is not a finite number: not believed"
    if any(not _finite_number(s) or s <= 0 for s in spans):
        return None, "a CUPTI-timed call showed no GPU activity"
    median = statistics.median(float(s) for s in spans)
    believable = CUPTI_AGREEMENT * judge_median - CUPTI_LAUNCH_SLACK_S
    if sum(spans) > elapsed * 1e3 or median < believable * 1e3:
        return None, (f"CUPTI's {median * 1e3:.2f} us disagrees with the judge's clock "
                      f"({judge_median * 1e6:.2f} us): not believed")
    least = 0.8 * least_span_s if least_span_s else LEAST_SPAN_S
    if median < least * 1e3:
        return None, (f"CUPTI's {median * 1e3:.3f} us is below the least span a kernel has "
                      f"on this device ({least * 1e6:.2f} us): not believed")
    if max(spans) > CUPTI_SPREAD * median:
        return None, (f"CUPTI's spans run from {min(spans) * 1e3:.2f} to "
                      f"{max(spans) * 1e3:.2f} us for the same work: not believed")
    return median, ""


@dataclass(frozen=True)
class JudgeConfig:
    trials: int = 3
    batches: int = 3
    target_batch_s: float = 0.002
    sample_checks: int = 6
    cupti_calls: int = 10
    extra_warmups: int = 4
    peak_bandwidth_gbps: float | None = None
    overlap_checks: bool = True
    """Check outputs where the judge would otherwise wait: on a process's first shape the
    checked calls' while the process captures its graph (a GPU), everything else after its
    last shape (the sandbox then passes a ``Deferred``); off, each shape's at its end."""


class PhaseClock:
    """Where a shape's seconds went, phase by phase (diagnosis for throughput work:
    ``phase_<name>_ms`` in the shape's stats)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Charge the time since the previous mark to ``phase``."""
        now = time.perf_counter()
        self.spent[phase] = self.spent.get(phase, 0.0) + now - self._last
        self._last = now

    def stats(self) -> dict[str, float]:
        return {f"phase_{name}_ms": seconds * 1e3 for name, seconds in self.spent.items()}


class Verdict(Exception):
    """A shape's evaluation ends here with this status."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Answers:
    """Outputs kept for a later check: copies of the sampled slots' outputs, with the
    variant each answered and the step that produced it. Checking them together costs
    one checker call per stack of variants rather than one per step; a wrong one still
    fails the shape, named by its step."""

    def __init__(self) -> None:
        self._kept: list[tuple[Variant, list[torch.Tensor]]] = []
        self._what: list[str] = []

    def keep(self, bank: ShapeBank, snapshot: Sequence[torch.Tensor],
             assignment: dict[int, Variant], what: str, slots: Sequence[int]) -> None:
        for slot, outputs in zip(slots, bank.copy_outputs(snapshot, slots), strict=True):
            self._kept.append((assignment[slot], outputs))
            self._what.append(what)

    def __len__(self) -> int:
        return len(self._kept)

    def nbytes(self) -> int:
        """Memory the kept copies hold."""
        return sum(t.numel() * t.element_size() for _, outs in self._kept for t in outs)

    def settle(self, bank: ShapeBank) -> dict[str, float]:
        """Check everything kept (then forget it); raise the first wrong one's verdict,
        else return the last verdict's stats."""
        kept, what = self._kept, self._what
        self._kept, self._what = [], []
        if not kept:
            return {}
        wrong, verdict = bank.check_answers(kept)
        if wrong is not None:
            raise Verdict(Status.INCORRECT, f"{what[wrong]}: {verdict.message}")
        return dict(verdict.stats)


class Deferred:
    """One candidate's kept answers, shape by shape, to be checked after its last shape:
    the judge then checks them on its own copies while the candidate's process reports
    its CUPTI records and is killed, rather than between shapes, while it waits. A wrong
    one fails its shape all the same (``Judge.settle``), and the shapes after it are
    dropped, as if judging had stopped there."""

    def __init__(self) -> None:
        self._shapes: list[tuple[ShapeBank, Answers]] = []

    def add(self, bank: ShapeBank, answers: Answers) -> None:
        self._shapes.append((bank, answers))

    def __len__(self) -> int:
        return len(self._shapes)

    def nbytes(self) -> int:
        return sum(answers.nbytes() for _, answers in self._shapes)

    def take(self) -> list[tuple[ShapeBank, Answers]]:
        shapes, self._shapes = self._shapes, []
        return shapes


class Asked:
    """A request sent to a candidate's process whose reply is still to be read."""

    def __init__(self, judge: Judge, handle: CandidateHandle, deadline: float, what: str) -> None:
        self.judge, self.handle, self.deadline, self.what = judge, handle, deadline, what

    def answered(self) -> bool:
        """Whether the reply has begun to arrive (``reply`` would not wait long)."""
        return self.handle.answered()

    def reply(self, within_s: float | None = None) -> dict[str, Any]:
        """The reply, waiting until the deadline (or ``within_s``, if sooner)."""
        # at least a moment: a reply already there is read, even at the deadline
        left = max(self.deadline - time.monotonic(), 1e-3)
        if within_s is not None:
            left = min(left, within_s)
        try:
            reply = self.handle.receive(left)
        except ChannelTimeout:
            raise Verdict(Status.TIMEOUT, f"{self.what}: no result within the time limit") from None
        except (ProtocolError, ChannelClosed) as exc:
            raise self.judge._broken(self.handle, self.what, exc) from None
        if "error" in reply:
            raise Verdict(Status.RUNTIME_ERROR, f"{self.what}: {bounded(str(reply['error']))}")
        return reply


class CuptiCollect:
    """A ``cupti_collect`` request under way (``Judge.start_collect``)."""

    def __init__(self, judge: Judge, pending: dict[str, tuple[float, float]],
                 asked: Asked | None, why: str = "") -> None:
        self.judge, self.pending, self.asked, self.why = judge, pending, asked, why
        self.reported: dict[str, Any] = {}
        self.flush_s: float | None = None
        """Seconds the process said its flush of CUPTI's buffers took (its own account:
        diagnosis of the judge's cost only)."""

    def answered(self) -> bool:
        """Whether ``receive`` would not wait (long): the reply is there, or none is due."""
        return self.asked is None or self.asked.answered()

    def receive(self) -> None:
        """Read the reply (once; waits for it): after this the process is not needed."""
        asked, self.asked = self.asked, None
        if asked is None:
            return
        try:
            reply = asked.reply(COLLECT_WAIT_S)
            reported = reply.get("spans_ms")
            phases = reply.get("phases_ms")
            if isinstance(phases, dict) and _finite_number(phases.get("flush")):
                self.flush_s = float(phases["flush"]) / 1e3
            if isinstance(reported, dict):
                self.reported = reported
            else:
                self.why = "no CUPTI spans reported"
        except Verdict as failed:
            self.why = f"no CUPTI spans: {failed.message}"[:300]

    def apply(self, results: Sequence[ShapeResult]) -> list[ShapeResult]:
        """Each pending shape's CUPTI figure, believed or not, in its timing."""
        self.receive()
        out = []
        for result in results:
            if result.timing is None or result.shape not in self.pending:
                out.append(result)
                continue
            elapsed, judge_median = self.pending[result.shape]
            cupti_ms, note = believe_cupti(self.reported.get(result.shape), elapsed, judge_median,
                                           self.judge.least_span_s) if not self.why else (None, self.why)
            timing = result.timing.model_copy(update={"cupti_ms": cupti_ms, "cupti_note": note})
            out.append(result.model_copy(update={"timing": timing}))
        return out


class Judge:
    def __init__(self, config: JudgeConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.flush = L2Flusher(device) if device.type == "cuda" else None
        self.least_span_s: float | None = None
        """The CUPTI span of a one-element kernel on this device, once measured."""
        self._cupti_pending: dict[str, tuple[float, float]] = {}
        """Per shape judged since the last ``collect_cupti``: the seconds its CUPTI calls
        took by the judge's clock, and its per-call figure."""

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def before_batch(self) -> None:
        """The judge's device work right before a timed batch: flush the L2, synchronise."""
        if self.flush is not None:
            self.flush()
        self.sync()

    # -- talking to the candidate --------------------------------------------------------

    def ask(self, handle: CandidateHandle, deadline: float, op: str, what: str,
             **fields: Any) -> dict[str, Any]:
        return self.ask_later(handle, deadline, op, what, **fields).reply()

    def ask_later(self, handle: CandidateHandle, deadline: float, op: str, what: str,
                  **fields: Any) -> Asked:
        """Send a request now; ``reply()`` of what this returns waits for the answer (with
        ``ask``'s verdicts). In between, the judge may work on what the candidate's process
        cannot reach (its own copies), never on the device while something is timed."""
        if deadline - time.monotonic() <= 0:
            raise Verdict(Status.TIMEOUT, f"{what}: no result within the time limit")
        try:
            handle.send(op, **fields)
        except (ProtocolError, ChannelClosed) as exc:
            raise self._broken(handle, what, exc) from None
        return Asked(self, handle, deadline, what)

    def _broken(self, handle: CandidateHandle, what: str, exc: Exception) -> Verdict:
        """The verdict on a process that broke the protocol or died (it is killed)."""
        handle.kill()
        if isinstance(exc, ProtocolError):
            return Verdict(Status.RUNTIME_ERROR, f"{what}: the candidate's process broke the "
                                                 f"protocol: {exc}")
        code = handle.exit_code()
        hint = ""
        if code == -signal.SIGSEGV and self.device.type == "cpu":
            hint = (" (a segmentation fault; the inputs are mapped read-only, so a write "
                    "to an input ends here)")
        return Verdict(Status.RUNTIME_ERROR,
                       f"{what}: the candidate's process died (exit code {code}){hint}: {exc}")

    # -- one shape -----------------------------------------------------------------------

    def judge_shape(
        self, handle: CandidateHandle, bank: ShapeBank, rng: random.Random, deadline: float,
        later: Deferred | None = None, quiet: Quiet | None = None, checked_later: bool = False,
    ) -> tuple[ShapeResult, float]:
        """Verdict and timing of one shape; the second value is the seconds it took. With
        ``later``, the full checks of the steps after the checked calls are left there, for
        ``settle`` (until then a PASSED verdict is provisional); else they are made here.
        With ``checked_later`` too, the checked calls' are left there as well (the shapes
        after a process's first: a wrong candidate is mostly found on its first shape, and
        on the others these checks then cost the judge no time between the calls).
        ``quiet`` is called before every batch the judge clocks (the warm-up batches that
        size the timed one too, bar a GPU's one eager batch before the capture, whose time
        only seeds the graph's size), before that batch's inputs are written; the seconds
        it waits extend ``deadline`` (they are not the candidate's doing)."""
        started = time.perf_counter()
        bank.restore_fixed()  # whatever an earlier process did is not this one's doing
        stats: dict[str, float] = {}
        try:
            timing, stats = self._run(handle, bank, rng, deadline, later, quiet, checked_later)
        except Verdict as verdict:
            bank.restore_fixed()
            return (
                ShapeResult(shape=bank.shape, status=verdict.status, message=verdict.message,
                            stats=stats),
                time.perf_counter() - started,
            )
        return (ShapeResult(shape=bank.shape, status=Status.PASSED, timing=timing, stats=stats),
                time.perf_counter() - started)

    def _run(self, handle: CandidateHandle, bank: ShapeBank, rng: random.Random,
             deadline: float, later: Deferred | None = None,
             quiet: Quiet | None = None, checked_later: bool = False,
             ) -> tuple[Timing, dict[str, float]]:
        config = self.config
        clock = PhaseClock()
        bases = bank.config.bases
        queues: dict[int, list[int]] = {b: [] for b in range(bases)}
        for index in bank.draw(rng):
            queues[index % bases].append(index)

        def fresh(base: int) -> Variant:
            if not queues[base]:
                raise Verdict(Status.RUNTIME_ERROR, "the judge ran out of fresh inputs (a bug)")
            return bank.variant(queues[base].pop())

        if bank.shape in handle.bound:  # its views were made before the candidate loaded
            self.ask(handle, deadline, "bind", "binding the inputs", shape=bank.shape)
        else:
            self.ask(handle, deadline, "bind", "binding the inputs", shape=bank.shape,
                     slots=bank.slots_json)
        clock.mark("bind")

        # 1. checked calls, each on a fresh variant, the base switching in place; their
        # outputs checked together (one checker call a stack) before anything is timed
        walls = []
        trials = Answers()
        for trial in range(config.trials):
            slot = rng.randrange(bank.slot_count)  # no slot is "the checked one"
            assignment = {slot: fresh(trial % bases)}
            self._write(bank, assignment)
            self.sync()
            t0 = time.perf_counter()
            self.ask(handle, deadline, "call", f"trial {trial}", shape=bank.shape, slot=slot)
            walls.append(time.perf_counter() - t0)
            self._verify(bank, bank.snapshot(), assignment, f"trial {trial}", [slot], trials)
        clock.mark("checked_calls")
        stats: dict[str, float] = {}
        answers = Answers()  # the rest are checked together: at the end of the shape or later
        deferred = later is not None and checked_later
        capturing = self.device.type == "cuda" and config.overlap_checks and not deferred
        if deferred:
            answers = trials  # checked with the rest, after the process's last shape
        elif not capturing:  # else below, while the candidate's process captures its graph
            stats = trials.settle(bank)
            clock.mark("checks")

        # 2. warm-up on fresh inputs, verified, sizing the batch
        rtt = handle.rtt_s or 0.0
        rounds = iter(range(config.trials, 1 << 30))  # the bases take turns, batch by batch

        def unseen(slots: list[int], what: str, graph: bool, timed: bool = False,
                   hushed: bool = True) -> tuple[float, dict[str, Any], list[Variant]]:
            """One batch on fresh variants, verified; (seconds by the judge's clock, reply,
            variants). ``hushed``: after ``quiet`` (every batch whose seconds size or time
            what counts; on a GPU, not the eager batch before the capture)."""
            nonlocal deadline
            if quiet is not None and hushed:
                # before the write: inputs written before a wait sit in the slots for as
                # long as it lasts, and the candidate's process can solve them unclocked
                deadline += quiet(not graph)
                clock.mark("quiet")
            assignment = self._assign(slots, next(rounds) % bases, fresh, rng)
            self._write(bank, assignment)
            clock.mark("write_inputs")
            if timed:
                self.before_batch()
            else:
                self.sync()
            t0 = time.perf_counter()
            reply = self.ask(handle, deadline, "batch", what, shape=bank.shape, slots=slots,
                             graph=graph)
            elapsed = time.perf_counter() - t0
            clock.mark("timed_batches" if timed else "warm_up")
            snapshot = bank.snapshot()
            seen = bank.examine(snapshot, assignment, duplicates=True)  # one host sync
            sample = self._sample(bank, assignment, rng) | self._copies(seen.groups, rng)
            self._verify(bank, snapshot, assignment, what, sorted(sample), answers, seen)
            clock.mark("verify_batches")
            return elapsed, reply, list(assignment.values())

        on_gpu = self.device.type == "cuda"
        n = self._first_size(bank, min(walls) - rtt)
        if on_gpu:
            # one eager batch warms the calls up; the graph sizes the batch (below), so
            # this one need not wait for an earlier process's death nor be repeated
            n = self._size_batch(bank, n, rtt, lambda s, w, g: unseen(s, w, g, hushed=False), 1)
            n = self._graph_calls(n, config.target_batch_s, bank.slot_count)
        else:
            n = self._size_batch(bank, n, rtt, unseen, SIZING_BATCHES)
        for _ in range(rng.randrange(config.extra_warmups + 1)):
            self.ask(handle, deadline, "call", "warm-up call", shape=bank.shape, slot=0)
        slots = list(range(n))
        graph = False
        clock.mark("warm_up")
        if self.device.type == "cuda":
            asked = self.ask_later(handle, deadline, "capture", "capturing a graph",
                                   shape=bank.shape, slots=slots)
            if capturing:
                # the checked calls' outputs are checked (on the judge's copies) while the
                # candidate's process captures: nothing is timed before both are over
                stats = self._settle_while(asked, trials, bank)
                clock.mark("checks")
            graph = bool(asked.reply().get("captured"))
            clock.mark("capture")
            if graph:
                slots = self._grow_graph(handle, bank, deadline, slots, rtt, unseen)
            else:  # eager batches are timed: sized on the sizing batches left
                slots = list(range(self._size_batch(bank, n, rtt, unseen, SIZING_BATCHES - 1)))
            n = len(slots)
            clock.mark("capture")

        # 3. timed batches on fresh inputs
        per_call = []
        claimed = []
        timed: list[Variant] = []
        for batch in range(config.batches):
            elapsed, reply, variants = unseen(slots, f"timed batch {batch}", graph, timed=True)
            timed += variants
            if _finite_number(reply.get("seconds")):  # the process's claim: diagnosis only
                claimed.append(float(reply["seconds"]))
            per_call.append(max(elapsed - rtt, 1e-9) / n)

        median = statistics.median(per_call)
        # diagnosis, not verdict: what the batch cost beyond the candidate's own claim
        stats = {**stats, "batch_calls": float(n), "round_trip_us": rtt * 1e6}
        if claimed:
            stats["claimed_call_us"] = statistics.median(claimed) / n * 1e6
        method = ("judge-graph" if graph else "judge-eager") if self.device.type == "cuda" \
            else "judge-cpu"

        changed = bank.fixed_changed()
        if changed:
            raise Verdict(Status.INCORRECT, f"the candidate modified its inputs {changed}")

        # 4. CUPTI's span, the FlashInfer-Bench figure, if it agrees with the judge's clock
        cupti_elapsed = self._cupti_calls(handle, bank, rng, deadline, fresh, answers, stats)
        clock.mark("cupti")
        if later is None:
            answers.settle(bank)  # every sampled output since the checked calls
            clock.mark("checks")
        else:
            later.add(bank, answers)  # checked after the last shape (``settle``)

        # 5. speed of light
        self._speed_of_light(handle, bank, deadline, fresh, median, timed, rng)
        clock.mark("floor")
        stats.update(clock.stats())
        ordered = sorted(per_call)
        timing = Timing(
            median_ms=median * 1e3, p25_ms=ordered[0] * 1e3, p75_ms=ordered[-1] * 1e3,
            e2e_ms=max(statistics.median(walls), 1e-9) * 1e3, samples=n * config.batches,
            method=method,
        )
        if cupti_elapsed is not None:  # its figure comes at collect_cupti
            self._cupti_pending[bank.shape] = (cupti_elapsed, median)
        return timing, stats

    @staticmethod
    def _settle_while(asked: Asked, answers: Answers, bank: ShapeBank) -> dict[str, float]:
        """``answers.settle`` while the candidate's process answers ``asked``; a wrong one
        kills that process (a failure is final, and its reply is not waited for)."""
        try:
            return answers.settle(bank)
        except Verdict:
            asked.handle.kill()
            raise

    def settle(self, later: Deferred, results: Sequence[ShapeResult]) -> list[ShapeResult]:
        """Check every answer ``judge_shape`` left in ``later``, shape by shape in order.
        The first shape with a wrong one becomes INCORRECT, named by its step, and the
        results after it are dropped, as if judging had stopped there; the others are
        returned as they were, with the error statistics of their checks where they had
        none (a shape whose checked calls were checked here too)."""
        failed: dict[str, Verdict] = {}
        found_stats: dict[str, dict[str, float]] = {}
        for bank, answers in later.take():
            try:
                found_stats[bank.shape] = answers.settle(bank)
            except Verdict as wrong:
                failed[bank.shape] = wrong
                break
        out: list[ShapeResult] = []
        for result in results:
            missing = {k: v for k, v in found_stats.get(result.shape, {}).items()
                       if k not in result.stats}
            if missing:
                result = result.model_copy(update={"stats": {**result.stats, **missing}})
            found = failed.get(result.shape)
            if found is not None:
                out.append(ShapeResult(
                    shape=result.shape, status=found.status, message=found.message,
                    reference=result.reference, baseline=result.baseline, stats=result.stats))
                break
            out.append(result)
        return out

    def _first_size(self, bank: ShapeBank, estimate: float) -> int:
        """Calls per batch for ``target_batch_s`` at ``estimate`` seconds a call."""
        return int(min(bank.slot_count, max(1, self.config.target_batch_s / max(estimate, 1e-7))))

    def _size_batch(self, bank: ShapeBank, n: int, rtt: float, unseen: UnseenBatch,
                    rounds: int) -> int:
        """Calls per batch so that one batch lasts about ``target_batch_s``, starting from
        ``n`` and measured on up to ``rounds`` warm-up batches of fresh inputs (``unseen``)."""
        target, most = self.config.target_batch_s, bank.slot_count
        for _ in range(rounds):
            elapsed, _, _ = unseen(list(range(n)), "warm-up batch", False)
            per_call = max(elapsed - rtt, 1e-9) / n
            wanted = int(min(most, max(1, -(-target // per_call))))
            if wanted <= n or n == most:
                return wanted
            n = wanted
        return n

    @staticmethod
    def _graph_calls(n: int, target_s: float, most: int) -> int:
        """Calls to capture, given ``n`` sized on eager calls for ``target_s`` a batch:
        ``GRAPH_HEADROOM`` times more where they were launch-bound (under
        ``GRAPH_GAIN_BELOW_S`` a call), at most ``most``."""
        if target_s / max(n, 1) < GRAPH_GAIN_BELOW_S:
            return min(most, n * GRAPH_HEADROOM)
        return min(most, n)

    def _grow_graph(self, handle: CandidateHandle, bank: ShapeBank, deadline: float,
                    slots: list[int], rtt: float, unseen: UnseenBatch) -> list[int]:
        """The batch was sized on eager calls; a replayed graph of them can be many times
        shorter (launch overhead gone), leaving the batch too short to measure. Replay it
        once on fresh inputs (untimed, verified), and if it lasted under half the target,
        capture a longer one."""
        n = len(slots)
        elapsed, _, _ = unseen(slots, "replaying the graph", True)
        per_call = max(elapsed - rtt, 1e-9) / n
        target, most = self.config.target_batch_s, bank.slot_count
        if n >= most or per_call * n >= target / 2:
            return slots
        longer = list(range(int(min(most, -(-target // per_call)))))
        captured = self.ask(handle, deadline, "capture", "capturing a longer graph",
                            shape=bank.shape, slots=longer).get("captured")
        return longer if captured else slots

    @staticmethod
    def _assign(slots: Sequence[int], base: int, fresh: Any, rng: random.Random) -> dict[int, Variant]:
        """Fresh variants of ``base`` for ``slots``, in random slots: the variants whose
        expected outputs are known (the ones the sample prefers) come off the queue
        together, and must not always land in the lowest slots, where a candidate could
        answer honestly and fake the rest."""
        variants = [fresh(base) for _ in slots]
        rng.shuffle(variants)
        return dict(zip(slots, variants, strict=True))

    @staticmethod
    def _write(bank: ShapeBank, assignment: dict[int, Variant]) -> None:
        changed = bank.write(assignment)
        if changed:
            raise Verdict(Status.INCORRECT, f"the candidate modified its inputs {changed}")

    def _sample(self, bank: ShapeBank, assignment: dict[int, Variant], rng: random.Random) -> set[int]:
        """``sample_checks`` slots to check in full: random, preferring variants whose
        expected outputs are known (which ones are is invisible to the candidate)."""
        slots = sorted(assignment)
        rng.shuffle(slots)
        slots.sort(key=lambda s: not bank.has_expected(assignment[s]))
        return set(slots[: self.config.sample_checks])

    @staticmethod
    def _copies(groups: Sequence[Sequence[int]], rng: random.Random) -> set[int]:
        """Slots to check because their outputs equal another slot's (``groups``, from
        ``ShapeBank.duplicates``): ``DUPLICATE_PICKS`` random slots among all duplicated
        ones, each with another member of its group.

        Equal outputs are legitimate where the answer does not depend on what varies
        (dsa_topk rows that need no scoring), so not every group is checked. A candidate
        that copies answers to save time makes many slots duplicated; a random pick among
        them lands on a copy, and the pair checked then holds two different right answers.
        """
        group_of = {slot: group for group in groups for slot in group}
        picked: set[int] = set()
        for slot in rng.sample(sorted(group_of), min(DUPLICATE_PICKS, len(group_of))):
            partner = rng.choice([s for s in group_of[slot] if s != slot])
            picked |= {slot, partner}
        return picked

    def _verify(self, bank: ShapeBank, snapshot: Sequence[torch.Tensor],
                assignment: dict[int, Variant], what: str, full: Sequence[int],
                answers: Answers | None = None, seen: Examined | None = None) -> dict[str, float]:
        """Screen every slot of ``assignment`` and its inputs now (the next write replaces
        them; ``seen``: what ``ShapeBank.examine`` found there, else examined here); check
        the ``full`` slots' outputs by the workload's rule now, or, given ``answers``,
        keep copies of them there, to be checked with others later."""
        if seen is None:
            seen = bank.examine(snapshot, assignment)
        bad = seen.bad
        if bad:
            slot = min(bad)
            raise Verdict(Status.INCORRECT, f"{what}: {bad[slot]}")
        changed = seen.changed
        if changed:
            bank.restore_fixed()
            raise Verdict(Status.INCORRECT, f"{what}: the candidate modified its inputs {changed}")
        if not full:
            return {}
        if answers is not None:
            answers.keep(bank, snapshot, assignment, what, full)
            return {}
        verdict = bank.check(snapshot, assignment, full)
        if not verdict.ok:
            raise Verdict(Status.INCORRECT, f"{what}: {verdict.message}")
        return dict(verdict.stats)

    def _cupti_calls(self, handle: CandidateHandle, bank: ShapeBank, rng: random.Random,
                     deadline: float, fresh: Any, answers: Answers,
                     stats: dict[str, float]) -> float | None:
        """The FlashInfer-Bench measurement's calls, on fresh variants, verified like a
        batch: the candidate's process records their kernels' spans in CUPTI and reports
        them at ``collect_cupti``. Returns the seconds they took by the judge's clock
        (None where no CUPTI figure is taken)."""
        if self.device.type != "cuda" or self.config.cupti_calls <= 0:
            return None
        slots = sorted(rng.sample(range(bank.slot_count), min(self.config.cupti_calls, bank.slot_count)))
        base = rng.randrange(bank.config.bases)
        assignment = self._assign(slots, base, fresh, rng)
        self._write(bank, assignment)
        self.sync()
        t0 = time.perf_counter()
        reply = self.ask(handle, deadline, "cupti", "CUPTI calls", shape=bank.shape, slots=slots)
        elapsed = time.perf_counter() - t0
        snapshot = bank.snapshot()
        self._verify(bank, snapshot, assignment, "CUPTI-timed call",
                     sorted(self._sample(bank, assignment, rng)), answers)
        phases = reply.get("phases_ms")
        if isinstance(phases, dict):  # the process's own account: diagnosis only
            stats.update({f"cupti_{k}_ms": float(v) for k, v in phases.items()
                          if isinstance(k, str) and _finite_number(v)})
        return elapsed

    def begin(self) -> None:
        """Called before a process's first shape: nothing pending from another process."""
        self._cupti_pending = {}

    def collect_cupti(self, handle: CandidateHandle, results: Sequence[ShapeResult],
                      deadline: float) -> list[ShapeResult]:
        """After a process's last shape: the CUPTI spans its process recorded for every
        shape judged since the last collect, each believed or not (``believe_cupti``) and
        written into that shape's timing. A process that fails to report leaves its
        shapes' verdicts as they were, with no CUPTI figure and the reason."""
        return self.start_collect(handle, deadline).apply(results)

    def start_collect(self, handle: CandidateHandle, deadline: float) -> CuptiCollect:
        """``collect_cupti`` in steps: the request goes out now; the returned object
        reads the reply (``receive``, once ``answered``) and applies it (``apply``)."""
        pending, self._cupti_pending = self._cupti_pending, {}
        if not pending:
            return CuptiCollect(self, pending, None)
        try:
            asked = self.ask_later(handle, deadline, "cupti_collect", "collecting CUPTI spans")
        except Verdict as failed:
            return CuptiCollect(self, pending, None, f"no CUPTI spans: {failed.message}"[:300])
        return CuptiCollect(self, pending, asked)

    def _speed_of_light(self, handle: CandidateHandle, bank: ShapeBank, deadline: float,
                        fresh: Any, median: float, timed: Sequence[Variant],
                        rng: random.Random) -> None:
        """The floor is the least bytes over the bandwidth, averaged over the timed inputs."""
        bandwidth = self.config.peak_bandwidth_gbps
        if bandwidth is None or self.device.type != "cuda":
            return
        costs = [bank.floor_bytes(v) for v in timed]
        if not costs or any(c is None for c in costs):
            return
        floor_bytes = statistics.fmean(c for c in costs if c is not None)
        floor = floor_bytes / (bandwidth * 1e9)
        if median >= floor:
            return
        for extra in range(2):
            slot = rng.randrange(bank.slot_count)
            assignment = {slot: fresh(extra % bank.config.bases)}
            self._write(bank, assignment)
            self.sync()
            self.ask(handle, deadline, "call", f"re-verification {extra}", shape=bank.shape, slot=slot)
            self._verify(bank, bank.snapshot(), assignment, f"re-verification {extra}", [slot])
        raise Verdict(
            Status.REJECTED,
            f"measured {median * 1e6:.2f} us is below the memory-bandwidth floor "
            f"{floor * 1e6:.2f} us ({floor_bytes / 1e6:.2f} MB at {bandwidth:.0f} GB/s): "
            "the timing cannot be real",
        )
