"""The parts of benchmarks/workload_gpu_check.py that need no GPU (its CPU dry run takes
minutes at fused_moe's full width: ``--device cpu --iterations 2 --shapes smoke``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import workload_gpu_check as check
from evokernel.candidate import Language
from evokernel.workload import WorkloadError, load_workload


def test_the_compile_column_is_the_torch_seed_with_compile_inductor() -> None:
    wl = load_workload("fused_moe")
    variant = check.compile_variant(wl)
    assert variant.language is Language.TORCH and variant.name == "torch_experts"
    # grouped dispatch breaks the graph on every call: the seed's constraint repairs it
    assert variant.params["COMPILE"] == "inductor" and variant.params["DISPATCH"] == "dense"
    assert variant.params["COMPUTE_DTYPE"] == "float32", "knobs no constraint touches keep their defaults"


def test_the_compile_column_needs_a_torch_seed_with_the_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    wl = load_workload("fused_moe")
    others = [s for s in wl.seeds() if s.language is not Language.TORCH]
    monkeypatch.setattr(type(wl), "seeds", lambda self: others)
    with pytest.raises(WorkloadError, match="no torch seed"):
        check.compile_variant(wl)


def rows(compile_status: str = "PASSED") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for shape, published_us in (("a", 1000.0), ("b", 4000.0)):
        out += [
            {"shape": shape, "callable": "published_reference", "status": "AGREES", "latency_us": published_us},
            {"shape": shape, "callable": "our_reference", "status": "PASSED", "latency_us": 500.0},
            {"shape": shape, "callable": "seed", "status": "PASSED", "latency_us": 10.0,
             "speedup": published_us / 10.0, "over_floor": 2.0},
            {"shape": shape, "callable": "torch_compile", "status": compile_status if shape == "b" else "PASSED",
             "latency_us": 100.0, "speedup": published_us / 100.0, "over_floor": 20.0},
        ]
    return out


def test_metrics_name_the_compile_column_beside_the_seeds() -> None:
    wl = load_workload("fused_moe")
    subjects = [("seed", "fused_moe.seeds.seed"), ("torch_compile", "fused_moe.torch_compile")]
    metrics = check.metrics_of(wl, ["a", "b"], subjects, rows(), True, True, 4000.0)
    assert metrics["fused_moe.published_reference_mean_ms"] == pytest.approx(2.5)
    assert metrics["fused_moe.seeds.seed.mean_speedup_vs_published"] == pytest.approx(250.0)
    assert metrics["fused_moe.torch_compile.correct_all_shapes"] is True
    assert metrics["fused_moe.torch_compile.mean_speedup_vs_published"] == pytest.approx(25.0)
    assert metrics["fused_moe.torch_compile.geomean_speedup_vs_published"] == pytest.approx(20.0)
    assert metrics["fused_moe.torch_compile.max_over_floor"] == pytest.approx(20.0)

    failed = check.metrics_of(wl, ["a", "b"], subjects, rows("INCORRECT"), True, True, 4000.0)
    assert failed["fused_moe.torch_compile.correct_all_shapes"] is False
    assert failed["fused_moe.torch_compile.mean_speedup_vs_published"] == pytest.approx(10.0), "passed shapes only"

    without = check.metrics_of(wl, ["a", "b"], subjects[:1], rows(), True, True, 4000.0)
    assert not any("torch_compile" in key for key in without), "no column without --compile"


def test_a_workload_without_a_compile_column_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(check, "compile_variant", lambda wl: (_ for _ in ()).throw(WorkloadError("none here")))
    assert check.main(["--workload", "fused_moe", "--compile", "--device", "cpu"]) == 2
    assert "none here" in capsys.readouterr().err


def test_every_column_is_set_against_the_triton_baseline() -> None:
    """over_<baseline> per row (the baseline's latency over the row's, on passed rows of
    shapes where the baseline passed), and per column the geometric mean and the least."""
    table = rows()
    for shape, baseline_us, status in (("a", 40.0, "PASSED"), ("b", 90.0, "INCORRECT")):
        table.append({"shape": shape, "callable": "triton_baseline", "status": status, "latency_us": baseline_us,
                      "speedup": 1.0, "over_floor": 1.0})
        table.append({"shape": shape, "callable": "seed2", "status": "PASSED", "latency_us": 5.0, "speedup": 1.0})
    for shape in ("a", "b"):
        check.add_over_baselines(table, shape, ["triton_baseline"])
    seed_a = next(r for r in table if r["shape"] == "a" and r["callable"] == "seed")
    assert seed_a["over_triton_baseline"] == pytest.approx(4.0)
    assert not any("over_triton_baseline" in r for r in table if r["shape"] == "b"), "the baseline failed on b"
    assert not any("over_triton_baseline" in r for r in table if r["callable"] in
                   ("triton_baseline", "published_reference", "our_reference"))

    wl = load_workload("fused_moe")
    subjects = [("seed", "fused_moe.seeds.seed"), ("seed2", "fused_moe.seeds.seed2"),
                ("triton_baseline", "fused_moe.triton_baseline"),
                ("torch_compile", "fused_moe.torch_compile")]
    metrics = check.metrics_of(wl, ["a", "b"], subjects, table, True, True, 4000.0, ["triton_baseline"])
    assert metrics["fused_moe.seeds.seed.over_triton_baseline"] == pytest.approx(4.0)
    assert metrics["fused_moe.seeds.seed.over_triton_baseline_shapes"] == 1
    assert metrics["fused_moe.torch_compile.over_triton_baseline_min"] == pytest.approx(0.4)
    assert metrics["fused_moe.triton_baseline.correct_all_shapes"] is False
    assert metrics["fused_moe.best_seed.over_triton_baseline"] == pytest.approx(8.0), "seed2 on shape a"
    assert metrics["fused_moe.best_seed.over_triton_baseline_shapes"] == 1
    assert "fused_moe.triton_baseline.over_triton_baseline" not in metrics


def test_the_baseline_is_a_column_and_a_found_candidate_loads(tmp_path: Any) -> None:
    wl = load_workload("fused_moe")
    assert [b.name for b in wl.baselines()] == ["triton_baseline"]
    seed = next(s for s in wl.seeds() if s.name == "triton_fused")
    dumped = tmp_path / "best_candidate.json"
    dumped.write_text(seed.model_dump_json(indent=1))  # what a search writes
    assert check.load_best(dumped, wl).id == seed.id
    assert check.load_best(wl.directory / "seeds" / "triton_fused.yaml", wl).id == seed.id
    with pytest.raises(WorkloadError):
        check.load_best(tmp_path / "missing.yaml", wl)


def test_a_run_directory_names_its_best(tmp_path: Any) -> None:
    """``--best`` given a search's run directory (or its best_solution.json): the finalists'
    pick, or without finalists the best passing record; finalists that named none, a run of
    another workload, or one where nothing passed is a clear error."""
    from evokernel.journal import RunDir
    from tests.test_finalists import verdict

    wl = load_workload("fused_moe")
    fast, slow = wl.seeds()[:2]
    run = RunDir.create(tmp_path / "run", {"seed": 0}, {"workload": wl.name}, [fast, slow])
    run.append(0, 0, slow, verdict(slow.id, 3.0))
    run.append(0, 1, fast, verdict(fast.id, 5.0))
    assert check.load_best(run.root, wl).id == fast.id
    assert check.load_best(run.root / "best_solution.json", wl).id == fast.id, "named by its solution"
    (run.root / "finalists.json").write_text(json.dumps({"best": slow.id}))  # confirmed the other
    assert check.load_best(run.root, wl).id == slow.id
    with pytest.raises(WorkloadError, match="not dsa_sparse_attention"):
        check.load_best(run.root, load_workload("dsa_sparse_attention"))
    (run.root / "finalists.json").write_text(json.dumps({"best": None}))
    with pytest.raises(WorkloadError, match="confirmed no candidate"):
        check.load_best(run.root, wl)
    (run.root / "finalists.json").write_text("{not json")
    with pytest.raises(WorkloadError, match="unreadable"):
        check.load_best(run.root, wl)
    empty = RunDir.create(tmp_path / "empty", {"seed": 0}, {"workload": wl.name}, [fast])
    empty.append(0, 0, fast, verdict(fast.id, None))
    with pytest.raises(WorkloadError, match="no candidate passed"):
        check.load_best(empty.root, wl)


def test_the_roofline_floor_is_the_slower_of_memory_and_compute() -> None:
    cost = {"bytes": 4e9, "flops": 2e12}  # 1 ms of memory at 4000 GB/s, 2 ms at 1000 TFLOP/s
    memory, roofline = check.floors_us(cost, 4000.0, 1000.0)
    assert memory == pytest.approx(1000.0) and roofline == pytest.approx(2000.0)
    assert check.floors_us({"bytes": 4e9, "flops": 5e11}, 4000.0, 1000.0)[1] == pytest.approx(1000.0)
    assert check.floors_us(cost, 4000.0, None) == (pytest.approx(1000.0), None)  # no FP8 rate
    assert check.floors_us({"bytes": 4e9}, 4000.0, 1000.0)[1] is None  # no flops counted
    assert check.floors_us(cost, None, 1000.0) == (None, None)
    assert check.measure_fp8_tflops(check.torch.device("cpu")) is None


def test_metrics_keep_the_worst_ratio_to_each_floor() -> None:
    wl = load_workload("fused_moe")
    table = rows()
    for row in table:
        if row["callable"] == "seed":
            row["over_roofline"] = 1.5 if row["shape"] == "a" else 1.2
    metrics = check.metrics_of(wl, ["a", "b"], [("seed", "fused_moe.seeds.seed")], table, True, True,
                               4000.0, tflops=1200.0)
    assert metrics["fused_moe.measured_fp8_tflops"] == 1200.0
    assert metrics["fused_moe.seeds.seed.max_over_floor"] == pytest.approx(2.0)
    assert metrics["fused_moe.seeds.seed.max_over_roofline"] == pytest.approx(1.5)
