"""The dsa_topk checker: the upstream evaluator's cases, plus ties and empty rows."""

from __future__ import annotations

import torch

from evokernel.evaluate.check import check_outputs, default_check
from evokernel.workload import load_workload

wl = load_workload("dsa_topk")
AXES = {**wl.definition.const_axes(), "batch_size": 3, "max_num_pages": 45, "num_pages": 300}


def case(seed: int = 0):  # type: ignore[no-untyped-def]
    inputs = wl._inputs_module.make_inputs(AXES, seed, "cpu")
    return inputs, wl.reference(*inputs.values())


def test_correct_passes() -> None:
    inputs, ref = case()
    verdict = check_outputs(wl, ref, ref, inputs)
    assert verdict.ok and verdict.stats["max_abs_error"] == 0.0


def test_shuffled_passes() -> None:
    inputs, (ref,) = case()
    shuffled = ref[:, torch.randperm(ref.shape[1])]
    assert check_outputs(wl, (shuffled,), (ref,), inputs).ok


def test_wrong_selection_fails() -> None:
    inputs, (ref,) = case()
    wrong = ref.clone()
    row = 0
    length = int(inputs["seq_lens"][row])
    ids = inputs["block_table"][row].long()[: (length + 63) // 64]
    all_ids = (ids[:, None] * 64 + torch.arange(64)).reshape(-1)[:length]
    unused = all_ids[~torch.isin(all_ids, ref[row].long())]
    assert unused.numel() > 0
    wrong[row, :16] = unused[:16].int()  # swap the best 16 for unchosen (worse) tokens
    verdict = check_outputs(wl, (wrong,), (ref,), inputs)
    assert not verdict.ok and "scores differ" in verdict.message


def test_duplicate_fails() -> None:
    inputs, (ref,) = case()
    dup = ref.clone()
    dup[0, 1] = dup[0, 0]
    assert "duplicate" in check_outputs(wl, (dup,), (ref,), inputs).message


def test_out_of_range_fails() -> None:
    inputs, (ref,) = case()
    bad = ref.clone()
    bad[0, 0] = 300 * 64 + 5  # past the end of the cache
    assert "not reachable" in check_outputs(wl, (bad,), (ref,), inputs).message


def test_unreachable_page_fails() -> None:
    inputs, (ref,) = case()
    used = set(inputs["block_table"].reshape(-1).tolist())
    foreign = next(p for p in range(300) if p not in used)
    bad = ref.clone()
    bad[0, 0] = foreign * 64
    assert "not reachable" in check_outputs(wl, (bad,), (ref,), inputs).message


def test_token_past_seq_len_fails() -> None:
    inputs, (_ref,) = case()
    row = 1
    inputs["seq_lens"][row] = 70  # 1 full page + 6 tokens; token 64+10 exists but is past the length
    ref2 = wl.reference(*inputs.values())[0]
    bad = ref2.clone()
    page1 = int(inputs["block_table"][row, 1])
    bad[row, 0] = page1 * 64 + 10
    assert "not reachable" in check_outputs(wl, (bad,), (ref2,), inputs).message


def test_missing_or_extra_entries_fail() -> None:
    inputs, (ref,) = case()
    short = ref.clone()
    short[0, -1] = -1
    assert "valid indices" in check_outputs(wl, (short,), (ref,), inputs).message
    garbage = ref.clone()
    garbage[0, 5] = -7
    assert "other than -1" in check_outputs(wl, (garbage,), (ref,), inputs).message


def test_ties_any_choice_passes() -> None:
    inputs, _ = case()
    row = 0
    # Make every token of row 0 identical: all scores tie, any 2048 of them are right.
    cache = inputs["k_index_cache_fp8"].view(torch.uint8).reshape(300, -1)
    pages = inputs["block_table"][row].long()
    first = cache[pages[0]].clone()
    same = first.clone()
    same[: 64 * 128] = first[:128].repeat(64)  # token 0's values for every token
    same[64 * 128 :] = first[64 * 128 : 64 * 128 + 4].repeat(64)  # and its scale
    cache[pages] = same
    (ref,) = wl.reference(*inputs.values())
    length = int(inputs["seq_lens"][row])
    all_ids = (pages[:, None] * 64 + torch.arange(64)).reshape(-1)[:length]
    other = ref.clone()
    other[row] = all_ids[-2048:].int()  # the last 2048 instead of whatever topk picked
    assert check_outputs(wl, (other,), (ref,), inputs).ok


def test_empty_row() -> None:
    inputs, _ = case()
    inputs["seq_lens"][2] = 0
    (ref,) = wl.reference(*inputs.values())
    assert bool((ref[2] == -1).all())
    assert check_outputs(wl, (ref,), (ref,), inputs).ok
    bad = ref.clone()
    bad[2, 0] = int(inputs["block_table"][2, 0]) * 64
    assert "0 valid" in check_outputs(wl, (bad,), (ref,), inputs).message or not check_outputs(wl,
        (bad,), (ref,), inputs
    ).ok


def test_shape_and_dtype() -> None:
    inputs, (ref,) = case()
    assert not check_outputs(wl, (ref.long(),), (ref,), inputs).ok
    assert not check_outputs(wl, (ref[:, :100],), (ref,), inputs).ok


def test_default_check_rule() -> None:
    ref = torch.tensor([1.0, 100.0, 0.0])
    ok = torch.tensor([1.005, 100.9, 0.009])  # within atol or within rtol
    assert default_check([ok], [ref], {}, names=["o"], atol=0.01, rtol=0.01).ok
    bad = torch.tensor([1.05, 100.0, 0.0])  # off by 0.05 abs and 5% rel
    assert "differ" in default_check([bad], [ref], {}, names=["o"], atol=0.01, rtol=0.01).message
    nan = torch.tensor([float("nan"), 100.0, 0.0])
    assert "NaN" in default_check([nan], [ref], {}, names=["o"], atol=0.01, rtol=0.01).message
    count = default_check([ok], [ref, ref], {}, names=["o", "p"], atol=0.01, rtol=0.01)
    assert not count.ok and "expected 2 outputs" in count.message


def test_a_right_answer_is_judged_with_one_host_read_and_every_rule_still_named(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The judge checks thousands of answers per candidate: where all is right, the
    rule's flags and statistics reach the host together (one device sync on a GPU); a
    broken rule is still named, the first in the rule's order."""
    from tests.evaluate.test_bank import HostReads

    inputs, (ref,) = case(3)
    reads = HostReads(monkeypatch)
    verdict = check_outputs(wl, (ref.clone(),), (ref,), inputs)
    assert verdict.ok and reads.count == 1
    monkeypatch.undo()
    negative, duplicated = ref.clone(), ref.clone()
    negative[1, 0], duplicated[2, 1] = -7, duplicated[2, 0]
    negative[2, 1] = negative[2, 0]  # a later rule broken too: the first is named
    assert check_outputs(wl, (negative,), (ref,), inputs).message == (
        "output row 1: negative index other than -1")
    assert check_outputs(wl, (duplicated,), (ref,), inputs).message == "output row 2: duplicate indices"
