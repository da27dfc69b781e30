from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pytest

from evokernel.candidate import Candidate
from evokernel.evaluate.replay import LandscapeError, ReplayEvaluator
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing


def candidate(tile: int) -> Candidate:
    return Candidate(
        workload="w", language="torch", sources={"k.py": "def build(p, k): pass\n"},
        entry_point="k.py::build", knob_space={"TILE": {"choices": [1, 2, 3]}}, knobs={"TILE": tile},
    )


def timing(ms: float) -> Timing:
    return Timing(median_ms=ms, p25_ms=ms, p75_ms=ms, e2e_ms=ms, samples=1, method="cuda-graph")


def passed(c: Candidate, ms: float) -> Evaluation:
    shapes = tuple(
        ShapeResult(shape=s, status=Status.PASSED, timing=timing(ms), reference=timing(10.0))
        for s in ("a", "b")
    )
    return Evaluation(candidate_id=c.id, status=Status.PASSED, shapes=shapes, device_s=1.5,
                      environment={"device": "NVIDIA H200"})


def write(path: Path, records: list[tuple[Candidate, Evaluation]]) -> Path:
    path.write_text("".join(
        json.dumps({"candidate": c.model_dump(mode="json"), "evaluation": e.model_dump(mode="json"),
                    "shapes": ["a", "b"]}) + "\n" for c, e in records))
    return path


def test_replays_recorded_and_refuses_to_invent(tmp_path: Path) -> None:
    one, two, three = candidate(1), candidate(2), candidate(3)
    ev = ReplayEvaluator.from_file(write(tmp_path / "l.jsonl", [(one, passed(one, 1.0)),
                                                                  (two, passed(two, 2.0))]))
    assert len(ev) == 2 and ev.environment()["device"] == "NVIDIA H200"
    assert ev.evaluate(one, ["a", "b"]).fitness == pytest.approx(10.0)
    assert ev.evaluate(one, ["a"]).shapes[0].shape == "a"
    unseen = ev.evaluate(three, ["a", "b"])
    assert unseen.status is Status.SKIPPED and "none is invented" in unseen.feedback
    assert ev.unseen == {three.id}
    assert ev.evaluate(one, ["a", "zzz"]).status is Status.SKIPPED
    best = ev.best()
    assert best is not None and best[0].id == one.id


def test_bad_landscapes(tmp_path: Path) -> None:
    with pytest.raises(LandscapeError, match="cannot read"):
        ReplayEvaluator.from_file(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(LandscapeError, match=r"bad\.jsonl:1"):
        ReplayEvaluator.from_file(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(LandscapeError, match="no records"):
        ReplayEvaluator.from_file(tmp_path / "empty.jsonl")


@pytest.mark.parametrize("suffix, compress", [(".jsonl.xz", lzma.compress), (".jsonl.gz", gzip.compress)])
def test_compressed_landscapes_replay_as_the_plain_file(tmp_path: Path, suffix: str, compress) -> None:
    one, two = candidate(1), candidate(2)
    plain = write(tmp_path / "l.jsonl", [(one, passed(one, 1.0)), (two, passed(two, 2.0))])
    packed = tmp_path / f"l{suffix}"
    packed.write_bytes(compress(plain.read_bytes()))
    ev = ReplayEvaluator.from_file(packed)
    assert len(ev) == 2
    assert ev.evaluate(two, ["a", "b"]).fitness == pytest.approx(5.0)
    # a file that only says it is compressed, or whose compressed body is damaged, is a
    # clear error, not a traceback
    fake = tmp_path / f"fake{suffix}"
    fake.write_bytes(plain.read_bytes())
    body = bytearray(compress(plain.read_bytes()))
    body[12:60] = bytes(b ^ 0xFF for b in body[12:60])
    damaged = tmp_path / f"damaged{suffix}"
    damaged.write_bytes(bytes(body))
    truncated = tmp_path / f"truncated{suffix}"
    truncated.write_bytes(compress(plain.read_bytes())[:-20])
    for broken in (fake, damaged, truncated):
        with pytest.raises(LandscapeError, match="cannot read landscape"):
            ReplayEvaluator.from_file(broken)
