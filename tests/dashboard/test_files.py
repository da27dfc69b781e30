"""The tolerant readers: a journal followed while it grows, tears and breaks."""

from __future__ import annotations

import json
import os
from pathlib import Path

from evokernel.dashboard.files import JournalFollower, SnapshotReader, read_json
from evokernel.journal import RunDir

from .conftest import copy_run


def journal_lines(run: Path) -> list[bytes]:
    return (run / "journal.jsonl").read_bytes().splitlines(keepends=True)


def test_follower_reads_what_is_appended_and_only_that(islands_run: Path, tmp_path: Path) -> None:
    lines = journal_lines(islands_run)
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"".join(lines[:5]))
    follower = JournalFollower(path)
    assert follower.poll()
    assert [r.seq for r in follower.records] == [0, 1, 2, 3, 4]
    assert not follower.poll()  # nothing new
    with open(path, "ab") as f:
        f.write(b"".join(lines[5:]))
    assert follower.poll()
    expected = RunDir.open(islands_run).records()
    assert [r.candidate_id for r in follower.records] == [r.candidate_id for r in expected]
    assert [r.fitness for r in follower.records] == [r.evaluation.fitness for r in expected]
    assert follower.corrupt == [] and follower.torn_bytes == 0


def test_a_torn_last_line_waits_until_it_is_finished(islands_run: Path, tmp_path: Path) -> None:
    lines = journal_lines(islands_run)
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"".join(lines[:3]) + lines[3][:40])
    follower = JournalFollower(path)
    follower.poll()
    assert len(follower.records) == 3 and follower.torn_bytes == 40 and follower.corrupt == []
    with open(path, "ab") as f:
        f.write(lines[3][40:])
    assert follower.poll()
    assert len(follower.records) == 4 and follower.torn_bytes == 0


def test_a_corrupt_line_is_named_and_skipped_and_the_rest_is_read(islands_run: Path, tmp_path: Path) -> None:
    lines = journal_lines(islands_run)
    path = tmp_path / "journal.jsonl"
    broken = json.loads(lines[2])
    del broken["evaluation"]
    path.write_bytes(b"".join([lines[0], b"{not json\n", json.dumps(broken).encode() + b"\n", *lines[3:6]]))
    follower = JournalFollower(path)
    follower.poll()
    assert [r.seq for r in follower.records] == [0, 3, 4, 5]
    assert len(follower.corrupt) == 2
    assert follower.corrupt[0].startswith("line 2:") and follower.corrupt[1].startswith("line 3:")
    assert "evaluation" in follower.corrupt[1]


def test_a_newer_journal_format_is_refused_by_line_not_misread(islands_run: Path, tmp_path: Path) -> None:
    line = json.loads(journal_lines(islands_run)[0])
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps({**line, "v": 99}) + "\n")
    follower = JournalFollower(path)
    follower.poll()
    assert follower.records == [] and "newer" in follower.corrupt[0]


def test_a_replaced_or_shrunk_journal_is_read_again_from_the_top(islands_run: Path, tmp_path: Path) -> None:
    lines = journal_lines(islands_run)
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"".join(lines[:6]))
    follower = JournalFollower(path)
    follower.poll()
    tmp = tmp_path / "new"
    tmp.write_bytes(b"".join(lines[:2]))
    os.replace(tmp, path)
    assert follower.poll()
    assert [r.seq for r in follower.records] == [0, 1] and follower.resets == 1
    path.unlink()
    assert follower.poll() and follower.missing and follower.records == []


def test_snapshot_reader_keeps_the_last_good_snapshot_when_a_newer_one_is_half_written(
        islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    reader = SnapshotReader(run / "snapshots")
    assert reader.poll()
    good = reader.data
    assert good is not None and reader.problem is None
    newest = max((run / "snapshots").iterdir())
    half = newest.with_name("gen-999999.json")
    half.write_text(newest.read_text()[:100])
    assert reader.poll()
    assert reader.data is good
    assert reader.problem is not None and "gen-999999.json is half-written" in reader.problem


def test_read_json_says_what_is_wrong(tmp_path: Path) -> None:
    assert read_json(tmp_path / "absent.json") == (None, "absent.json does not exist (yet)")
    (tmp_path / "torn.json").write_text('{"a": ')
    data, why = read_json(tmp_path / "torn.json")
    assert data is None and why is not None and why.startswith("torn.json is half-written or corrupt")
    (tmp_path / "list.json").write_text("[1]")
    assert read_json(tmp_path / "list.json")[1] == "list.json does not hold a JSON object"
