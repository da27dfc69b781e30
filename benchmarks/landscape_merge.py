"""Join landscapes measured in several sessions into one file that compare can replay.

    python benchmarks/landscape_merge.py --out workloads/dsa_topk/landscapes/cuda_family-h200.jsonl.xz \
        --workload dsa_topk --seed cuda_family --grid MS_MODE,MS_SCORE,MS_STAGES,MS_WARPS,MS_CTAS,MS_EARLY,MS_SLICES \
        benchmarks/results/raw/landscape-dsa_topk-cuda_family-grid9-h200-2026-12-05.jsonl.xz more.jsonl

Records are kept in the order read, each candidate once (the first measurement of it
wins); every record must be on the same shapes. With ``--grid`` (and ``--seed``), only
the points of that grid are kept: the named parameters of the seed at any valid values,
every other one at the seed's value (benchmarks/landscape_points.py ``grid``), and the
summary says how much of the grid the inputs hold. Compare restricts the search space to
the values a landscape records, so a complete grid is a space with no unseen proposals.
Writes ``.jsonl``, or ``.jsonl.xz`` compressed (sources repeat in every record and xz
stores them once). Prints one summary line; exit status 0, or 2 on bad input.
"""

from __future__ import annotations

import argparse
import lzma
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.landscape_points import LandscapeFileError, grid, read_records
from evokernel.workload import load_workload


class UsageError(ValueError):
    """Bad input: a message for the user, exit status 2."""


def merge(paths: Sequence[Path], keep: set[str] | None = None) -> tuple[list[str], dict[str, int]]:
    """The merged lines and counts (read, repeated, outside the grid, kept)."""
    try:
        records = read_records(paths)
    except LandscapeFileError as exc:
        raise UsageError(str(exc)) from exc
    shape_sets = {r.shapes for r in records}
    if len(shape_sets) > 1:
        raise UsageError(f"the landscapes were measured on {len(shape_sets)} different shape sets; "
                         "only records of one set combine")
    seen: set[str] = set()
    lines = []
    counts = {"read": len(records), "repeated": 0, "outside_grid": 0}
    for r in records:
        if r.candidate_id in seen:
            counts["repeated"] += 1
            continue
        seen.add(r.candidate_id)
        if keep is not None and r.candidate_id not in keep:
            counts["outside_grid"] += 1
            continue
        lines.append(r.line)
    counts["kept"] = len(lines)
    return lines, counts


def write(path: Path, lines: Sequence[str]) -> None:
    data = ("\n".join(lines) + "\n").encode()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(lzma.compress(data, preset=9) if path.suffix == ".xz" else data)
    tmp.replace(path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("landscapes", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help=".jsonl or .jsonl.xz")
    parser.add_argument("--workload", help="with --grid: the workload of the seed")
    parser.add_argument("--seed", help="with --grid: the seed whose grid is kept")
    parser.add_argument("--grid", default="", metavar="NAME,NAME,...",
                        help="keep only this grid's points (the others at the seed's values)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not args.out.name.endswith((".jsonl", ".jsonl.xz")):
            raise UsageError(f"--out {args.out}: name it .jsonl or .jsonl.xz")
        if not args.out.parent.is_dir():
            raise UsageError(f"--out {args.out}: no folder {args.out.parent}")
        keep = None
        if args.grid:
            if not (args.workload and args.seed):
                raise UsageError("--grid needs --workload and --seed")
            try:
                workload = load_workload(args.workload)
            except (KeyError, ValueError, FileNotFoundError) as exc:
                raise UsageError(str(exc)) from exc
            seeds = {s.name: s for s in workload.seeds()}
            if args.seed not in seeds:
                raise UsageError(f"{args.workload} has no seed {args.seed!r} (it has {sorted(seeds)})")
            try:
                points = grid(seeds[args.seed], [n for n in args.grid.split(",") if n], 0)
            except ValueError as exc:
                raise UsageError(str(exc)) from exc
            keep = {candidate.id for _, candidate in points}
        lines, counts = merge(args.landscapes, keep)
        if not lines:
            raise UsageError("no record is left to write")
    except UsageError as exc:
        print(f"landscape_merge: {exc}", file=sys.stderr)
        return 2
    write(args.out, lines)
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    if keep is not None:
        summary += f"; the grid has {len(keep)} points, {counts['kept'] / len(keep):.1%} of them measured"
    print(f"wrote {args.out}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
