"""Run the triton_fused seed under Triton's CPU interpreter; used by test_fused_moe.py
in a process of its own (TRITON_INTERPRET=1 must be set before triton is imported).

    TRITON_INTERPRET=1 python tests/workloads/interpret_triton_seed.py run '[{}, [{"MID_SPLIT_K1": 2}, 40]]'
    TRITON_INTERPRET=1 python tests/workloads/interpret_triton_seed.py align
    TRITON_INTERPRET=1 python tests/workloads/interpret_triton_seed.py baseline '[[16, 64, 128, 1, 4, 4]]'

``run`` prints one JSON line per knob configuration and input set: one built runner is
called on two input sets of one shape (6 tokens, or the number given with the knobs as
``[knobs, seq_len]``) (the second reuses the first's buffers), and each
output gets the checker's verdict and the largest error relative to its row's largest
element. ``align`` prints one JSON line per routing case: the routing and alignment
kernels' results set against the reference's routing, with the names of the
invariants that failed (none when correct). ``baseline`` runs the triton_baseline
baseline (workloads/fused_moe/baselines) with each given GEMM configuration (the
fields of its GemmConfig) on three batch sizes, two input sets each with one runner,
and checks its block alignment's invariants after every call: one JSON line per call.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "workloads" / "fused_moe" / "seeds"
BASELINES = REPO / "workloads" / "fused_moe" / "baselines"


def fix_triton_interpreter() -> None:
    """Work around two bugs of Triton 3.6's CPU interpreter (the GPU compiler is unaffected).

    Its float32 -> fp8 e4m3 conversion drops the carry when rounding up a mantissa of
    all ones (126.8 becomes 64, not 128), and its dot multiplies bfloat16 operands as
    raw 16-bit integers. Conversions to fp8 go through torch instead, and bfloat16 dot
    operands are widened to float32 first.
    """
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def fixed_convert(data, src, dst, rounding):  # type: ignore[no-untyped-def]
        if src == tl.float32 and dst == tl.float8e4nv:
            values = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
            return values.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        return convert(data, src, dst, rounding)

    dot = interpreter.InterpreterBuilder.create_dot

    def fixed_dot(self, a, b, d, precision, imprecise):  # type: ignore[no-untyped-def]
        def widen(x):  # type: ignore[no-untyped-def]
            if x.dtype.scalar != tl.bfloat16:
                return x
            return interpreter.TensorHandle(
                convert(x.data, tl.bfloat16, tl.float32, None).view(np.float32), tl.float32
            )

        return dot(self, widen(a), widen(b), d, precision, imprecise)

    interpreter._convert_float = fixed_convert
    interpreter.InterpreterBuilder.create_dot = fixed_dot


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1 (before triton is imported)")
    fix_triton_interpreter()
    from evokernel.candidate import load_candidate
    from evokernel.evaluate.check import check_outputs
    from evokernel.workload import load_workload

    wl = load_workload("fused_moe")
    if sys.argv[1] == "baseline":
        check_baseline(wl, json.loads(sys.argv[2]))
        return
    seed = load(SEEDS / "triton_fused.py", "triton_fused_interpreted")
    if sys.argv[1] == "align":
        check_alignment(wl, seed)
        return
    defaults = load_candidate(SEEDS / "triton_fused.yaml", "fused_moe").params
    for entry in json.loads(sys.argv[2]):
        knobs, seq_len = (entry, 6) if isinstance(entry, dict) else entry
        sets = input_sets(wl, seq_len)
        run = seed.build({**defaults, **knobs})
        for call, (given, want) in enumerate(sets):
            out = torch.full_like(want, float("nan"))
            run(*given.values(), out)
            verdict = check_outputs(wl, [out], [want], given)
            error = (out.float() - want.float()).abs() / (want.float().abs().amax(dim=1, keepdim=True) + 1)
            print(json.dumps({"knobs": knobs, "seq_len": seq_len, "band": seed.Config({**defaults, **knobs}).band(seq_len),
                              "call": call, "verdict": verdict.ok, "message": verdict.message,
                              "max_error": float(error.max()),
                              "rows_with_local_experts": int((want.float().abs().sum(1) > 0).sum())}))


def input_sets(wl: Any, seq_len: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Two input sets of one reduced-width shape (the second a ``vary_inputs`` variant of
    the first) with the reference's outputs."""
    axes = {**wl.definition.const_axes(), "hidden_size": 256, "intermediate_size": 128,
            "seq_len": seq_len, "local_expert_offset": 64}
    inputs = wl._inputs_module.make_inputs(axes, 2, "cpu")
    (ref,) = wl.reference(*inputs.values())
    # Outputs of this reduced width are small: raise them so the tolerance's relative part decides.
    inputs["gemm2_weights_scale"] = inputs["gemm2_weights_scale"] * (50 / float(ref.float().abs().amax()))
    (ref,) = wl.reference(*inputs.values())
    sets = [(inputs, ref)]
    varied = {**inputs, **wl._inputs_module.vary_inputs(inputs, axes, 3, "cpu")}
    sets.append((varied, wl.reference(*varied.values())[0]))
    return sets


def alignment_problems(
    seed: ModuleType, ws: object, ids: torch.Tensor, weights: torch.Tensor, offset: int, block_m: int
) -> list[str]:
    """Names of the invariants the kernels' routing and alignment break for reference
    routing (``ids``, ``weights``: [T, 8]); empty when all hold."""
    problems = []
    tokens = ids.shape[0]
    pairs = tokens * 8
    local = ws.local.long()  # type: ignore[attr-defined]
    got_weights = ws.weights  # type: ignore[attr-defined]
    want_local = ids.long() - offset
    want_local = torch.where((want_local >= 0) & (want_local < 32), want_local, 32)
    # The same local experts per token (slot order is free), with the same weights.
    if not torch.equal(local.view(tokens, 8).sort(1).values, want_local.sort(1).values):
        problems.append("local experts")
    for t in range(tokens):
        for j in range(8):
            e = int(local[t * 8 + j])
            if e < 32:
                k = int((want_local[t] == e).nonzero()[0])
                if abs(float(got_weights[t * 8 + j]) - float(weights[t, k])) > 1e-5 * (1 + float(weights[t, k])):
                    problems.append("weights")
    is_local = local < 32
    block_expert = ws.block_expert.long()  # type: ignore[attr-defined]
    used = int((block_expert < 32).sum())
    if not bool((block_expert[used:] == 32).all()):
        problems.append("unused blocks come last")
    if not torch.equal(block_expert[:used], block_expert[:used].sort().values):
        problems.append("blocks ordered by expert")
    counts = torch.bincount(local[is_local], minlength=32)
    if used != int(((counts + block_m - 1) // block_m).sum()):
        problems.append("blocks per expert")
    pair_of_row = ws.pair_of_row[: used * block_m].long()  # type: ignore[attr-defined]
    row_expert = block_expert[:used].repeat_interleave(block_m)
    real = pair_of_row != pairs
    if bool(((pair_of_row < 0) | (pair_of_row > pairs)).any()):
        problems.append("rows hold a pair or the padding mark")
    elif not torch.equal(pair_of_row[real].sort().values, is_local.nonzero().flatten()):
        problems.append("every local pair in one row")
    elif not torch.equal(local[pair_of_row[real]], row_expert[real]):
        problems.append("a pair's row lies in its expert's blocks")
    else:
        for e in range(32):
            mine = pair_of_row[real & (row_expert == e)]
            if not torch.equal(mine, mine.sort().values):
                problems.append("pairs of an expert in pair order")
    row_of_pair = ws.row_of_pair.long()  # type: ignore[attr-defined]
    if not torch.equal(row_of_pair >= 0, is_local):
        problems.append("row_of_pair marks the local pairs")
    elif not torch.equal(ws.pair_of_row[row_of_pair[is_local]].long(), is_local.nonzero().flatten()):  # type: ignore[attr-defined]
        problems.append("row_of_pair inverts pair_of_row")
    return problems


def check_alignment(wl: object, seed: ModuleType) -> None:
    """The routing and alignment stage on its own, both layouts (one program; routing then
    alignment kernels), into buffers first filled with junk: one JSON line per case."""
    reference = wl._inputs_module._reference()  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(0)
    for tokens, block_m, route_tokens in ((1, 16, 16), (9, 16, 8), (50, 64, 16), (300, 32, 32)):
        logits = torch.randn(tokens, 256, generator=gen) * 2
        bias = (torch.randn(256, generator=gen) * 0.05).to(torch.bfloat16)
        offset = 96
        ids, weights = reference.route(logits, bias, 2.5)
        layouts = {}
        for one_program in (True, False):
            cfg = seed.Config({**{f"{band}_BLOCK_M": block_m for band in seed.BANDS}, "ROUTE_TOKENS": route_tokens,
                               "ONE_PROGRAM_ROUTING_UP_TO": tokens if one_program else 0})
            ws = seed.Workspace.allocate(cfg, tokens, 256, 128, 32, torch.device("cpu"))
            for buffer in (ws.local, ws.pair_of_row, ws.block_expert, ws.row_of_pair, ws.counts):
                buffer.copy_(torch.randint(-5, 2 * tokens * 8, buffer.shape, generator=gen))
            ws.weights.fill_(float("nan"))
            seed.route_and_align(cfg, ws, logits, bias, torch.tensor(2.5), torch.tensor(offset, dtype=torch.int32))
            layouts[one_program] = ws
            print(json.dumps({"tokens": tokens, "block_m": block_m, "route_tokens": route_tokens,
                              "one_program": one_program,
                              "problems": alignment_problems(seed, ws, ids, weights, offset, block_m)}))
        used = int((layouts[True].block_expert < 32).sum()) * block_m
        same = all(torch.equal(getattr(layouts[True], name)[:n], getattr(layouts[False], name)[:n])
                   for name, n in (("local", tokens * 8), ("pair_of_row", used),
                                   ("block_expert", layouts[True].max_blocks), ("row_of_pair", tokens * 8)))
        print(json.dumps({"tokens": tokens, "block_m": block_m, "layouts_agree": same}))


def reduced_axes(wl: Any, seq_len: int, offset: int) -> dict[str, int]:
    return {**wl.definition.const_axes(), "hidden_size": 256, "intermediate_size": 128,
            "seq_len": seq_len, "local_expert_offset": offset}


def reduced_inputs(wl: Any, axes: dict[str, int], seed: int) -> dict[str, torch.Tensor]:
    """Inputs at hidden 256, intermediate 128, with GEMM 2's scales raised so that outputs
    are ~50 and the checker's relative tolerance decides."""
    inputs: dict[str, torch.Tensor] = wl._inputs_module.make_inputs(axes, seed, "cpu")
    (ref,) = wl.reference(*inputs.values())
    inputs["gemm2_weights_scale"] = inputs["gemm2_weights_scale"] * (50 / max(float(ref.float().abs().amax()), 1e-6))
    return inputs


def baseline_layout_problems(ws: Any, block_m: int) -> list[str]:
    """Names of the block alignment's invariants that do not hold in ``ws`` after a call."""
    problems = []
    pairs = ws.bucket.numel()
    bucket = ws.bucket.long()
    used = int(ws.post_pad[0])
    blocks = (torch.bincount(bucket, minlength=33) + block_m - 1) // block_m
    if used != int(blocks.sum()) * block_m:
        problems.append("padded row count")
    labels = ws.expert_ids[: used // block_m].long()
    if not torch.equal(labels, torch.repeat_interleave(torch.tensor([*range(32), -1]), blocks)):
        problems.append("row block labels")
    rows = ws.sorted_ids[:used].long()
    real = rows < pairs
    if bool(((rows < 0) | (rows > pairs)).any()):
        problems.append("rows hold a pair or the padding mark")
    elif not torch.equal(rows[real].sort().values, torch.arange(pairs)):
        problems.append("every pair in exactly one row")
    else:
        row_bucket = torch.where(labels < 0, 32, labels).repeat_interleave(block_m)
        if not torch.equal(bucket[rows[real]], row_bucket[real]):
            problems.append("a pair's row lies in its bucket's run")
        if not bool((real.view(-1, block_m).int().diff(dim=1) <= 0).all()):
            problems.append("padding after the pairs")
    return problems


def check_baseline(wl: Any, configs: list[list[int]]) -> None:
    """Each configuration on 1 (twice: no local pair, then some), 6 and 40 tokens: one
    runner per batch, called on an input set and then on a variant of it (new logits
    and activations, same buffers)."""
    from evokernel.evaluate.check import check_outputs

    module = load(BASELINES / "triton_baseline.py", "triton_baseline_interpreted")
    cases = []
    for tokens, seed, offset in ((1, 5, 32), (1, 7, 32), (6, 5, 64), (40, 2, 160)):
        axes = reduced_axes(wl, tokens, offset)
        inputs = reduced_inputs(wl, axes, seed)
        varied = {**inputs, **wl._inputs_module.vary_inputs(inputs, axes, seed + 100, "cpu")}
        cases.append((tokens, [(s, wl.reference(*s.values())[0]) for s in (inputs, varied)]))
    for fields in configs:
        cfg = module.GemmConfig(*fields)
        for tokens, sets in cases:
            run = module.Pipeline(cfg)
            for call, (given, want) in enumerate(sets):
                out = torch.full_like(want, float("nan"))
                run(*given.values(), out)
                (ws,) = run.workspaces.values()
                verdict = check_outputs(wl, [out], [want], given)
                error = (out.float() - want.float()).abs() / (want.float().abs().amax(dim=1, keepdim=True) + 1)
                print(json.dumps({"config": fields, "tokens": tokens, "call": call, "verdict": verdict.ok,
                                  "message": verdict.message, "max_error": float(error.max()),
                                  "local_pairs": int((ws.bucket < 32).sum()),
                                  "rows_with_local_experts": int((want.float().abs().sum(1) > 0).sum()),
                                  "problems": baseline_layout_problems(ws, cfg.block_m)}), flush=True)


if __name__ == "__main__":
    main()
