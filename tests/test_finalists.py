"""Finalists: the search's best measured again before one is named best."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from evokernel.candidate import Candidate
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.finalists import measure, pick
from evokernel.run import build
from evokernel.runtime import Runtime
from evokernel.testing import fake_candidate, fake_config
from tests.test_search import FAKE, journal_ids, search


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=1, method="fake")


def verdict(candidate_id: str, speedup: float | None) -> Evaluation:
    """One shape; ``speedup`` None: INCORRECT."""
    if speedup is None:
        shape = ShapeResult(shape="s", status=Status.INCORRECT, message="mismatch at [3]")
        return Evaluation(candidate_id=candidate_id, status=Status.INCORRECT, shapes=(shape,),
                          feedback="mismatch at [3]", device_s=0.5)
    shape = ShapeResult(shape="s", status=Status.PASSED, timing=timing(1.0 / speedup), reference=timing(1.0))
    return Evaluation(candidate_id=candidate_id, status=Status.PASSED, shapes=(shape,), device_s=0.5)


class ScriptedRuntime:
    """Answers the n-th evaluation of a candidate with the n-th figure of its script."""

    n_evaluators = 1

    def __init__(self, script: dict[str, list[float | None]]) -> None:
        self.script = {cid: list(figures) for cid, figures in script.items()}
        self.asked: list[str] = []

    def evaluate(self, candidates: Sequence[Candidate], shapes: Sequence[str]) -> Iterator[tuple[int, Evaluation]]:
        for i, cand in enumerate(candidates):
            self.asked.append(cand.id)
            yield i, verdict(cand.id, self.script[cand.id].pop(0))


def three() -> tuple[Candidate, Candidate, Candidate]:
    return fake_candidate("lucky", 1.0, TILE=64), fake_candidate("steady", 1.0, TILE=128), fake_candidate("seed")


def test_pick_takes_the_best_found_and_the_best_seed() -> None:
    ranked = [("a", verdict("a", 9.0)), ("s1", verdict("s1", 8.0)), ("b", verdict("b", 7.0)),
              ("bad", verdict("bad", None)), ("s2", verdict("s2", 6.0)), ("c", verdict("c", 5.0))]
    assert [cid for cid, _ in pick(ranked, {"s1", "s2"}, 2)] == ["a", "s1", "b"]
    assert [cid for cid, _ in pick(ranked, {"s1", "s2"}, 0)] == ["s1"]
    assert pick([("bad", verdict("bad", None))], set(), 3) == []


def test_the_lucky_figure_does_not_name_the_best() -> None:
    lucky, steady, seed = three()
    runtime = ScriptedRuntime({lucky.id: [9.0, 8.0, 8.5], steady.id: [10.0, 9.8, 10.2], seed.id: [5.0, 4.9, 5.1]})
    finals = measure(cast(Runtime, runtime), [(lucky, 12.0), (steady, 10.5), (seed, 5.0)], {seed.id}, ["s"], 3)
    assert [f.name for f in finals.finalists] == ["steady", "lucky", "seed"]
    best = finals.best
    assert best is not None and best.name == "steady" and best.fitness == pytest.approx(10.0)
    assert finals.gain == pytest.approx(10.0 / 5.0)
    assert finals.device_s == pytest.approx(9 * 0.5)
    text = "\n".join(finals.lines())
    assert "in the search 12.000, confirmed 8.500 (range 8.000-9.000)" in text
    assert f"best found: {steady.id}, 2.000x the best seed (range 1.922-2.082: faster in every round)" in text
    assert finals.to_json()["gain_range"] == pytest.approx([9.8 / 5.1, 10.2 / 4.9])


def test_rounds_are_interleaved_and_rotated() -> None:
    a, b, c = three()
    runtime = ScriptedRuntime({x.id: [1.0, 1.0] for x in (a, b, c)})
    measure(cast(Runtime, runtime), [(a, 1.0), (b, 1.0), (c, 1.0)], set(), ["s"], 2)
    assert runtime.asked == [a.id, b.id, c.id, b.id, c.id, a.id]


def test_a_gain_within_the_noise_says_so() -> None:
    found, _, seed = three()
    runtime = ScriptedRuntime({found.id: [6.0, 5.0, 5.5], seed.id: [5.2, 5.0, 5.4]})
    finals = measure(cast(Runtime, runtime), [(found, 7.0), (seed, 5.0)], {seed.id}, ["s"], 3)
    assert finals.gain == pytest.approx(5.5 / 5.2)
    assert finals.lines()[-1].endswith("(range 0.926-1.200: not separated from the seed by these rounds)")


def test_a_finalist_that_fails_a_fresh_round_is_not_confirmed() -> None:
    racy, steady, seed = three()
    runtime = ScriptedRuntime({racy.id: [20.0, None, 20.0], steady.id: [3.0, 3.0, 3.0], seed.id: [2.0, 2.0, 2.0]})
    finals = measure(cast(Runtime, runtime), [(racy, 20.0), (steady, 3.0), (seed, 2.0)], {seed.id}, ["s"], 3)
    last = finals.finalists[-1]
    assert last.name == "lucky" and not last.confirmed and last.fitness is None
    assert last.failure == "INCORRECT (round 2): mismatch at [3]"
    assert finals.best is not None and finals.best.name == "steady"
    assert "NOT confirmed: INCORRECT (round 2)" in "\n".join(finals.lines())


def test_when_nothing_beats_the_seed_the_seed_is_named() -> None:
    found, _, seed = three()
    runtime = ScriptedRuntime({found.id: [4.0], seed.id: [5.0]})
    finals = measure(cast(Runtime, runtime), [(found, 6.0), (seed, 5.0)], {seed.id}, ["s"], 1)
    assert finals.best is not None and finals.best.is_seed and finals.gain == pytest.approx(1.0)
    assert "the search found nothing faster that held" in finals.lines()[-1]


def test_a_run_measures_its_finalists_beyond_its_budget(tmp_path: Path) -> None:
    config = fake_config(budget=16, noise=0.2, flaky_on={"TILE": 256})
    config = config.model_copy(update={"run_dir": str(tmp_path / "r"),
                                       "output": config.output.model_copy(update={"finalists": 2})})
    with build(config) as run:
        run.run()
        finals = run.measure_finalists()
        run.finish("budget spent")
        evaluations = run.engine.state.spent.evaluations
        calls = cast(Any, run.runtime).evaluator.calls
        by_search = run.engine.ranked()[0][0]
    assert finals is not None and evaluations == 16
    assert calls == 16 + 3 * len(finals.finalists)  # fresh rounds: not charged, but run
    assert sum(f.is_seed for f in finals.finalists) == 1 and len(finals.finalists) == 3
    saved = json.loads((tmp_path / "r" / "finalists.json").read_text())
    assert saved["rounds"] == 3 and len(saved["finalists"]) == 3
    assert all(len(f["fresh"]) == 3 for f in saved["finalists"])
    tiles = {f.candidate_id: run.engine.candidates[f.candidate_id].params.get("TILE") for f in finals.finalists}
    assert 256 in tiles.values() and any(t != 256 for t in tiles.values())
    for f in finals.finalists:  # a TILE=256 candidate passed once, then raced: never named best
        assert f.confirmed == (tiles[f.candidate_id] != 256)
    assert finals.best is not None and tiles[finals.best.candidate_id] != 256
    # the exported solution is the finalist confirmed best, not the search's luckiest figure
    solution = json.loads((tmp_path / "r" / "best_solution.json").read_text())
    assert finals.best.candidate_id in solution["name"] and by_search != finals.best.candidate_id


def test_with_no_finalist_confirmed_no_solution_is_exported(tmp_path: Path) -> None:
    """Every finalist fails a fresh round: the run names no best and exports none either,
    not the search's top figure (a solution an earlier finish left is removed)."""
    config = fake_config(budget=12, shapes="quick")
    config = config.model_copy(update={"run_dir": str(tmp_path / "r")})
    with build(config) as run:
        run.run()
        (tmp_path / "r" / "best_solution.json").write_text("{}")  # as an earlier finish left it
        seed_ids = {s.id for s in run.seeds}
        chosen = pick(run.engine.ranked(), seed_ids, 3)
        racy = ScriptedRuntime({cid: [None] for cid, _ in chosen})
        run.finals = measure(cast(Runtime, racy), [(run.engine.candidates[cid], fit) for cid, fit in chosen],
                             seed_ids, run.shapes, 1)
        outputs = run.finish("budget spent")
    assert run.finals.best is None and len(run.finals.finalists) == len(chosen) >= 2
    assert "solution" not in outputs and not (tmp_path / "r" / "best_solution.json").exists()


def test_the_command_line_reports_finalists_and_can_turn_them_off(tmp_path: Path) -> None:
    out = search("--config", FAKE, "--run-dir", str(tmp_path / "on"), "--budget", "12",
                 "--set", "evaluator.options.noise=0.1")
    assert out.returncode == 0, out.stderr
    assert "finalists measured 3 more times each" in out.stdout and "[best seed]" in out.stdout
    assert "## Finalists, measured again" in (tmp_path / "on" / "summary.md").read_text()
    assert len(journal_ids(tmp_path / "on")) == 12  # not journaled: the search's record is the search's
    off = search("--config", FAKE, "--run-dir", str(tmp_path / "off"), "--budget", "12", "--finalists", "0")
    assert off.returncode == 0, off.stderr
    assert "finalists measured" not in off.stdout and not (tmp_path / "off" / "finalists.json").exists()


def test_a_saved_population_leaves_out_a_finalist_that_failed_a_fresh_round(tmp_path: Path) -> None:
    config = fake_config(budget=16, noise=0.2, flaky_on={"TILE": 256})
    config = config.model_copy(update={"run_dir": str(tmp_path / "r"),
                                       "output": config.output.model_copy(update={"finalists": 2, "top": 20})})
    with build(config) as run:
        run.run()
        finals = run.measure_finalists()
        saved = json.loads(run.save_population(str(tmp_path / "pops" / "elites")).read_text())
    assert finals is not None
    racy = {f.candidate_id for f in finals.finalists if not f.confirmed}
    kept = {Candidate.model_validate(m["candidate"]).id for m in saved["members"]}
    assert racy and not racy & kept
    assert {f.candidate_id for f in finals.finalists if f.confirmed} <= kept
