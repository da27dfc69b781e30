"""The ancestry of one candidate: every ancestor reachable through ``parents``.

Journal lines carry each candidate's parents, so the ancestry of the best candidate
comes from the journal alone; an ancestor that was never evaluated in this run (a
candidate named only in ``sources/``) is read from its source file and shown as
such. The main line follows each candidate's first parent (the one a mutation or
repair started from; for a crossover, the first of the pair).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from evokernel.dashboard.files import Evaluated, read_candidate

MAX_NODES = 200


def ancestry(candidate_id: str | None, by_id: dict[str, Evaluated], run_root: Path) -> dict[str, Any]:
    """Nodes (nearest first) and parent->child edges of ``candidate_id``'s ancestry."""
    if candidate_id is None:
        return {"of": None, "nodes": [], "edges": [], "truncated": False}
    main = set(_main_line(candidate_id, by_id, run_root))
    nodes: list[dict[str, Any]] = []
    edges: list[list[str]] = []
    depth = {candidate_id: 0}
    queue = deque([candidate_id])
    truncated = False
    while queue:
        cid = queue.popleft()
        if len(nodes) >= MAX_NODES:
            truncated = True
            break
        node = _node(cid, by_id, run_root)
        node.update(depth=depth[cid], main=cid in main)
        nodes.append(node)
        for parent in node["parents"]:
            edges.append([parent, cid])
            if parent not in depth:
                depth[parent] = depth[cid] + 1
                queue.append(parent)
    known = {n["id"] for n in nodes}
    return {"of": candidate_id, "nodes": nodes, "edges": [e for e in edges if e[0] in known],
            "truncated": truncated}


def _main_line(candidate_id: str, by_id: dict[str, Evaluated], run_root: Path) -> list[str]:
    line: list[str] = []
    cid = candidate_id
    while cid not in line and len(line) < MAX_NODES:
        line.append(cid)
        parents = _node(cid, by_id, run_root)["parents"]
        if not parents:
            break
        cid = parents[0]
    return line


def _node(cid: str, by_id: dict[str, Evaluated], run_root: Path) -> dict[str, Any]:
    r = by_id.get(cid)
    if r is not None:
        return {"id": cid, "name": r.name, "operator": r.operator, "generation": r.candidate_generation,
                "parents": list(r.parents), "status": r.status, "fitness": r.fitness, "seq": r.seq}
    cand, _ = read_candidate(run_root, cid)
    if cand is None:
        return {"id": cid, "name": "?", "operator": "?", "generation": None, "parents": [],
                "status": "UNKNOWN", "fitness": None, "seq": None}
    return {"id": cid, "name": cand.name, "operator": cand.operator, "generation": cand.generation,
            "parents": list(cand.parents), "status": "NOT_EVALUATED", "fitness": None, "seq": None}
