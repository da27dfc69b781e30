"""The run tables: the lineage of the best candidate, or of any other named one."""

from __future__ import annotations

from pathlib import Path

from evokernel.analysis.tables import lineage
from evokernel.journal import RunDir
from evokernel.testing import fake_engine


def test_lineage_follows_the_named_candidate_back_to_a_seed(tmp_path: Path) -> None:
    root = tmp_path / "run"
    fake_engine(root, budget=24).run()
    run = RunDir.open(root)
    records = run.records()
    best = lineage(run)
    assert best.iloc[-1]["candidate"] == max(records, key=lambda r: r.evaluation.rank_key()).candidate_id
    named = next(r for r in reversed(records) if r.candidate.get("parents")
                 and r.candidate_id != best.iloc[-1]["candidate"])
    chain = lineage(run, of=named.candidate_id)
    assert chain.iloc[-1]["candidate"] == named.candidate_id
    assert chain.iloc[0]["operator"] == "seed"
