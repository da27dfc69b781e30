"""Deterministic stand-ins for a workload and an evaluator, for tests and dry runs.

The fake evaluator's verdict is a known function of a candidate's parameters (and
a ``SPEED = x`` line in its source; a ``FAIL = "STATUS"`` line makes it fail with that
status, e.g. ``BUILD_FAILED``, as an LLM-written kernel might), so searches are reproducible to the bit and a
test can say in advance which candidates pass, fail or are skipped. Selected from
a config with ``workload_loader: evokernel.testing:load_fake_workload`` and
``evaluator: {factory: fake}`` (``fake_config`` writes one).
"""

from __future__ import annotations

import math
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evokernel.candidate import Candidate, Language, Param
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing

if TYPE_CHECKING:
    from evokernel.config import RunConfig
    from evokernel.engine import Engine
    from evokernel.runtime import Runtime

FAKE_ENV = {"gpu": "fake-gpu", "driver": "0", "torch": "0", "cuda": "0"}

_KERNEL = '''SPEED = {speed}


def build(params, kernels):
    def run(*args):
        return None
    return run
'''


def fake_candidate(
    name: str = "fake_a", speed: float = 1.0, language: Language = Language.TORCH, **knobs: object
) -> Candidate:
    """A seed with the fake landscape's parameter space."""
    return Candidate(
        workload="fake",
        name=name,
        language=language,
        sources={"kernel.py": _KERNEL.format(speed=speed)},
        entry_point="kernel.py::build",
        knob_space={
            "TILE": Param(choices=(16, 32, 64, 128, 256), default=32),
            "ALGO": Param(choices=("radix", "bitonic", "broken"), default="radix"),
            "UNROLL": Param(choices=(1, 2, 4, 8), default=1),
        },
        launch_space={"THREADS": Param(choices=(64, 128, 256, 512, 1024), default=128)},
        knobs=knobs,  # type: ignore[arg-type]
    )


@dataclass
class FakeWorkload:
    """Just what the search needs of a workload: a name, shape subsets and seeds."""

    name: str = "fake"
    subsets: dict[str, list[str]] = field(
        default_factory=lambda: {"smoke": ["s0"], "quick": ["s0", "s1"], "all": ["s0", "s1", "s2"]}
    )

    def resolve_shapes(self, names: str) -> list[str]:
        if names not in self.subsets:
            raise ValueError(f"workload fake has no shape subset {names!r}")
        return list(self.subsets[names])

    def seeds(self) -> list[Candidate]:
        return [
            fake_candidate("fake_a", 1.0),
            fake_candidate("fake_b", 1.2, TILE=16),
            fake_candidate("fake_cuda", 2.0, language=Language.CUDA),
        ]


def load_fake_workload(name: str) -> FakeWorkload:
    return FakeWorkload()


def fake_speedup(candidate: Candidate) -> float | None:
    """The landscape: None means INCORRECT. Peak at TILE=128, UNROLL=4, THREADS=256."""
    p = candidate.params
    if p.get("ALGO") == "broken":
        return None
    src = "\n".join(candidate.sources.values())
    m = re.search(r"SPEED\s*=\s*([0-9.]+)", src)
    speed = float(m.group(1)) if m else 1.0
    tiles = [16, 32, 64, 128, 256]
    t = 1.0 - 0.15 * abs(tiles.index(int(p.get("TILE", 32)))- 3)  # type: ignore[call-overload]
    u = {1: 0.8, 2: 0.9, 4: 1.0, 8: 0.85}.get(int(p.get("UNROLL", 1)), 0.5)  # type: ignore[call-overload]
    th = {64: 0.7, 128: 0.85, 256: 1.0, 512: 0.95, 1024: 0.9}.get(int(p.get("THREADS", 128)), 0.5)  # type: ignore[call-overload]
    a = 1.1 if p.get("ALGO") == "bitonic" else 1.0
    return round(10.0 * speed * t * u * th * a, 9)


def fake_delay(candidate_id: str, delay_s: float, jitter: float = 0.0) -> float:
    """How long the fake evaluator holds its device for ``candidate``.

    ``jitter`` spreads it uniformly over ``delay_s * [1 - jitter, 1 + jitter]``, fixed
    per candidate (from its id), so the same search takes the same time however its
    evaluations are spread over evaluators: real evaluations vary (a failed build is
    quick, a full cascade is not), and that is what a generational barrier pays for.
    """
    u = int(candidate_id[:8], 16) / 0xFFFFFFFF
    return delay_s * (1 + jitter * (2 * u - 1))


class FakeEvaluator:
    """Implements ``Evaluator``; CUDA candidates are SKIPPED unless ``gpu=True``."""

    def __init__(
        self,
        workload_name: str = "fake",
        *,
        delay_s: float = 0.0,
        delay_jitter: float = 0.0,
        gpu: bool = False,
        environment: dict[str, str] | None = None,
        device_s: float = 0.5,
        raise_on: dict[str, Any] | None = None,
        exit_on: dict[str, Any] | None = None,
        concurrent: int = 1,
        noise: float = 0.0,
        flaky_on: dict[str, Any] | None = None,
        warm_up_fails: bool = False,
        **_: object,
    ) -> None:
        """``raise_on``/``exit_on``: parameter values that make ``evaluate`` raise, or kill
        the process, to test that a broken evaluator costs one evaluation, not the run.
        ``noise``: each evaluation's speedups are multiplied by ``exp(noise * z)``, z a
        standard normal drawn from the candidate's id and how many times it was evaluated
        (reproducible). ``flaky_on``: parameter values whose candidates pass their first
        evaluation and are INCORRECT in every later one (a race that showed up late).
        ``warm_up`` records its shapes and how many evaluations came before it
        (``warmed``); ``warm_up_fails`` makes it raise.
        ``concurrent``: calls it takes at once (``evokernel.evaluate.Concurrent``); the most
        seen in flight is ``peak_in_flight()``."""
        self.workload_name = workload_name
        self.delay_s = delay_s
        self.delay_jitter = delay_jitter
        self.gpu = gpu
        self.env = dict(FAKE_ENV if environment is None else environment)
        self.device_s = device_s
        self.raise_on = dict(raise_on or {})
        self.exit_on = dict(exit_on or {})
        self.calls = 0
        self.noise = noise
        self.flaky_on = dict(flaky_on or {})
        self.times_seen: Counter[str] = Counter()
        self.warm_up_fails = warm_up_fails
        self.warmed: list[tuple[list[str], int]] = []
        self.concurrent = concurrent
        self._in_flight = 0
        self._peak = 0
        self._counting = threading.Lock()

    @property
    def concurrent_calls(self) -> int:
        return self.concurrent

    def warm_up(self, shapes: Sequence[str]) -> None:
        """``evokernel.evaluate.Warming``: nothing to set up here but the record."""
        self.warmed.append((list(shapes), self.calls))
        if self.warm_up_fails:
            raise RuntimeError("fake warm-up broke")

    def warm_ups(self) -> list[tuple[list[str], int]]:
        """``warmed``, as a method (what a Ray actor's ``call`` can return)."""
        return list(self.warmed)

    def peak_in_flight(self) -> int:
        """The most ``evaluate`` calls that ran at once."""
        return self._peak

    def environment(self) -> dict[str, str]:
        """The fingerprint, before any evaluation (as ``SandboxEvaluator.environment``)."""
        return dict(self.env)

    def evaluate(self, candidate: Candidate, shapes: Sequence[str]) -> Evaluation:
        with self._counting:
            self.calls += 1
            self.times_seen[candidate.id] += 1
            nth = self.times_seen[candidate.id]
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
        try:
            return self._evaluate(candidate, shapes, nth)
        finally:
            with self._counting:
                self._in_flight -= 1

    def _evaluate(self, candidate: Candidate, shapes: Sequence[str], nth: int) -> Evaluation:
        if self.delay_s:
            time.sleep(fake_delay(candidate.id, self.delay_s, self.delay_jitter))
        p = candidate.params
        if self.exit_on and all(p.get(k) == v for k, v in self.exit_on.items()):
            os._exit(3)
        if self.raise_on and all(p.get(k) == v for k, v in self.raise_on.items()):
            raise RuntimeError(f"fake evaluator broke on {self.raise_on}")
        resources = {
            "registers": float(32 + int(p.get("TILE", 32)) // 4),  # type: ignore[call-overload]
            "shared_bytes": float(int(p.get("TILE", 32)) * int(p.get("UNROLL", 1)) * 64),  # type: ignore[call-overload]
        }
        common = {"candidate_id": candidate.id, "environment": self.env, "resources": resources}
        if candidate.language is Language.CUDA and not self.gpu:
            results = tuple(ShapeResult(shape=s, status=Status.SKIPPED, message="needs a GPU") for s in shapes)
            return Evaluation(status=Status.SKIPPED, shapes=results, feedback="needs a GPU", **common)  # type: ignore[arg-type]
        src = "\n".join(candidate.sources.values())
        failed = re.search(r"^FAIL\s*=\s*[\"'](\w+)[\"']", src, re.MULTILINE)
        if failed and failed.group(1) in Status.__members__:
            status = Status[failed.group(1)]
            results = tuple(ShapeResult(shape=s, status=status, message=f"fake {status.value}") for s in shapes)
            why = f"fake {status.value}: the source says FAIL"
            return Evaluation(status=status, shapes=results, feedback=why, device_s=self.device_s, **common)  # type: ignore[arg-type]
        speedup = fake_speedup(candidate)
        if self.flaky_on and nth > 1 and all(p.get(k) == v for k, v in self.flaky_on.items()):
            speedup = None
        if speedup is not None and self.noise:
            speedup *= math.exp(self.noise * random.Random(f"{candidate.id}/{nth}").gauss(0.0, 1.0))
        if speedup is None:
            results = tuple(ShapeResult(shape=s, status=Status.INCORRECT, message="mismatch") for s in shapes)
            return Evaluation(status=Status.INCORRECT, shapes=results, feedback="wrong", device_s=self.device_s, **common)  # type: ignore[arg-type]
        results = tuple(
            ShapeResult(
                shape=s,
                status=Status.PASSED,
                timing=_timing(1.0 / (speedup * (1 + 0.1 * i))),
                reference=_timing(1.0),
            )
            for i, s in enumerate(shapes)
        )
        return Evaluation(status=Status.PASSED, shapes=results, device_s=self.device_s, **common)  # type: ignore[arg-type]

    def close(self) -> None:
        pass


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=1, method="fake")


def fake_config(
    strategy: str = "evolutionary",
    *,
    budget: int = 24,
    seed: int = 0,
    batch_size: int = 4,
    shapes: str = "smoke",
    pipeline: bool = False,
    options: dict[str, Any] | None = None,
    **evaluator_options: Any,
) -> RunConfig:
    """A run config over the fake workload and evaluator, in process (no Ray)."""
    from evokernel.config import RunConfig

    return RunConfig.model_validate({
        "workload": "fake", "workload_loader": "evokernel.testing:load_fake_workload",
        "strategy": strategy, "seed": seed, "shapes": shapes, "batch_size": batch_size,
        "pipeline": pipeline, "budget": {"evaluations": budget}, "runtime": {"kind": "local"},
        "evaluator": {"factory": "fake", "options": evaluator_options},
        "strategy_options": dict(options or {}), "output": {"progress": False},
    })


def fake_engine(
    run_dir: str | Path,
    strategy: str = "evolutionary",
    *,
    budget: int = 24,
    seed: int = 0,
    batch_size: int = 4,
    options: dict[str, Any] | None = None,
    shapes: Sequence[str] = ("s0",),
    runtime: Runtime | None = None,
    resume: bool = False,
    pipeline: bool = False,
    allow_env_change: bool = False,
    **evaluator_options: Any,
) -> Engine:
    """An engine over the fake landscape in ``run_dir`` (new, or resumed if ``resume``),
    built by ``evokernel.run.build`` like any run. The directory is left unlocked, so
    that a test can resume it in the same process after an interruption. On resume,
    ``evaluator_options`` (if any) make a fresh evaluator, as on another machine."""
    from evokernel.journal import RunDir
    from evokernel.run import build, resumed_config
    from evokernel.runtime import LocalRuntime

    if resume:
        directory = RunDir.open(run_dir)
        config = resumed_config(directory, {"budget": {"evaluations": budget}})
        if runtime is None and evaluator_options:
            runtime = LocalRuntime(lambda: FakeEvaluator(**evaluator_options))
        run = build(config, resume=directory, runtime=runtime, shapes=list(shapes),
                    allow_env_change=allow_env_change)
    else:
        config = fake_config(strategy, budget=budget, seed=seed, batch_size=batch_size, pipeline=pipeline,
                             options=options, **evaluator_options)
        run = build(config.model_copy(update={"run_dir": str(run_dir)}), runtime=runtime, shapes=list(shapes),
                    allow_env_change=allow_env_change)
    run.directory.unlock()
    return run.engine


def fake_llm_responder(request: dict[str, Any]) -> Any:
    """A deterministic stand-in model for the fake workload, for ``StubLLMServer(responder=...)``.

    It reads the (first) kernel's ``SPEED`` line from the prompt and answers as each LLM
    operator expects: a repair drops the ``FAIL`` line; a mutation or crossover writes a
    new speed (as a whole file, or as a SEARCH/REPLACE edit when the prompt asks for
    diffs), and one reply in three writes a kernel that fails to build, so that repair has
    work; the agent calls ``check`` once, then finishes. The answer depends only on the
    messages, so a rerun or a replay sees the same replies.
    """
    import hashlib
    import json

    from evokernel.llm.stub import Reply

    messages = request.get("messages") or []
    text = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    h = int(hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:8], 16)
    m = re.search(r"^SPEED[ \t]*=[ \t]*([0-9.]+)[ \t]*$", text, re.MULTILINE)
    line, speed = (m.group(0), float(m.group(1))) if m else ("", 1.0)
    new_speed = round(speed * (0.9 + (h % 31) / 100), 4)
    if request.get("tools"):
        if any(msg.get("role") == "tool" for msg in messages):
            return Reply.completion("The draft checks out; done.")
        files = {"kernel.py": _KERNEL.format(speed=new_speed)}
        return Reply.tools(("check", {"files": files}), content="Trying a faster draft.")
    if "## Broken kernel" in text:
        return Reply.completion(f"Drop the failing line.\n```python kernel.py\n{_KERNEL.format(speed=speed)}```\n")
    fail = 'FAIL = "BUILD_FAILED"\n' if h % 3 == 0 else ""
    if "SEARCH/REPLACE" in text and line:
        return Reply.completion(
            f"Change the speed.\nkernel.py\n<<<<<<< SEARCH\n{line}\n=======\n{fail}SPEED = {new_speed}\n>>>>>>> REPLACE\n"
        )
    return Reply.completion(f"A new speed.\n```python kernel.py\n{fail}{_KERNEL.format(speed=new_speed)}```\n")
