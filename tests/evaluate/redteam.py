"""The red-team suite: its table (candidates/suite.yaml) and how one case is judged.

Shared by tests/evaluate/test_sandbox.py (CPU), tests/evaluate/test_gpu.py and
benchmarks/redteam.py, so that a case means the same thing everywhere. A case holds
when, after its candidate's evaluation:

- the status is one the row expects on this device, and the feedback says ``says``;
- nothing but an expected PASSED has a fitness, and a PASSED case whose row names
  ``min_ms`` was timed at least that slow on every shape (the attack did not help);
  with ``no_faster``, a PASSED has a fitness within ``NOISE`` of the honest one's;
- the log holds ``log`` (proof that the attack ran; with ``log_on``, only on those
  devices: where the attack finds no opening to try, min_ms alone judges), no planted secret shows in
  the feedback or the log, and neither they nor a shape's message is longer than
  ``TEXT_BOUND``;
- no process the attacker started (argv marked ``evk-redteam``) is left on the host,
  the judge's baseline-timing file is byte for byte what it was, and no dead process's
  log is kept on disk past ``LOG_KEEP``;
- with ``then``: an honest candidate evaluated right after it (while its process may
  still be being killed, as in a search) gets PASSED and a fitness within ``NOISE`` of
  what it got alone (at the start, or, failing that, in a run right after, the attacker
  gone: a slower host is not harm);
- with ``behind``: that candidate is evaluated right before it (an accomplice, in the
  other lane, whose process may still be being killed while this one loads); only the
  case's own evaluation is judged.

A row with ``isolated: true`` runs in a fresh judge process of its own (``python -m
tests.evaluate.redteam``), so that an attack that kills the judge fails its case instead
of the test run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evokernel.candidate import load_candidate
from evokernel.evaluate.process import LOG_KEEP
from evokernel.evaluate.result import Evaluation, Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator

CANDIDATES = Path(__file__).parent / "candidates"
REPO = Path(__file__).resolve().parents[2]
HONEST = "torch_loop.py"
MARKER = "evk-redteam"
"""Every process an attacker starts carries this in its argv, so the host can find it."""
PLANTED = {
    "OPENAI_API_KEY": "sk-redteam-planted-7d2a91c4e0b3",
    "EVOKERNEL_LLM_API_KEY": "redteam-planted-llm-5e8f",
    "HF_TOKEN": "hf_redteam_planted_0c41",
}
"""Secrets set in the judge's environment while the suite runs; no candidate may see one."""
TEXT_BOUND = 80 * 1024
"""Most characters of an evaluation's feedback, log, or a shape's message: whatever a
candidate's process says, the records and prompts that quote them stay small."""
NOISE = 2.5
"""How far an honest candidate's fitness may move between two evaluations on a shared,
loaded CPU before it counts as changed by the case before it."""


@dataclass(frozen=True)
class Case:
    file: str
    expected: dict[str, tuple[Status, ...]]
    """Per device, the statuses that hold (``A|B`` in the table: either is safe)."""
    says: str = ""
    screen: str = "reject"
    """``off``: run with the static screen off, to show the runtime boundary on its own."""
    min_ms: float | None = None
    log: str = ""
    log_on: str = ""
    """Devices (``cpu|cuda``) on which ``log`` must show; empty: every device."""
    repeat: int = 1
    """Evaluations of the same candidate in a row; the last one is judged."""
    then: str | None = None
    isolated: bool = False
    no_faster: bool = False
    """A PASSED is allowed (the attack may find nothing to fake), but then with a fitness
    no more than ``NOISE`` times the honest candidate's: faking did not pay."""
    behind: str | None = None
    """A candidate evaluated right before the case's (its verdict is not judged)."""

    @property
    def path(self) -> Path:
        return CANDIDATES / self.file

    @property
    def name(self) -> str:
        return self.file + (" (screen off)" if self.screen == "off" else "")


def _statuses(value: str) -> tuple[Status, ...]:
    return tuple(Status(part.strip()) for part in str(value).split("|"))


def load_suite(path: Path = CANDIDATES / "suite.yaml") -> list[Case]:
    rows = yaml.safe_load(path.read_text())
    cases = []
    options_known = ("says", "screen", "min_ms", "log", "log_on", "repeat", "then", "isolated", "no_faster",
                     "behind")
    for row in rows:
        unknown = sorted(set(row) - {"file", "cpu", "cuda", *options_known})
        if unknown:  # a key read by nobody would be a check that never runs
            raise ValueError(f"suite.yaml: {row['file']} has unknown keys {unknown}")
        expected = {d: _statuses(row[d]) for d in ("cpu", "cuda") if d in row}
        options = {k: row[k] for k in options_known if k in row}
        if "log_on" in options:  # a misspelt device would switch the log's proof off everywhere
            devices = str(options["log_on"]).split("|")
            if not set(devices) <= {"cpu", "cuda"} or "log" not in options:
                raise ValueError(f"suite.yaml: {row['file']}: log_on is cpu, cuda or cpu|cuda, "
                                 f"beside a log (got log_on {options['log_on']!r})")
        cases.append(Case(row["file"], expected, **options))
    names = [c.name for c in cases]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"suite.yaml lists {duplicated} twice")
    return cases


def cases_for(device: str) -> list[Case]:
    return [c for c in load_suite() if device in c.expected]


def config_for(device: str, **changes: Any) -> SandboxConfig:
    """The suite's judge: small, but every phase of the cascade runs. Its time limit is
    60 s on the CPU, where an honest candidate takes seconds; 30 s on a GPU, where it
    takes about one (each hang costs a whole limit: two of the cases hang)."""
    options: dict[str, Any] = {"device": device, "timeout_s": 60 if device == "cpu" else 30,
                               "trials": 2, "batches": 2, "baseline": "own"}
    options.update(changes)
    return SandboxConfig(**options)


@contextlib.contextmanager
def planted_secrets() -> Iterator[None]:
    """Put the planted secrets in this process's environment (where a judge's keys live)."""
    saved = {k: os.environ.get(k) for k in PLANTED}
    os.environ.update(PLANTED)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def screen(evaluator: SandboxEvaluator, mode: str) -> Iterator[None]:
    saved = evaluator.config.static_screen
    evaluator.config.static_screen = mode
    try:
        yield
    finally:
        evaluator.config.static_screen = saved


def survivors() -> list[str]:
    """Host processes whose argv carries the attackers' marker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if MARKER in argv and "tests.evaluate.redteam" not in argv:
            found.append(f"{entry}: {argv.strip()}")
    return found


SHELVES = ("/var/tmp", "/run/lock", "/var/lock", "/dev/shm")
"""Folders a candidate's process might share with later ones; its leftovers are removed
before each case, so that a case starts from what the judge alone left."""


def clean_shelves() -> None:
    for folder in SHELVES:
        for path in Path(folder).glob(f"*{MARKER}*"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _digest(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


@dataclass
class Outcome:
    case: Case
    status: str
    feedback: str
    fitness: float | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "feedback": self.feedback, "fitness": self.fitness,
                "problems": self.problems}


def evaluate(evaluator: SandboxEvaluator, file: str, shapes: Sequence[str]) -> Evaluation:
    return evaluator.evaluate(load_candidate(CANDIDATES / file, evaluator.workload.name), shapes)


def judge_case(evaluator: SandboxEvaluator, case: Case, shapes: Sequence[str],
               honest_fitness: float | None = None) -> Outcome:
    """Evaluate one case on ``evaluator`` and say what, if anything, went wrong."""
    if case.isolated:
        return judge_isolated(case, evaluator.config.device, shapes, evaluator.work_dir)
    device = evaluator.device.type
    baseline_file = evaluator._baseline_path
    before = _digest(baseline_file)
    clean_shelves()
    with screen(evaluator, "off" if case.screen == "off" else evaluator.config.static_screen):
        if case.behind:  # not waited for: its process may still be dying as the case loads
            evaluate(evaluator, case.behind, shapes)
        for _ in range(case.repeat):
            ev = evaluate(evaluator, case.file, shapes)
    problems = check_evaluation(case, device, ev)
    if case.no_faster and ev.fitness is not None and honest_fitness is not None \
            and ev.fitness > honest_fitness * NOISE:
        problems.append(f"faking paid: fitness {ev.fitness:.3g} against the honest "
                        f"candidate's {honest_fitness:.3g}")
    if _digest(baseline_file) != before:
        problems.append(f"the baseline file {baseline_file} changed")
    if case.then:  # right away, as in a search: the attacker's process may still be dying
        after = evaluate(evaluator, case.then, shapes)
        harm = check_follower(after, honest_fitness)
        if harm and after.fitness is not None:
            # The honest figure may be many minutes old, the host since slowed (a long test
            # run on a shared machine): judge the follower against an honest run now, with
            # the attacker's process gone. Harm done while it died still shows; drift does not.
            evaluator.wait_retired()
            again = evaluate(evaluator, case.then, shapes)
            if again.fitness is not None:
                harm = [f"{problem}; {again.fitness:.3g} alone again now; {most_slowed(after, again)}"
                        for problem in check_follower(after, again.fitness)]
        problems += harm
    evaluator.wait_retired()  # the last process is killed in the background
    kept = {path.name: path.stat().st_size for path in (evaluator.work_dir / "logs").glob("*.log")
            if path.stat().st_size > LOG_KEEP + 1024}
    if kept:
        problems.append(f"logs of dead processes kept whole on disk: {kept}")
    left = survivors()
    if left:
        problems.append(f"processes outlived the evaluation: {left}")
    return Outcome(case, ev.status.value, ev.feedback, ev.fitness, problems)


def check_evaluation(case: Case, device: str, ev: Evaluation) -> list[str]:
    problems = []
    expected = case.expected[device]
    if ev.status not in expected:
        wanted = "|".join(s.value for s in expected)
        problems.append(f"status {ev.status.value}, expected {wanted}: {ev.feedback[:300]}")
    if case.says and not any(part in ev.feedback for part in case.says.split("|")):
        problems.append(f"feedback does not say {case.says!r}: {ev.feedback[:300]}")
    if ev.fitness is not None and Status.PASSED not in expected:
        problems.append(f"a fitness ({ev.fitness:.3g}) for a case that must not pass")
    if ev.status is Status.PASSED and case.min_ms is not None:
        fast = {s.shape[:8]: s.timing.median_ms for s in ev.shapes
                if s.timing is not None and s.timing.median_ms < case.min_ms}
        if fast:
            problems.append(f"timed faster than its {case.min_ms} ms of work allows: {fast}")
    log_required = not case.log_on or device in case.log_on.split("|")
    if case.log and log_required and case.log not in ev.log:
        problems.append(f"log does not show {case.log!r}: ...{ev.log[-300:]}")
    long = [len(text) for text in (ev.feedback, ev.log, *(r.message for r in ev.shapes))
            if len(text) > TEXT_BOUND]
    if long:
        problems.append(f"the evaluation's texts run to {long} characters (at most {TEXT_BOUND})")
    leaked = [k for k, v in PLANTED.items() if v in ev.feedback or v in ev.log]
    if leaked:
        problems.append(f"planted secrets reached the candidate: {leaked}")
    return problems


def check_follower(after: Evaluation, honest_fitness: float | None) -> list[str]:
    """The honest candidate evaluated right after an attack: unharmed and unhelped."""
    if after.status is not Status.PASSED or after.fitness is None:
        return [f"the honest candidate after it got {after.status.value}: {after.feedback[:300]}"]
    if honest_fitness is not None and abs(math.log(after.fitness / honest_fitness)) > math.log(NOISE):
        return [f"the honest candidate after it got fitness {after.fitness:.3g}, "
                f"{honest_fitness:.3g} alone"]
    return []


def most_slowed(after: Evaluation, alone: Evaluation) -> str:
    """Where a harmed follower lost most against the same candidate alone: the shape, and
    both runs' figures there (the judge's median and CUPTI's span), to tell a clock that
    moved from a kernel that ran slower."""
    lost = {shape: alone.speedups[shape] / speedup for shape, speedup in after.speedups.items()
            if shape in alone.speedups and speedup > 0}
    if not lost:
        return "no shape to compare"
    shape = max(lost, key=lambda k: lost[k])
    by_shape = {s.shape: s.timing for s in after.shapes}, {s.shape: s.timing for s in alone.shapes}

    def figures(timing: Any) -> str:
        if timing is None:
            return "no timing"
        cupti = "none" if timing.cupti_ms is None else f"{timing.cupti_ms * 1e3:.1f} us"
        return f"median {timing.median_ms * 1e3:.1f} us ({timing.method}), CUPTI {cupti}"

    return (f"most on {shape[:8]} ({lost[shape]:.2f}x slower): after it {figures(by_shape[0].get(shape))}; "
            f"alone {figures(by_shape[1].get(shape))}")


# -- a case in a judge process of its own ----------------------------------------------


def judge_isolated(case: Case, device: str, shapes: Sequence[str], work_dir: Path) -> Outcome:
    """Run the case in a fresh ``python -m tests.evaluate.redteam`` and read its outcome."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        command = [sys.executable, "-m", "tests.evaluate.redteam", case.file, case.screen, device,
                   str(work_dir), report.name, *shapes]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        text = Path(report.name).read_text()
    if done.returncode != 0 or not text:
        why = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        return Outcome(case, "JUDGE DIED", "", None,
                       [f"the judge's process died ({why}): {done.stderr[-600:]}"])
    data = json.loads(text)
    return Outcome(case, data["status"], data["feedback"], data["fitness"], data["problems"])


def _isolated_main(argv: Sequence[str]) -> int:
    file, mode, device, work_dir, report, *shapes = argv
    case = next(c for c in load_suite() if c.file == file and c.screen == mode)
    case = dataclasses.replace(case, isolated=False)
    shared = Path(work_dir)  # the suite's run: its baseline timings are reused, not its logs
    config = config_for(device, baseline_cache=shared / "baseline_timings.json")
    own = Path(tempfile.mkdtemp(prefix="isolated-", dir=shared))
    with planted_secrets(), SandboxEvaluator("dsa_topk", work_dir=own, config=config) as evaluator:
        alone = evaluate(evaluator, HONEST, shapes) if case.then else None
        outcome = judge_case(evaluator, case, shapes, alone.fitness if alone else None)
    Path(report).write_text(json.dumps(outcome.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(_isolated_main(sys.argv[1:]))


def slow_deaths(ev: SandboxEvaluator, seconds: float, first_only: bool = False) -> None:
    """Make every used process of ``ev`` (or only the first) take ``seconds`` longer to
    retire: a process whose death takes a while (a device context torn down, a million
    files in its /tmp)."""
    retire = ev._retire
    slowed: list[bool] = []

    def slow(handle: Any, *rest: Any) -> None:
        if not (first_only and slowed):
            slowed.append(True)
            time.sleep(seconds)
        retire(handle, *rest)

    ev._retire = slow  # type: ignore[method-assign,assignment]
