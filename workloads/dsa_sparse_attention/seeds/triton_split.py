"""DSA sparse attention in Triton: split over the 2048 indexed tokens, then combine.

``split_kernel`` runs one program per (query token, head group, split). A program
loads the group's queries once, then walks its split of the index row BLOCK_N
tokens at a time: it gathers the latent and rotary rows those tokens name (-1 slots
load zeros and are masked out of the softmax), computes the logits on the tensor
cores (tl.dot; a group of fewer than 16 heads fills the rest of the 16 rows with
zero queries), and keeps a base-2 online softmax. It writes the split's normalised
output and log-sum-exp (the partials: float32, or bfloat16 with PARTIALS bfloat16).
The splits of each (token, head) are then weighed by their log-sum-exp into the
bf16 output and the final lse:

* COMBINE fused (one launch per call): each program, after storing its partials,
  counts itself in on a per-(token, head group) counter: ``tl.debug_barrier()`` (all
  of the program's stores precede the atomic in the CTA), then one acq_rel atomic add
  at gpu scope, which releases the program's partials and acquires those of every
  earlier arrival. The program that reads ``NUM_SPLITS - 1`` is the last: it merges
  the splits (loads with ``.cg``: from L2, never a stale L1 line), writes the outputs
  and sets the counter back to 0. Counters are zeroed once, when the workspace is
  allocated, and are zero between calls: no memset launch, graph replays work. The
  workspace (partials and counters) is kept per device; it grows eagerly (never under
  graph capture), and old buffers are kept alive since a captured graph may use them.
  Calls must not run concurrently on two streams.
* COMBINE spread (one launch per call; many splits for few tokens): every program
  merges. After storing its partials and the same barrier, a program adds
  ``EPOCH / NUM_SPLITS`` to its (token, head group) counter with one acq_rel atomic
  (``old`` is the value before), then spins on acquire atomic reads (adding 0) until
  the counter has grown by a whole EPOCH past ``old - old % EPOCH``: every split of
  its token and group has arrived. It then merges one slice of the 512 output dims
  (``split * SLICE`` onwards, SLICE = 512 / NUM_SPLITS) for all of its group's
  heads; split 0 also writes the group's lse. A call adds exactly EPOCH to each
  counter it uses, so counters stay multiples of EPOCH between calls whatever the
  split count (a power of two dividing EPOCH), only grow (int32 wrap-around is
  harmless: EPOCH divides 2**32 and only differences are compared), and never need a
  reset launch: graph replays work, no host sync. **Waiting is safe only if every
  program of the grid is resident at once**: the host caps the grid at one wave,
  the device's SM count times RESIDENT_PER_SM (1, a bound that holds whenever the
  kernel can launch at all), by lowering the split count (``spread_splits``); with
  COOPERATIVE 1 the launch is also cooperative, so the driver refuses a grid that
  could not be co-resident instead of letting it hang. Only a cooperative launch may
  assume more (knob RESIDENT_PER_SM 2: two programs an SM, twice the splits for 2 to 8
  tokens, where one program of 4 warps an SM hides little of the gathers' latency; a
  grid that cannot be co-resident is then the driver's error, never a hang). It assumes no other kernel
  holds SMs forever (a concurrent kernel only delays the wave) and, like fused, no
  concurrent call on another stream with the same workspace. Under TRITON_INTERPRET
  (programs run one after another, a spin would never end) the split kernel only
  arrives, and a second launch, ``spread_merge_kernel``, runs the same slice merge.
* COMBINE separate: ``combine_kernel`` does it, a second launch.

With one split the first kernel writes the final outputs itself and nothing merges.
A split shorter than BLOCK_N gathers in steps of its own length (a power of two, at
least 16) instead.

Every launch is decided by shapes alone (no host sync): the function can be
captured in a CUDA graph. ``sm_scale`` is read on the device.

Knobs (see triton_split.yaml): COMBINE (fused, separate or spread), NUM_SPLITS (0 =
the fewest splits, a power of two, that give TARGET_PROGRAMS programs, at most
MAX_SPLITS; spread: the most that fit in min(TARGET_PROGRAMS, one wave)),
HEADS_PER_PROGRAM (16 or 8), BLOCK_N (tokens per step), PARTIALS (float32 or
bfloat16), num_warps, num_stages (software pipelining of the gathers), COOPERATIVE,
RESIDENT_PER_SM (spread's wave: SMs times 1 or, cooperative only, 2). A call of at
most FEW_TOKENS tokens takes FEW_HEADS_PER_PROGRAM, FEW_BLOCK_N, FEW_NUM_SPLITS,
FEW_TARGET_PROGRAMS, FEW_num_warps and FEW_num_stages instead (a second set of the
kernel's specialisations; the partials' dtype, the merge and the wave are shared).

Under TRITON_INTERPRET=1 (CPU) the dots take float32 operands: the interpreter keeps
bf16 as raw 16-bit integers and its tl.dot multiplies those patterns.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

HEADS = 16
CKV = 512
KPE = 64
LOG2E = tl.constexpr(1.4426950408889634)
EPOCH = 1024
"""What one call adds to each spread counter it uses (a power of two, at least the
largest split count): counters stay multiples of it between calls."""
RESIDENT_PER_SM = 1
"""Programs of the split kernel assumed resident per SM when capping a spread grid, by
default: one always is if the kernel launches at all (its registers and shared memory
fit). The knob of the same name may raise it for cooperative launches only."""
INTERPRETER_SMS = 132
"""The SM count assumed under TRITON_INTERPRET (an H100/H200 SXM), for split choices."""
MIN_BLOCK = 16
"""The smallest gather step (tl.dot needs 16)."""


@triton.jit
def mma(a, b, acc, DOT_F32: tl.constexpr):
    """acc + a @ b on the tensor cores in bf16, or in float32 (see DOT_F32)."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a.to(tl.bfloat16), b, acc)


@triton.jit
def split_kernel(
    q_nope_ptr,  # bf16 [T, 16, 512]
    q_pe_ptr,  # bf16 [T, 16, 64]
    ckv_ptr,  # bf16 [num_pages * 64, 512]
    kpe_ptr,  # bf16 [num_pages * 64, 64]
    idx_ptr,  # int32 [T, TOPK]
    scale_ptr,  # float32 [1]
    part_out_ptr,  # float32 [T, 16, NUM_SPLITS, 512]  (unused when NUM_SPLITS == 1)
    part_lse_ptr,  # float32 [T, 16, NUM_SPLITS]
    out_ptr,  # bf16 [T, 16, 512]  (written here only when NUM_SPLITS == 1)
    lse_ptr,  # float32 [T, 16]
    count_ptr,  # int32 [T * 16 / HEADS_PER_PROGRAM], zero between calls (FUSED only)
    TOPK: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    ROWS: tl.constexpr,  # max(16, HEADS_PER_PROGRAM): tl.dot needs 16 rows
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT_F32: tl.constexpr,  # only under TRITON_INTERPRET, whose bf16 dot is wrong
    FUSED: tl.constexpr,  # the last program of a (token, head group) merges the splits
    SPLITS_POW2: tl.constexpr,
    SPREAD: tl.constexpr = False,  # every program merges a slice (COMBINE spread)
    SPREAD_WAIT: tl.constexpr = True,  # False under TRITON_INTERPRET: arrive, do not wait
    SLICE: tl.constexpr = 1,  # output dims each program merges (SPREAD)
    EPOCH_: tl.constexpr = 1024,  # what a call adds to a counter (SPREAD)
):
    token = tl.program_id(0)
    group = tl.program_id(1)
    split = tl.program_id(2)
    CHUNK: tl.constexpr = (TOPK + NUM_SPLITS - 1) // NUM_SPLITS

    rows = tl.arange(0, ROWS)
    row_ok = rows < HEADS_PER_PROGRAM
    heads = group * HEADS_PER_PROGRAM + rows
    dims = tl.arange(0, 512)
    rope = tl.arange(0, 64)
    q_nope = tl.load(
        q_nope_ptr + (token * 16 + heads[:, None]) * 512 + dims[None, :],
        mask=row_ok[:, None], other=0.0,
    )
    q_pe = tl.load(
        q_pe_ptr + (token * 16 + heads[:, None]) * 64 + rope[None, :],
        mask=row_ok[:, None], other=0.0,
    )
    scale = tl.load(scale_ptr) * LOG2E  # logits in base 2

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, 512], tl.float32)
    first = split * CHUNK
    last = tl.minimum(first + CHUNK, TOPK)
    for step in tl.range(0, CHUNK, BLOCK_N, num_stages=NUM_STAGES):
        slots = first + step + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_ptr + token * TOPK + slots, mask=slots < last, other=-1)
        ok = idx >= 0
        row = tl.where(ok, idx, 0).to(tl.int64)
        latent = tl.load(ckv_ptr + row[:, None] * 512 + dims[None, :], mask=ok[:, None], other=0.0)
        rotary = tl.load(kpe_ptr + row[:, None] * 64 + rope[None, :], mask=ok[:, None], other=0.0)
        logits = tl.zeros([ROWS, BLOCK_N], tl.float32)
        logits = mma(q_nope, tl.trans(latent), logits, DOT_F32)
        logits = mma(q_pe, tl.trans(rotary), logits, DOT_F32)
        logits = tl.where(ok[None, :], logits * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        m_base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_base)
        p = tl.exp2(logits - m_base[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc = mma(p, latent, acc, DOT_F32)
        m_i = m_new

    has = l_i > 0.0
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + (token * 16 + heads[:, None]) * 512 + dims[None, :],
                 out.to(tl.bfloat16), mask=row_ok[:, None])
        tl.store(lse_ptr + token * 16 + heads, lse, mask=row_ok)
    else:
        base = (token * 16 + heads) * NUM_SPLITS + split
        tl.store(part_out_ptr + base[:, None] * 512 + dims[None, :],
                 out.to(part_out_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.store(part_lse_ptr + base, lse, mask=row_ok)
        if SPREAD:
            counter = count_ptr + token * tl.num_programs(1) + group
            tl.debug_barrier()  # every thread's partial stores come before the release
            old = tl.atomic_add(counter, EPOCH_ // NUM_SPLITS, sem="acq_rel", scope="gpu")
            if SPREAD_WAIT:
                start = old - (old & (EPOCH_ - 1))  # the counter before this call's arrivals
                seen = old + EPOCH_ // NUM_SPLITS
                while seen - start < EPOCH_:  # a difference: int32 wrap-around is harmless
                    seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
                merge_slice(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, token, group, split,
                            HEADS_PER_PROGRAM, NUM_SPLITS, SPLITS_POW2, SLICE)
        elif FUSED:
            counter = count_ptr + token * tl.num_programs(1) + group
            tl.debug_barrier()  # every thread's partial stores come before the release
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == NUM_SPLITS - 1:
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # zero for the next call
                merge_splits(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, token, heads, row_ok,
                             NUM_SPLITS, SPLITS_POW2, ROWS)


@triton.jit
def merge_splits(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, token, heads, row_ok,
                 NUM_SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr, ROWS: tl.constexpr):
    """The fused merge: every split of this program's heads, weighed by its lse."""
    dims = tl.arange(0, 512)
    splits = tl.arange(0, SPLITS_POW2)
    pairs = token * 16 + heads
    lses = tl.load(part_lse_ptr + pairs[:, None] * NUM_SPLITS + splits[None, :],
                   mask=row_ok[:, None] & (splits[None, :] < NUM_SPLITS), other=float("-inf"),
                   cache_modifier=".cg")
    peak = tl.max(lses, axis=1)
    base = tl.where(peak == float("-inf"), 0.0, peak)
    total = tl.sum(tl.exp2(lses - base[:, None]), axis=1)  # 0 where every split is empty
    acc = tl.zeros([ROWS, 512], tl.float32)
    for split in range(NUM_SPLITS):
        lse_s = tl.load(part_lse_ptr + pairs * NUM_SPLITS + split, mask=row_ok,
                        other=float("-inf"), cache_modifier=".cg")
        weight = tl.exp2(lse_s - base)  # 0 for an empty split: its partial is not read
        part = tl.load(part_out_ptr + (pairs[:, None] * NUM_SPLITS + split) * 512 + dims[None, :],
                       mask=(row_ok & (weight > 0.0))[:, None], other=0.0, cache_modifier=".cg")
        acc += part.to(tl.float32) * weight[:, None]
    has = total > 0.0
    out = acc / tl.where(has, total, 1.0)[:, None]
    tl.store(out_ptr + pairs[:, None] * 512 + dims[None, :], out.to(tl.bfloat16), mask=row_ok[:, None])
    tl.store(lse_ptr + pairs, tl.where(has, base + tl.log2(tl.where(has, total, 1.0)), float("-inf")),
             mask=row_ok)


@triton.jit
def merge_slice(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, token, group, split,
                HEADS_PER_PROGRAM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                SPLITS_POW2: tl.constexpr, SLICE: tl.constexpr):
    """The spread merge: output dims ``split * SLICE`` onwards (SLICE of them, those
    below 512) of this group's heads, from every split's partials, in one [splits,
    heads, SLICE] tile read from L2 (.cg); split 0 also writes the heads' lse."""
    heads = group * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
    pairs = token * 16 + heads
    splits = tl.arange(0, SPLITS_POW2)
    split_ok = splits < NUM_SPLITS
    dims = split * SLICE + tl.arange(0, SLICE)
    dim_ok = dims < 512
    lses = tl.load(part_lse_ptr + pairs[None, :] * NUM_SPLITS + splits[:, None],
                   mask=split_ok[:, None], other=float("-inf"), cache_modifier=".cg")  # [S, H]
    peak = tl.max(lses, axis=0)
    base = tl.where(peak == float("-inf"), 0.0, peak)
    weight = tl.exp2(lses - base[None, :])  # 0 for an empty split: its partial is not read
    total = tl.sum(weight, axis=0)
    offsets = (pairs[None, :, None] * NUM_SPLITS + splits[:, None, None]) * 512 + dims[None, None, :]
    part = tl.load(part_out_ptr + offsets, mask=(weight > 0.0)[:, :, None] & dim_ok[None, None, :],
                   other=0.0, cache_modifier=".cg")
    acc = tl.sum(part.to(tl.float32) * weight[:, :, None], axis=0)  # [H, SLICE]
    has = total > 0.0
    out = acc / tl.where(has, total, 1.0)[:, None]
    tl.store(out_ptr + pairs[:, None] * 512 + dims[None, :], out.to(tl.bfloat16),
             mask=dim_ok[None, :])
    tl.store(lse_ptr + pairs, tl.where(has, base + tl.log2(tl.where(has, total, 1.0)), float("-inf")),
             mask=(heads >= 0) & (split == 0))


@triton.jit
def spread_merge_kernel(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr,
                        HEADS_PER_PROGRAM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                        SPLITS_POW2: tl.constexpr, SLICE: tl.constexpr):
    """The spread merge as a launch of its own: only under TRITON_INTERPRET, where the
    split kernel cannot wait for its peers."""
    merge_slice(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, tl.program_id(0), tl.program_id(1),
                tl.program_id(2), HEADS_PER_PROGRAM, NUM_SPLITS, SPLITS_POW2, SLICE)


@triton.jit
def combine_kernel(
    part_out_ptr,  # float32 [T, 16, NUM_SPLITS, 512]
    part_lse_ptr,  # float32 [T, 16, NUM_SPLITS]
    out_ptr,  # bf16 [T, 16, 512]
    lse_ptr,  # float32 [T, 16]
    NUM_SPLITS: tl.constexpr,
    SPLITS_POW2: tl.constexpr,
):
    pair = tl.program_id(0)  # token * 16 + head
    splits = tl.arange(0, SPLITS_POW2)
    split_ok = splits < NUM_SPLITS
    lse = tl.load(part_lse_ptr + pair * NUM_SPLITS + splits, mask=split_ok, other=float("-inf"))
    peak = tl.max(lse, axis=0)
    base = tl.where(peak == float("-inf"), 0.0, peak)
    weight = tl.exp2(lse - base)  # 0 for an empty split
    total = tl.sum(weight, axis=0)
    dims = tl.arange(0, 512)
    parts = tl.load(part_out_ptr + (pair * NUM_SPLITS + splits[:, None]) * 512 + dims[None, :],
                    mask=split_ok[:, None], other=0.0).to(tl.float32)
    has = total > 0.0
    out = tl.sum(parts * weight[:, None], axis=0) / tl.where(has, total, 1.0)
    tl.store(out_ptr + pair * 512 + dims, out.to(tl.bfloat16))
    tl.store(lse_ptr + pair, tl.where(has, base + tl.log2(tl.where(has, total, 1.0)), float("-inf")))


def choose_splits(
    tokens: int, groups: int, topk: int, block_n: int, target: int, cap: int | None = None
) -> int:
    """The fewest power-of-two splits giving ``target`` programs, at most one per block
    and at most ``cap``."""
    splits = 1
    most = max(1, topk // block_n)
    if cap is not None:
        most = min(most, cap)
    while tokens * groups * splits < target and splits * 2 <= most:
        splits *= 2
    return splits


def spread_splits(tokens: int, groups: int, topk: int, wave: int, target: int, requested: int = 0) -> int:
    """COMBINE spread: the most power-of-two splits (at most ``requested`` when given,
    at most one per MIN_BLOCK slots) whose ``tokens * groups * splits`` programs fit in
    ``min(target, wave)``. The grid never exceeds one wave unless the split count is 1
    (then nothing waits): the precondition of the spin-wait."""
    limit = min(target, wave) if target > 0 else wave
    most = max(1, topk // MIN_BLOCK)
    if requested > 0:
        most = min(most, requested)
    splits = 1
    while splits * 2 <= most and tokens * groups * splits * 2 <= limit:
        splits *= 2
    return splits


def step_size(block_n: int, topk: int, splits: int) -> int:
    """The gather step: BLOCK_N, or the split's length rounded up to a power of two
    (at least MIN_BLOCK) where that is shorter."""
    chunk = -(-topk // splits)
    return max(MIN_BLOCK, min(block_n, triton.next_power_of_2(chunk)))


def wave_size(device: torch.device, resident: int = RESIDENT_PER_SM) -> int:
    """Programs resident at once: SMs times ``resident`` (sure for 1; for more, only a
    cooperative launch makes it sure, by failing where it does not hold). Meta tensors (a
    warm ahead, evokernel/evaluate/triton_warm.py) stand for the current CUDA device."""
    if device.type == "meta" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        return INTERPRETER_SMS * resident
    return torch.cuda.get_device_properties(device).multi_processor_count * resident


class Workspace:
    """Per-device partials and arrival counters of the fused and spread merges (see the
    module doc)."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self._dtype = dtype
        self._by_device: dict[Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._retired: list[tuple[torch.Tensor, ...]] = []

    def get(
        self, device: torch.device, tokens: int, groups: int, splits: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(part_out, part_lse, counters) large enough for this call."""
        pairs = tokens * HEADS * splits
        held = self._by_device.get(device)
        if (held is None or held[1].numel() < pairs or held[2].numel() < tokens * groups):
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("triton_split: the workspace must grow outside graph capture; "
                                   "call once eagerly with this batch size first")
            have = held[1].numel() if held is not None else 0
            capacity = max(pairs, 2 * have, 16 * HEADS * 16)
            counters = max(tokens * groups, 2 * held[2].numel() if held is not None else 0, 64)
            if held is not None:
                self._retired.append(held)
            held = (torch.empty(capacity * CKV, dtype=self._dtype, device=device),
                    torch.empty(capacity, dtype=torch.float32, device=device),
                    torch.zeros(counters, dtype=torch.int32, device=device))
            self._by_device[device] = held
        return held


COMBINES = ("fused", "separate", "spread")
PARTIAL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


BAND_DEFAULTS = {"HEADS_PER_PROGRAM": 16, "BLOCK_N": 32, "NUM_SPLITS": 0, "TARGET_PROGRAMS": 264,
                 "num_warps": 4, "num_stages": 2}
"""The parameters a token band sets on its own (``FEW_`` + name for the few-token band),
and their values where a caller gives none (the manifest's defaults may differ)."""
FEW = "FEW_"


def band_params(params: dict, prefix: str = "") -> dict[str, int]:
    """One band's values of BAND_DEFAULTS' parameters: ``prefix + name`` where given, else
    the plain parameter, else its default."""
    return {name: int(params.get(prefix + name, params.get(name, default)))
            for name, default in BAND_DEFAULTS.items()}


def build(params: dict, kernels: object = None):
    del kernels
    combine = str(params.get("COMBINE", "spread"))
    if combine not in COMBINES:
        raise ValueError(f"COMBINE {combine!r} is not one of {COMBINES}")
    fused, spread = combine == "fused", combine == "spread"
    cap = int(params.get("MAX_SPLITS", 16))
    few_tokens = int(params.get("FEW_TOKENS", 0))
    bands = {False: band_params(params), True: band_params(params, FEW)}
    for band in bands.values():
        if HEADS % band["HEADS_PER_PROGRAM"]:
            raise ValueError(f"HEADS_PER_PROGRAM {band['HEADS_PER_PROGRAM']} does not divide {HEADS}")
        if spread and band["NUM_SPLITS"] & (band["NUM_SPLITS"] - 1):
            raise ValueError(f"COMBINE spread needs a power-of-two NUM_SPLITS, not {band['NUM_SPLITS']}")
    cooperative = bool(int(params.get("COOPERATIVE", 1)))
    resident = int(params.get("RESIDENT_PER_SM", RESIDENT_PER_SM))
    if resident > RESIDENT_PER_SM and not (spread and cooperative):
        raise ValueError(f"RESIDENT_PER_SM {resident} needs COMBINE spread with COOPERATIVE 1: "
                         "only a cooperative launch refuses a grid that cannot be co-resident")
    partials = PARTIAL_DTYPES[str(params.get("PARTIALS", "float32"))]
    workspace = Workspace(partials)
    # Triton's CPU interpreter multiplies bf16 operands as their raw 16-bit patterns,
    # so under it the dots run in float32; on a GPU they run in bf16.
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    launch_options = {} if interpreted or not (spread and cooperative) else {"launch_cooperative_grid": True}

    def run(
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        sparse_indices: torch.Tensor,
        sm_scale: torch.Tensor,
        output: torch.Tensor,
        lse: torch.Tensor,
    ) -> None:
        tokens, topk = sparse_indices.shape
        if tokens == 0:
            return
        band = bands[tokens <= few_tokens]
        heads_per_program, block_n, num_splits = band["HEADS_PER_PROGRAM"], band["BLOCK_N"], band["NUM_SPLITS"]
        target, num_warps, num_stages = band["TARGET_PROGRAMS"], band["num_warps"], band["num_stages"]
        groups = HEADS // heads_per_program
        if spread:
            splits = spread_splits(tokens, groups, topk, wave_size(output.device, resident), target, num_splits)
        else:
            splits = num_splits or choose_splits(tokens, groups, topk, block_n, target, cap)
        counters: torch.Tensor = sparse_indices  # not touched unless fused/spread with several splits
        if splits > 1 and (fused or spread):
            part_out, part_lse, counters = workspace.get(output.device, tokens, groups, splits)
        elif splits > 1:
            part_out = torch.empty(tokens, HEADS, splits, CKV, device=output.device, dtype=partials)
            part_lse = torch.empty(tokens, HEADS, splits, device=output.device,
                                   dtype=torch.float32)
        else:
            part_out = part_lse = lse  # not touched on the one-split path
        pow2 = triton.next_power_of_2(splits)
        slice_ = triton.next_power_of_2(-(-CKV // splits))
        split_kernel[(tokens, groups, splits)](
            q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale,
            part_out, part_lse, output, lse, counters,
            TOPK=topk, NUM_SPLITS=splits, HEADS_PER_PROGRAM=heads_per_program,
            ROWS=max(16, heads_per_program), BLOCK_N=step_size(block_n, topk, splits),
            NUM_STAGES=num_stages, DOT_F32=interpreted, FUSED=fused, SPLITS_POW2=pow2,
            SPREAD=spread and splits > 1, SPREAD_WAIT=not interpreted, SLICE=slice_,
            EPOCH_=EPOCH, num_warps=num_warps, **(launch_options if splits > 1 else {}),
        )
        if splits > 1 and spread and interpreted:
            spread_merge_kernel[(tokens, groups, splits)](
                part_out, part_lse, output, lse, HEADS_PER_PROGRAM=heads_per_program,
                NUM_SPLITS=splits, SPLITS_POW2=pow2, SLICE=slice_, num_warps=4,
            )
        if splits > 1 and not (fused or spread):
            combine_kernel[(tokens * HEADS,)](
                part_out, part_lse, output, lse,
                NUM_SPLITS=splits, SPLITS_POW2=pow2, num_warps=4,
            )

    return run
