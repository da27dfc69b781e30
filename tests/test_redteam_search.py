"""A search seeded with red-team candidates that must fail plus one honest seed completes,
journals every status, and returns the honest seed as best: no fault counts as fitness."""

from __future__ import annotations

from pathlib import Path

import pytest

from evokernel.candidate import load_candidate
from evokernel.config import RunConfig
from evokernel.evaluate.result import Status
from evokernel.evaluate.sandbox import SandboxConfig, SandboxEvaluator
from evokernel.run import build
from evokernel.runtime import LocalRuntime

CANDIDATES = Path(__file__).parent / "evaluate" / "candidates"
CHEATS = [
    "syntax_error.py", "wrong_answer.py", "crash.py", "modifies_input.py", "writes_nothing.py",
    "caches_by_pointer.py", "exits_process.py", "segfault.py", "imports_subprocess.py",
    "bad_signature.py", "writes_past_output.py", "infinite_loop.py", "eats_memory.py",
    "cuda/illegal_address.yaml", "cuda/oob_write.yaml", "cuda/build_error.yaml",
    "reads_caller_frame.py", "counts_calls_late.py", "copies_other_slot.py",
    "caches_by_fingerprint.py", "patches_topk.py", "forges_result_file.py", "exec_base64.py",
]
SHAPES = ["30cecff1-7ea4-474b-90fc-7f4a87206d8e", "d8a73470-cfa1-49ad-aba6-d9b99c0c5b2d"]


@pytest.mark.slow
def test_search_over_the_red_team_returns_the_honest_seed(tmp_path: Path) -> None:
    honest = load_candidate(CANDIDATES / "torch_loop.py", "dsa_topk")
    seeds = [load_candidate(CANDIDATES / name, "dsa_topk") for name in CHEATS] + [honest]
    config = SandboxConfig(device="cpu", timeout_s=20, trials=2, batches=2, baseline="own")
    runtime = LocalRuntime(lambda: SandboxEvaluator("dsa_topk", work_dir=tmp_path / "w", config=config))
    run_config = RunConfig.model_validate({
        "workload": "dsa_topk", "strategy": "random", "budget": {"evaluations": len(seeds)}, "batch_size": 4,
        "runtime": {"kind": "local"}, "run_dir": str(tmp_path / "run"), "output": {"progress": False}})
    with build(run_config, runtime=runtime, seeds=seeds, shapes=SHAPES) as run:
        run.run()
    engine = run.engine
    runtime.close()

    statuses = {r.candidate_id: r.evaluation.status for r in run.directory.records()}
    assert len(statuses) == len(seeds), "every candidate was journaled"
    passed = [cid for cid, status in statuses.items() if status is Status.PASSED]
    assert passed == [honest.id], statuses
    best_id, best = engine.ranked()[0]
    assert best_id == honest.id and best.fitness is not None
    assert {Status.BUILD_FAILED, Status.RUNTIME_ERROR, Status.TIMEOUT, Status.INCORRECT,
            Status.REJECTED} <= set(statuses.values())
