"""Timing pieces: output poison, the L2 flush, and CUPTI kernel spans.

Two figures are measured for every shape (see judge.py for how they are used):

- the judge's figure: the judge's own clock around a batch of calls the candidate's
  process runs back to back (a CUDA graph replay where the calls can be captured),
  divided by the number of calls. Nothing in the candidate's process can change it
  except by doing the work faster: every call of the batch writes its own poisoned
  output slot, and the judge screens all of them and checks a sample in full.
- the FlashInfer-Bench figure: CUPTI's kernel span of one eager call on a cold L2
  (latest end minus earliest start of the call's GPU activities), measured in the
  candidate's process with ``cupti-python``. It is comparable with published figures
  but comes from code the candidate could patch, so the judge accepts it only where it
  agrees with its own figure.

A call's GPU activities are found by time, not by correlation with API records as
FlashInfer-Bench finds them: the device is synchronised before the call's window opens
and before it closes, so the activities that start inside the window are the call's, and
the same set as correlation finds (a launch inside the call runs after the window opened
and is over when it closes). Recording only device activities, not every runtime and
driver call, keeps CUPTI's records few: with API records, flushing them took 0.12-0.15 s
a candidate on an H100 (eight shapes, ten calls each), more than any other step of
retiring its process.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

POISON_INT = -123456789
POISON_FLOAT = float("nan")


def poison_value(dtype: torch.dtype) -> float | int | bool:
    """A value no correct kernel leaves in an output of this dtype."""
    if dtype.is_floating_point:
        return POISON_FLOAT
    if dtype == torch.bool:
        return True
    size = torch.empty((), dtype=dtype).element_size()
    return POISON_INT if size >= 4 else -1 - (1 << (8 * size - 2))


def poison(outputs: Sequence[torch.Tensor]) -> None:
    """Fill outputs with values no correct kernel leaves behind."""
    for out in outputs:
        out.fill_(poison_value(out.dtype))


def still_poisoned(out: torch.Tensor) -> torch.Tensor:
    """Mask of the elements of ``out`` that still hold the poison value."""
    value = poison_value(out.dtype)
    if out.dtype.is_floating_point:
        return torch.isnan(out)
    return out == value


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice its size (as FlashInfer-Bench does)."""

    def __init__(self, device: torch.device) -> None:
        props = torch.cuda.get_device_properties(device)
        size = max(int(getattr(props, "L2_cache_size", 0)) * 2, 64 << 20)
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class CuptiSpans:
    """Per-call kernel spans through ``cupti-python``, the FlashInfer-Bench way.

    ``available`` is False where the package or the device does not support it; the
    judge then records no CUPTI figure and says why.
    """

    def __init__(self) -> None:
        self.why_not = ""
        self.last_phases_ms: dict[str, float] = {}
        """Milliseconds the last ``measure`` spent enabling CUPTI, in the calls, flushing
        its records and disabling it."""
        self._device: list[tuple[int, int]] = []
        """(start, end) in ns of every device activity recorded since the last collect."""
        try:
            from cupti import cupti

            self._cupti: Any = cupti
            cupti.activity_register_callbacks(self._requested, self._completed)
        except Exception as exc:
            self._cupti = None
            self.why_not = f"cupti-python unavailable: {type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self._cupti is not None

    def _requested(self) -> tuple[int, int]:
        return 8 << 20, 0

    def _completed(self, activities: Sequence[Any]) -> None:
        kinds = self._cupti.ActivityKind
        for a in activities:
            if a.kind in (kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.MEMSET):
                self._device.append((int(a.start), int(a.end)))

    def _kinds(self) -> list[Any]:
        k = self._cupti.ActivityKind
        return [k.CONCURRENT_KERNEL, k.MEMCPY, k.MEMSET]

    def measure(
        self, calls: Sequence[Callable[[], None]], before: Callable[[], None]
    ) -> list[float | None]:
        """Span in ms of each call (None: no GPU activity in it); ``before`` runs untimed.
        Collects everything recorded so far: call it only with no ``record`` pending."""
        return self.collect({"": self.record(calls, before)})[""]

    def record(
        self, calls: Sequence[Callable[[], None]], before: Callable[[], None]
    ) -> list[tuple[int, int]]:
        """Run the calls under CUPTI (``before`` untimed, a device sync around each) and
        return their windows, each from the sync before its call to the sync after it;
        the records stay in CUPTI's buffers until ``collect`` (forcing them out is done
        once per candidate, not per shape)."""
        cupti = self._cupti
        windows = []
        marks = [time.perf_counter()]
        for kind in self._kinds():
            cupti.activity_enable(kind)
        try:
            torch.cuda.synchronize()
            marks.append(time.perf_counter())
            for call in calls:
                before()
                torch.cuda.synchronize()
                start = cupti.get_timestamp()
                call()
                torch.cuda.synchronize()
                windows.append((start, cupti.get_timestamp()))
            marks.append(time.perf_counter())
        finally:
            for kind in self._kinds():
                cupti.activity_disable(kind)
        marks.append(time.perf_counter())
        # where a measurement's time goes (diagnosis of the judge's cost); an exception
        # above leaves before here, so all four marks exist
        self.last_phases_ms = {name: (b - a) * 1e3 for name, a, b in zip(
            ("enable", "calls", "disable"), marks[:-1], marks[1:], strict=True)}
        return windows

    def collect(self, windows: dict[str, list[tuple[int, int]]]) -> dict[str, list[float | None]]:
        """Flush CUPTI's buffers and give each recorded window its span in ms (None: no
        GPU activity in it), by key; then forget every record."""
        started = time.perf_counter()
        self._cupti.activity_flush_all(1)
        self.last_phases_ms = {"flush": (time.perf_counter() - started) * 1e3}
        out = spans_of(windows, self._device)
        self._device.clear()
        return out


def spans_of(windows: dict[str, list[tuple[int, int]]],
             device: Sequence[tuple[int, int]]) -> dict[str, list[float | None]]:
    """Per window (start, end in ns), the span in ms of the device activities (start, end
    in ns) that started inside it: latest end minus earliest start (None where none
    did). Records sorted once by start and found by bisection: thousands of records and
    windows cost milliseconds, not a scan of every record per window."""
    ordered = sorted(device)
    starts = [s for s, _ in ordered]
    out: dict[str, list[float | None]] = {}
    for key, pairs in windows.items():
        spans: list[float | None] = []
        for start, end in pairs:
            inside = ordered[bisect_left(starts, start) : bisect_right(starts, end)]
            spans.append((max(e for _, e in inside) - inside[0][0]) / 1e6 if inside else None)
        out[key] = spans
    return out
