"""Shared chunks: the same bytes seen through two mappings, tensors at agreed offsets."""

from __future__ import annotations

import os

import torch

from evokernel.evaluate.shared import ALIGN, Chunk, Layout, TensorSpec


def test_layout_aligns_and_round_trips() -> None:
    layout = Layout(chunk=7)
    a = layout.add((3, 5), torch.float32)
    b = layout.add((2,), torch.float8_e4m3fn)
    c = layout.add((4, 4), torch.int64)
    assert [s.offset % ALIGN for s in (a, b, c)] == [0, 0, 0]
    assert b.offset >= a.offset + a.nbytes and c.offset >= b.offset + b.nbytes
    assert TensorSpec.from_json(c.to_json()) == c
    assert layout.size == c.offset + c.nbytes


def test_a_second_mapping_of_the_fd_sees_the_same_memory() -> None:
    layout = Layout(chunk=1)
    spec = layout.add((4, 8), torch.bfloat16)
    judge = Chunk.allocate(layout.size, torch.device("cpu"))
    other = Chunk.open(os.dup(judge.fd), judge.size, torch.device("cpu"))
    mine, theirs = judge.tensor(spec), other.tensor(spec)
    mine.copy_(torch.arange(32, dtype=torch.bfloat16).view(4, 8))
    assert torch.equal(theirs, mine)
    theirs.fill_(-1)
    assert bool((mine == -1).all())
    other.close()
    judge.close()


def test_a_spec_past_the_end_is_refused() -> None:
    chunk = Chunk.allocate(1024, torch.device("cpu"))
    try:
        chunk.tensor(TensorSpec(0, 1000, (100,), "float32"))
    except ValueError as exc:
        assert "past the end" in str(exc)
    else:
        raise AssertionError("expected a ValueError")
    finally:
        chunk.close()
