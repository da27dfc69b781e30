"""The judge on the CPU: honest torch candidates pass with the judge's timing, and every
red-team case (candidates/suite.yaml, judged as tests/evaluate/redteam.py says) gets
what it must: its status, no fitness unless an honest figure, no survivors, no secret."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from evokernel.candidate import load_candidate
from evokernel.evaluate.bank_store import pair_bytes
from evokernel.evaluate.isolation import child_environment, namespaces_permitted, probe
from evokernel.evaluate.judge import SIZING_BATCHES
from evokernel.evaluate.process import CandidateHandle
from evokernel.evaluate.result import Evaluation, Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.evaluate.shared import Chunk, DeviceMemoryError

from .redteam import (
    CANDIDATES,
    HONEST,
    PLANTED,
    Case,
    cases_for,
    check_evaluation,
    config_for,
    judge_case,
    load_suite,
    planted_secrets,
    slow_deaths,
)

# One no-scoring shape (1 row, 1 page) and one scoring shape (4 rows, 34 pages).
SHAPES = ["30cecff1-7ea4-474b-90fc-7f4a87206d8e", "d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d"]


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxEvaluator]:
    """One judge for the module, with secrets planted in its environment from the start."""
    work = tmp_path_factory.mktemp("sandbox")
    with planted_secrets(), SandboxEvaluator("dsa_topk", work_dir=work, config=config_for("cpu")) as ev:
        yield ev


@pytest.fixture(scope="module")
def honest(evaluator: SandboxEvaluator) -> Evaluation:
    """The honest candidate alone: what a case's ``then`` is compared with."""
    return evaluate(evaluator, HONEST)


def evaluate(evaluator: SandboxEvaluator, name: str, shapes: list[str] = SHAPES) -> Evaluation:
    return evaluator.evaluate(load_candidate(CANDIDATES / name, "dsa_topk"), shapes)


def test_correct_candidate_passes_with_the_judges_timing(honest: Evaluation) -> None:
    assert honest.status is Status.PASSED, honest.feedback
    assert honest.fitness is not None and honest.fitness > 0
    for shape in honest.shapes:
        assert shape.timing is not None and shape.reference is not None
        assert shape.timing.method == "judge-cpu" and shape.baseline == "own"
        assert shape.timing.samples >= 2
    assert honest.environment["device"] == "cpu"
    assert honest.environment["baseline"].startswith("own")


def test_vectorised_honest_candidate_passes(evaluator: SandboxEvaluator) -> None:
    """The solver every attacker copies is right: their failures are their cheats."""
    ev = evaluate(evaluator, "honest_vectorised.py")
    assert ev.status is Status.PASSED, ev.feedback


# Cases that need only a bounded time: the hang has a test of its own below.
CPU_CASES = [c for c in cases_for("cpu") if Status.TIMEOUT not in c.expected["cpu"]]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.name)
def test_red_team_case(evaluator: SandboxEvaluator, honest: Evaluation, case: Case,
                       tmp_path: Path) -> None:
    if case.file == "eats_memory.py":
        # The bound is what is tested, not its size: page faults on a small VM ran at about
        # 370 MB/s, so filling the default 8 GB took 21-36 s, past the 60 s limit on a loaded
        # CI machine (a TIMEOUT instead of the allocator's error). 3 GB holds an honest process.
        config = config_for("cpu", cpu_memory_gb=3.0)
        with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as small:
            small.baseline_timings(SHAPES[:1])  # timed before the case, which must not change it
            outcome = judge_case(small, case, SHAPES[:1], honest.fitness)
    else:
        outcome = judge_case(evaluator, case, SHAPES, honest.fitness)
    assert outcome.ok, "\n".join(outcome.problems)


def test_the_suite_covers_every_class_of_the_issue() -> None:
    assert len(cases_for("cpu")) >= 35
    off = {c.file for c in cases_for("cpu") if c.screen == "off"}
    assert {"exec_base64.py", "imports_comma.py", "dunder_import.py"} <= off


def test_the_suite_reads_every_key_it_is_given(tmp_path: Path) -> None:
    """A row's option that nobody read would be a check that silently never runs (it
    happened: ``no_faster`` was dropped until red team 4 noticed)."""
    assert {c.file for c in load_suite() if c.no_faster} >= {"inflates_batch.py", "solves_ahead.py"}
    suite = tmp_path / "suite.yaml"
    suite.write_text("- {file: wrong_answer.py, cpu: INCORRECT, no_fastr: true}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_suite(suite)
    for row in ('{file: x.py, cpu: PASSED, log: "ran", log_on: gpu}',  # no such device
                '{file: x.py, cpu: PASSED, log_on: cpu}'):  # nothing to show
        suite.write_text(f"- {row}\n")
        with pytest.raises(ValueError, match="log_on is cpu, cuda"):
            load_suite(suite)


def test_a_log_proof_is_asked_only_where_the_row_says() -> None:
    (quiet,) = [c for c in load_suite() if c.file == "solves_during_quiet.py"]
    assert quiet.log and quiet.log_on == "cpu"
    silent = Evaluation(candidate_id="x", status=Status.RUNTIME_ERROR, log="nothing to see")
    case = Case("x.py", {"cpu": (Status.RUNTIME_ERROR,), "cuda": (Status.RUNTIME_ERROR,)},
                log="s of quiet", log_on="cpu")
    assert any("log does not show" in p for p in check_evaluation(case, "cpu", silent))
    assert not check_evaluation(case, "cuda", silent)
    everywhere = Case("x.py", case.expected, log="s of quiet")
    assert any("log does not show" in p for p in check_evaluation(everywhere, "cuda", silent))


def test_hang_times_out_and_the_next_candidate_still_runs(tmp_path: Path) -> None:
    config = config_for("cpu", timeout_s=8, trials=1, batches=1)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        hung = ev.evaluate(load_candidate(CANDIDATES / "infinite_loop.py", "dsa_topk"), SHAPES[:1])
        assert hung.status is Status.TIMEOUT and "no result within" in hung.feedback
        good = ev.evaluate(load_candidate(CANDIDATES / HONEST, "dsa_topk"), SHAPES[:1])
        assert good.status is Status.PASSED, good.feedback


def test_with_quiet_graphs_a_spare_is_replaced_once_the_candidate_is_clocked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``quiet_graphs``: taking a process starts no replacement; the evaluation asks for
    one after its clocked shapes (started once half the lane's spares are used: on the CPU,
    one spare, at once), and every candidate, the failed one included, gets a process."""
    config = config_for("cpu", trials=1, batches=1, quiet_graphs=True)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        filled: list[int] = []
        taken: list[bool] = []
        for lane in ev._lanes:  # consecutive candidates take the lanes in turn
            pool = lane.pool
            monkeypatch.setattr(pool, "fill", lambda low_water=None, real=pool.fill:
                                filled.append(1) or real(low_water))
            monkeypatch.setattr(pool, "take", lambda refill=True, real=pool.take: taken.append(refill)
                                or real(refill=refill))
        for name, status in ((HONEST, Status.PASSED), ("crash.py", Status.RUNTIME_ERROR), (HONEST, Status.PASSED)):
            before = len(filled)
            assert evaluate(ev, name, SHAPES[:1]).status is status
            assert len(filled) > before
        assert taken and not any(taken)


def test_wrong_workload_is_rejected(evaluator: SandboxEvaluator) -> None:
    candidate = load_candidate(CANDIDATES / HONEST, "other")
    assert evaluator.evaluate(candidate, SHAPES).status is Status.REJECTED


def test_baseline_timings_are_cached_on_disk(evaluator: SandboxEvaluator, honest: Evaluation) -> None:
    first = evaluator.baseline_timings(SHAPES)
    assert evaluator._baseline_path.exists()
    again = SandboxEvaluator("dsa_topk", work_dir=evaluator.work_dir, config=evaluator.config)
    try:
        assert again.baseline_timings(SHAPES) == first
        assert not again._bank_store.shapes(), "read from disk: no inputs made, nothing re-timed"
        assert again.baseline_spent == {}
    finally:
        again.close()
    # the run that timed it says where the time went
    spent = evaluator.baseline_spent
    assert spent["shapes"] == len(SHAPES) and spent["banks_s"] > 0 and spent["judge_s"] > 0


def test_secrets_are_not_passed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in PLANTED.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HARMLESS", "1")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = child_environment(probe(False))
    assert not set(PLANTED) & set(env)
    assert "HARMLESS" not in env, "an allow-list, not a deny-list"
    assert env["LC_ALL"] == "C.UTF-8"


def test_candidate_cannot_reach_the_network(evaluator: SandboxEvaluator, tmp_path: Path) -> None:
    if not namespaces_permitted():
        pytest.skip("unshare --net is not permitted on this machine")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    source = (CANDIDATES / "opens_socket.py").read_text().replace("PORT = 0", f"PORT = {port}")
    (tmp_path / "opens_socket.py").write_text(source)
    candidate = load_candidate(tmp_path / "opens_socket.py", "dsa_topk")
    evaluator.config.static_screen = "off"  # the screen would refuse __import__ first
    try:
        ev = evaluator.evaluate(candidate, SHAPES[:1])
    finally:
        evaluator.config.static_screen = "reject"
    assert ev.status is Status.RUNTIME_ERROR, ev.feedback
    with pytest.raises(TimeoutError):
        server.accept()  # nothing ever connected
    server.close()


def test_policies_forbid_library_topk_and_the_reference(tmp_path: Path) -> None:
    config = config_for("cpu", trials=1, batches=1, policies=("no_library_topk", "no_reference"))
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        for name, why in (("uses_library_topk.py", "no_library_topk"),
                          ("calls_reference.py", "no_reference")):
            result = ev.evaluate(load_candidate(CANDIDATES / name, "dsa_topk"), SHAPES[:1])
            assert result.status is Status.REJECTED and why in result.feedback
    with pytest.raises(ValueError, match="no policy 'nope'"):
        SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=SandboxConfig(policies=("nope",)))


def test_library_topk_is_allowed_by_default(evaluator: SandboxEvaluator) -> None:
    assert evaluate(evaluator, "uses_library_topk.py", SHAPES[:1]).status is Status.PASSED


def _shared_mappings(pid: int) -> set[str]:
    """The memfd files a process has mapped (one inode per chunk)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[4] for line in maps if "memfd:" in line}


def test_a_process_lets_go_of_the_banks_the_judge_closed(tmp_path: Path) -> None:
    """With room for one shape's bank, judging a second shape closes the first; the
    candidate's process unmaps it too (on a GPU its memory is freed only then: one
    process judged on 128 shapes once held 108 GB of an H200)."""
    config = config_for("cpu", bank_memory_gb=1e-6)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        handle = ev._fresh_process()
        try:
            children = Path(f"/proc/{handle.proc.pid}/task/{handle.proc.pid}/children")
            pid = int(children.read_text().split()[0]) if handle.namespaced else handle.proc.pid
            seen = []
            for shape in SHAPES:
                ev.bank(shape)
                assert len(ev._bank_store.shapes()) == 1
                handle.map(ev._bank_store.chunks())
                assert handle.mapped == set(ev._bank_store.chunks())
                seen.append(_shared_mappings(pid))
            assert len(seen[1]) == 2 and not seen[0] & seen[1], seen
        finally:
            ev._retire(handle)


def test_idle_spares_let_go_of_the_banks_the_judge_dropped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With room for one shape, candidates judged on two drop and remake banks; the
    spares waiting in every lane, which mapped the chunks when they started, let go of
    the dropped ones too (on a GPU a chunk's memory is freed only when no process maps
    it: idle spares could hold tens of GB of banks the judge no longer counts), and the
    judge says once that shapes are remade for every candidate."""
    config = config_for("cpu", spares=2, bank_memory_gb=1e-4, trials=1, batches=1)
    with caplog.at_level("WARNING"), SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.warm_up(SHAPES)
        for _ in range(3):
            assert evaluate(ev, HONEST, SHAPES).status is Status.PASSED
        ev.wait_retired()
        live = {chunk.fd for bank in ev._bank_store.banks() for chunk, _ in bank.chunks.values()}
        for lane in ev._lanes:
            for spare in lane.pool._ready:
                assert spare.mapped == set(ev._bank_store.chunks(lane.index)), (lane.index, spare.mapped)
        assert len(live) == 2 * len(ev._lanes)
    remade = [r for r in caplog.records if "anew for every candidate" in r.getMessage()]
    assert len(remade) == 1


def _pair_sizes(tmp_path: Path) -> list[int]:
    """Bytes of each of SHAPES' banks (every lane's), made with room to spare."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "sizes", config=config_for("cpu")) as ev:
        sizes = []
        for shape in SHAPES:
            pair = ev._bank_store._make_pair(shape)
            sizes.append(pair_bytes(pair))
            for bank in pair:
                bank.close()
        return sizes


def test_the_judge_makes_room_for_a_bank_before_it_makes_it(tmp_path: Path) -> None:
    """With room for one shape, the first shape's bank is dropped before the second's is
    made, not after: a judge whose budget fits its shapes never holds more than that
    (on an H100, banks made first and dropped after ran a fused_moe run out of memory)."""
    room = 1.2 * max(_pair_sizes(tmp_path))
    config = config_for("cpu", bank_memory_gb=room / (1 << 30))
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        held_when_made: list[int] = []
        make = ev._bank_store._make_pair

        def recording(shape: str) -> Any:
            held_when_made.append(len(ev._bank_store.shapes()))
            return make(shape)

        ev._bank_store._make_pair = recording  # type: ignore[method-assign]
        for shape in [*SHAPES, SHAPES[0]]:
            ev.bank(shape)
            assert ev._bank_store.shapes() == [shape]
        assert held_when_made == [0, 0, 0]


def _short_of_memory(ev: SandboxEvaluator, shape: str, message: str) -> list[DeviceMemoryError]:
    """Make ``shape``'s next bank fail as a device short of memory would, once per error
    left in the returned list (one now; append more)."""
    make = ev._bank_store._make_pair
    failures = [DeviceMemoryError(message)]

    def short_of_memory(name: str) -> Any:
        if name == shape and failures:
            raise failures.pop()
        return make(name)

    ev._bank_store._make_pair = short_of_memory  # type: ignore[method-assign]
    return failures


def test_a_device_out_of_memory_drops_the_other_shapes_and_tries_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A bank that finds no memory on the device (its other tenants, torch's cache) drops
    shapes (here the only other one) and is made again; with nothing to drop, a clear
    error. The policy itself is tested in test_bank_store.py."""
    with caplog.at_level("WARNING"), \
            SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        failures = _short_of_memory(ev, SHAPES[1], "no room on the device (test)")
        ev.bank(SHAPES[0])
        ev.bank(SHAPES[1])
        assert ev._bank_store.shapes() == [SHAPES[1]]
        assert any("ran out of memory" in r.getMessage() for r in caplog.records)
        ev._bank_store._evict(limit=0)
        failures.append(DeviceMemoryError("no room on the device (test)"))
        with pytest.raises(DeviceMemoryError, match="do not fit on the device"):
            ev.bank(SHAPES[1])


def test_a_shortage_beside_the_baselines_process_is_forgotten_once_it_is_gone(tmp_path: Path) -> None:
    """Banks made while the baseline's process runs its reference may find the device
    short (a published fused_moe reference held 33 GiB of an H100); once the baseline is
    timed and its process gone, the banks get their whole budget again, so the run's
    first candidates do not make most shapes anew (test_bank_store.py has the policy)."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        failures = _short_of_memory(ev, SHAPES[1], "no room beside the reference's process (test)")
        ev.baseline_timings(SHAPES[:2])
        assert not failures, "the shortage was met while the baseline was timed"
        assert ev._bank_store._limit() == int(ev._bank_store.budget_gb() * (1 << 30))
        ev.bank(SHAPES[0])
        assert ev._bank_store.shapes() == [SHAPES[1], SHAPES[0]], "both held again"


def test_an_evaluation_says_how_its_process_started(honest: Evaluation) -> None:
    """The steps of its spare's start (the process's own account, before any candidate
    code, and the pool's), for the throughput breakdown."""
    steps = {k for k in honest.overheads if k.startswith("spare_")}
    assert {"spare_confine_s", "spare_answer_s", "spare_map_s", "spare_bind_s",
            "spare_start_s"} <= steps, steps
    assert all(honest.overheads[k] >= 0 for k in steps)
    # forked by the fork server (the default): no interpreter start, no import of torch
    assert "spare_import_s" not in steps
    assert {"spare_fork_s", "spare_namespaces_s"} <= steps, steps
    assert honest.overheads["spare_fork_s"] < honest.overheads["spare_start_s"]


def test_spare_processes_bind_the_known_shapes_before_any_candidate(
        evaluator: SandboxEvaluator, honest: Evaluation) -> None:
    """A spare started after the judge made its banks holds their slots' views already;
    the judge then selects a shape without sending its slots, and the candidate passes."""
    assert honest.status is Status.PASSED
    handle = evaluator._fresh_process()
    try:
        assert set(SHAPES) <= handle.bound
        assert "error" not in handle.request("bind", 10.0, shape=SHAPES[0])
        assert "error" in handle.request("bind", 10.0, shape="not-a-shape")
    finally:
        evaluator._retire(handle)
    assert evaluate(evaluator, HONEST).status is Status.PASSED


def test_a_process_maps_more_chunks_than_one_message_can_carry(evaluator: SandboxEvaluator) -> None:
    """128 shapes hold 256 chunks; one message carries at most 253 descriptors."""
    chunks = [Chunk.allocate(4096, torch.device("cpu")) for _ in range(300)]
    handle = evaluator._lanes[0].pool.take()
    try:
        handle.map({10_000 + i: (chunk, False) for i, chunk in enumerate(chunks)})
        assert len(handle.mapped) == 300
    finally:
        handle.kill()
        for chunk in chunks:
            chunk.close()


def test_a_failed_scrub_stops_the_next_candidate_before_it_loads(tmp_path: Path) -> None:
    """The last process is retired in the background; if its scrub fails, no later
    candidate may use the chunks: the next evaluation raises, and its own process is
    still retired."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        retire = ev._retire
        calls: list[str] = []

        def failing(handle: Any, *rest: Any) -> None:
            retire(handle, *rest)
            calls.append("retired")
            if len(calls) == 1:
                raise OSError("scrub failed")

        ev.baseline_timings(SHAPES[:1])  # its process is retired in the foreground
        ev._retire = failing  # type: ignore[method-assign,assignment]
        assert evaluate(ev, HONEST, SHAPES[:1]).status is Status.PASSED
        with pytest.raises(RuntimeError, match="scrubbing after a candidate failed"):
            evaluate(ev, HONEST, SHAPES[:1])
        ev.wait_retired()
        assert calls == ["retired", "retired"]
        assert evaluate(ev, HONEST, SHAPES[:1]).status is Status.PASSED


def test_warm_up_binds_every_shape_in_spares_started_before_the_shapes_existed(tmp_path: Path) -> None:
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        for lane in ev._lanes:  # the pools' spares start now, before any bank
            ev._retire(ev._fresh_process(lane.index), lane.index)
        ready = [h for lane in ev._lanes for h in lane.pool._ready]
        assert not any(set(SHAPES) <= h.bound for h in ready)
        ev.warm_up(SHAPES)
        ready = [h for lane in ev._lanes for h in lane.pool._ready]
        assert len(ready) >= len(ev._lanes) and all(set(SHAPES) <= h.bound for h in ready)
        assert evaluate(ev, HONEST, SHAPES).status is Status.PASSED


def test_the_round_trip_is_measured_with_no_process_dying(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timed batch subtracts the run's round trip, measured on a fresh process
    before any candidate code loads. A used process dying in the background (its device
    context torn down, or its kernels still running: a candidate can leave work behind)
    or the judge's scrub lengthens a round trip measured meanwhile, and every batch after
    would be shortened by that much: each measurement waits until no lane is retiring."""
    import evokernel.evaluate.sandbox as sandbox

    monkeypatch.setattr(sandbox, "RECALIBRATE_EVERY", 1)  # measured for every candidate
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", spares=3)) as ev:  # spares ready: as on a GPU
        overlapped: list[bool] = []
        calibrate = CandidateHandle.calibrate

        def watched(handle: CandidateHandle, before: Any, trips: int = 8) -> None:
            overlapped.append(any(lane.retiring() for lane in ev._lanes))
            calibrate(handle, before, trips)

        slow_deaths(ev, 0.5)
        monkeypatch.setattr(CandidateHandle, "calibrate", watched)
        for _ in range(3):
            assert evaluate(ev, HONEST, SHAPES[:1]).status is Status.PASSED
        ev.wait_retired()
        assert len(overlapped) >= 3 and not any(overlapped), overlapped  # and the baseline's


def test_one_round_trip_serves_the_run_until_it_is_due_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The round trip is measured once and given to every process until
    RECALIBRATE_EVERY candidates later: no per-process noise in the comparison."""
    import evokernel.evaluate.sandbox as sandbox

    monkeypatch.setattr(sandbox, "RECALIBRATE_EVERY", 3)
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        measured: list[float] = []
        ev.baseline_timings(SHAPES[:1])  # measures it first (candidate count 0)
        calibrate = CandidateHandle.calibrate

        def counted(handle: CandidateHandle, before: Any, trips: int = 8) -> None:
            calibrate(handle, before, trips)
            assert handle.rtt_s is not None
            measured.append(handle.rtt_s)

        assert ev._round_trip_s is not None
        measured.append(ev._round_trip_s)
        monkeypatch.setattr(CandidateHandle, "calibrate", counted)
        round_trips = []
        for _ in range(4):
            result = evaluate(ev, HONEST, SHAPES[:1])
            assert result.status is Status.PASSED
            round_trips.append(result.shapes[0].stats["round_trip_us"])
        assert len(measured) == 2  # the baseline's, then candidate 3's
        assert round_trips == [measured[0] * 1e6] * 2 + [measured[1] * 1e6] * 2


def test_the_next_candidate_loads_while_the_last_one_dies_and_is_timed_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With two lanes, a candidate loads (in its lane's chunks) while the one before it
    is still being killed, and the judge waits for that death before it times anything:
    no timed batch runs while any other lane is retiring."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", spares=3)) as ev:
        ev.warm_up(SHAPES[:1])
        loads: list[bool] = []
        timed: list[bool] = []
        ask = ev.judge.ask
        before_batch = ev.judge.before_batch

        def asked(handle: Any, deadline: float, op: str, *rest: Any, **fields: Any) -> Any:
            if op == "load":
                loads.append(any(lane.retiring() for lane in ev._lanes))
            return ask(handle, deadline, op, *rest, **fields)

        def timing() -> None:
            timed.append(any(lane.retiring() for lane in ev._lanes))
            before_batch()

        slow_deaths(ev, 2.5)  # longer than a loaded machine takes to start the next one
        monkeypatch.setattr(ev.judge, "ask", asked)
        monkeypatch.setattr(ev.judge, "before_batch", timing)
        results = [evaluate(ev, HONEST, SHAPES[:1]) for _ in range(3)]
        ev.wait_retired()
        assert all(r.status is Status.PASSED for r in results)
        assert loads[1:] == [True, True], loads  # the last one was dying meanwhile
        assert timed and not any(timed), timed
        assert all(r.overheads["quiet_wait_s"] > 0 for r in results[1:])
        assert all(r.overheads["behind_kill_s"] >= 0 for r in results[1:])


def test_a_process_that_outlives_its_kill_takes_its_lanes_chunks_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process stuck in the kernel can outlive SIGKILL and the kill's wait; it still
    maps every chunk of its lane and may write them after any scrub. The judge then gives
    that lane new chunks for every shape before it serves again (the old ones closed);
    the next candidates share nothing with it."""
    import select as select_module
    import subprocess

    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        assert evaluate(ev, HONEST, SHAPES[:1]).status is Status.PASSED
        ev.wait_retired()
        old = ev._bank_store.pair(SHAPES[0])
        handle = ev._fresh_process(0)
        real_select = select_module.select

        def never_exits(read: Any, write: Any, error: Any, timeout: Any = None) -> Any:
            if handle._first is not None and list(read) == [handle._first]:
                return [], [], []
            return real_select(read, write, error, timeout)

        def no_wait(timeout: float | None = None) -> int:
            raise subprocess.TimeoutExpired("candidate", timeout or 0)

        with monkeypatch.context() as patch:
            patch.setattr(select_module, "select", never_exits)
            patch.setattr(handle.proc, "wait", no_wait)
            assert handle.kill(wait_s=0.1) is False
            ev._retire(handle, 0)
        assert handle.kill() is True  # it is gone for real now
        ev.wait_retired()
        new = ev._bank_store.pair(SHAPES[0])
        assert new[0] is not old[0] and not set(new[0].chunks) & set(old[0].chunks)
        assert new[1] is old[1]  # the other lane's process never mapped lane 0's chunks
        assert old[0].input_chunk.raw.numel() == 0  # closed
        for _ in range(2):  # both lanes serve again
            result = evaluate(ev, HONEST, SHAPES[:1])
            assert result.status is Status.PASSED, result.feedback


def test_an_earlier_candidates_slow_death_is_not_charged_to_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A used process can take long to die (many processes, much memory, a device
    context to tear down); the next candidate waits for that before it is timed. The
    wait does not count against its time limit, or the one before could make it TIMEOUT."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path,
                          config=config_for("cpu", spares=3, timeout_s=8.0)) as ev:
        ev.baseline_timings(SHAPES[:1])  # its process is retired in the foreground
        slow_deaths(ev, 10.0, first_only=True)  # longer than the next one's whole time limit
        first = evaluate(ev, HONEST, SHAPES[:1])
        second = evaluate(ev, HONEST, SHAPES[:1])
        ev.wait_retired()
        assert first.status is Status.PASSED
        assert second.status is Status.PASSED, second.feedback
        assert second.overheads["quiet_wait_s"] > 5.0


def test_no_inputs_of_a_clocked_batch_are_written_while_the_judge_waits_for_a_death(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge waits for the candidate before to die (``quiet``) before it writes the
    inputs of any batch it clocks: written before the wait, they sat in the slots for as
    long as it lasted, and the candidate's process could solve them unclocked (red team 7:
    solves_during_quiet.py served its first timed batch at 0.15 ms a call where working
    costs 5). The warm-up batches that size the timed one are clocked too: the dying
    process's leftover work must not make the batch smaller."""
    from evokernel.evaluate.judge import Judge

    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", spares=3)) as ev:
        ev.warm_up(SHAPES[:1])
        dying: list[bool] = []
        assign = Judge._assign

        def assigned(*args: Any) -> Any:  # every batch's variants, just before its write
            dying.append(any(lane.retiring() for lane in ev._lanes))
            return assign(*args)

        # a slow death (dies_slowly.py takes 2 s on this CPU), longer than the next
        # candidate's load even on a loaded machine, so that the judge must wait for it
        slow_deaths(ev, 4.0)
        monkeypatch.setattr(Judge, "_assign", staticmethod(assigned))
        evaluate(ev, HONEST, SHAPES[:1])
        attack = evaluate(ev, "solves_during_quiet.py", SHAPES[:1])
        ev.wait_retired()
    assert attack.status is Status.PASSED, attack.feedback
    assert attack.overheads["quiet_wait_s"] > 0.5  # it did wait for the death
    assert dying and not any(dying), dying
    timing = attack.shapes[0].timing
    assert timing is not None and timing.p25_ms >= 5.0, timing  # no batch was solved ahead
    assert "solved ahead so far: 0" in attack.log


def test_an_earlier_candidates_slow_death_is_not_charged_where_a_new_bank_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape whose bank was evicted is made anew in the middle of a candidate's
    evaluation, and making a bank waits for every lane's retiring (it may drop a bank a
    dying process still maps). That wait is an earlier candidate's slow death too: it
    does not count against this one's time limit, or a rival dying slowly (a million
    files in its /tmp, a CUPTI reply held back) could make it TIMEOUT."""
    config = config_for("cpu", spares=3, timeout_s=8.0, bank_memory_gb=1e-4)  # one bank
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config) as ev:
        ev.baseline_timings(SHAPES)  # cached: no evaluation times the baseline again
        slow_deaths(ev, 10.0, first_only=True)  # longer than the next one's whole time limit
        first = evaluate(ev, HONEST, SHAPES[:1])  # its bank evicts the other shape's
        assert SHAPES[1] not in ev._bank_store
        second = evaluate(ev, HONEST, SHAPES[1:])  # makes that one anew, mid-evaluation
        ev.wait_retired()
        assert first.status is Status.PASSED, first.feedback
        assert second.status is Status.PASSED, second.feedback
        assert second.overheads["quiet_wait_s"] > 5.0


def test_the_judges_choices_cannot_be_replayed_from_public_values(
        evaluator: SandboxEvaluator, tmp_path: Path) -> None:
    """Which slots a batch checks comes from the judge's random stream. Seeded by the
    run seed, the candidate's id and the evaluation's number alone, a candidate's process
    (which reads its id, and can guess the number from where its trials land) replays it
    and fakes only the unchecked calls; the stream is salted with the evaluator's secret."""
    from evokernel.evaluate.bank import derived_seed

    public = random.Random(derived_seed(evaluator.config.seed, "cand", 1)).random()
    mine = evaluator._judge_rng("cand", 1).random()
    assert mine != public
    assert evaluator._judge_rng("cand", 1).random() == mine  # one evaluator: reproducible
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as other:
        assert other._judge_rng("cand", 1).random() != mine


def test_on_a_gpu_only_eager_batches_wait_for_starting_spares(
        evaluator: SandboxEvaluator, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a graph replay does not wait for spares starting (they start all the
    time), unless ``quiet_graphs``. An eager batch's time holds the candidate's launches
    and syncs: it waits (on the CPU, every clocked batch does)."""
    from types import SimpleNamespace

    waited: list[int] = []
    for lane in evaluator._lanes:
        monkeypatch.setattr(lane.pool, "await_started", lambda: waited.append(1) or 0.0)
    monkeypatch.setattr(evaluator, "_await_retired", lambda index, spent: 0.0)
    evaluator._quiet(0, {}, eager=True)
    evaluator._quiet(0, {}, eager=False)
    assert len(waited) == 2 * len(evaluator._lanes)  # the CPU: both
    waited.clear()
    monkeypatch.setattr(evaluator, "device", SimpleNamespace(type="cuda"))
    evaluator._quiet(0, {}, eager=False)
    assert waited == []
    evaluator._quiet(0, {}, eager=True)
    assert len(waited) == len(evaluator._lanes)
    waited.clear()
    monkeypatch.setattr(evaluator.config, "quiet_graphs", True)  # graph replays wait too
    evaluator._quiet(0, {}, eager=False)
    assert len(waited) == len(evaluator._lanes)


def test_the_later_full_checks_run_once_the_process_is_retiring_and_still_fail(
        evaluator: SandboxEvaluator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full checks of every step after the first shape's checked calls wait for the
    candidate's last shape and run while its process is killed (its reply and its memory no longer
    matter: they are the judge's copies); a wrong answer fails its shape all the same,
    and the shapes judged after it are dropped, as if judging had stopped there."""
    from evokernel.evaluate.judge import Answers

    evaluator.baseline_timings(SHAPES)  # its checks are made shape by shape, before this
    retiring: list[bool] = []
    settle = Answers.settle

    def watched(self: Answers, bank: Any) -> Any:
        lane = evaluator._lanes[evaluator._counter % len(evaluator._lanes)]  # this candidate's
        retiring.append(lane._retiring is not None)
        return settle(self, bank)

    monkeypatch.setattr(Answers, "settle", watched)
    result = evaluate(evaluator, "counts_calls.py")  # right on its first two calls only
    assert result.status is Status.INCORRECT and "warm-up batch" in result.feedback
    assert [s.shape for s in result.shapes] == SHAPES[:1]
    # the first shape's checked calls before its timing; everything else (the second
    # shape's checked calls too) once the kill began, where the first shape fails first
    assert retiring == [False, True]


def test_the_gpu_branch_of_the_judge_on_the_cpu(tmp_path: Path) -> None:
    """The judge's GPU-only steps run here with a judge that takes its device for a GPU
    (its syncs no-ops, no CUPTI calls run): the checked calls' outputs checked while the
    process is asked to capture (a CPU process answers that it cannot), CUPTI collected
    while the later checks run, then the kill. A wrong checked call found during the
    capture kills the process there, and the judge and the next candidate carry on."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        ev.baseline_timings(SHAPES)
        ev.judge.device = torch.device("cuda")
        ev.judge.sync = lambda: None  # type: ignore[method-assign,assignment]
        ev.judge._cupti_calls = lambda *a, **k: 1e-3  # type: ignore[method-assign,assignment]
        asked: list[str] = []
        ask_later = ev.judge.ask_later

        def spied(handle: Any, deadline: float, op: str, what: str, **fields: Any) -> Any:
            asked.append(op)
            return ask_later(handle, deadline, op, what, **fields)

        ev.judge.ask_later = spied  # type: ignore[method-assign,assignment]
        quieted: list[bool] = []
        real_quiet = ev._quiet

        def quiet(lane: int, spent: dict[str, float], eager: bool = False) -> float:
            quieted.append(eager)
            return real_quiet(lane, spent, eager)

        ev._quiet = quiet  # type: ignore[method-assign]
        honest = evaluate(ev, HONEST)
        # no graph here, so every clocked batch is eager: each waits for starting spares
        assert quieted and all(quieted)
        assert honest.status is Status.PASSED and len(honest.shapes) == 2
        assert all(s.timing is not None and s.timing.method == "judge-eager"
                   and s.timing.cupti_note == "no CUPTI spans" for s in honest.shapes)
        assert asked.count("capture") == 2 and asked.count("cupti_collect") == 1
        # one eager batch before the capture (the graph sizes the batch); the sizing
        # batches left come after it, since this process captures none
        shapes = " ".join(asked).split("bind")[1:]
        assert len(shapes) == 2
        for ops in shapes:
            before, _, after = ops.partition("capture")
            assert before.split().count("batch") == 1
            assert 1 <= after.split().count("batch") - ev.judge.config.batches <= SIZING_BATCHES - 1
        lazy = evaluate(ev, "counts_calls.py")
        assert lazy.status is Status.INCORRECT and "warm-up batch" in lazy.feedback
        asked.clear()
        wrong = evaluate(ev, "wrong_answer.py")  # the second shape's checked calls are wrong
        assert wrong.status is Status.INCORRECT and "trial 0" in wrong.feedback
        assert [s.status for s in wrong.shapes] == [Status.PASSED, Status.INCORRECT]
        # a shape after the first: its checked calls are checked with the rest, after the
        # last shape (the process was timed on it first), and still named as theirs
        assert "capture" in " ".join(asked).split("bind")[2]
        assert evaluate(ev, HONEST).status is Status.PASSED


def test_the_deferred_checks_read_only_the_judges_copies(
        evaluator: SandboxEvaluator, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the deferred checks run, the candidate's process may still be alive (its
    kill is under way, or it is still reporting CUPTI) and its chunks are not scrubbed
    yet: they must read the judge's copies taken at each reply, and its own inputs, never
    the shared chunks. Here every byte of every chunk is overwritten just before they run
    (as a process writing in the kill window would): an honest candidate still passes,
    so nothing there was read (red-team case corrects_after_reply.py: the other way)."""
    evaluator.baseline_timings(SHAPES)
    settle = evaluator.judge.settle
    kept: list[int] = []

    def scribbled(later: Any, results: Any) -> Any:
        kept.append(len(later))
        for bank in evaluator._bank_store.banks():
            bank.output_chunk.raw.fill_(0)  # no poison left, and no right answer either
            bank.input_chunk.raw.fill_(0x3C)
        return settle(later, results)

    monkeypatch.setattr(evaluator.judge, "settle", scribbled)
    try:
        result = evaluate(evaluator, HONEST)
    finally:
        evaluator.wait_retired()
        for bank in evaluator._bank_store.banks():
            bank.use_base(bank.active_base)  # the CPU seal means no scrub restores them
    assert kept == [len(SHAPES)]  # every shape's later checks were deferred to here
    assert result.status is Status.PASSED, result.feedback


def test_torch_compile_works_in_the_confined_process(tmp_path: Path) -> None:
    """torch.compile (inductor: a C++ build, compile workers, file locks on its caches)
    runs inside the candidate's process, under the seccomp filter whose locks lock
    nothing (isolation.py): the torch seed with COMPILE inductor passes."""
    from evokernel.workload import load_workload

    workload = load_workload("dsa_topk")
    seed = next(s for s in workload.seeds() if s.name == "torch_vectorized")
    compiled = seed.with_params(knobs={"COMPILE": "inductor"}, operator="test")
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu")) as ev:
        result = ev.evaluate(compiled, SHAPES[:1])
    assert result.status is Status.PASSED, result.feedback


def test_a_crowded_device_makes_the_next_candidate_load_after_the_death(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dying process holds its device memory until its context is gone; one holding
    most of it (holds_device_memory.py) would leave the next candidate none. With less
    than OVERLAP_FREE_BYTES free while a lane retires, the next candidate loads only
    once that death is over (and the wait is not charged to it); with room, it loads
    beside the dying one."""
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path, config=config_for("cpu", spares=3)) as ev:
        ev.warm_up(SHAPES[:1])
        slow_deaths(ev, 3.0)  # longer than a loaded machine takes to start the next one
        loads: list[bool] = []
        ask = ev.judge.ask

        def asked(handle: Any, deadline: float, op: str, *rest: Any, **fields: Any) -> Any:
            if op == "load":
                loads.append(any(lane.retiring() for lane in ev._lanes))
            return ask(handle, deadline, op, *rest, **fields)

        monkeypatch.setattr(ev.judge, "ask", asked)
        free = {"bytes": 1 << 40}
        monkeypatch.setattr(ev, "_free_device_bytes", lambda: free["bytes"])
        roomy = [evaluate(ev, HONEST, SHAPES[:1]) for _ in range(2)]
        free["bytes"] = 1 << 30  # a dying process holds nearly all of it
        crowded = evaluate(ev, HONEST, SHAPES[:1])
        ev.wait_retired()
    assert all(r.status is Status.PASSED for r in [*roomy, crowded])
    assert loads == [False, True, False], loads
    assert crowded.overheads["quiet_wait_s"] > 1.0
