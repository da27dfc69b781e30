"""The judge's inputs for one shape: base sets, variants, expected outputs, and slots.

A shape's inputs are split by the workload's ``vary_inputs``: the *fixed* inputs (the
big ones, e.g. dsa_topk's key cache) come from a few *bases*; the *varying* ones
(queries, lengths, page tables) come in many cheap *variants* over each base. Every
call a candidate makes sees a variant no earlier call of its process saw, so no
result can be served from a cache keyed by the inputs' addresses or contents.

The fixed inputs sit at one address for every slot, and the judge switches the
base written there between phases: the bases differ from the first one only in a
random eighth of their rows (pages, experts), so a result cached by pointer, or by a
fingerprint of a few bytes, is wrong after a switch.

Everything here lives in the judge's process. The candidate's process sees only the
*slots*: views into one shared chunk, holding per slot the fixed inputs of its base,
its own copy of the varying inputs, and its own outputs between poisoned guard bands.
The judge's private copies (bases, variants, expected outputs) never leave this
process, and expected outputs are computed by the workload's reference here, never by
candidate code.
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from evokernel.evaluate.check import Verdict as CheckVerdict
from evokernel.evaluate.check import check_outputs
from evokernel.evaluate.shared import Chunk, Layout, TensorSpec
from evokernel.evaluate.timing import poison_value, still_poisoned
from evokernel.workload import Workload

STACK_ROWS = 512
"""Most rows stacked into one reference or checker call (memory: dsa_topk's checker holds
rows x 64 heads x max_num_pages x 64 float32 scores)."""
GUARD = 1024
"""Poisoned elements before and after every output: a write past either end shows."""


def derived_seed(*parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:6], "little")


@dataclass(frozen=True)
class BankConfig:
    seed: int = 0
    salt: str = ""
    """Mixed into every input's seed and never shown to a candidate: with it, no candidate
    can regenerate the judge's inputs ahead of a call from the (public) run seed."""
    bases: int = 2
    """Versions of the fixed inputs; all but the first change a random eighth of its rows."""
    slots: int = 64
    """Most calls one batch can hold: each has its own inputs and outputs."""
    variants: int = 256
    """Variants per shape (at least what one process uses: it never sees one twice).
    Made when first used, then kept with their expected outputs."""
    memory_bytes: int = 2 << 30
    """What the variants and slots of one shape may take; fewer slots if they need more."""
    trials: int = 3
    batches: int = 3
    sizing_batches: int = 4
    """Untimed batches on fresh variants before the timed ones (the judge's warm-up, and
    on a GPU one graph replay)."""
    cupti_calls: int = 10
    """What one process takes of the variants (the judge's own settings): at least that
    many exist per base, whatever the memory budget says."""


@dataclass
class Variant:
    index: int
    base: int
    values: dict[str, torch.Tensor]
    """The varying inputs (all inputs where the workload varies none)."""


class ShapeBank:
    """Inputs of one shape, in the judge's memory and in one shared chunk of slots."""

    def __init__(
        self, workload: Workload, shape: str, config: BankConfig, device: torch.device,
        reference: Callable[..., Sequence[torch.Tensor]], chunk_id: int = 0,
    ) -> None:
        self.workload, self.shape, self.config, self.device = workload, shape, config, device
        self.chunk_id = chunk_id
        self.reference = reference
        self.names = workload.input_names
        first = workload.make_inputs(shape, derived_seed(config.seed, config.salt, shape, "base", 0), device)
        probe = workload.vary_inputs(shape, first, 0, device)
        self.varying = [n for n in self.names if n in probe] if probe is not None else list(self.names)
        self.fixed = [n for n in self.names if n not in self.varying]
        self.bases = [first] + [self._altered(first, b) for b in range(1, config.bases)]
        variant_bytes = sum(first[n].numel() * first[n].element_size() for n in self.varying)
        outputs = workload.allocate_outputs(shape, "meta")
        output_bytes = sum(o.numel() * o.element_size() + 2 * GUARD * o.element_size()
                           for o in outputs)
        batches = config.batches + config.sizing_batches
        fit = max(2, config.memory_bytes // max(1, (batches + 1) * (variant_bytes + output_bytes)))
        self.slot_count = int(min(config.slots, fit))
        # one process never sees a variant twice: per base, its share of the batches
        # (slot_count each), checked, CUPTI and re-verification calls; more, up to the
        # budget, so that consecutive processes see different ones
        per_base = (-(-batches // config.bases) * self.slot_count
                    + -(-config.trials // config.bases) + min(config.cupti_calls, self.slot_count) + 2)
        affordable = config.memory_bytes // max(1, variant_bytes + output_bytes)
        self.variant_count = max(config.bases * per_base, min(config.variants, affordable))
        self._variants: list[Variant | None] = [None] * self.variant_count
        # every variant's varying inputs in one tensor per input, so that a batch's write
        # is one gather and one scatter per input, whatever its size
        self._store = {n: torch.empty((self.variant_count, *first[n].shape), dtype=first[n].dtype,
                                      device=device) for n in self.varying}
        self._store_bytes = {n: as_bytes(t) for n, t in self._store.items()}
        """``_store`` as [variants, bytes] views, made once (a view is a dispatch; a batch
        used to make a dozen)."""
        self._expected: dict[int, list[torch.Tensor]] = {}
        self._bytes: dict[int, float | None] = {}
        self._weights: dict[int, torch.Tensor] = {}
        self._written: dict[str, torch.Tensor] = {}
        self._written_slots = torch.empty(0, dtype=torch.long)
        self._written_order: list[int] = []
        self._layout(outputs)
        self.active_base = -1
        self.use_base(0)

    def twin(self, chunk_id: int) -> ShapeBank:
        """A bank of the same shape with slots in chunks of its own (ids ``chunk_id`` and
        ``chunk_id + 1``), sharing everything private to the judge: bases, variants, their
        expected outputs and least bytes. For another lane (bank_store.py): a process that
        maps one bank's chunks cannot reach the twin's, and no input or expected output is
        made twice."""
        twin = copy.copy(self)  # shallow: the private stores are the same objects
        twin.__dict__.pop("slots_json", None)  # a cached_property of the chunks
        twin.chunk_id = chunk_id
        twin._written = {}
        twin._written_slots = torch.empty(0, dtype=torch.long)
        twin._written_order = []
        twin._layout(self.workload.allocate_outputs(self.shape, "meta"))
        twin.active_base = -1
        twin.use_base(0)
        return twin

    def _altered(self, first: dict[str, torch.Tensor], b: int) -> dict[str, torch.Tensor]:
        """``first`` with a random eighth of its fixed inputs' rows from an independent set."""
        if not self.fixed:
            return first
        other = self.workload.make_inputs(
            self.shape, derived_seed(self.config.seed, self.config.salt, self.shape, "base", b), self.device)
        rows: dict[int, torch.Tensor] = {}
        gen = torch.Generator(device="cpu").manual_seed(derived_seed(self.config.seed, self.config.salt, self.shape, b))
        out = dict(first)
        for name in self.fixed:
            tensor = first[name]
            if tensor.dim() == 0 or tensor.shape[0] < 2:
                out[name] = other[name].clone()
                continue
            n = tensor.shape[0]
            if n not in rows:
                rows[n] = torch.randperm(n, generator=gen)[: max(1, n // 8)].to(tensor.device)
            altered = tensor.clone()
            altered[rows[n]] = other[name][rows[n]]
            out[name] = altered
        return out

    # -- layout -------------------------------------------------------------------------

    def _layout(self, outputs: Sequence[torch.Tensor]) -> None:
        """Two chunks: the inputs (read-only to a candidate's process where the platform
        can enforce it: on the CPU) and the outputs; ids ``chunk_id`` and ``chunk_id + 1``."""
        inputs, outs = Layout(self.chunk_id), Layout(self.chunk_id + 1)
        first = self.bases[0]
        fixed = {n: inputs.add(first[n].shape, first[n].dtype) for n in self.fixed}
        self.fixed_end = inputs.size
        self.fixed_gaps = uncovered(list(fixed.values()), self.fixed_end)
        """Alignment padding between fixed inputs: writable on a GPU, compared by nothing,
        so zeroed by ``scrub`` (else a channel from one candidate to the next)."""
        s = self.slot_count
        varying = {n: inputs.add((s, *first[n].shape), first[n].dtype) for n in self.varying}
        rows = [outs.add((s, 2 * GUARD + o.numel()), o.dtype) for o in outputs]
        self.input_chunk = Chunk.allocate(inputs.size, self.device, read_only_elsewhere=True)
        self.output_chunk = Chunk.allocate(outs.size, self.device)
        # on the CPU the seal makes inputs unwritable for the candidate; on a GPU the judge
        # compares them instead (a process can always re-map device memory it imported)
        self.inputs_sealed = self.device.type == "cpu"
        self.fixed_views = {n: self.input_chunk.tensor(spec) for n, spec in fixed.items()}
        self.varying_views = {n: self.input_chunk.tensor(spec) for n, spec in varying.items()}
        self._varying_bytes = {n: as_bytes(v) for n, v in self.varying_views.items()}
        self.output_rows = [self.output_chunk.tensor(spec) for spec in rows]
        self.output_shapes = [tuple(o.shape) for o in outputs]
        self.slot_specs: list[list[TensorSpec]] = []
        for slot in range(s):
            specs = []
            for name in self.names:
                if name in fixed:
                    specs.append(fixed[name])
                else:
                    whole = varying[name]
                    size = whole.nbytes // s
                    specs.append(TensorSpec(whole.chunk, whole.offset + slot * size,
                                            whole.shape[1:], whole.dtype))
            for spec, shape in zip(rows, self.output_shapes, strict=True):
                row = spec.nbytes // s
                element = row // spec.shape[1]
                specs.append(TensorSpec(spec.chunk, spec.offset + slot * row + GUARD * element,
                                        shape, spec.dtype))
            self.slot_specs.append(specs)

    @property
    def chunks(self) -> dict[int, tuple[Chunk, bool]]:
        """Each shared chunk by id, with whether a candidate's process may write it."""
        return {self.chunk_id: (self.input_chunk, False), self.chunk_id + 1: (self.output_chunk, True)}

    def use_base(self, base: int) -> None:
        """Write base ``base``'s fixed inputs in place (same addresses, new contents)."""
        for name, view in self.fixed_views.items():
            view.copy_(self.bases[base][name])
        self.active_base = base

    def restore_fixed(self) -> list[str]:
        """Put back any fixed input a candidate changed; the names it changed."""
        if self.active_base < 0:
            return []
        changed = self.fixed_changed()
        if changed:
            self.use_base(self.active_base)
        return sorted(changed)

    # -- variants -----------------------------------------------------------------------

    @cached_property
    def slots_json(self) -> list[list[Any]]:
        """``slot_specs`` as the candidate's process receives them (made once)."""
        return [[spec.to_json() for spec in specs] for specs in self.slot_specs]

    def variant(self, index: int) -> Variant:
        found = self._variants[index]
        if found is None:
            base = index % self.config.bases
            seed = derived_seed(self.config.seed, self.config.salt, self.shape, "variant", index)
            if self.fixed:
                values = self.workload.vary_inputs(self.shape, self.bases[base], seed, self.device)
                assert values is not None
                values = {n: values[n] for n in self.varying}
            else:
                values = self.workload.make_inputs(self.shape, seed, self.device)
            for name in self.varying:
                self._store[name][index].copy_(values[name])
            found = Variant(index, base, {n: self._store[n][index] for n in self.varying})
            self._variants[index] = found
        return found

    def make_variants(self) -> None:
        """Make every variant now, and its least bytes (``floor_bytes``), once per run,
        before any candidate's clock: no batch waits for the workload's input generator,
        and no speed-of-light test for its cost function (a host sync per variant).

        Every variant is queued first and their costs read after, so that a cost that
        reads values back (a host sync) does not wait each time for the kernels making its
        own variant. It did not shorten making dsa_sparse_attention's 23 banks on an H100
        (227 s, against 215 s interleaved): that cost was host work in the workload's
        ``vary_inputs`` and ``cost`` (bank-profile, 2026-12-07)."""
        variants = [self.variant(index) for index in range(self.variant_count)]
        for variant in variants:
            self.floor_bytes(variant)

    def draw(self, rng: random.Random) -> list[int]:
        """A fresh order of variant indices for one candidate's process.

        Last in the list (taken first) are variants whose expected outputs are known
        already, in random order: a candidate cannot tell them from the others, and the
        judge computes fewer references.
        """
        order = list(range(self.variant_count))
        rng.shuffle(order)
        known = [i for i in order if i in self._expected]
        return [i for i in order if i not in self._expected] + known

    def has_expected(self, variant: Variant) -> bool:
        return variant.index in self._expected

    def stacks(self, variants: Sequence[Variant]) -> list[list[Variant]]:
        """``variants`` in groups that one reference or checker call can take, stacked
        along the workload's row axis (groups of one where it has none, or where an input
        without that axis varies)."""
        axis = self.workload.row_axis
        rows = self.workload.axes_of(self.shape).get(axis, 0) if axis else 0
        stackable = axis is not None and set(self.varying) <= set(self.workload.row_inputs)
        size = max(1, STACK_ROWS // max(1, rows)) if stackable else 1
        groups: list[list[Variant]] = []
        for base in sorted({v.base for v in variants}):
            same_base = [v for v in variants if v.base == base]
            groups += [same_base[i : i + size] for i in range(0, len(same_base), size)]
        return groups

    def stacked_inputs(self, group: Sequence[Variant]) -> dict[str, torch.Tensor]:
        """The inputs of a group from ``stacks``: row inputs concatenated, the rest shared."""
        if len(group) == 1:
            return self.inputs_of(group[0])
        each = [self.inputs_of(v) for v in group]
        rowwise = set(self.workload.row_inputs)
        return {n: torch.cat([e[n] for e in each]) if n in rowwise else each[0][n]
                for n in self.names}

    def expect(self, variants: Sequence[Variant]) -> None:
        """Compute the expected outputs these variants lack, a stack at a time."""
        missing = list({v.index: v for v in variants if v.index not in self._expected}.values())
        for group in self.stacks(missing):
            with torch.no_grad():
                produced = self.reference(*self.stacked_inputs(group).values())
            produced = [t if isinstance(t, torch.Tensor) else torch.as_tensor(t) for t in produced]
            for i, variant in enumerate(group):
                if len(group) == 1:
                    self._expected[variant.index] = [t.clone() for t in produced]
                else:
                    rows = produced[0].shape[0] // len(group)
                    self._expected[variant.index] = [t[i * rows : (i + 1) * rows].clone()
                                                     for t in produced]

    def warm(self, per_base: int) -> None:
        """Compute expected outputs for the first ``per_base`` variants of each base now,
        once per run, so that candidates' checked calls rarely wait for the reference."""
        self.expect([self.variant(i) for i in range(min(self.variant_count, per_base * self.config.bases))])

    def inputs_of(self, variant: Variant) -> dict[str, torch.Tensor]:
        base = self.bases[variant.base]
        return {n: variant.values[n] if n in variant.values else base[n] for n in self.names}

    def expected(self, variant: Variant) -> list[torch.Tensor]:
        """The reference's outputs for a variant (computed here once, then kept)."""
        self.expect([variant])
        return self._expected[variant.index]

    def check(self, snapshot: Sequence[torch.Tensor], assignment: dict[int, Variant],
              slots: Sequence[int]) -> CheckVerdict:
        """The workload's rule on these slots' outputs (``check_answers`` of them)."""
        _, verdict = self.check_answers(
            [(assignment[s], self.outputs_of(snapshot, s)) for s in slots])
        return verdict

    def check_answers(
        self, answers: Sequence[tuple[Variant, Sequence[torch.Tensor]]],
    ) -> tuple[int | None, CheckVerdict]:
        """The workload's rule on (variant, outputs) pairs, a stack of pairs per checker
        call; where a stack fails, its pairs one by one, so that the verdict names the
        first wrong one. Returns that pair's position (None when all pass) and its
        verdict, or, when all pass, a passing verdict whose every statistic is the largest
        any checker call reported (the worst error over all the answers)."""
        self.expect([variant for variant, _ in answers])
        worst: dict[str, float] = {}
        for group in self._stacked_positions(answers):
            verdict = self._check_stack([answers[i] for i in group])
            if verdict.ok:
                for key, value in verdict.stats.items():
                    worst[key] = max(worst.get(key, value), value)
                continue
            if len(group) > 1:  # which pair: the message names it
                for i in group:
                    alone = self._check_stack([answers[i]])
                    if not alone.ok:
                        return i, alone
            return group[0], verdict
        return None, CheckVerdict(True, stats=worst)

    def _stacked_positions(self, answers: Sequence[tuple[Variant, Any]]) -> list[list[int]]:
        """Positions in ``answers`` grouped as ``stacks`` groups their variants (a variant
        answered twice: each answer its own position, in order, so both are checked)."""
        positions: dict[int, list[int]] = {}
        for i, (variant, _) in enumerate(answers):
            positions.setdefault(id(variant), []).append(i)
        return [[positions[id(v)].pop(0) for v in group]
                for group in self.stacks([variant for variant, _ in answers])]

    def _check_stack(self, pairs: Sequence[tuple[Variant, Sequence[torch.Tensor]]]) -> CheckVerdict:
        if len(pairs) == 1:
            variant, outputs = pairs[0]
            return check_outputs(self.workload, outputs, self._expected[variant.index],
                                 self.inputs_of(variant))
        group = [variant for variant, _ in pairs]
        stacked = [torch.cat(parts) for parts in zip(*(o for _, o in pairs), strict=True)]
        expected = [torch.cat(parts) for parts in zip(*(self._expected[v.index] for v in group),
                                                      strict=True)]
        return check_outputs(self.workload, stacked, expected, self.stacked_inputs(group))

    # -- slots --------------------------------------------------------------------------

    def write(self, assignment: dict[int, Variant]) -> list[str]:
        """Write each slot's variant (all of one base); poison every output row.

        Returns the fixed inputs found changed before a switch of base (a candidate wrote
        them since the last check); they are restored either way.
        """
        bases = {v.base for v in assignment.values()}
        if len(bases) != 1:
            raise ValueError(f"one write holds variants of one base, not {sorted(bases)}")
        base = bases.pop()
        changed: list[str] = []
        if base != self.active_base:
            changed = [] if self.active_base < 0 else self.fixed_changed()
            self.use_base(base)
        order = sorted(assignment)
        slots = self._index(order)
        indices = self._index([assignment[s].index for s in order])
        self._written = {name: self._store_bytes[name].index_select(0, indices)
                         for name in self.varying}
        self._written_slots = slots
        self._written_order = order
        for name, values in self._written.items():  # one copy per input, not per slot
            self._varying_bytes[name].index_copy_(0, slots, values)
        for row in self.output_rows:
            row.fill_(poison_value(row.dtype))
        return changed

    def scrub(self) -> None:
        """After a process ends: nothing it computed or left behind stays for the next one
        (outputs poisoned, varying inputs and every spare byte zeroed, fixed inputs restored)."""
        self.input_chunk.raw[self.fixed_end :].zero_()
        for start, end in self.fixed_gaps:
            self.input_chunk.raw[start:end].zero_()
        self.output_chunk.raw.zero_()
        for row in self.output_rows:
            row.fill_(poison_value(row.dtype))
        self.restore_fixed()

    def snapshot(self) -> list[torch.Tensor]:
        """A copy of every output row, guards included, as the candidate left them."""
        return [row.clone() for row in self.output_rows]

    def outputs_of(self, snapshot: Sequence[torch.Tensor], slot: int) -> list[torch.Tensor]:
        return [row[slot, GUARD : row.shape[1] - GUARD].view(shape)
                for row, shape in zip(snapshot, self.output_shapes, strict=True)]

    def copy_outputs(self, snapshot: Sequence[torch.Tensor], slots: Sequence[int],
                     ) -> list[list[torch.Tensor]]:
        """Copies of these slots' outputs (``outputs_of`` each, cloned): one gather per
        output row for all of them, not one copy per slot and row."""
        if not slots:
            return []
        index = self._index(slots)
        bodies = [row.index_select(0, index)[:, GUARD : row.shape[1] - GUARD].contiguous()
                  for row in snapshot]  # the guards not kept (nor counted by the callers)
        return [[body[i].view(shape) for body, shape in zip(bodies, self.output_shapes, strict=True)]
                for i in range(len(slots))]

    def _index(self, values: Sequence[int]) -> torch.Tensor:
        """``values`` as an index tensor on the device, without a host sync on a GPU
        (a pinned copy, sent asynchronously; the device reads it in stream order)."""
        if self.device.type != "cuda":
            return torch.tensor(list(values), dtype=torch.long)
        return torch.tensor(list(values), dtype=torch.long, pin_memory=True).to(
            self.device, non_blocking=True)

    def screen(self, snapshot: Sequence[torch.Tensor], slots: Sequence[int]) -> dict[int, str]:
        """Cheap checks of many slots at once: guards intact, nothing left poisoned."""
        flags = self._screen_flags(snapshot, self._index(slots))
        return _screened(slots, torch.stack(flags).tolist() if flags else [])

    def _screen_flags(self, snapshot: Sequence[torch.Tensor], index: torch.Tensor) -> list[torch.Tensor]:
        """Per output row, two bool tensors over the slots of ``index``: a guard written,
        something left poisoned (on the device: read them with one sync)."""
        flags = []
        for row in snapshot:
            rows = row.index_select(0, index)
            guards = torch.cat([rows[:, :GUARD], rows[:, rows.shape[1] - GUARD :]], dim=1)
            body = rows[:, GUARD : rows.shape[1] - GUARD]
            flags.append((~still_poisoned(guards)).any(dim=1))
            flags.append(still_poisoned(body).any(dim=1) if body.numel()
                         else torch.zeros(len(index), dtype=torch.bool, device=index.device))
        return flags

    def duplicates(self, snapshot: Sequence[torch.Tensor], slots: Sequence[int]) -> list[list[int]]:
        """Groups of slots whose outputs are equal (a copied result looks like this; so
        does a shape whose answer does not depend on the inputs that vary).

        Each slot's output bytes are folded into one number with fixed random weights;
        equal outputs give equal numbers, and different ones almost never do.
        """
        return _grouped(slots, self._fold(snapshot, self._index(slots)).tolist())

    def _fold(self, snapshot: Sequence[torch.Tensor], index: torch.Tensor) -> torch.Tensor:
        """``duplicates``' number of each slot of ``index``, on the device."""
        keys = torch.zeros(len(index), dtype=torch.int64, device=index.device)
        for row in snapshot:
            body = row.index_select(0, index)[:, GUARD : row.shape[1] - GUARD].contiguous()
            words = body.view(torch.uint8).reshape(len(index), -1)
            if words.shape[1] % 4 == 0:
                words = words.view(torch.int32)
            weights = self._fold_weights(words.shape[1])
            # integer arithmetic (wrapping) is exact in any order: equal outputs, equal keys
            keys += (words.to(torch.int64) * weights).sum(dim=1)
        return keys

    def examine(self, snapshot: Sequence[torch.Tensor], assignment: dict[int, Variant],
                duplicates: bool = False) -> Examined:
        """``screen``, ``inputs_changed`` and (with ``duplicates``) ``duplicates`` of the
        slots of the last write, read from the device together: one host sync for all."""
        slots = self._written_slots
        order = self._check_written(assignment)
        flags = self._screen_flags(snapshot, slots)
        changed = self._changed_flags()
        parts = [torch.stack(flags).long().reshape(-1)] if flags else []
        if changed is not None:
            parts.append(changed.long())
        if duplicates:
            parts.append(self._fold(snapshot, slots))
        read = torch.cat(parts).tolist() if parts else []
        n, at = len(order), len(flags) * len(order)
        bad = _screened(order, [read[i * n : (i + 1) * n] for i in range(len(flags))])
        names = sorted(self._written)
        changed_names = [name for name, c in zip(names, read[at : at + len(names)], strict=True) if c]
        at += len(names) if changed is not None else 0
        groups = _grouped(order, read[at : at + n]) if duplicates else []
        return Examined(bad, changed_names, groups)

    def _fold_weights(self, width: int) -> torch.Tensor:
        """Fixed random weights for ``duplicates``, made once per output width."""
        if width not in self._weights:
            gen = torch.Generator(device="cpu").manual_seed(width)
            self._weights[width] = torch.randint(1, 1 << 31, (width,), generator=gen).to(self.device)
        return self._weights[width]

    def floor_bytes(self, variant: Variant) -> float | None:
        """The least bytes a correct kernel moves on this variant's inputs (kept)."""
        if variant.index not in self._bytes:
            cost = self.workload.cost(self.inputs_of(variant))
            self._bytes[variant.index] = None if cost is None else float(cost["bytes"])
        return self._bytes[variant.index]

    def inputs_changed(self, assignment: dict[int, Variant]) -> list[str]:
        """Varying inputs of these slots that differ from what the judge last wrote there
        (``assignment`` must be that write's), compared in one pass per input."""
        self._check_written(assignment)
        changed = self._changed_flags()
        if changed is None:
            return []
        return [name for name, c in zip(sorted(self._written), changed.tolist(), strict=True) if c]

    def _check_written(self, assignment: dict[int, Variant]) -> list[int]:
        order = sorted(assignment)
        if order != self._written_order:
            raise ValueError("inputs_changed compares the slots of the last write")
        return order

    def _changed_flags(self) -> torch.Tensor | None:
        """Per varying input (in name order), whether the last write's slots hold other
        bytes than it wrote (bit for bit), on the device; None where none varies."""
        if not self._written:
            return None
        return torch.stack([
            (self._varying_bytes[name].index_select(0, self._written_slots)
             != self._written[name]).any()
            for name in sorted(self._written)])

    def fixed_changed(self) -> list[str]:
        """Fixed inputs that differ from the active base. Where the chunk is sealed against
        writable mappings (the CPU) no other process can change them, and this costs
        nothing; on a GPU it compares (fast there)."""
        if self.inputs_sealed:
            return []
        return sorted(n for n, v in self.fixed_views.items()
                      if not same(v, self.bases[self.active_base][n]))

    def nbytes(self) -> int:
        """Memory this bank holds: its shared chunks and the judge's private stores."""
        return self.chunk_bytes() + self.private_bytes()

    def chunk_bytes(self) -> int:
        """Memory of the shared chunks (a twin has its own)."""
        return self.input_chunk.size + self.output_chunk.size

    def private_bytes(self) -> int:
        """Memory of the bases, variants and expected outputs (a twin shares them)."""
        def size(tensors: Any) -> int:
            return sum(t.numel() * t.element_size() for t in tensors)

        total = sum(size(self.bases[b][n] for n in self.fixed) for b in range(len(self.bases)))
        total += size(self._store.values())
        total += sum(size(outs) for outs in self._expected.values())
        return total

    def close(self) -> None:
        self.input_chunk.close()
        self.output_chunk.close()


@dataclass(frozen=True)
class Examined:
    """What ``ShapeBank.examine`` found in the slots of one write."""

    bad: dict[int, str]
    """Slot -> why its output fails the screen (``screen``)."""
    changed: list[str]
    """Varying inputs written over (``inputs_changed``)."""
    groups: list[list[int]]
    """Slots with equal outputs (``duplicates``; empty unless asked for)."""


def _screened(slots: Sequence[int], flags: Sequence[Sequence[int]]) -> dict[int, str]:
    """``screen``'s verdicts from the flags ``_screen_flags`` made (read on the host):
    per output row, a written guard, then something left poisoned."""
    bad: dict[int, str] = {}
    for broken, unwritten in zip(flags[0::2], flags[1::2], strict=True):
        for slot, b, u in zip(slots, broken, unwritten, strict=True):
            if b:
                bad.setdefault(slot, "the candidate wrote outside its output buffer")
            elif u:
                bad.setdefault(slot, "some outputs were never written")
    return bad


def _grouped(slots: Sequence[int], keys: Sequence[int]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for slot, key in zip(slots, keys, strict=True):
        groups.setdefault(key, []).append(slot)
    return [group for group in groups.values() if len(group) > 1]


def uncovered(specs: Sequence[TensorSpec], end: int) -> list[tuple[int, int]]:
    """Byte ranges of ``[0, end)`` that none of ``specs`` covers (alignment padding)."""
    gaps, at = [], 0
    for spec in sorted(specs, key=lambda s: s.offset):
        if spec.offset > at:
            gaps.append((at, spec.offset))
        at = max(at, spec.offset + spec.nbytes)
    if end > at:
        gaps.append((at, end))
    return gaps


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN equals NaN; fp8 has no comparison kernels)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def as_bytes(stacked: torch.Tensor) -> torch.Tensor:
    """A [slots, ...] tensor as [slots, bytes] of uint8 (fp8 has no index kernels)."""
    return stacked.reshape(stacked.shape[0], -1).view(torch.uint8)
