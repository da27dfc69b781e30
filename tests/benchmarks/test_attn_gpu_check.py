"""The parts of benchmarks/attn_gpu_check.py that need no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import attn_gpu_check as check
from evokernel.evaluate.result import Evaluation, ShapeResult, Status, Timing
from evokernel.workload import load_workload


def test_sweep_moves_one_parameter_at_a_time() -> None:
    wl = load_workload(check.WORKLOAD)
    seed = next(s for s in wl.seeds() if s.name == "cuda_mma")
    variants = check.one_at_a_time(seed)
    space = {**seed.knob_space, **seed.launch_space}
    assert len(variants) == sum(len(p.choices) - 1 for p in space.values())
    for label, variant in variants:
        changed = {k for k, v in variant.params.items() if v != seed.params[k]}
        assert len(changed) == 1 and label.startswith(f"cuda_mma.{changed.pop()}=")
    assert len({v.id for _, v in variants}) == len(variants)


def test_finds_the_published_definition_given_a_trace_root(tmp_path: Path) -> None:
    wl = load_workload(check.WORKLOAD)
    folder = tmp_path / "definitions" / "dsa_paged"
    folder.mkdir(parents=True)
    (folder / f"{wl.definition.name}.json").write_text('{"reference": "def run(*a):\\n    return a"}')
    found = check.find_published(wl, str(tmp_path))
    assert found is not None and found.parent == folder
    assert check.load_published(found)(1, 2) == (1, 2)


def test_summary_has_speedups_only_when_every_shape_passed() -> None:
    timing = Timing(median_ms=0.01, p25_ms=0.009, p75_ms=0.011, e2e_ms=0.05, samples=50,
                    method="cuda-graph")
    shapes = ["a", "b"]
    ok = Evaluation(candidate_id="x", status=Status.PASSED, shapes=tuple(
        ShapeResult(shape=s, status=Status.PASSED, timing=timing) for s in shapes))
    summary = check.summarise("s", ok, shapes, {"a": 1000.0, "b": 4000.0}, {"a": 5.0, "b": 4.0})
    assert summary["seeds.s.correct_all_shapes"] is True
    assert summary["seeds.s.mean_speedup"] == pytest.approx(250.0)
    assert summary["seeds.s.geomean_speedup"] == pytest.approx(200.0)
    assert summary["seeds.s.max_over_floor"] == pytest.approx(2.5)
    assert "seeds.s.mean_latency_us_cupti" not in summary and summary["seeds.s.cupti_shapes"] == 0
    with_cupti = Evaluation(candidate_id="z", status=Status.PASSED, shapes=tuple(
        ShapeResult(shape=s, status=Status.PASSED, timing=timing.model_copy(update={"cupti_ms": c}))
        for s, c in zip(shapes, (0.008, 0.012), strict=True)))
    summary = check.summarise("s", with_cupti, shapes, {"a": 1000.0, "b": 4000.0}, {"a": 5.0, "b": 4.0})
    assert summary["seeds.s.mean_latency_us_cupti"] == pytest.approx(10.0)
    assert summary["seeds.s.max_over_floor_cupti"] == pytest.approx(3.0)
    wl = load_workload(check.WORKLOAD)
    real = wl.subsets["smoke"][:2]
    named = with_cupti.model_copy(update={"shapes": tuple(
        r.model_copy(update={"shape": n}) for r, n in zip(with_cupti.shapes, real, strict=True))})
    rows = check.judge_rows("s", named, wl, dict.fromkeys(real, 1.0), dict.fromkeys(real, 4.0))
    assert [r["cupti_us"] for r in rows] == pytest.approx([8.0, 12.0])
    assert [r["over_floor_cupti"] for r in rows] == pytest.approx([2.0, 3.0])
    failed = Evaluation(candidate_id="y", status=Status.INCORRECT, feedback="wrong", shapes=(
        ShapeResult(shape="a", status=Status.INCORRECT, message="wrong"),))
    summary = check.summarise("s", failed, shapes, {"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0})
    assert summary["seeds.s.correct_all_shapes"] is False and "seeds.s.mean_speedup" not in summary


def test_variants_default_to_the_other_combines() -> None:
    seeds = load_workload(check.WORKLOAD).seeds()
    auto = dict(check.variants_of(seeds, "auto"))
    defaults = {s.name: s.params["COMBINE"] for s in seeds if "COMBINE" in s.params}
    assert set(defaults) == {"triton_split", "cuda_mma"}
    triton = next(s for s in seeds if s.name == "triton_split")
    (other,) = set(triton.knob_space["PARTIALS"].choices) - {triton.params["PARTIALS"]}
    assert set(auto) == {f"{seed}[COMBINE={combine}]" for seed, default in defaults.items()
                         for combine in ("fused", "separate", "spread") if combine != default} | {
        f"triton_split[COMBINE=spread,PARTIALS={other}]"}
    assert all(v.params["COMBINE"] == label.split("COMBINE=")[1].split(",")[0].rstrip("]")
               for label, v in auto.items())
    assert auto[f"triton_split[COMBINE=spread,PARTIALS={other}]"].params["PARTIALS"] == other
    assert check.variants_of(seeds, "none") == []
    (label, variant), = check.variants_of(seeds, "cuda_mma:MAX_SPLITS=32,COMBINE=separate")
    assert label == "cuda_mma[MAX_SPLITS=32,COMBINE=separate]"
    assert variant.params["MAX_SPLITS"] == 32 and variant.params["COMBINE"] == "separate"
    with pytest.raises(check.UsageError):
        check.variants_of(seeds, "cuda_mma:NO_SUCH=1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_refuses_to_run_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main(["--shapes", "smoke"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_a_best_found_that_cannot_be_read_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--best`` names the candidate a search found; one that is not there stops the run
    before anything is timed, with exit status 2."""
    status = check.main(["--device", "cpu", "--shapes", "smoke", "--best", str(tmp_path / "absent.json")])
    assert status == 2
    assert "--best" in capsys.readouterr().err


def test_the_published_reference_is_timed_without_a_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """It synchronises, so its capture fails, and a failed capture keeps its memory pool
    for the life of the process: the baselines never try one for it."""
    wl = load_workload(check.WORKLOAD)
    tried: list[bool] = []

    def timer(fn: object, calls: object, config: check.TimingConfig) -> tuple[Timing, None]:
        tried.append(config.use_graphs)
        return Timing(median_ms=1.0, p25_ms=1.0, p75_ms=1.0, e2e_ms=1.0, samples=1, method="cpu"), None

    monkeypatch.setattr(check, "time_cpu", timer)
    rows, _, agreed = check.baselines(wl, wl.resolve_shapes("smoke")[:1], wl.reference, None,
                                      torch.device("cpu"), 0, check.TimingConfig())
    assert agreed
    assert [r["subject"] for r in rows if "latency_us" in r] == ["published_reference", "our_reference"]
    assert tried == [False, True]
