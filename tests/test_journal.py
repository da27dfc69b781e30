"""The run directory: append-only journal, torn lines, atomic snapshots, clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evokernel.journal import FORMAT, RunDir, RunDirError
from evokernel.testing import FakeEvaluator, fake_candidate


def new_run(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path / "run", {"seed": 0}, {"workload": "fake"})


def journal_some(run: RunDir, n: int) -> None:
    ev = FakeEvaluator()
    tiles = (16, 32, 64, 128, 256)
    for i in range(n):
        c = fake_candidate(TILE=tiles[i % 5], UNROLL=(1, 2, 4, 8)[i // 5 % 4])
        run.append(0, i, c, ev.evaluate(c, ["s0"]))


def snapshot_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_create_open_and_records(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    journal_some(run, 4)
    again = RunDir.open(run.root)
    records = again.records()
    assert [r.seq for r in records] == [0, 1, 2, 3]
    assert "sources" not in records[0].candidate  # sources live in sources/<id>.json
    assert again.load_candidate(records[0].candidate_id).id == records[0].candidate_id
    with pytest.raises(RunDirError, match="not empty"):
        RunDir.create(run.root, {}, {})


def test_torn_last_line_is_ignored_with_a_warning_then_cut(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    run = new_run(tmp_path)
    journal_some(run, 3)
    with open(run.journal_path, "ab") as f:
        f.write(b'{"v": 1, "seq": 3, "gen": 0, "ind')
    again = RunDir.open(run.root)
    assert "torn last line" in caplog.text and "will be redone" in caplog.text
    assert len(again.records()) == 3
    journal_some(again, 1)  # the next append cuts the torn tail first
    lines = run.journal_path.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line) for line in lines)


def test_snapshots_are_atomic_and_pruned(tmp_path: Path) -> None:
    run = new_run(tmp_path)
    for g in range(6):
        run.write_snapshot(g, {"journal_seq": 0, "spent": {}, "engine": {}, "strategy": {"g": g}})
    names = sorted(p.name for p in run.snapshots_dir.iterdir())
    assert names == ["gen-000003.json", "gen-000004.json", "gen-000005.json"]
    assert run.latest_snapshot()["strategy"] == {"g": 5}  # type: ignore[index]


def corrupt_snapshot(run: RunDir) -> None:
    run.write_snapshot(1, {"journal_seq": 0, "spent": {}, "engine": {}, "strategy": {}})
    path = run.snapshots_dir / "gen-000001.json"
    path.write_bytes(path.read_bytes()[:20])


def newer_snapshot(run: RunDir) -> None:
    run.write_snapshot(1, {"journal_seq": 0, "spent": {}, "engine": {}, "strategy": {}})
    path = run.snapshots_dir / "gen-000001.json"
    data = json.loads(path.read_text())
    data["format"] = FORMAT + 1
    path.write_text(json.dumps(data))


def newer_manifest(run: RunDir) -> None:
    data = json.loads((run.root / "run.json").read_text())
    data["format"] = FORMAT + 1
    (run.root / "run.json").write_text(json.dumps(data))


def corrupt_middle_line(run: RunDir) -> None:
    journal_some(run, 3)
    lines = run.journal_path.read_bytes().split(b"\n")
    lines[1] = lines[1][:30]
    run.journal_path.write_bytes(b"\n".join(lines))


def ahead_snapshot(run: RunDir) -> None:
    run.write_snapshot(1, {"journal_seq": 5, "spent": {}, "engine": {}, "strategy": {}})


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (corrupt_snapshot, "corrupt or truncated"),
        (newer_snapshot, "newer than"),
        (newer_manifest, "newer than"),
        (corrupt_middle_line, "line 2 is corrupt"),
        (ahead_snapshot, "ahead of the journal"),
    ],
)
def test_bad_runs_give_clear_errors_and_stay_unchanged(tmp_path: Path, damage, message: str) -> None:  # type: ignore[no-untyped-def]
    run = new_run(tmp_path)
    damage(run)
    before = snapshot_tree(run.root)
    with pytest.raises(RunDirError, match=message):
        RunDir.open(run.root)
    assert snapshot_tree(run.root) == before


def test_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("hi")
    with pytest.raises(RunDirError, match="not an evokernel run"):
        RunDir.open(tmp_path / "x")
    with pytest.raises(RunDirError, match="not a directory"):
        RunDir.open(tmp_path / "missing")
    assert (tmp_path / "x" / "notes.txt").read_text() == "hi"
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["notes.txt"]


def test_create_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = [fake_candidate(TILE=16), fake_candidate(TILE=64)]
    written: list[str] = []

    def dies_on_the_second(self: RunDir, candidate: object) -> None:
        written.append(str(candidate))
        if len(written) == 2:
            raise KeyboardInterrupt  # a kill midway
        original(self, candidate)  # type: ignore[arg-type]

    original = RunDir.write_source
    monkeypatch.setattr(RunDir, "write_source", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        RunDir.create(tmp_path / "run", {"seed": 0}, {"seeds": [s.id for s in seeds]}, seeds)
    assert list(tmp_path.iterdir()) == []  # neither the run nor its temporary folder
    monkeypatch.undo()
    (tmp_path / "run").mkdir()  # an empty directory is taken over, whole
    run = RunDir.create(tmp_path / "run", {"seed": 0}, {"seeds": [s.id for s in seeds]}, seeds)
    assert [c.id for c in map(run.load_candidate, run.seed_ids())] == [s.id for s in seeds]


def test_what_a_killed_create_left_is_removed(tmp_path: Path) -> None:
    dead = tmp_path / ".run.creating-999999999-abcd1234"  # no such process
    (dead / "sources").mkdir(parents=True)
    live = tmp_path / f".run.creating-{os.getpid()}-abcd1234"  # this process: in progress
    live.mkdir()
    new_run(tmp_path)
    assert not dead.exists() and live.exists()


def test_the_lock_names_its_holder_and_goes_with_it(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", {"seed": 0}, {"workload": "fake"}, lock=True)
    other = RunDir.open(tmp_path / "run")  # another open file description: as another process
    with pytest.raises(RunDirError, match=rf"is in use by process {os.getpid()} on "):
        other.lock()
    run.unlock()
    assert not (tmp_path / "run" / "lock.json").exists()
    other.lock()
    assert json.loads((tmp_path / "run" / "lock.json").read_text())["pid"] == os.getpid()
    other.unlock()
