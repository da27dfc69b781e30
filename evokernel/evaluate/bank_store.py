"""The judge's input banks, per shape and per lane, within one memory budget.

A shape's bank (bank.py) holds the judge's private inputs and expected outputs and the
shared chunks a candidate's process writes its answers into. Every lane (lanes.py) gets
its own chunks of every shape, twins of one bank that share the private part
(``ShapeBank.twin``): a process maps only its lane's chunks, so it cannot reach what the
candidate in the next lane is judged on.

Banks are large (a shape of fused_moe's holds GBs of weights), and a run may name more
shapes than fit on the device, so ``BankStore`` keeps shapes within
``SandboxConfig.bank_memory_gb`` and makes a dropped one anew when it is next used. Three
things make that subtle, and are why this is a class of its own:

- A chunk's memory on a GPU is freed only once no process maps it. A bank may be closed
  only once no lane's process maps it (the evaluator waits for that), and the idle spare
  processes, which mapped every chunk when they started, must let go of it after.
- Making a bank may find the device short of memory that the budget said was there (its
  other tenants, the candidates' processes, torch's cache): then the budget is lowered to
  what was held when it failed (never below one shape), shapes are dropped to leave a
  shape's room below that, and it is tried again (then once more with every other shape
  dropped). The lowered budget lasts ``CAP_MAKES`` makes: the shortage may have been a
  candidate's, and a candidate must not shrink the judge's banks for the rest of the run.
  The evaluator lifts it sooner where it knows the tenant gone (``lift_cap``: the
  baseline's process, once the baseline is timed).
- Which shape to drop. An evaluation takes its shapes in the same order candidate after
  candidate, so when they do not all fit, dropping the least recent one is the worst
  choice: it is the next one needed, and every shape is made anew for every candidate
  (seven of fused_moe's eight on an H100, 2026-12-06). The store predicts each shape's
  next use from its last two (the last plus the interval between them) and drops the one
  needed last: in a repeated sweep that is the one just used, and one or two shapes are
  made again a sweep. A shape with no prediction, or one overdue (used in an earlier
  sweep and not since), goes first, the least recent of those first.

What it needs of the evaluator comes in through its constructor: how to wait until no
lane's process maps a bank, and how to make a lane's idle spares map what the lane holds
now. The store knows processes only through those two callables.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from evokernel.evaluate.bank import BankConfig, ShapeBank
from evokernel.evaluate.shared import Chunk, DeviceMemoryError
from evokernel.workload import Workload

log = logging.getLogger(__name__)

__all__ = ["BankStore", "pair_bytes"]

CAP_MAKES = 16
"""Makes a ceiling learned from an out-of-memory lasts (``BankStore._limit``)."""


class BankStore:
    """Every shape's banks (one per lane), within a budget: the one predicted to be needed
    last is dropped first (see the module's docstring).

    The evaluator makes one store per run and asks it for a shape's bank in a lane
    (``bank``) before it judges a candidate or the baseline on that shape; the spare
    processes ask it what to map and bind (``chunks``, ``slots``); retiring a lane's
    process scrubs that lane's banks (``lane_banks``) or, where the process outlived its
    kill, gives the lane new chunks (``renew_lane``).

    Thread safety: the methods may be called from any thread (the evaluation threads, the
    spare pools' starting threads, the lanes' retiring threads). One lock guards the
    ordered map of shapes, the chunk ids and the largest shape's size; it is never held
    while a bank is made or closed, or while a callable of the evaluator runs. What the
    store does not guard, its callers provide: a new shape is made by one caller at a time
    (the evaluator makes them under its head lock, or in a run's set-up before any
    evaluation), and a lane's chunks are replaced only while no process of that lane is
    alive.

    Args:
        workload: Whose inputs and expected outputs (its reference) the banks hold.
        device: Where the banks live. On a GPU each new bank makes every variant up front
            and the budget defaults to a share of the device's memory.
        lanes: How many lanes share each shape: a shape has this many banks, one made and
            the others its twins.
        config: The banks' settings, but for ``memory_bytes``, which the store sets from its
            budget (a quarter of it, at most 2 GiB) each time it makes a bank.
        memory_gb: ``SandboxConfig.bank_memory_gb``: the budget in GiB; None or 0 for the
            device's default (``budget_gb``).
        await_unmapped: Returns once no lane's process maps any bank's chunks (it may wait
            for used processes to die). Called before a new shape is made, since making one
            may drop others.
        refresh_spares: Makes lane ``i``'s idle spare processes map what that lane holds
            now and let go of closed chunks. Called after banks were dropped or a lane's
            chunks renewed.
    """

    def __init__(self, workload: Workload, device: torch.device, lanes: int, config: BankConfig,
                 *, memory_gb: float | None, await_unmapped: Callable[[], None],
                 refresh_spares: Callable[[int], None]) -> None:
        self._workload = workload
        self._device = device
        self._lanes = max(1, lanes)
        self._config = config
        self._memory_gb = memory_gb
        self._await_unmapped = await_unmapped
        self._refresh_spares = refresh_spares
        self._lock = threading.Lock()
        self._pairs: OrderedDict[str, list[ShapeBank]] = OrderedDict()
        """Per shape, one bank per lane (twins), in the order last used (least recent first)."""
        self._chunk_ids = 0
        self._largest_pair = 0
        """Bytes of the largest shape's banks made so far: room kept for the next one."""
        self._cap: int | None = None
        """Bytes held when making a bank last ran out of device memory (at least one shape's):
        the budget's ceiling for the next ``CAP_MAKES`` makes."""
        self._makes_under_cap = 0
        self._tick = 0
        self._uses: dict[str, tuple[int, int | None]] = {}
        """Per shape ever asked for: the tick of its last use and of the one before."""
        self._warned_eviction = False

    # -- what the evaluator and the spare pools read ------------------------------------

    def bank(self, shape: str, lane: int = 0) -> ShapeBank:
        """``shape``'s bank in ``lane``'s chunks, made for every lane where it is new.

        Called before a shape is judged (a candidate's, the baseline's), and in a run's
        set-up. A shape already held is only marked most recent: nothing waits. A new one
        first waits for ``await_unmapped`` (room is made by dropping shapes, and no process
        may map a dropped bank), then drops shapes (the one predicted to be needed last
        first) until room as large as the largest shape made so far is left within the budget,
        makes the shape's banks, and drops more if it took more than that. Idle spares are
        refreshed after any drop, so they map the new bank and none of the dropped ones.

        Assumes the caller is the only one making a new shape at this time (see the class).

        Raises:
            DeviceMemoryError: The device had no room for the banks even once every other
                shape was dropped (where some were, a warning says so before the retry).
        """
        with self._lock:
            self._tick += 1
            last = self._uses.get(shape)
            self._uses[shape] = (self._tick, last[0] if last else None)
            if shape in self._pairs:
                self._pairs.move_to_end(shape)
                return self._pairs[shape][lane]
        self._await_unmapped()  # a new bank can drop an old one: no process may map it
        budget = self._limit()
        evicted = self._evict(limit=budget - self._largest_pair)
        if evicted:
            self._release_dropped()
        pair = self._make_pair_with_room(shape, evicted)
        with self._lock:
            self._pairs[shape] = pair
            self._largest_pair = max(self._largest_pair, pair_bytes(pair))
            if self._cap is not None:
                self._makes_under_cap += 1
                if self._makes_under_cap > CAP_MAKES:
                    self._cap = None  # the full budget again; a shortage that stayed lowers it again
        evicted += self._evict(limit=self._limit(), protect=shape)
        if evicted:
            self._release_dropped()  # and the spares map the new bank
            if not self._warned_eviction:
                self._warned_eviction = True
                log.warning("the judge's inputs for shape(s) %s were dropped to stay within %.1f GiB "
                            "(bank_memory_gb, or what the device held): an evaluation over more shapes "
                            "than fit makes some anew for every candidate; raise bank_memory_gb, or "
                            "use fewer lanes", ", ".join(s[:8] for s in evicted), self._limit() / (1 << 30))
        return pair[lane]

    def __contains__(self, shape: object) -> bool:
        """Whether ``shape``'s banks are held now: the next ``bank`` of it waits for nothing.
        Does not mark it most recent."""
        with self._lock:
            return shape in self._pairs

    def shapes(self) -> list[str]:
        """The shapes held now, the least recently used first."""
        with self._lock:
            return list(self._pairs)

    def pair(self, shape: str) -> list[ShapeBank]:
        """``shape``'s bank in every lane, by lane (a copy of the list); KeyError where it
        is not held. Does not mark it most recent."""
        with self._lock:
            return list(self._pairs[shape])

    def banks(self) -> list[ShapeBank]:
        """Every bank held now, of every shape and lane."""
        with self._lock:
            return [bank for pair in self._pairs.values() for bank in pair]

    def lane_banks(self, lane: int) -> list[ShapeBank]:
        """``lane``'s bank of every shape held now: what a process of that lane mapped, and
        what is scrubbed once it is dead."""
        with self._lock:
            return [pair[lane] for pair in self._pairs.values()]

    def chunks(self, lane: int = 0) -> dict[int, tuple[Chunk, bool]]:
        """Every chunk of ``lane`` (by id, with whether a process may write it): what a
        process of that lane maps, and no other lane's."""
        with self._lock:
            return {i: c for pair in self._pairs.values() for i, c in pair[lane].chunks.items()}

    def slots(self, lane: int = 0) -> dict[str, list[list[Any]]]:
        """The slot specs of every shape in ``lane``'s chunks: what a spare of that lane
        binds ahead, so that the judge selects a shape without sending them."""
        with self._lock:
            return {shape: pair[lane].slots_json for shape, pair in self._pairs.items()}

    def room(self, shape: str) -> int:
        """How many shapes the size of ``shape``'s banks fit at once, a quarter of the budget
        (or of what the device held, where that was less) kept spare (at least 1). Makes the
        shape's banks (``bank``, with its waits)."""
        self.bank(shape)
        with self._lock:
            per_shape = pair_bytes(self._pairs[shape])
        return max(1, int(0.75 * self._limit() // max(1, per_shape)))

    def budget_gb(self) -> float:
        """The budget in GiB: ``memory_gb`` where given; else 4 on the CPU, and on a GPU 45%
        of its memory or 48 GiB a lane, whichever is less."""
        if self._memory_gb:
            return self._memory_gb
        if self._device.type != "cuda":
            return 4.0
        total = torch.cuda.get_device_properties(self._device).total_memory / (1 << 30)
        return min(0.45 * total, 48.0 * self._lanes)

    def lift_cap(self) -> None:
        """Forget a ceiling a shortage set: the full budget holds again from the next make.

        Called when the tenant that caused the shortage is known gone: after the baseline
        is timed and its process has exited (a published reference's temporaries held 33
        GiB of an H100 in fused_moe's set-up, 2026-12-07, and the ceiling they set then
        dropped seven of eight shapes for the run's first candidates). A shortage that
        stays lowers the ceiling again at the next make that meets it. Shapes dropped are
        not made here; ``bank`` makes them when next asked."""
        with self._lock:
            if self._cap is not None:
                log.info("the judge's inputs may take %.1f GiB again (the ceiling of %.1f GiB "
                         "is lifted)", self.budget_gb(), self._cap / (1 << 30))
            self._cap = None
            self._makes_under_cap = 0

    # -- what changes chunks --------------------------------------------------------------

    def renew_lane(self, lane: int) -> None:
        """Give ``lane`` new chunks for every shape; the old ones are closed.

        Called when a process of ``lane`` outlived its kill: it may still write the chunks
        it mapped, so a scrub proves nothing and no one may use them again. Assumes no
        live process of ``lane`` is to be used with the old chunks (the evaluator calls
        this before the lane serves again). The new chunks are twins of another lane's
        bank, so no input or expected output is made again; with one lane there is no
        other, and every bank is dropped instead (made anew when next used, after
        ``await_unmapped``). Idle spares are refreshed: lane ``lane``'s, or with one lane,
        all of them.
        """
        if self._lanes == 1:
            self._drop_all()
            return
        source = (lane + 1) % self._lanes  # any other lane's twin shares the private stores
        with self._lock:
            pairs = list(self._pairs.values())
        for pair in pairs:
            old, pair[lane] = pair[lane], pair[source].twin(self._next_chunk_id())
            old.close()
        self._refresh_spares(lane)
        self._empty_cache()

    def close(self) -> None:
        """Close every bank and hold none. Called once, with the evaluator, when no process
        maps any chunk any more; the store is not used after."""
        with self._lock:
            for pair in self._pairs.values():
                for bank in pair:
                    bank.close()
            self._pairs.clear()

    # -- inside ---------------------------------------------------------------------------

    def _make_pair(self, shape: str) -> list[ShapeBank]:
        """A shape's bank for every lane (closed again if any of them cannot be made)."""
        gpu = self._device.type == "cuda"
        config = dataclasses.replace(
            self._config, memory_bytes=int(min(2.0, self.budget_gb() / 4) * (1 << 30)))
        pair: list[ShapeBank] = []
        try:
            pair.append(ShapeBank(self._workload, shape, config, self._device,
                                  self._workload.expected_outputs, self._next_chunk_id()))
            pair[0].warm(16 if gpu else 2)
            if gpu:  # on the CPU, making them as they are needed costs less than all at once
                pair[0].make_variants()
            pair.extend(pair[0].twin(self._next_chunk_id()) for _ in range(self._lanes - 1))
        except BaseException:
            for bank in pair:
                bank.close()
            raise
        return pair

    def _make_pair_with_room(self, shape: str, evicted: list[str]) -> list[ShapeBank]:
        """``_make_pair``, where the device runs out of memory: the ceiling lowered to what
        was held, shapes dropped to leave one shape's room below it, tried again, then once
        more with every other shape dropped. Appends what it drops to ``evicted``."""
        first = True
        while True:  # each round drops at least one shape, or raises
            try:
                return self._make_pair(shape)
            except (DeviceMemoryError, torch.OutOfMemoryError) as exc:
                with self._lock:
                    held = self._bytes()
                    if held > 0:  # nothing held says nothing of what fits
                        floor = max(held, self._largest_pair)
                        self._cap = floor if self._cap is None else min(self._cap, floor)
                        self._makes_under_cap = 0
                dropped = self._evict(limit=held - max(1, self._largest_pair) if first else 0)
                first = False
                if not dropped:
                    raise DeviceMemoryError(f"the judge's inputs for shape {shape} do not fit on the "
                                            f"device: {exc}") from exc
                evicted += dropped
                log.warning("shape %s: the device ran out of memory for the judge's inputs beside %.1f GiB "
                            "of others; dropped %s and tried again (at most %.1f GiB are held from now on)",
                            shape[:8], held / (1 << 30), ", ".join(d[:8] for d in dropped),
                            self._limit() / (1 << 30))
                self._release_dropped()

    def _limit(self) -> int:
        """Bytes the banks may take: the budget, or less where the device held less."""
        budget = int(self.budget_gb() * (1 << 30))
        return budget if self._cap is None else min(budget, self._cap)

    def _evict(self, limit: int, protect: str | None = None) -> list[str]:
        """Drop shapes, ``protect`` never, while they take more than ``limit`` bytes, the one
        predicted to be needed last first (see the module's docstring); their names. No
        process may map their chunks (the caller has waited for ``await_unmapped``) until
        ``_release_dropped``."""
        dropped: list[tuple[str, list[ShapeBank]]] = []
        with self._lock:
            while self._bytes() > max(0, limit):
                victims = [name for name in self._pairs if name != protect]
                if not victims:
                    break
                name = max(victims, key=self._drop_priority)
                dropped.append((name, self._pairs.pop(name)))
        for _, pair in dropped:  # closed outside the lock (see the class)
            for bank in pair:
                bank.close()
        return [name for name, _ in dropped]

    def _drop_priority(self, name: str) -> tuple[int, float, int]:
        """Larger drops first (under ``_lock``): shapes with no prediction or an overdue
        one, the least recent of them first; then the latest predicted next use."""
        last, before = self._uses.get(name, (0, None))
        if before is None or 2 * last - before < self._tick:
            return (1, 0.0, -last)
        return (0, float(2 * last - before), last)

    def _release_dropped(self) -> None:
        """After ``_evict``: idle spares let go of the dropped chunks (on a GPU, a chunk's
        memory is freed only when no process maps it), torch's cache of what they held."""
        self._refresh_every_lane()
        self._empty_cache()

    def _drop_all(self) -> None:
        """Close every bank of every lane (the next use of a shape makes it anew, in new
        chunks)."""
        with self._lock:
            pairs = list(self._pairs.values())
            self._pairs.clear()
        for pair in pairs:
            for bank in pair:
                bank.close()
        self._refresh_every_lane()
        self._empty_cache()

    def _refresh_every_lane(self) -> None:
        for lane in range(self._lanes):
            self._refresh_spares(lane)

    def _empty_cache(self) -> None:
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

    def _next_chunk_id(self) -> int:
        with self._lock:
            self._chunk_ids += 2  # inputs and outputs
            return self._chunk_ids

    def _bytes(self) -> int:
        """Memory of every lane's chunks and, once per shape, the judge's private stores
        (under ``_lock``)."""
        return sum(pair_bytes(pair) for pair in self._pairs.values())


def pair_bytes(pair: Sequence[ShapeBank]) -> int:
    """Memory of one shape's banks: every lane's chunks and, once, the judge's private stores."""
    return sum(b.chunk_bytes() for b in pair) + pair[0].private_bytes()
