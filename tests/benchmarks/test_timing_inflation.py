"""benchmarks/timing_inflation.py: which timed shapes count as inflated, by position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.timing_inflation import inflated_by_position, inflated_shares, main
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.testing import fake_candidate


def _judged(*figures: tuple[float, float | None]) -> Evaluation:
    """A PASSED evaluation whose shapes have these (judge ms, CUPTI ms) figures."""
    def timing(judge: float, cupti: float | None = None) -> Timing:
        return Timing(median_ms=judge, p25_ms=judge, p75_ms=judge, e2e_ms=judge, samples=3,
                      method="judge-graph", cupti_ms=cupti)

    shapes = tuple(ShapeResult(shape=f"s{i}", status=Status.PASSED, timing=timing(judge, cupti),
                               reference=timing(1.0)) for i, (judge, cupti) in enumerate(figures))
    return Evaluation(candidate_id="c", status=Status.PASSED, shapes=shapes)


EVALUATIONS = [_judged((0.03, 0.01), (0.011, 0.01)), _judged((0.01, None), (0.0201, 0.01), (0.01, 0.01))]


def test_a_judge_figure_over_twice_its_cupti_span_or_without_one_is_inflated() -> None:
    assert inflated_by_position(EVALUATIONS) == [(2, 2), (1, 2), (0, 1)]
    shares = inflated_shares(EVALUATIONS)
    assert shares == {"inflated_share": 0.6, "inflated_share_first": 1.0, "inflated_share_later": 1 / 3}
    assert inflated_shares([])["inflated_share"] is None


def test_the_command_reads_a_landscape_and_refuses_a_broken_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "landscape.jsonl"
    path.write_text("".join(json.dumps({"candidate": fake_candidate(f"c{i}").model_dump(mode="json"),
                                        "evaluation": e.model_dump(mode="json"),
                                        "shapes": [s.shape for s in e.shapes]}) + "\n"
                            for i, e in enumerate(EVALUATIONS)))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "shape 0: 2 of 2 inflated (100%)" in out and "shape 2: 0 of 1 inflated (0%)" in out
    (tmp_path / "broken.jsonl").write_text("{}\n")
    assert main([str(tmp_path / "broken.jsonl")]) == 2
    assert "not a landscape record" in capsys.readouterr().err
