"""Host side of the cuda_small_batch candidate: batches of up to ``CUDA_UP_TO`` tokens
(at most 64) take the CUDA path of cuda_small_batch.cu, three launches (routing and the
permutation, GEMM1 with SwiGLU, GEMM2 with the combine); larger batches take the
triton_fused pipeline of this folder, built from the same parameters (so its knobs keep
triton_fused's defaults unless a candidate sets them).

The CUDA path issues device work only: no value is read back, grids follow from the
device's SM count and the launch knobs, and a shape's buffers are allocated on its first
call and reused, so a call can be captured in a CUDA graph (the first call of a shape
must come before any capture). The kernels count the passes themselves and pick their
split-K from that count (``SPLIT_K1``/``SPLIT_K2`` 0), so nothing about the routing has
to reach the host.

``shared_bytes`` mirrors the ring sizing of cuda_small_batch.cu (the kernels trap if they
are handed less than they need); the tests compile the file to check the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .triton_fused import build as build_triton
from .triton_fused import device_scalar

HIDDEN = 7168
INTER = 2048
GEMM1_ROWS = 2 * INTER
LOCAL = 32
TOP_K = 8
TILES2 = HIDDEN // 16
MAX_TOKENS = 64
"""The most tokens the CUDA path takes (its routing kernel holds 8 pairs a token in shared memory)."""
SMEM_PER_SM = 232_448  # 227 KiB on sm_90
TABLE_BYTES = (3 * (LOCAL + MAX_TOKENS) + 2 * MAX_TOKENS * TOP_K) * 4
"""The kernels' static shared memory: pass and pair tables (cuda_small_batch.cu's Tables)."""
ROUTE_THREADS = 1024
SPLITS1 = (0, 1, 2, 4, 7, 8, 14)
"""GEMM1 split-K choices: 0 lets the kernel choose, else a divisor of its 56 K blocks."""
SPLITS2 = (0, 1, 2, 4, 8)
"""GEMM2 split-K choices: 0 lets the kernel choose, else a divisor of its 16 K blocks."""
SMS_WITHOUT_A_GPU = 132
"""The SM count assumed for a device that is not a GPU (an H100/H200 SXM), so that the
host path can be exercised on meta tensors."""


def stage_bytes(pass_frags: int) -> int:
    """One ring stage of a warp: weight tile, activation rows, their scales, a weight scale."""
    pairs = 8 * pass_frags
    return 2048 + pairs * 128 + pairs * 4 + 16


def ring_depth(stages: int, warps: int, ctas_per_sm: int, pass_frags: int) -> int:
    """Ring stages per warp: ``stages``, or as many as fit in a CTA's share of an SM
    beside the tables."""
    fitting = (SMEM_PER_SM // ctas_per_sm - 1024 - TABLE_BYTES) // (warps * stage_bytes(pass_frags))
    if fitting < 2:
        raise ValueError(f"two ring stages of {warps} warps with PASS_FRAGS {pass_frags} do not "
                         f"fit {ctas_per_sm} CTAs an SM")
    return min(stages, fitting)


def shared_bytes(stages: int, warps: int, ctas_per_sm: int, pass_frags: int) -> int:
    return warps * ring_depth(stages, warps, ctas_per_sm, pass_frags) * stage_bytes(pass_frags)


@dataclass(frozen=True)
class Settings:
    up_to: int
    pass_frags: int
    split1: int
    split2: int
    stages: int
    warps: int
    ctas_per_sm: int

    @staticmethod
    def of(params: dict[str, Any]) -> Settings:
        settings = Settings(
            up_to=int(params.get("CUDA_UP_TO", 64)),
            pass_frags=int(params.get("PASS_FRAGS", 1)),
            split1=int(params.get("SPLIT_K1", 0)),
            split2=int(params.get("SPLIT_K2", 0)),
            stages=int(params.get("STAGES", 6)),
            warps=int(params.get("WARPS", 8)),
            ctas_per_sm=int(params.get("CTAS_PER_SM", 1)),
        )
        if not 0 <= settings.up_to <= MAX_TOKENS:
            raise ValueError(f"CUDA_UP_TO must lie in [0, {MAX_TOKENS}], not {settings.up_to}")
        if settings.split1 not in SPLITS1:
            raise ValueError(f"SPLIT_K1 must be one of {SPLITS1}, not {settings.split1}")
        if settings.split2 not in SPLITS2:
            raise ValueError(f"SPLIT_K2 must be one of {SPLITS2}, not {settings.split2}")
        settings.shared_bytes()  # raises if the ring cannot fit
        return settings

    def shared_bytes(self) -> int:
        return shared_bytes(self.stages, self.warps, self.ctas_per_sm, self.pass_frags)


@dataclass(frozen=True)
class Workspace:
    """The CUDA path's buffers for one batch size. The fixup sums and counters start at
    zero and every call leaves them at zero (see cuda_small_batch.cu)."""

    num_passes: torch.Tensor   # [1] int32
    pass_expert: torch.Tensor  # [32 + T] int32: a pass's local expert
    pass_start: torch.Tensor   # [32 + T] int32: its first pair row
    pass_count: torch.Tensor   # [32 + T] int32: its pairs (at most 8 * PASS_FRAGS)
    pair_token: torch.Tensor   # [8T] int32: each pair row's token
    pair_weight: torch.Tensor  # [8T] f32: its routing weight
    sums1: torch.Tensor        # [8T, 4096] f32: GEMM1 partial sums
    h: torch.Tensor            # [8T, 2048] uint8: the e4m3 intermediate
    h_scale: torch.Tensor      # [8T, 16] f32: its scale per pair and 128 columns
    arrived1: torch.Tensor     # [(32 + T) * 16] int32: GEMM1 arrivals per pass and column block
    sums2: torch.Tensor        # [T, 7168] f32: GEMM2 sums per token
    arrived2: torch.Tensor     # [448] int32: GEMM2 arrivals per 16-row tile

    @staticmethod
    def allocate(tokens: int, device: torch.device) -> Workspace:
        pairs, passes = tokens * TOP_K, LOCAL + tokens  # passes <= 32 + 8T / (8 * PASS_FRAGS)

        def ints(n: int) -> torch.Tensor:
            return torch.empty(n, dtype=torch.int32, device=device)

        return Workspace(
            num_passes=ints(1),
            pass_expert=ints(passes),
            pass_start=ints(passes),
            pass_count=ints(passes),
            pair_token=ints(pairs),
            pair_weight=torch.empty(pairs, device=device),
            sums1=torch.zeros(pairs, GEMM1_ROWS, device=device),
            h=torch.empty(pairs, INTER, dtype=torch.uint8, device=device),
            h_scale=torch.empty(pairs, INTER // 128, device=device),
            arrived1=torch.zeros(passes * (INTER // 128), dtype=torch.int32, device=device),
            sums2=torch.zeros(tokens, HIDDEN, device=device),
            arrived2=torch.zeros(TILES2, dtype=torch.int32, device=device),
        )


def sm_count(device: torch.device, known: dict[Any, int]) -> int:
    if device not in known:
        known[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                         if device.type == "cuda" else SMS_WITHOUT_A_GPU)
    return known[device]


def build(params: dict, kernels: Any) -> Any:
    if kernels is None:
        raise RuntimeError("cuda_small_batch needs compiled kernels (a CUDA device)")
    settings = Settings.of(params)
    larger = build_triton(params)
    route, gemm1, gemm2 = kernels["moe_route"], kernels["moe_gemm1"], kernels["moe_gemm2"]
    smem = settings.shared_bytes()
    threads = settings.warps * 32
    workspaces: dict[tuple[Any, int], Workspace] = {}
    scalars: dict[tuple[Any, ...], torch.Tensor] = {}
    sms: dict[Any, int] = {}

    def run(
        routing_logits: torch.Tensor,
        routing_bias: torch.Tensor,
        hidden_states: torch.Tensor,
        hidden_states_scale: torch.Tensor,
        gemm1_weights: torch.Tensor,
        gemm1_weights_scale: torch.Tensor,
        gemm2_weights: torch.Tensor,
        gemm2_weights_scale: torch.Tensor,
        local_expert_offset: torch.Tensor,
        routed_scaling_factor: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        tokens, hidden = hidden_states.shape
        if tokens > settings.up_to:
            larger(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                   gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                   routed_scaling_factor, output)
            return
        if tokens == 0:
            return
        if (hidden, gemm2_weights.shape[2], gemm2_weights.shape[0]) != (HIDDEN, INTER, LOCAL):
            raise ValueError("cuda_small_batch is built for hidden 7168, intermediate 2048, 32 local experts")
        tensors = (routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                   gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, output)
        if not all(t.is_contiguous() for t in tensors):
            raise ValueError("cuda_small_batch reads its inputs and writes its output as contiguous arrays")
        device = hidden_states.device
        ws = workspaces.get((device, tokens))
        if ws is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("cuda_small_batch: call once with this batch size before capturing a graph")
            ws = workspaces[(device, tokens)] = Workspace.allocate(tokens, device)
        offset = device_scalar(local_expert_offset, torch.int32, device, scalars)
        factor = device_scalar(routed_scaling_factor, torch.float32, device, scalars)
        grid = (sm_count(device, sms) * settings.ctas_per_sm,)
        route((1,), (ROUTE_THREADS,), routing_logits, routing_bias, factor, offset, tokens,
              ws.num_passes, ws.pass_expert, ws.pass_start, ws.pass_count, ws.pair_token, ws.pair_weight)
        gemm1(grid, (threads,), gemm1_weights, gemm1_weights_scale, hidden_states, hidden_states_scale,
              ws.num_passes, ws.pass_expert, ws.pass_start, ws.pass_count, ws.pair_token,
              ws.sums1, ws.h, ws.h_scale, ws.arrived1, tokens, settings.split1, shared_mem=smem)
        gemm2(grid, (threads,), gemm2_weights, gemm2_weights_scale, ws.h, ws.h_scale,
              ws.num_passes, ws.pass_expert, ws.pass_start, ws.pass_count, ws.pair_token, ws.pair_weight,
              ws.sums2, output, ws.arrived2, tokens, settings.split2, shared_mem=smem)

    return run
