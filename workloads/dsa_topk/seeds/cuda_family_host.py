"""Host side of the cuda_family candidate: picks a kernel from the static shapes, launches it.

Only shapes steer the launches (no host synchronisation, no host read of device data),
so ``run`` can be captured in a CUDA graph:

* ``max_pages * 64 <= topk``: no row can need scores; ``pt_topk`` writes every valid
  token's global id and pads with -1 (one launch).
* otherwise the band of (max_pages, batch) picks one of ``ms_topk``, ``ml_topk``,
  ``ls_topk``, ``ll_topk``, each compiled with its band's parameters; ``fused`` and
  ``cluster`` are one launch, ``two_pass`` two launches of the same kernel (phase 0
  scores, phase 1 selects).

Workspace: a key buffer per call (``torch.empty``, no launch) and, per device, a
per-row arrival counter and a per-row histogram that start at zero and that the kernels
leave at zero (the selecting CTA resets them), so no call has to clear them.

``smem_layout`` mirrors ``make_layout`` in cuda_family.cu; the kernel traps if the
host ever gives less shared memory than its own layout needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

PAGE_TOKENS = 64
PAGE_BYTES = 8448
SIMT_TILE_BYTES = 1024
KEY_BYTES = 8192
WG_STAGE_BYTES = 9216
"""A page staged for wgmma: 8192 key bytes and 256 of scales, padded to 1 KiB."""
WG_ALIGN = 1024
"""Slack before the wgmma region, whose 128-byte swizzle atoms start on 1 KiB boundaries."""
QT_BYTES = 128 * 65 * 4
HIST_STRIDE = 4096
XCHG_WORDS = 7
"""GATHER split: split_select's words (bin0, above0, its count, two slot counters, two first slots)."""
SMEM_LIMIT = 232448 - 1024
"""Dynamic shared memory a CTA may ask for: 227 KiB less 1 KiB kept for static use."""

BANDS = ("MS", "ML", "LS", "LL")
MID_MAX_PAGES = 64
LONG_MAX_PAGES = 128
SMALL_BATCH = 16
BAND_MAX_PAGES = {"MS": MID_MAX_PAGES, "ML": MID_MAX_PAGES, "LS": LONG_MAX_PAGES, "LL": LONG_MAX_PAGES}


def band_of(batch: int, max_pages: int, topk: int) -> str:
    """``PT`` when no row can exceed ``topk`` tokens, else the scoring band of the shape."""
    if max_pages * PAGE_TOKENS <= topk:
        return "PT"
    if max_pages > LONG_MAX_PAGES:
        raise ValueError(f"max_num_pages {max_pages} is outside the cuda_family range "
                         f"(at most {LONG_MAX_PAGES} pages per row)")
    size = "S" if batch <= SMALL_BATCH else "L"
    return ("M" if max_pages <= MID_MAX_PAGES else "L") + size


@dataclass(frozen=True)
class BandConfig:
    """The parameters of one scoring band (the manifest's ``<BAND>_*`` values)."""

    mode: str
    score: str
    load: str
    stages: int
    swizzle: int
    select: str
    radix_bits: int
    hist: str
    short: str
    early: int  # wgmma: the row's loads issued together (no launch or layout change)
    slices: int  # wgmma: K slices in flight per tensor-core wait (registers only)
    gather: str  # cluster radix: the leader gathers the keys, or the cluster splits the select
    digit: str  # radix: the first digit from the key's top bits, or linear over the row's span
    compact: str  # radix: output slots by shared atomics or by a prefix sum
    handoff: str  # fused: the row's keys ordered by fences or by an acquire-release ticket
    ctas: int
    warps: int

    @classmethod
    def of(cls, params: Mapping[str, Any], band: str) -> BandConfig:
        def get(name: str) -> Any:
            key = f"{band}_{name}"
            if key not in params:
                raise KeyError(f"cuda_family needs parameter {key}")
            return params[key]

        return cls(
            mode=str(get("MODE")), score=str(get("SCORE")), load=str(get("LOAD")),
            stages=int(get("STAGES")), swizzle=int(get("SWIZZLE")), select=str(get("SELECT")),
            radix_bits=int(get("RADIX_BITS")), hist=str(get("HIST")), short=str(get("SHORT")),
            early=int(get("EARLY")), slices=int(get("SLICES")), gather=str(get("GATHER")),
            digit=str(get("DIGIT")), compact=str(get("COMPACT")), handoff=str(get("HANDOFF")),
            ctas=int(get("CTAS")), warps=int(get("WARPS")),
        )

    @property
    def threads(self) -> int:
        return 32 * self.warps


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


def smem_layout(cfg: BandConfig, max_pages: int) -> dict[str, int]:
    """Byte offset of each dynamic shared-memory region, and ``total`` (make_layout)."""
    slots = max_pages * PAGE_TOKENS
    staged = cfg.load != "ldg"
    simt = cfg.score == "simt"
    radix = cfg.select == "radix"
    if cfg.score == "wgmma":  # slack to align, q, then each warpgroup's stages
        stage = WG_ALIGN + KEY_BYTES + (cfg.warps // 4) * cfg.stages * WG_STAGE_BYTES
    else:
        stage = (cfg.warps * cfg.stages * PAGE_BYTES if staged
                 else (cfg.warps * SIMT_TILE_BYTES if simt else 0))
    sizes = [
        ("stage", stage),
        ("bars", cfg.warps * cfg.stages * 8 if cfg.load == "bulk" else 0),
        ("qt", QT_BYTES if simt else 0),
        ("hist", 4 * (1 << cfg.radix_bits) if radix else 0),
        ("keys", 4 * slots if radix or cfg.mode == "cluster" else 0),
        ("sorted", 8 * _pow2_at_least(slots) if not radix else 0),
        ("cand", 2 * slots if radix else 0),
        ("bts", 4 * max_pages),
        ("xchg", 4 * XCHG_WORDS if cfg.gather == "split" else 0),
    ]
    layout: dict[str, int] = {}
    offset = 0
    for name, size in sizes:
        layout[name] = offset
        offset += -(-size // 16) * 16
    layout["total"] = offset
    return layout


class Workspace:
    """Per-device arrival counters and histograms, zero between calls, grown eagerly."""

    def __init__(self) -> None:
        self._by_device: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        held = self._by_device.get(device)
        if held is None or held[0].numel() < rows:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("cuda_family: the workspace must grow outside graph capture; "
                                   "call once eagerly with this batch size first")
            capacity = max(64, rows, 2 * held[0].numel() if held else 0)
            held = (torch.zeros(capacity, dtype=torch.int32, device=device),
                    torch.zeros(capacity * HIST_STRIDE, dtype=torch.int32, device=device))
            self._by_device[device] = held
        return held


def build(params: dict[str, Any], kernels: Any) -> Callable[..., None]:
    if kernels is None:
        raise RuntimeError("cuda_family needs compiled kernels (a CUDA device)")
    configs = {band: BandConfig.of(params, band) for band in BANDS}
    pt_threads = int(params["PT_THREADS"])
    workspace = Workspace()

    def run(
        q_index_fp8: torch.Tensor,
        k_index_cache_fp8: torch.Tensor,
        weights: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        topk_indices: torch.Tensor,
    ) -> None:
        batch, max_pages = block_table.shape
        topk = topk_indices.shape[1]
        if batch == 0:
            return
        band = band_of(batch, max_pages, topk)
        if band == "PT":
            kernels["pt_topk"]((batch, 1, 1), (pt_threads, 1, 1), seq_lens, block_table,
                               topk_indices, max_pages, topk)
            return
        cfg = configs[band]
        smem = smem_layout(cfg, max_pages)["total"]
        if smem > SMEM_LIMIT:  # only past the band's widest rows, which band_of refuses
            raise ValueError(f"cuda_family band {band}: {smem} bytes of shared memory")
        device = block_table.device
        counters, hist = workspace.get(device, batch)
        keys = torch.empty(batch * max_pages * PAGE_TOKENS, dtype=torch.int32, device=device)
        kernel = kernels[f"{band.lower()}_topk"]
        args = (q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices,
                keys, hist, counters, max_pages, topk)
        block = (cfg.threads, 1, 1)
        kernel((cfg.ctas, batch, 1), block, *args, 0, shared_mem=smem)
        if cfg.mode == "two_pass":
            kernel((1, batch, 1), block, *args, 1, shared_mem=smem)

    return run
