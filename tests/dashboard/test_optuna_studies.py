"""Optuna studies: read without touching the files, and openable by optuna-dashboard."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from evokernel.dashboard.optuna_studies import StudyFiles, summarize
from evokernel.journal import RunDir

from .conftest import copy_run, tree_fingerprint


def study_files(run: Path) -> list[Path]:
    files = sorted((run / "optuna").glob("*.log"))
    assert files, "the run tuned no champion"
    return files


def test_summaries_hold_the_trials_the_strategy_told(islands_run: Path) -> None:
    snapshot = RunDir.open(islands_run).latest_snapshot()
    assert snapshot is not None
    before = tree_fingerprint(islands_run)
    summaries = {s["name"]: s for f in study_files(islands_run) for s in summarize(f)}
    assert tree_fingerprint(islands_run) == before  # no lock file, no append
    for tuner in snapshot["strategy"]["tuners"]:  # tuners still open at the snapshot
        study = tuner["study"]
        s = summaries[study["name"]]
        assert s["values"][:len(study["told"])] == [t["value"] for t in study["told"]]
    for s in summaries.values():
        done = [v for v in s["values"] if v is not None]
        assert s["complete"] == len(done) and s["best_value"] == max(done)
        assert s["command"] == f"optuna-dashboard {s['file']}"


def test_a_torn_study_file_reads_its_complete_lines_and_a_garbled_one_is_a_problem(
        islands_run: Path, tmp_path: Path) -> None:
    run = copy_run(islands_run, tmp_path)
    path = study_files(run)[0]
    whole = summarize(path)[0]
    path.write_bytes(path.read_bytes() + b'{"op_code": 4, "wor')
    assert summarize(path)[0]["trials"] == whole["trials"]
    files = StudyFiles(run / "optuna")
    path.write_bytes(b"not json at all\n")
    assert files.poll()
    assert files.problems and files.problems[0].startswith(f"optuna/{path.name} is unreadable")
    assert not files.poll()  # a bad file is reported once, not re-read every time


def wsgi_get(app: Any, path: str) -> tuple[str, Any]:
    status: list[str] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "", "SERVER_NAME": "localhost",
               "SERVER_PORT": "80", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(),
               "wsgi.errors": sys.stderr}
    body = b"".join(app(environ, lambda s, h, e=None: status.append(s)))
    return status[0], json.loads(body)


def test_optuna_dashboard_opens_every_study_file(islands_run: Path) -> None:
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    from optuna_dashboard._storage_url import get_storage  # what its command line does with a path

    for path in study_files(islands_run):
        before = tree_fingerprint(islands_run)
        app = optuna_dashboard.wsgi(get_storage(str(path)))
        status, studies = wsgi_get(app, "/api/studies")
        assert status.startswith("200")
        [ours] = summarize(path)
        [theirs] = studies["study_summaries"]
        assert theirs["study_name"] == ours["name"]
        status, detail = wsgi_get(app, f"/api/studies/{theirs['study_id']}")
        assert [t["values"][0] if t.get("values") else None for t in detail["trials"]] == ours["values"]
        assert tree_fingerprint(islands_run) == before
