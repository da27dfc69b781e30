"""probe_kernels' phase timers, without a GPU: the probe-only build switch, the record
layout it shares with cuda_family.cu, and the phase table on synthetic stamps."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.probe_kernels import (
    GROUPS,
    META,
    PHASE_DEFINE,
    PHASES,
    RECORDS,
    SLOTS,
    CtaRecord,
    decode_records,
    format_phase_table,
    phase_summary,
    phase_table,
    preparation,
    probe_phases,
    with_define,
)
from evokernel.candidate import load_candidate
from evokernel.evaluate.build import cuda_source

SEEDS = Path(__file__).resolve().parents[2] / "workloads" / "dsa_topk" / "seeds"


def test_the_record_layout_is_the_kernels() -> None:
    source = (SEEDS / "cuda_family.cu").read_text()
    defines = dict(re.findall(r"^#define ((?:PH|EVK)_[A-Z0-9]+) (\d+)", source, re.M))
    assert int(defines["EVK_SLOTS"]) == SLOTS
    assert int(defines["EVK_META"]) == META
    assert int(defines["EVK_RECORDS"]) == RECORDS
    stamps = {name: int(v) for name, v in defines.items() if name.startswith("PH_")}
    assert stamps == {f"PH_{p.upper()}": i for i, p in enumerate(PHASES) if not p.startswith("pass")
                      } | {"PH_PASS1": PHASES.index("pass1")}
    assert PHASES[PHASES.index("pass1"):PHASES.index("pass1") + 3] == ("pass1", "pass2", "pass3")
    assert len(PHASES) <= META


def test_the_define_is_the_probes_alone() -> None:
    family = load_candidate(SEEDS / "cuda_family.yaml", "dsa_topk")
    timed = with_define(family, PHASE_DEFINE)
    assert timed.params == family.params and timed.space == family.space
    assert PHASE_DEFINE not in family.space, "not a knob the search sees"
    assert timed.id != family.id, "no build cache confuses the two"
    assert timed.sources["cuda_family_host.py"] == family.sources["cuda_family_host.py"]
    assert f"#define {PHASE_DEFINE}" not in cuda_source(family)
    _, _, kernel = cuda_source(timed).partition("#line 1\n")  # after the parameters
    assert kernel == f"#define {PHASE_DEFINE} 1\n#line 1\n" + family.sources["cuda_family.cu"]


# -- synthetic stamps ------------------------------------------------------------------


def buffer_of(records: list[tuple[int, int, int, dict[str, int], dict[str, int]]]) -> np.ndarray:
    """A buffer as the kernel leaves it: (row, cta, launch, ns, cycles) per CTA, at the
    kernel's index row * (CTAS + 1) + cta with CTAS = 8 (two_pass's second launch: cta 8)."""
    table = np.zeros((RECORDS, 2 * SLOTS), dtype=np.int64)
    for row, cta, launch, ns, cycles in records:
        index = row * 9 + (8 if launch else cta)
        table[index, META] = row | cta << 16 | launch << 24
        for name, t in ns.items():
            table[index, PHASES.index(name)] = t
        for name, c in cycles.items():
            table[index, SLOTS + PHASES.index(name)] = c
    return table.reshape(-1)


def fused_call(shift: int, late: int) -> np.ndarray:
    """Row 0: CTA 0 scores, CTA 1 scores last and selects; row 1 is short (CTA 0 only).
    Stamps in ns from 10**9 + shift; cycles at 2 per ns from 5000. ``late`` delays the
    selecting CTA's scoring."""
    base = 10**9 + shift

    def stamps(ns: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        return ({k: base + v for k, v in ns.items()},
                {k: 5000 + 2 * v for k, v in ns.items()})

    scorer = stamps({"entry": 0, "q": 400, "scored": 3000, "handoff": 3500, "exit": 3500})
    selector = stamps({"entry": 200, "q": 700, "scored": 4000 + late, "handoff": 4600 + late,
                       "loaded": 6000 + late, "bin0": 6500 + late, "cand": 7500 + late,
                       "pass1": 8000 + late, "output": 9000 + late, "exit": 9000 + late})
    short = stamps({"entry": 100, "exit": 900})
    return buffer_of([(0, 0, 0, *scorer), (0, 1, 0, *selector), (1, 0, 0, *short)])


def test_records_are_decoded_with_their_roles() -> None:
    records = decode_records(fused_call(0, 0))
    assert [(r.row, r.cta, r.launch, r.group) for r in records] == [
        (0, 0, 0, "score"), (0, 1, 0, "select"), (1, 0, 0, "short")]
    assert records[1].ns["pass1"] - records[1].ns["entry"] == 7800
    assert "pass2" not in records[1].ns, "a pass not reached has no stamp"
    two_pass = buffer_of([(3, 0, 1, {"entry": 7, "loaded": 9, "exit": 11}, {})])
    (second,) = decode_records(two_pass)
    assert (second.row, second.cta, second.launch, second.group) == (3, 0, 1, "select")


def test_a_split_clusters_stamps_keep_the_leader_the_selecting_cta() -> None:
    """cuda_family's GATHER split: every CTA of the cluster stamps handoff, bin0 and cand
    (the select is shared), the leader alone loaded (= its handoff), the passes and the
    output; the others exit after cand. The leader is the selecting CTA, the others score,
    and their bin0 and cand durations are their own."""
    base = 10**9
    leader = {"entry": 0, "q": 300, "scored": 2500, "handoff": 3000, "loaded": 3000, "bin0": 3400,
              "cand": 3900, "pass1": 4300, "output": 4700, "exit": 4700}
    other = {"entry": 50, "q": 350, "scored": 2800, "handoff": 3000, "bin0": 3400, "cand": 3900,
             "exit": 4000}
    buffer = buffer_of([(0, 0, 0, {k: base + v for k, v in leader.items()}, {}),
                        *((0, c, 0, {k: base + v for k, v in other.items()}, {}) for c in (1, 2, 3))])
    records = decode_records(buffer)
    assert [(r.cta, r.group) for r in records] == [(0, "select"), (1, "score"), (2, "score"), (3, "score")]
    rows = {(r["group"], r["phase"]): r for r in phase_table([records])}
    assert rows[("select", "loaded")]["dur_us"] == 0.0, "nothing gathered"
    assert rows[("select", "bin0")]["dur_us"] == 0.4 and rows[("select", "output")]["end_us"] == 4.7
    assert rows[("score", "bin0")]["ctas"] == 3 and rows[("score", "bin0")]["dur_us"] == 0.4
    assert rows[("score", "cand")]["dur_us"] == 0.5 and rows[("score", "exit")]["dur_us"] == 0.1
    assert ("score", "loaded") not in rows and ("score", "pass1") not in rows


def test_an_overflowing_grid_is_refused() -> None:
    table = np.zeros((RECORDS, 2 * SLOTS), dtype=np.int64)
    table[-1, 0] = 1
    with pytest.raises(RuntimeError, match="more CTAs"):
        decode_records(table.reshape(-1))


def test_the_phase_table_takes_medians_over_calls() -> None:
    calls = [decode_records(fused_call(shift, late))
             for shift, late in ((0, 0), (123_456, 1000), (7, 2000))]
    rows = {(r["group"], r["phase"]): r for r in phase_table(calls)}
    assert [g for g in GROUPS if any(k[0] == g for k in rows)] == list(GROUPS)
    # the selecting CTA's scoring ends 4000 + late ns after the call's first entry:
    # late 0, 1000, 2000 -> median 5000 ns
    sel = rows[("select", "scored")]
    assert sel["end_us"] == 5.0 and sel["end_max_us"] == 5.0
    assert sel["dur_us"] == 4.3 and sel["dur_cycles"] == 8600
    assert sel["ctas"] == 1 and sel["calls"] == 3
    assert rows[("select", "entry")]["dur_us"] == 0.2, "entry: its start after the first"
    assert rows[("select", "entry")]["dur_cycles"] is None
    assert rows[("select", "handoff")]["dur_us"] == 0.6
    assert rows[("select", "loaded")]["dur_us"] == 1.4
    assert rows[("select", "pass1")]["dur_us"] == 0.5
    assert rows[("select", "output")]["dur_us"] == 1.0, "since pass1: pass2, pass3 not reached"
    assert ("select", "pass2") not in rows
    assert rows[("score", "scored")]["end_us"] == 3.0
    assert rows[("score", "exit")]["dur_us"] == 0.0
    assert rows[("short", "exit")]["end_us"] == 0.9 and rows[("short", "exit")]["dur_us"] == 0.8
    summary = phase_summary(calls)
    assert summary["in_kernel_span_us"] == 10.0
    assert summary["timer_step_ns"] == 100.0
    assert summary["sm_ghz"] == 2.0
    text = format_phase_table(phase_table(calls))
    assert text.splitlines()[0].split() == ["group", "phase", "ctas", "end_us", "end_max_us",
                                            "dur_us", "dur_cycles"]
    assert any(line.split()[:2] == ["select", "cand"] for line in text.splitlines())


def test_the_median_and_the_latest_of_several_ctas() -> None:
    base = 10**9

    def scorer(cta: int, scored: int) -> tuple[int, int, int, dict[str, int], dict[str, int]]:
        return (0, cta, 0, {"entry": base, "q": base + 10, "scored": base + scored}, {})

    call = decode_records(buffer_of([scorer(0, 1000), scorer(1, 2000), scorer(2, 6000)]))
    (row,) = [r for r in phase_table([call]) if r["phase"] == "scored"]
    assert (row["ctas"], row["end_us"], row["end_max_us"], row["dur_us"]) == (3, 2.0, 6.0, 1.99)
    assert phase_table([[]]) == []
    empty: list[CtaRecord] = []
    assert phase_summary([empty])["in_kernel_span_us"] is None


class FakeSpans:
    def measure(self, calls: list[Any], before: Any) -> list[float | None]:
        for call in calls:
            before()
            call()
        return [0.012, None, 0.010]


def test_the_phase_probe_of_one_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """probe_phases' glue on the CPU: a fake run leaves one fused call's stamps in the
    buffer (and counts the zeroing between calls), a fake CUPTI gives the spans."""
    buffer = torch.zeros(RECORDS * 2 * SLOTS, dtype=torch.int64)
    stamps = torch.from_numpy(fused_call(0, 0))
    seen = []

    def run(*args: Any) -> None:
        seen.append(int(buffer.count_nonzero()))
        buffer.copy_(stamps)

    row: dict[str, Any] = {"subject": "wg", "shape": "d8a7", "batch_size": 4, "cupti_us": 9.5,
                           "passed": None, "params": {}}
    rows = probe_phases((run, buffer), {"q": 0}, [1], {}, [], lambda: None, "cold", FakeSpans(), 4, row)
    assert seen[0] == 0 and seen[-4:] == [0, 0, 0, 0], "zeroed before each stamped call"
    assert row["phase_cupti_us"] == pytest.approx(11.0) and row["cupti_us"] == 9.5
    assert row["in_kernel_span_us"] == 9.0 and row["sm_ghz"] == 2.0
    assert {r["kind"] for r in rows} == {"phase"}
    select = {r["phase"]: r for r in rows if r["group"] == "select"}
    assert select["output"]["end_us"] == 9.0 and select["output"]["calls"] == 4
    assert all(r["subject"] == "wg" and r["batch_size"] == 4 and "cupti_us" not in r for r in rows)
    out = capsys.readouterr().out
    assert "in-kernel span 9.0 us" in out and "select  loaded" in out
    buffer.zero_()
    empty = probe_phases((lambda *a: None, buffer), {}, [], {}, [], lambda: None, "cold", FakeSpans(),
                         2, dict(row))
    assert empty == [] and "no band CTA stamped" in capsys.readouterr().out


def test_each_cache_state_prepares_its_calls() -> None:
    """--l2: cold flushes, code flushes and then calls the other inputs, warm does nothing;
    an unknown state is refused."""
    done: list[str] = []
    for state, expected in (("cold", ["flush"]), ("code", ["flush", "other"]), ("warm", [])):
        done.clear()
        preparation(state, lambda: done.append("flush"), lambda: done.append("other"))()
        assert done == expected, state
    with pytest.raises(ValueError, match="one of cold, code, warm"):
        preparation("hot", None, None)


def test_the_code_state_times_the_first_inputs_with_stamps_of_their_call_alone(
        capsys: pytest.CaptureFixture[str]) -> None:
    """In the code state the phase build's untimed call on the other inputs comes after the
    flush and before the stamp buffer is zeroed: the stamps read are the timed call's."""
    buffer = torch.zeros(RECORDS * 2 * SLOTS, dtype=torch.int64)
    stamps = torch.from_numpy(fused_call(0, 0))
    order: list[str] = []

    def run(*args: Any) -> None:
        which = "first" if args[0] == "q1" else "other"
        order.append(f"{which}:{int(buffer.count_nonzero())}")
        buffer.copy_(stamps)

    row: dict[str, Any] = {"subject": "wg", "shape": "d8a7", "l2": "code", "cupti_us": 9.5,
                           "passed": None, "params": {}}
    rows = probe_phases((run, buffer), {"q": "q1"}, [], {"q": "q2"}, [],
                        lambda: order.append("flush"), "code", FakeSpans(), 2, row)
    stamped = order[-6:]  # the last two stamped calls, each after its flush and other call
    assert stamped[0] == "flush" and stamped[1].startswith("other") and stamped[2] == "first:0"
    assert stamped[3] == "flush" and stamped[4].startswith("other") and stamped[5] == "first:0"
    assert rows and all(r["l2"] == "code" for r in rows)
    capsys.readouterr()
