"""Run directories for the dashboard tests, made once per session by real (fake-evaluator) searches.

Tests that change a run directory (tearing its journal, say) work on a copy
(``copy_run``); the session's originals stay as the searches left them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from evokernel.populations import Axis
from evokernel.testing import fake_engine

REPO = Path(__file__).resolve().parents[2]
FAKE = str(REPO / "tests" / "fake_run.yaml")


@pytest.fixture(scope="session")
def islands_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An evolutionary run over two tournament islands, with Optuna tuning of champions."""
    root = tmp_path_factory.mktemp("dash") / "islands"
    fake_engine(root, budget=30, options={"tune_trials": 3}).run()
    return root


@pytest.fixture(scope="session")
def map_elites_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dash") / "map_elites"
    axes = [Axis(name="registers", source="resource", edges=(40.0, 64.0)),
            Axis(name="ALGO", source="param")]
    fake_engine(root, budget=24, options={"island_kind": "map_elites", "axes": axes}).run()
    return root


@pytest.fixture(scope="session")
def llm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A search with LLM operators (a scripted model on loopback) beside the knob operators."""
    from evokernel.llm.stub import StubLLMServer
    from evokernel.testing import fake_llm_responder

    root = tmp_path_factory.mktemp("dash") / "llm"
    rates = "operators.rates={llm_mutate: 2, llm_mutate_diff: 1, llm_repair: 1, knob_mutation: 1}"
    with StubLLMServer(responder=fake_llm_responder) as stub:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVOKERNEL_LLM_")
               and k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
        env.update(PYTHONPATH=str(REPO), EVOKERNEL_LLM_BASE_URL=stub.base_url, EVOKERNEL_LLM_MODEL="stub-model")
        subprocess.run([sys.executable, "-m", "evokernel.search", "--quiet", "--config", FAKE, "--operators",
                        "mixed", "--budget", "24", "--run-dir", str(root), "--set", rates,
                        "--set", "llm.max_retries=0"], cwd=REPO, env=env, check=True, capture_output=True,
                       timeout=300)
    return root


@pytest.fixture(scope="session")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from evokernel.analysis import compare

    root = tmp_path_factory.mktemp("dash") / "compare"
    code = compare.main(["--workload", "fake", "--config", FAKE, "--strategies", "ga,random", "--seeds", "2",
                         "--budget", "12", "--runtime", "local", "--no-landscape", "--out", str(root),
                         "--quiet", "--no-report"])
    assert code == 0
    return root


def copy_run(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


def tree_fingerprint(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``root`` with its size, modification time and content hash."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() or path.is_symlink():
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns,
                                                hashlib.sha256(path.read_bytes()).hexdigest())
    return out


class LiveServer:
    """The dashboard app under uvicorn in a thread, on a free loopback port."""

    def __init__(self, root: Path, poll_s: float = 0.2) -> None:
        import uvicorn

        from evokernel.dashboard.__main__ import bind
        from evokernel.dashboard.server import create_app

        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(root, poll_s=poll_s), log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            threading.Event().wait(0.02)
        raise RuntimeError("the dashboard server did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[type[LiveServer]]:
    yield LiveServer
