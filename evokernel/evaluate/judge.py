"""The judge: one candidate's process, one shape, from first call to verdict and time.

Per shape, in the judge's process, with the candidate's process reached only
through its socket (process.py) and seeing only its slots (bank.py):

1. **Checked calls.** ``trials`` calls, each on a fresh variant: the judge writes the
   inputs, poisons the outputs, asks for one call, copies the outputs the moment the
   reply arrives, then checks guards, inputs (bit for bit) and the workload's rule
   against expected outputs it computed itself.
2. **Warm-up and batch size.** Calls on already-seen inputs, a random number more on
   every device, until a batch of ``n`` calls lasts about ``target_batch_s``.
3. **Timed batches.** Each slot gets a fresh variant, the judge flushes the L2, starts
   its clock, asks for the batch (one CUDA-graph replay if the calls could be captured,
   else eager calls), stops its clock at the reply. Per call: (elapsed - round trip
   measured before any candidate code loaded) / n. Every slot's output is screened
   (guards, never-written elements), inputs are checked unchanged, and a random sample
   plus any slot whose output duplicates another's is checked in full.
4. **CUPTI.** On a GPU, fresh variants again and the FlashInfer-Bench measurement in
   the candidate's process; its outputs are judged like a batch, and its spans count
   only where they agree with the judge's clock.
5. **Speed of light.** A time below the workload's bytes over the datasheet bandwidth
   is re-verified on fresh inputs and then rejected as impossible.
"""

from __future__ import annotations

import logging
import random
import signal
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evokernel.evaluate.bank import ShapeBank, Variant
from evokernel.evaluate.channel import ChannelClosed, ChannelTimeout, ProtocolError
from evokernel.evaluate.check import check_outputs
from evokernel.evaluate.process import CandidateHandle
from evokernel.evaluate.result import ShapeResult, Status, Timing
from evokernel.evaluate.timing import L2Flusher

log = logging.getLogger(__name__)

CUPTI_AGREEMENT = 0.5
CUPTI_LAUNCH_SLACK_S = 4e-6
"""A CUPTI median (reported by the candidate's process) is believed when it is at least
``CUPTI_AGREEMENT`` times the judge's per-call figure less ``CUPTI_LAUNCH_SLACK_S``: the
judge's figure includes the launch gaps between the kernels of a replayed batch (about
1-2 us each on an H200), which a kernel span does not. A kernel that takes tens of
microseconds by the judge's clock cannot claim a span of one."""


@dataclass(frozen=True)
class JudgeConfig:
    trials: int = 3
    batches: int = 3
    target_batch_s: float = 0.002
    sample_checks: int = 2
    cupti_calls: int = 10
    extra_warmups: int = 4
    peak_bandwidth_gbps: float | None = None


class Verdict(Exception):
    """A shape's evaluation ends here with this status."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Judge:
    def __init__(self, config: JudgeConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.flush = L2Flusher(device) if device.type == "cuda" else None

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
        left = deadline - time.monotonic()
        if left <= 0:
            raise Verdict(Status.TIMEOUT, f"{what}: no result within the time limit")
        try:
            reply = handle.request(op, left, **fields)
        except ChannelTimeout:
            raise Verdict(Status.TIMEOUT, f"{what}: no result within the time limit") from None
        except ProtocolError as exc:
            handle.kill()
            raise Verdict(Status.RUNTIME_ERROR, f"{what}: the candidate's process broke the "
                                                f"protocol: {exc}") from None
        except ChannelClosed as exc:
            handle.kill()
            code = handle.exit_code()
            hint = ""
            if code == -signal.SIGSEGV and self.device.type == "cpu":
                hint = (" (a segmentation fault; the inputs are mapped read-only, so a write "
                        "to an input ends here)")
            raise Verdict(
                Status.RUNTIME_ERROR,
                f"{what}: the candidate's process died (exit code {code}){hint}: {exc}",
            ) from None
        if "error" in reply:
            raise Verdict(Status.RUNTIME_ERROR, f"{what}: {reply['error']}")
        return reply

    # -- one shape -----------------------------------------------------------------------

    def judge_shape(
        self, handle: CandidateHandle, bank: ShapeBank, rng: random.Random, deadline: float
    ) -> tuple[ShapeResult, float]:
        """Verdict and timing of one shape; the second value is the seconds it took."""
        started = time.perf_counter()
        bank.restore_fixed()  # whatever an earlier process did is not this one's doing
        stats: dict[str, float] = {}
        try:
            timing, stats = self._run(handle, bank, rng, deadline)
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
             deadline: float) -> tuple[Timing, dict[str, float]]:
        config = self.config
        bases = bank.config.bases
        queues: dict[int, list[int]] = {b: [] for b in range(bases)}
        for index in bank.draw(rng):
            queues[index % bases].append(index)

        def fresh(base: int) -> Variant:
            if not queues[base]:
                raise Verdict(Status.RUNTIME_ERROR, "the judge ran out of fresh inputs (a bug)")
            return bank.variant(queues[base].pop())

        self.ask(handle, deadline, "bind", "binding the inputs", shape=bank.shape,
                 slots=[[s.to_json() for s in specs] for specs in bank.slot_specs])

        # 1. checked calls, each on a fresh variant, the base switching in place
        stats: dict[str, float] = {}
        walls = []
        last: Variant | None = None
        for trial in range(config.trials):
            last = fresh(trial % bases)
            assignment = {0: last}
            self._write(bank, assignment)
            self.sync()
            t0 = time.perf_counter()
            self.ask(handle, deadline, "call", f"trial {trial}", shape=bank.shape, slot=0)
            walls.append(time.perf_counter() - t0)
            snapshot = bank.snapshot()
            stats = self._verify(bank, snapshot, assignment, f"trial {trial}", [0])
        assert last is not None

        # 2. warm-up on inputs already seen, sizing the batch
        rtt = handle.rtt_s or 0.0
        self._write(bank, dict.fromkeys(range(bank.slot_count), last))
        self.sync()
        n = self._size_batch(handle, bank, deadline, min(walls) - rtt, rtt)
        for _ in range(rng.randrange(config.extra_warmups + 1)):
            self.ask(handle, deadline, "call", "warm-up call", shape=bank.shape, slot=0)
        slots = list(range(n))
        graph = False
        if self.device.type == "cuda":
            graph = bool(self.ask(handle, deadline, "capture", "capturing a graph",
                                  shape=bank.shape, slots=slots).get("captured"))

        # 3. timed batches on fresh inputs
        per_call = []
        claimed = []
        timed: list[Variant] = []
        for batch in range(config.batches):
            base = (config.trials + batch) % bases
            assignment = {s: fresh(base) for s in slots}
            timed += assignment.values()
            self._write(bank, assignment)
            self.before_batch()
            t0 = time.perf_counter()
            reply = self.ask(handle, deadline, "batch", f"timed batch {batch}", shape=bank.shape,
                             slots=slots, graph=graph)
            elapsed = time.perf_counter() - t0
            if isinstance(reply.get("seconds"), int | float):
                claimed.append(float(reply["seconds"]))
            snapshot = bank.snapshot()
            per_call.append(max(elapsed - rtt, 1e-9) / n)
            sample = self._sample(bank, assignment, rng) | bank.duplicates(snapshot, slots)
            self._verify(bank, snapshot, assignment, f"timed batch {batch}", sorted(sample))

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
        cupti_ms, cupti_note = self._cupti(handle, bank, rng, deadline, fresh, median)

        # 5. speed of light
        self._speed_of_light(handle, bank, deadline, fresh, median, timed)
        ordered = sorted(per_call)
        timing = Timing(
            median_ms=median * 1e3, p25_ms=ordered[0] * 1e3, p75_ms=ordered[-1] * 1e3,
            e2e_ms=max(statistics.median(walls), 1e-9) * 1e3, samples=n * config.batches,
            method=method, cupti_ms=cupti_ms, cupti_note=cupti_note,
        )
        return timing, stats

    def _size_batch(self, handle: CandidateHandle, bank: ShapeBank, deadline: float,
                    estimate: float, rtt: float) -> int:
        """Calls per batch so that one batch lasts about ``target_batch_s`` (warm-up too)."""
        target, most = self.config.target_batch_s, bank.slot_count
        n = int(min(most, max(1, target / max(estimate, 1e-7))))
        for _ in range(4):
            t0 = time.perf_counter()
            self.ask(handle, deadline, "batch", "warm-up batch", shape=bank.shape,
                      slots=list(range(n)), graph=False)
            per_call = max(time.perf_counter() - t0 - rtt, 1e-9) / n
            wanted = int(min(most, max(1, -(-target // per_call))))
            if wanted <= n or n == most:
                return wanted
            n = wanted
        return n

    @staticmethod
    def _write(bank: ShapeBank, assignment: dict[int, Variant]) -> None:
        changed = bank.write(assignment)
        if changed:
            raise Verdict(Status.INCORRECT, f"the candidate modified its inputs {changed}")

    def _sample(self, bank: ShapeBank, assignment: dict[int, Variant], rng: random.Random) -> set[int]:
        """Slots to check in full: random, preferring variants whose expected outputs are
        known (which ones are is invisible to the candidate)."""
        slots = sorted(assignment)
        rng.shuffle(slots)
        slots.sort(key=lambda s: not bank.has_expected(assignment[s]))
        return set(slots[: self.config.sample_checks])

    def _verify(self, bank: ShapeBank, snapshot: Sequence[torch.Tensor],
                assignment: dict[int, Variant], what: str, full: Sequence[int]) -> dict[str, float]:
        bad = bank.screen(snapshot, sorted(assignment))
        if bad:
            slot = min(bad)
            raise Verdict(Status.INCORRECT, f"{what}: {bad[slot]}")
        changed = bank.inputs_changed(assignment)
        if changed:
            bank.restore_fixed()
            raise Verdict(Status.INCORRECT, f"{what}: the candidate modified its inputs {changed}")
        stats: dict[str, float] = {}
        for slot in full:
            variant = assignment[slot]
            verdict = check_outputs(bank.workload, bank.outputs_of(snapshot, slot),
                                    bank.expected(variant), bank.inputs_of(variant))
            if not verdict.ok:
                raise Verdict(Status.INCORRECT, f"{what}: {verdict.message}")
            stats = dict(verdict.stats)
        return stats

    def _cupti(self, handle: CandidateHandle, bank: ShapeBank, rng: random.Random,
               deadline: float, fresh: Any, judge_median: float) -> tuple[float | None, str]:
        if self.device.type != "cuda" or self.config.cupti_calls <= 0:
            return None, ""
        slots = list(range(min(self.config.cupti_calls, bank.slot_count)))
        base = rng.randrange(bank.config.bases)
        assignment = {s: fresh(base) for s in slots}
        self._write(bank, assignment)
        self.sync()
        t0 = time.perf_counter()
        reply = self.ask(handle, deadline, "cupti", "CUPTI calls", shape=bank.shape, slots=slots)
        elapsed = time.perf_counter() - t0
        snapshot = bank.snapshot()
        self._verify(bank, snapshot, assignment, "CUPTI-timed call",
                     sorted(self._sample(bank, assignment, rng)))
        spans = reply.get("spans_ms")
        if not isinstance(spans, list) or not spans:
            return None, str(reply.get("why", "no CUPTI spans"))[:300]
        if any(not isinstance(s, int | float) or s <= 0 for s in spans):
            return None, "a CUPTI-timed call showed no GPU activity"
        median = statistics.median(float(s) for s in spans)
        believable = CUPTI_AGREEMENT * judge_median - CUPTI_LAUNCH_SLACK_S
        if sum(spans) > elapsed * 1e3 or median < believable * 1e3:
            return None, (f"CUPTI's {median * 1e3:.2f} us disagrees with the judge's clock "
                          f"({judge_median * 1e6:.2f} us): not believed")
        return median, ""

    def _speed_of_light(self, handle: CandidateHandle, bank: ShapeBank, deadline: float,
                        fresh: Any, median: float, timed: Sequence[Variant]) -> None:
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
            assignment = {0: fresh(extra % bank.config.bases)}
            self._write(bank, assignment)
            self.sync()
            self.ask(handle, deadline, "call", f"re-verification {extra}", shape=bank.shape, slot=0)
            self._verify(bank, bank.snapshot(), assignment, f"re-verification {extra}", [0])
        raise Verdict(
            Status.REJECTED,
            f"measured {median * 1e6:.2f} us is below the memory-bandwidth floor "
            f"{floor * 1e6:.2f} us ({floor_bytes / 1e6:.2f} MB at {bandwidth:.0f} GB/s): "
            "the timing cannot be real",
        )
