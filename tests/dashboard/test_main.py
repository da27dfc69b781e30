"""The command line: bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from evokernel.dashboard.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_path_a_file_and_a_folder_that_is_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip().endswith("does not exist")
    (tmp_path / "file").write_text("x")
    assert main([str(tmp_path / "file")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    assert main([str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "neither a run directory" in err and len(err.strip().splitlines()) == 1


def test_a_port_in_use_is_refused_in_one_line(islands_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main([str(islands_run), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"cannot listen on 127.0.0.1:{port}" in err and len(err.splitlines()) == 1
    assert main([str(islands_run), "--poll", "0"]) == 2


def test_the_command_serves_on_loopback_and_says_where(islands_run: Path) -> None:
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "evokernel.dashboard", str(islands_run), "--port", "0"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("evokernel.dashboard: http://127.0.0.1:") and str(islands_run) in line
        url = line.split()[1]
        with urllib.request.urlopen(url + "api/state", timeout=10) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
