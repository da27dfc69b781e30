"""The judge's input banks within their budget (evokernel/evaluate/bank_store.py), on the
CPU: the shape needed last dropped first, room for the largest shape made before a new
one, a shape made once and twinned for every lane, nothing left open when making fails,
and no process mapping a bank when it is dropped."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from evokernel.evaluate import bank_store
from evokernel.evaluate.bank import BankConfig
from evokernel.evaluate.bank_store import BankStore, pair_bytes
from evokernel.evaluate.shared import DeviceMemoryError


class World:
    """What the store reaches: a fake workload whose banks have the sizes set here, and a
    log of what happened in order (banks made and closed, waits, spare refreshes)."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        """Bytes of one lane's chunks, per shape (the private stores take none)."""
        self.events: list[tuple[str, ...]] = []
        self.made: list[FakeBank] = []
        self.fail_make: list[BaseException] = []
        """Raised, one each, by the next shapes made."""
        self.fail_twin_at: int | None = None
        """The twin (1 = the first) whose making raises."""
        self.held_when_made: list[int] = []
        self.store: BankStore | None = None

    def expected_outputs(self, *inputs: Any) -> Any:
        raise AssertionError("the store never computes expected outputs itself")

    def make_store(self, *, lanes: int = 2, budget: int | None = None) -> BankStore:
        self.store = BankStore(
            self, torch.device("cpu"), lanes, BankConfig(seed=1, salt="s"),  # type: ignore[arg-type]
            memory_gb=None if budget is None else budget / (1 << 30),
            await_unmapped=lambda: self.events.append(("await",)),
            refresh_spares=lambda lane: self.events.append(("refresh", str(lane))))
        return self.store


class FakeBank:
    """A ShapeBank as the store uses it: made, warmed, twinned, sized, closed."""

    world: World

    def __init__(self, workload: World, shape: str, config: BankConfig, device: torch.device,
                 reference: Callable[..., Any], chunk_id: int = 0) -> None:
        self.world = workload
        if workload.store is not None:
            workload.held_when_made.append(
                sum(pair_bytes(workload.store.pair(s)) for s in workload.store.shapes()))
        if workload.fail_make:
            raise workload.fail_make.pop(0)
        self.shape, self.config, self.chunk_id = shape, config, chunk_id
        self.twins = 0
        self.closed = False
        workload.made.append(self)
        workload.events.append(("make", shape))

    def warm(self, per_base: int) -> None:
        pass

    def make_variants(self) -> None:
        pass

    def twin(self, chunk_id: int) -> FakeBank:
        self.twins += 1
        if self.twins == self.world.fail_twin_at:
            raise RuntimeError("no room for a twin (test)")
        twin = copy.copy(self)
        twin.chunk_id, twin.closed = chunk_id, False
        return twin

    def chunk_bytes(self) -> int:
        return self.world.sizes.get(self.shape, 50)

    def private_bytes(self) -> int:
        return 0

    @property
    def chunks(self) -> dict[int, tuple[str, bool]]:
        return {self.chunk_id: ("inputs", False), self.chunk_id + 1: ("outputs", True)}

    @property
    def slots_json(self) -> list[list[Any]]:
        return [[self.shape, self.chunk_id]]

    def close(self) -> None:
        self.closed = True
        self.world.events.append(("close", self.shape))


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setattr(bank_store, "ShapeBank", FakeBank)
    here = World()
    yield here
    if here.store is not None:
        here.store.close()


def test_the_least_recent_shape_is_dropped_first_to_stay_within_the_budget(world: World) -> None:
    """Each shape takes 100 bytes (two lanes of 50); 350 hold three, with room for one
    more kept. A shape used again is recent again: the one used longest ago goes."""
    store = world.make_store(budget=350)
    for shape in "ABC":
        store.bank(shape)
    store.bank("A")  # used again: now the most recent
    assert store.shapes() == ["B", "C", "A"]
    store.bank("D")
    assert store.shapes() == ["C", "A", "D"]
    assert world.events.index(("close", "B")) < world.events.index(("make", "D"))
    closed = {bank.shape for bank in world.made if bank.closed}
    assert closed == {"B"}


def test_room_as_large_as_the_largest_shape_is_made_before_a_new_one(world: World) -> None:
    """A new shape may be as large as the largest made so far: room for that is made
    before it is made (banks made first and dropped after ran an H100 out of memory);
    what it takes beyond that room is dropped after."""
    world.sizes = {"big": 150, "x": 50, "y": 50, "z": 50, "huge": 300}
    store = world.make_store(budget=450)
    for shape in ["big", "x", "y", "z"]:
        store.bank(shape)
    # big (300) went before x was made; after that at most 450 - 300 is held at a make
    assert world.held_when_made == [0, 0, 100, 100]
    assert store.shapes() == ["y", "z"]
    store.bank("huge")  # 600: beyond the budget on its own, and alone once made
    assert store.shapes() == ["huge"]
    assert world.events.index(("close", "y")) < world.events.index(("make", "huge"))
    assert world.events.index(("make", "huge")) < world.events.index(("close", "z"))


def test_a_shape_is_made_once_and_twinned_for_every_lane(world: World) -> None:
    """One bank per lane, all of them twins of one: nothing of the judge's is made twice,
    and a lane's process maps its own chunks and no other lane's."""
    store = world.make_store(lanes=3)
    second = store.bank("A", 1)
    assert [bank.shape for bank in world.made] == ["A"]
    pair = store.pair("A")
    assert second is pair[1] and len(pair) == 3
    assert store.bank("A", 2) is pair[2] and store.bank("A") is pair[0]
    assert [bank.shape for bank in world.made] == ["A"]  # held: made no more
    assert world.events.count(("await",)) == 1  # and only the new shape waited
    ids = [set(store.chunks(lane)) for lane in range(3)]
    assert all(len(each) == 2 for each in ids)
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert store.lane_banks(2) == [pair[2]]
    assert store.slots(1) == {"A": pair[1].slots_json}
    assert "A" in store and "B" not in store


def test_banks_that_cannot_all_be_made_are_closed_and_none_is_held(world: World) -> None:
    store = world.make_store(lanes=3)
    world.fail_twin_at = 2
    with pytest.raises(RuntimeError, match="no room for a twin"):
        store.bank("A")
    assert store.shapes() == []
    assert world.events.count(("close", "A")) == 2  # the first bank and its first twin


def test_a_device_short_of_memory_lowers_the_ceiling_and_drops_what_it_must(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """The budget is the judge's guess: the device's other tenants, the candidates'
    processes or torch's cache can leave less. What was held when making failed becomes
    the ceiling; one shape's room is made below it and the banks made again; then, failing
    again, with every other shape dropped; with nothing to drop, a clear error."""
    store = world.make_store()  # 4 GiB: far above what the device holds here
    for shape in "AB":
        store.bank(shape)
    world.fail_make.append(DeviceMemoryError("no room on the device (test)"))
    with caplog.at_level("WARNING"):
        store.bank("C")
    assert store.shapes() == ["B", "C"]  # A dropped, B kept: the device held two
    assert "ran out of memory" in caplog.text and "at most 0.0 GiB" in caplog.text
    store.bank("D")  # no failure now: the ceiling of 200 bytes keeps two
    assert store.shapes() == ["C", "D"] and world.held_when_made[-1] == 100
    world.fail_make.append(torch.OutOfMemoryError("no room on the device (test)"))
    store.bank("E")  # torch's own error alike: the device held only D now, so one at a time
    assert store.shapes() == ["E"]
    world.fail_make.append(DeviceMemoryError("still no room (test)"))
    with pytest.raises(DeviceMemoryError, match="do not fit on the device"):
        store.bank("F")  # nothing left to drop
    assert store.shapes() == []


def test_after_one_shapes_room_every_other_shape_is_dropped(world: World) -> None:
    world.sizes = {"big": 300}
    store = world.make_store(lanes=1)
    for shape in ["A", "B", "C", "big", "D"]:
        store.bank(shape)
    world.fail_make += [DeviceMemoryError("no room (test)")] * 2
    store.bank("E")  # one shape's room (300 below the 400 held) did not do: all dropped, then made
    assert store.shapes() == ["E"]


def test_shapes_taken_in_the_same_order_are_made_again_once_a_sweep(world: World) -> None:
    """Eight shapes, room for seven, taken in order candidate after candidate: dropping the
    least recent would make every one anew every sweep (it is the next needed); the store
    drops the one needed last, so that after two sweeps one shape is made again a sweep."""
    world.sizes = {s: 100 for s in "ABCDEFGH"}
    store = world.make_store(budget=750, lanes=1)  # seven held (with a shape's room: six before a make)
    sweeps = []
    for _ in range(6):
        before = len(world.made)
        for shape in "ABCDEFGH":
            store.bank(shape)
        sweeps.append(len(world.made) - before)
    assert sweeps[0] == 8 and sweeps[3:] == [1, 1, 1], sweeps  # least recent first: 8 every sweep


def test_a_shape_of_an_earlier_sweep_goes_before_those_of_this_one(world: World) -> None:
    """Shapes used in an earlier order and not since (overdue) are dropped first."""
    world.sizes = {s: 100 for s in "ABCDEFGH"}
    store = world.make_store(budget=500, lanes=1)  # four with a shape's room
    for _ in range(3):
        for shape in "ABCD":
            store.bank(shape)
    for _ in range(2):
        for shape in "EF":
            store.bank(shape)
    assert set(store.shapes()) >= {"E", "F"}
    assert [e[1] for e in world.events if e[0] == "make"].count("E") == 1  # E and F stayed made


def test_no_process_maps_a_bank_when_it_is_dropped_and_idle_spares_let_go_after(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """A new shape waits until no lane's process maps any bank (it may drop one); after a
    drop every lane's idle spares refresh what they map, once the old banks are closed
    and again once the new one is made, and a warning says once that shapes are made
    anew."""
    store = world.make_store(budget=150)
    store.bank("A")
    world.events.clear()
    with caplog.at_level("WARNING"):
        store.bank("B")
        store.bank("A")
    assert world.events[:3] == [("await",), ("close", "A"), ("close", "A")]
    first_refresh = world.events.index(("refresh", "0"))
    assert world.events[first_refresh:first_refresh + 2] == [("refresh", "0"), ("refresh", "1")]
    made = world.events.index(("make", "B"))
    assert first_refresh < made
    assert world.events[made + 1:made + 3] == [("refresh", "0"), ("refresh", "1")]  # and map B
    assert caplog.text.count("anew for every candidate") == 1


def test_the_store_calls_the_evaluator_back_without_holding_its_lock(world: World) -> None:
    """A spare's refresh reads the store (what its lane holds now), and the wait for the
    lanes may take seconds while spare pools read it: the lock held through either would
    deadlock or stall them."""
    store = world.make_store(lanes=2, budget=150)
    held: list[bool] = []
    store._await_unmapped = lambda: held.append(store._lock.locked())
    store._refresh_spares = lambda lane: held.append(store._lock.locked())
    for shape in "ABA":  # each new, each dropping the other
        store.bank(shape)
    store.renew_lane(0)
    assert len(held) >= 3 + 2 * 2 + 1 and not any(held), held


def test_a_renewed_lane_gets_new_chunks_and_the_other_lanes_keep_theirs(world: World) -> None:
    store = world.make_store(lanes=2)
    store.bank("A")
    old = store.pair("A")
    world.events.clear()
    store.renew_lane(0)
    new = store.pair("A")
    assert new[0] is not old[0] and old[0].closed and not set(new[0].chunks) & set(old[0].chunks)
    assert new[1] is old[1] and not old[1].closed
    assert [bank.shape for bank in world.made] == ["A"]  # a twin: nothing made again
    assert ("refresh", "0") in world.events and ("refresh", "1") not in world.events


def test_with_one_lane_a_renewal_drops_every_bank(world: World) -> None:
    store = world.make_store(lanes=1)
    store.bank("A")
    store.bank("B")
    store.renew_lane(0)
    assert store.shapes() == [] and all(bank.closed for bank in world.made)
    assert ("refresh", "0") in world.events


def test_the_budget_and_the_room_it_leaves(world: World) -> None:
    assert world.make_store().budget_gb() == 4.0  # the CPU's default
    store = world.make_store(budget=1000)
    assert store.room("A") == 7  # 100 bytes a shape in three quarters of 1000
    store.close()
    assert store.shapes() == [] and all(bank.closed for bank in world.made)


def test_real_banks_share_the_judges_stores_across_lanes() -> None:
    """With the workload's own banks: the twins have chunks of their own and the judge's
    stores once, which is what the budget counts."""
    from evokernel.workload import load_workload

    workload = load_workload("dsa_topk")
    store = BankStore(workload, torch.device("cpu"), 2, BankConfig(seed=1, salt="s", slots=4),
                      memory_gb=None, await_unmapped=lambda: None, refresh_spares=lambda lane: None)
    try:
        pair = [store.bank("30cecff1-7ea4-474b-90fc-7f4a87206d8e", lane) for lane in range(2)]
        assert not set(pair[0].chunks) & set(pair[1].chunks)
        assert pair[0].bases is pair[1].bases
        assert pair[0].private_bytes() > 0  # counted once, not once a lane
        assert pair_bytes(pair) == sum(bank.nbytes() for bank in pair) - pair[1].private_bytes()
    finally:
        store.close()
    assert pair[0].input_chunk.raw.numel() == 0  # closed


def test_a_shortage_with_nothing_held_lowers_nothing_and_a_lowered_budget_recovers(world: World) -> None:
    """Running out of memory with no bank held says nothing of what fits (the ceiling stays
    where it was); a ceiling learned from a shortage (a candidate's, maybe) lasts
    CAP_MAKES makes, then the whole budget is used again."""
    world.sizes = {s: 100 for s in "ABCDEFGH"}
    store = world.make_store(lanes=1, budget=10_000)
    world.fail_make.append(DeviceMemoryError("no room (test)"))
    with pytest.raises(DeviceMemoryError):
        store.bank("A")
    for shape in "ABCD":
        store.bank(shape)
    assert store.shapes() == list("ABCD")  # not one shape at a time
    world.fail_make.append(DeviceMemoryError("no room (test)"))
    store.bank("E")  # four held when it failed: at most four from now on
    assert len(store.shapes()) == 4
    store.bank("F")
    assert len(store.shapes()) == 4 and world.held_when_made[-1] == 300
    for _ in range(bank_store.CAP_MAKES // 4 + 2):
        for shape in "ABCDEFGH":
            store.bank(shape)
    assert len(store.shapes()) == 8  # the ceiling was let go: every shape fits the budget


def test_a_lifted_ceiling_lets_the_next_makes_use_the_whole_budget(world: World) -> None:
    """A shortage caused by a tenant known to be gone (the baseline's process) lowers the
    ceiling only until ``lift_cap``: after it, shapes dropped under the ceiling are made
    again and kept beside the others; a shortage that stays lowers it again."""
    world.sizes = {s: 100 for s in "ABCDEF"}
    store = world.make_store(lanes=1, budget=10_000)
    for shape in "ABCD":
        store.bank(shape)
    world.fail_make.append(DeviceMemoryError("no room beside the baseline's process (test)"))
    store.bank("E")
    assert len(store.shapes()) == 4, "the ceiling: four shapes were held when it failed"
    store.lift_cap()
    for shape in "ABCDEF":
        store.bank(shape)
    assert store.shapes() == list("ABCDEF"), "every shape fits the budget again"
    world.sizes["G"] = 100
    world.fail_make.append(DeviceMemoryError("still short (test)"))
    store.bank("G")
    assert len(store.shapes()) == 6 and "G" in store.shapes(), (
        "a shortage after the lift lowers the ceiling again: six were held when it failed")
