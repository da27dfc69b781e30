"""The page model of one run, checked against the run's own journal and snapshot."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from evokernel.dashboard.run_view import RunView
from evokernel.journal import RunDir

from .conftest import copy_run, tree_fingerprint


def test_series_and_best_match_the_journal(islands_run: Path) -> None:
    records = RunDir.open(islands_run).records()
    state = RunView(islands_run).state()
    fitness = [r.evaluation.fitness for r in records]
    assert state["evaluations"] == len(records)
    assert state["series"]["fitness"] == fitness
    best_so_far, best = [], None
    for f in fitness:
        best = f if f is not None and (best is None or f > best) else best
        best_so_far.append(best)
    assert state["series"]["best"] == best_so_far
    assert state["best"]["fitness"] == max(f for f in fitness if f is not None)
    spent = 0.0
    for r, x in zip(records, state["series"]["device_s"], strict=True):
        spent += r.evaluation.device_s
        assert abs(x - spent) < 1e-9
    counts: dict[str, int] = {}
    for r in records:
        counts[r.evaluation.status.value] = counts.get(r.evaluation.status.value, 0) + 1
    assert state["status_counts"] == counts


def test_islands_follow_the_snapshot_and_every_evaluation_has_one(islands_run: Path) -> None:
    state = RunView(islands_run).state()
    snapshot = RunDir.open(islands_run).latest_snapshot()
    assert snapshot is not None
    islands = snapshot["strategy"]["islands"]
    assert [i["index"] for i in state["islands"]] == list(range(len(islands["islands"])))
    assert [i["size"] for i in state["islands"]] == [len(i["members"]) for i in islands["islands"]]
    assert set(state["series"]["island"]) <= set(range(len(islands["islands"])))
    assert None not in state["series"]["island"]  # every evaluation was before the newest snapshot
    for i in state["islands"]:
        fits = [m["fitness"] for m in i["top"] if m["fitness"] is not None]
        assert i["best"]["fitness"] == max(fits)


def test_lineage_of_the_best_reaches_a_seed_through_journaled_parents(islands_run: Path) -> None:
    state = RunView(islands_run).state()
    by_id = {r.candidate_id: r for r in RunDir.open(islands_run).records()}
    lineage = state["lineage"]
    assert lineage["of"] == state["best"]["id"]
    main = [n for n in lineage["nodes"] if n["main"]]
    assert main[0]["id"] == state["best"]["id"] and main[0]["depth"] == 0
    assert main[-1]["operator"] == "seed" and main[-1]["parents"] == []
    for child, parent in pairwise(main):
        assert by_id[child["id"]].candidate["parents"][0] == parent["id"]
    ids = {n["id"] for n in lineage["nodes"]}
    assert all(p in ids and c in ids for p, c in lineage["edges"])


def test_map_elites_grids_have_labelled_axes_and_the_snapshot_cells(map_elites_run: Path) -> None:
    state = RunView(map_elites_run).state()
    snapshot = RunDir.open(map_elites_run).latest_snapshot()
    assert snapshot is not None
    grids = state["map_elites"]
    assert len(grids) == len(snapshot["strategy"]["islands"]["islands"])
    for grid, island in zip(grids, snapshot["strategy"]["islands"]["islands"], strict=True):
        registers, algo = grid["axes"]
        assert registers["bins"] == ["0", "1", "2"] and registers["labels"] == ["<40", "40-64", ">=64"]
        assert set(algo["bins"]) <= {"radix", "bitonic", "broken"}
        assert sorted(c["cell"] for c in grid["cells"]) == sorted(c["cell"] for c in island["cells"])


def test_budget_rate_and_a_config_of_the_search_command(islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    (run / "config.yaml").write_text("budget: {evaluations: 40, gpu_seconds: 30}\n")
    state = RunView(run).state()
    assert state["budget"]["evaluations"] == {"spent": state["evaluations"], "limit": 40}
    assert state["budget"]["device_s"]["limit"] == 30.0
    assert state["budget"]["device_s"]["spent"] == state["series"]["device_s"][-1]
    # the fake search wrote its whole journal within a second or two: too short a span for a rate
    assert state["rate"]["per_minute"] is None
    assert state["rate"]["last"] is not None


def test_the_rate_counts_evaluations_over_journal_time(islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    lines = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()][:7]
    for i, line in enumerate(lines):  # one evaluation every 20 s
        line["time"] = f"2026-01-01T00:{i * 20 // 60:02d}:{i * 20 % 60:02d}+00:00"
    (run / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rate = RunView(run).state()["rate"]
    assert rate["per_minute"] == 3.0  # 6 intervals in 120 s
    assert rate["recent_per_minute"] == 0.0  # nothing in the last five minutes


def test_reading_never_changes_the_run_directory(islands_run: Path, map_elites_run: Path, llm_run: Path) -> None:
    for run in (islands_run, map_elites_run, llm_run):
        before = tree_fingerprint(run)
        view = RunView(run)
        view.refresh()
        view.refresh()
        assert tree_fingerprint(run) == before


def test_refresh_reports_change_only_when_the_files_change(islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    lines = (run / "journal.jsonl").read_bytes().splitlines(keepends=True)
    (run / "journal.jsonl").write_bytes(b"".join(lines[:10]))
    view = RunView(run)
    assert view.refresh()
    version = view.state()["version"]
    assert not view.refresh() and view.state()["version"] == version
    with open(run / "journal.jsonl", "ab") as f:
        f.write(lines[10])
    assert view.refresh()
    assert view.state()["version"] == version + 1 and view.state()["evaluations"] == 11


def test_a_torn_or_corrupt_journal_is_a_notice_with_what_could_be_read(islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    lines = (run / "journal.jsonl").read_bytes().splitlines(keepends=True)
    (run / "journal.jsonl").write_bytes(b"".join(lines[:4]) + b"garbage\n" + b"".join(lines[4:8]) + lines[8][:25])
    state = RunView(run).state()
    assert state["evaluations"] == 8
    notices = " ".join(state["notices"])
    assert "partly written line (25 bytes)" in notices
    assert "1 corrupt line(s)" in notices and "line 5" in notices


def test_a_run_being_created_is_described_not_raised(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    state = RunView(tmp_path / "r").state()
    assert state["evaluations"] == 0 and state["best"] is None
    assert any("journal.jsonl does not exist yet" in n for n in state["notices"])
    assert any("run.json does not exist" in n for n in state["notices"])


def test_a_run_half_created_changes_only_when_its_files_appear(islands_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text((islands_run / "config.yaml").read_text())
    view = RunView(run)
    view.refresh()
    version = view.state()["version"]
    assert not view.refresh() and view.state()["version"] == version
    (run / "run.json").write_text((islands_run / "run.json").read_text())
    assert view.refresh()
    assert view.manifest == json.loads((islands_run / "run.json").read_text())
    assert view.state()["created"] == view.manifest["created"]
    assert not any("run.json" in n for n in view.state()["notices"])


def test_finalists_appear_once_the_run_writes_them(islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    view = RunView(run)
    assert view.state()["finalists"] is None
    best = max(RunDir.open(run).records(), key=lambda r: r.evaluation.fitness or 0.0)
    finals = {"rounds": 3, "device_s": 4.5, "best": best.candidate_id, "gain_over_best_seed": 1.5,
              "finalists": [{"candidate": best.candidate_id, "seed": False, "in_search": 9.0, "confirmed": True,
                             "fitness": 8.0, "fresh": [], "failure": ""}]}
    (run / "finalists.json").write_text(json.dumps(finals))
    assert view.refresh()
    assert view.state()["finalists"] == finals
    assert not view.refresh()
    (run / "finalists.json").unlink()  # a resumed run measures them again
    assert view.refresh() and view.state()["finalists"] is None
    (run / "finalists.json").write_text(json.dumps({**finals, "rounds": 5}))
    assert view.refresh() and view.state()["finalists"]["rounds"] == 5
