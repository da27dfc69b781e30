"""The figures draw what the data says: no fitness where a candidate has none."""

from __future__ import annotations

import numpy as np
import pandas as pd

from evokernel.analysis import plots


def test_lineage_draws_no_fitness_for_a_candidate_without_one() -> None:
    chain = pd.DataFrame({
        "step": [0, 1, 2], "candidate": ["a", "b", "c"], "operator": ["seed", "knob_mutation", "knob_mutation"],
        "generation": [0, 1, 2], "status": ["SKIPPED", "PASSED", "PASSED"],
        "fitness": [np.nan, 2.0, 3.0], "changed": ["", "TILE=64", "UNROLL=4"],
    })
    fig = plots.lineage({"evolutionary (seed 0)": chain})
    ax = fig.axes[0]
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [2.0, 3.0]
    in_data = [c for c in ax.collections if c.get_offset_transform() == ax.transData]
    points = sorted(tuple(map(float, xy)) for c in in_data for xy in c.get_offsets())
    assert points == [(1.0, 2.0), (2.0, 3.0)]  # every point drawn at a fitness value has one
    on_axis = [c for c in ax.collections if c not in in_data]
    assert [tuple(map(float, xy)) for c in on_axis for xy in c.get_offsets()] == [(0.0, 0.04)]
    assert any("SKIPPED: no fitness" in t.get_text() for t in ax.texts)  # the seed: a mark that says why
