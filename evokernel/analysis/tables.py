"""pandas tables read from run directories: trajectories, time to target, operators, lineage.

The journal is the one source: a row per evaluation actually spent (cached repeats
cost nothing and are not rows), numbered from 1 in the order the engine charged
them, seeds included. ``best_so_far`` is the running maximum fitness, 0 until a
candidate passes (a speedup of 0: no working kernel yet).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from evokernel.journal import RunDir

EVALUATION_COLUMNS = ["strategy", "seed", "index", "generation", "candidate", "operator", "parents",
                      "status", "fitness", "best_so_far", "device_s", "spent_device_s"]


def evaluations(run: RunDir, strategy: str | None = None, seed: int | None = None) -> pd.DataFrame:
    """Every journaled evaluation of one run, in charge order."""
    rows = []
    best, spent = 0.0, 0.0
    for i, record in enumerate(run.records(), start=1):
        ev = record.evaluation
        fitness = ev.fitness
        if fitness is not None:
            best = max(best, fitness)
        spent += ev.device_s
        rows.append({
            "index": i, "generation": record.generation, "candidate": record.candidate_id,
            "operator": record.candidate.get("operator", ""),
            "parents": ";".join(record.candidate.get("parents", ())),
            "status": ev.status.value, "fitness": np.nan if fitness is None else fitness,
            "best_so_far": best, "device_s": ev.device_s, "spent_device_s": spent,
        })
    frame = pd.DataFrame(rows, columns=EVALUATION_COLUMNS[2:])
    frame.insert(0, "seed", run.manifest.get("seed", 0) if seed is None else seed)
    frame.insert(0, "strategy", run.manifest.get("strategy", "") if strategy is None else strategy)
    return frame.astype({"fitness": float, "best_so_far": float, "index": int})


def to_target(frame: pd.DataFrame, target: float, budget: float, unit: str = "evaluations") -> pd.DataFrame:
    """Per (strategy, seed): the cost at which best-so-far first reached ``target``.

    ``unit`` is ``evaluations`` (cost = evaluation number) or ``device_s`` (cost =
    device seconds spent). A run that never reached the target is kept, marked
    ``reached=False``, with cost ``budget + 1``: a value above every reached cost, so
    medians and rank tests treat it as "more than the budget", which is all we know.
    Only what was spent within the budget counts: the engine asks whole batches, so
    a device-second budget can be overshot by up to one batch.
    """
    cost_col = "index" if unit == "evaluations" else "spent_device_s"
    rows = []
    for (strategy, seed), whole in frame.groupby(["strategy", "seed"], sort=False):
        run = whole[whole[cost_col] <= budget]  # a device budget can overshoot by a batch: not counted
        hit = run[run["best_so_far"] >= target]
        reached = not hit.empty
        rows.append({
            "strategy": strategy, "seed": int(seed), "reached": reached,
            "cost": float(hit[cost_col].iloc[0]) if reached else float(budget + 1),
            "final_best": float(run["best_so_far"].iloc[-1]) if len(run) else 0.0,
            "evaluations": len(run),
        })
    return pd.DataFrame(rows, columns=["strategy", "seed", "reached", "cost", "final_best", "evaluations"])


def operator_success(frame: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and operator: children made, share that PASSED, share better than a parent.

    "Improved" means the child passed and beat the best fitness among its parents
    as evaluated in the same run (a parent that failed counts as fitness 0; a parent
    never evaluated in the run leaves the child out of the improvement count).
    """
    rows = []
    for (strategy, seed), run in frame.groupby(["strategy", "seed"], sort=False):
        fitness = dict(zip(run["candidate"], run["fitness"].fillna(0.0), strict=True))
        for op, parents, status, fit in zip(run["operator"], run["parents"], run["status"], run["fitness"], strict=True):
            ids = [p for p in parents.split(";") if p]
            known = [fitness[p] for p in ids if p in fitness]
            judged = bool(ids) and len(known) == len(ids)
            rows.append({"strategy": strategy, "seed": seed, "operator": op, "passed": status == "PASSED",
                         "judged": judged, "improved": judged and not np.isnan(fit) and fit > max(known)})
    per = pd.DataFrame(rows, columns=["strategy", "seed", "operator", "passed", "judged", "improved"])
    out = per.groupby(["strategy", "operator"], sort=False).agg(
        children=("passed", "size"), passed=("passed", "sum"), judged=("judged", "sum"),
        improved=("improved", "sum")).reset_index()
    out["passed_rate"] = out["passed"] / out["children"]
    out["improved_rate"] = (out["improved"] / out["judged"]).where(out["judged"] > 0)
    return out


def lineage(run: RunDir, of: str | None = None) -> pd.DataFrame:
    """The chain from a seed to the run's best candidate, or to candidate ``of``
    (following the best parent).

    Columns: step (0 = the seed end), candidate, operator, generation, fitness,
    status, and the parameters changed from the previous step.
    """
    records = run.records()
    by_id: dict[str, dict[str, Any]] = {}
    for r in records:
        by_id.setdefault(r.candidate_id, {"candidate": r.candidate, "evaluation": r.evaluation})
    scored = [(r.evaluation.rank_key(), -i, r.candidate_id) for i, r in enumerate(records)]
    if not scored:
        return pd.DataFrame(columns=["step", "candidate", "operator", "generation", "status", "fitness", "changed"])
    current: str | None = of if of is not None else max(scored)[2]
    chain: list[tuple[str, dict[str, Any] | None, Any]] = []
    visited: set[str] = set()
    while current is not None and current not in visited:
        visited.add(current)
        entry = by_id.get(current)
        if entry is None:  # a parent never evaluated in this run: end the chain at it
            cand = _source(run, current)
            chain.append((current, cand, None))
            break
        cand, ev = entry["candidate"], entry["evaluation"]
        chain.append((current, cand, ev))
        parents = [p for p in cand.get("parents", ()) if p != current]
        if not parents:
            break
        current = max(parents, key=lambda p: by_id[p]["evaluation"].rank_key() if p in by_id else (-1, 0.0))
    chain.reverse()
    rows = []
    previous: dict[str, Any] = {}
    for step, (cid, cand, ev) in enumerate(chain):
        params = _params(cand)
        changed = {k: v for k, v in params.items() if previous.get(k, v) != v} if step else {}
        rows.append({
            "step": step, "candidate": cid, "operator": (cand or {}).get("operator", "?"),
            "generation": (cand or {}).get("generation", 0),
            "status": ev.status.value if ev is not None else "not evaluated",
            "fitness": ev.fitness if ev is not None and ev.fitness is not None else np.nan,
            "changed": ", ".join(f"{k}={v}" for k, v in sorted(changed.items())),
        })
        previous = params
    return pd.DataFrame(rows)


def _source(run: RunDir, candidate_id: str) -> dict[str, Any] | None:
    path = run.sources_dir / f"{candidate_id}.json"
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _params(cand: dict[str, Any] | None) -> dict[str, Any]:
    """Values of every declared parameter (chosen, else default), from a candidate dict."""
    if not cand:
        return {}
    values: dict[str, Any] = {}
    for space in ("knob_space", "launch_space"):
        for name, p in (cand.get(space) or {}).items():
            values[name] = p["default"] if p.get("default") is not None else p["choices"][0]
    values.update(cand.get("knobs") or {})
    values.update(cand.get("launch") or {})
    return values


def stack(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate per-run frames, ordered by strategy (as given), seed and index."""
    if not frames:
        return pd.DataFrame(columns=EVALUATION_COLUMNS)
    out = pd.concat(list(frames), ignore_index=True)
    order = {s: i for i, s in enumerate(dict.fromkeys(out["strategy"]))}
    out = out.assign(_o=out["strategy"].map(order)).sort_values(["_o", "seed", "index"], kind="stable")
    return out.drop(columns="_o").reset_index(drop=True)
