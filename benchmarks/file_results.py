"""File what a device call sent back into benchmarks/results/, under a tag.

    python benchmarks/file_results.py --tag profile /work/.device/1/throughput-214443.tgz ...

Each ``<stage>-<time>.tgz`` that benchmarks/gpu_run.sh packed holds the stage's
``<what>-<device>-<date>.json`` (and its CSV), its log, sometimes a landscape
(``.jsonl``) and a profile. They are filed as:

- ``<what>-<tag>-<device>-<date>.json`` and ``.csv`` (the JSON's ``raw`` and
  ``landscape`` fields renamed to match);
- landscapes under ``raw/`` as ``<name>-<tag>-<device>-<date>.jsonl.xz`` (LZMA, preset
  9: every reader in evokernel takes them as they are);
- the stage's log as ``logs/<stage>-<tag>-<device>-<date>.log``, profiles beside the JSON;
- its ``.md`` files (a search's summary) as ``<name>-<tag>-<device>-<date>.md``;
- a search's ``best_candidate.json`` (a candidate, not a result: later commands take it
  as ``BEST=``) as ``benchmarks/candidates/best_candidate-<workload>-<tag>-<device>-<date>.json``
  (the workload and the device and date as its result names them: without a result, the tag alone).

Without a result in the archive (a stage cut short before writing one) the names lack
the device and date: give such an archive a tag of its own.

Nothing is overwritten: a name already taken stops the filing before anything is written.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CANDIDATES = Path(__file__).resolve().parent / "candidates"
"""Candidates a device call found (best_candidate.json), filed for later commands."""
_RESULT = re.compile(r"^(?P<what>.+?)-(?P<device>[a-z0-9]+(?:-[0-9]+gb-hbm3e?)?)-(?P<date>\d{4}-\d{2}-\d{2})$")


def short_device(device: str) -> str:
    """``h100-80gb-hbm3`` -> ``h100`` (the names the README and earlier files use)."""
    return device.split("-")[0]


def _filed_stem(found: re.Match[str], tag: str) -> str:
    """``<what>-<tag>-<short device>-<date>`` for a name ``_RESULT`` matched."""
    return f"{found['what']}-{tag}-{short_device(found['device'])}-{found['date']}"


def plan(archive: Path, tag: str, unpacked: Path) -> list[tuple[Path, Path, str]]:
    """(source, destination, kind) for every file worth keeping in one unpacked archive."""
    stage = re.sub(r"-\d{6}\.tgz$", "", archive.name)  # attn-check-030039.tgz -> attn-check
    results = [p for p in unpacked.iterdir() if p.suffix == ".json" and _RESULT.match(p.stem)]
    moves: list[tuple[Path, Path, str]] = []
    device = date = None
    searched: str | None = None  # the workload a search result names (search-<workload>-...)
    for result in results:
        found = _RESULT.match(result.stem)
        assert found is not None
        device, date = short_device(found["device"]), found["date"]
        stem = _filed_stem(found, tag)
        if found["what"].startswith("search-"):
            searched = found["what"].removeprefix("search-")
        moves.append((result, RESULTS / f"{stem}.json", "result"))
        csv = result.with_suffix(".csv")
        if csv.exists():
            moves.append((csv, RESULTS / f"{stem}.csv", "copy"))
    suffix = f"-{tag}-{device}-{date}" if device else f"-{tag}"
    for path in sorted(unpacked.iterdir()):
        if path.suffix == ".jsonl":
            moves.append((path, RESULTS / "raw" / f"{path.stem}{suffix}.jsonl.xz", "xz"))
        elif path.suffix == ".txt":  # a profile, named like its result or by its stage
            named = _RESULT.match(path.stem)
            moves.append((path, RESULTS / f"{_filed_stem(named, tag) if named else path.stem + suffix}.txt", "copy"))
        elif path.name == f"{stage}.log":
            moves.append((path, RESULTS / "logs" / f"{stage}{suffix}.log", "copy"))
        elif path.suffix == ".md":  # a search's summary
            moves.append((path, RESULTS / f"{path.stem}{suffix}.md", "copy"))
        elif path.name == "best_candidate.json":
            name = "-".join(part for part in ("best_candidate", searched, tag, device, date) if part)
            moves.append((path, CANDIDATES / f"{name}.json", "copy"))
    return moves


def renamed(text: str, moves: Sequence[tuple[Path, Path, str]]) -> str:
    """A result's JSON with its ``raw`` and ``landscape`` names following the files."""
    data = json.loads(text)
    names = {src.name: dst.relative_to(RESULTS).as_posix() for src, dst, _ in moves if dst.is_relative_to(RESULTS)}

    def follow(node: object) -> object:
        if isinstance(node, dict):
            return {k: follow(v) for k, v in node.items()}
        if isinstance(node, list):
            return [follow(v) for v in node]
        if isinstance(node, str):
            base = node.removeprefix("raw/")
            return names.get(base, node)
        return node

    return json.dumps(follow(data), indent=1) + "\n"


def file_archive(archive: Path, tag: str) -> list[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        moves = plan(archive, tag, Path(tmp))
        taken = [dst for _, dst, _ in moves if dst.exists()]
        if taken:
            raise SystemExit(f"not filing {archive.name}: already there: {', '.join(map(str, taken))}")
        for src, dst, kind in moves:
            dst.parent.mkdir(parents=True, exist_ok=True)
            if kind == "result":
                dst.write_text(renamed(src.read_text(), moves))
            elif kind == "xz":
                with lzma.open(dst, "wb", preset=9) as out:
                    out.write(src.read_bytes())
            else:
                dst.write_bytes(src.read_bytes())
        return [dst for _, dst, _ in moves]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tag", required=True, help="what distinguishes this run (e.g. profile)")
    parser.add_argument("archives", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.]*", args.tag):
        parser.error("--tag: lower-case letters, digits, '_' and '.'")
    for archive in args.archives:
        for path in file_archive(archive, args.tag):
            print(path.relative_to(RESULTS.parent.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
