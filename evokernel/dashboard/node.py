"""Everything about one evaluated candidate, for the page's node panel.

Its source (``sources/<id>.json``), a unified diff against each parent (the files,
plus the declared parameters' values, since the built-in operators change values,
not code), its per-shape evaluation from the journal, its operator, and the LLM
exchange that made it, if one did: ``llm_outcomes.jsonl`` names the recording keys
of a proposal's requests, and each key is a file ``<recording dir>/<key>.json``
holding the request and the reply (``evokernel/llm/record.py``).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from evokernel.candidate import Candidate
from evokernel.dashboard.files import Evaluated, read_candidate, read_json
from evokernel.dashboard.run_view import RunView

MAX_TEXT = 40_000
"""Longest text (source file, log, message) sent to the page; the rest is cut and says so."""


class UnknownNode(LookupError):
    """No journal line and no source file has this id."""


def describe(view: RunView, candidate_id: str) -> dict[str, Any]:
    """The node panel's model; raises ``UnknownNode`` for an id this run does not know."""
    record = view.record(candidate_id)
    candidate, why = read_candidate(view.root, candidate_id)
    if record is None and candidate is None:
        raise UnknownNode(f"no candidate {candidate_id} in {view.root.name}: {why}")
    notices = [] if candidate is not None else [f"source unavailable: {why}"]
    parents = list(record.parents if record is not None else candidate.parents if candidate else ())
    diffs = []
    for parent_id in parents:
        parent, pwhy = read_candidate(view.root, parent_id)
        if parent is None or candidate is None:
            notices.append(f"no diff against {parent_id}: {pwhy or why}")
            continue
        diffs.append({"parent": parent_id, "parent_name": parent.name, "text": diff(parent, candidate)})
    return {
        "id": candidate_id,
        "run": view.label,
        "name": candidate.name if candidate else record.name if record else "?",
        "operator": candidate.operator if candidate else record.operator if record else "?",
        "generation": candidate.generation if candidate else record.candidate_generation if record else None,
        "language": candidate.language.value if candidate else None,
        "parents": parents,
        "params": dict(candidate.params) if candidate else {},
        "sources": {k: _cut(v) for k, v in sorted(candidate.sources.items())} if candidate else {},
        "diffs": diffs,
        "evaluation": None if record is None else _evaluation(record),
        "llm": _llm(view, candidate_id),
        "notices": notices,
    }


def diff(parent: Candidate, child: Candidate) -> str:
    """A unified diff of ``parent`` -> ``child``: every source file, then the parameter values."""
    out: list[str] = []
    for name in sorted(set(parent.sources) | set(child.sources)):
        a, b = parent.sources.get(name), child.sources.get(name)
        if a == b:
            continue
        out.extend(difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            fromfile=f"{parent.id}/{name}" if a is not None else "/dev/null",
            tofile=f"{child.id}/{name}" if b is not None else "/dev/null"))
    params_a = [f"{k} = {v!r}\n" for k, v in sorted(parent.params.items())]
    params_b = [f"{k} = {v!r}\n" for k, v in sorted(child.params.items())]
    out.extend(difflib.unified_diff(params_a, params_b, fromfile=f"{parent.id}/(parameters)",
                                    tofile=f"{child.id}/(parameters)", n=len(params_a) + len(params_b)))
    text = "".join(line if line.endswith("\n") else line + "\n" for line in out)
    return _cut(text) if text else "(no difference: same sources and parameter values)\n"


def _evaluation(r: Evaluated) -> dict[str, Any]:
    e = r.evaluation
    return {
        "status": e.status.value, "fitness": e.fitness, "mean_speedup": e.mean_speedup,
        "device_s": e.device_s, "wall_s": e.wall_s, "seq": r.seq, "generation": r.generation,
        "time": None if r.time is None else r.time.isoformat(),
        "feedback": _cut(e.feedback), "log": _cut(e.log), "resources": e.resources,
        "environment": e.environment,
        "shapes": [{
            "shape": s.shape, "status": s.status.value, "message": _cut(s.message),
            "ms": None if s.timing is None else s.timing.median_ms,
            "reference_ms": None if s.reference is None else s.reference.median_ms,
            "speedup": s.speedup, "method": None if s.timing is None else s.timing.method,
        } for s in e.shapes],
    }


def _llm(view: RunView, candidate_id: str) -> list[dict[str, Any]]:
    folder = view.recording_dir()
    out = []
    for outcome in view.llm_outcomes_of(candidate_id):
        exchanges = []
        for key in outcome.get("requests") or []:
            exchanges.append(_exchange(folder, str(key)))
        out.append({"operator": outcome.get("operator"), "outcome": outcome.get("outcome"),
                    "detail": outcome.get("detail"), "model": outcome.get("model"),
                    "tokens": outcome.get("tokens"), "generation": outcome.get("gen"), "exchanges": exchanges})
    return out


def _exchange(folder: Path, key: str) -> dict[str, Any]:
    if not key.isalnum():
        return {"key": key, "problem": "not a recording key"}
    data, why = read_json(folder / f"{key}.json")
    if data is None:
        return {"key": key, "problem": f"recording {why}"}
    request: dict[str, Any] = data["request"] if isinstance(data.get("request"), dict) else {}
    reply: dict[str, Any] = data["reply"] if isinstance(data.get("reply"), dict) else {}
    messages = [{"role": str(m.get("role")), "content": _cut(_text(m.get("content")))}
                for m in request.get("messages") or [] if isinstance(m, dict)]
    return {"key": key, "model": request.get("model"), "messages": messages,
            "reply": _cut(_text(reply.get("content"))), "tool_calls": reply.get("tool_calls") or [],
            "usage": reply.get("usage"), "latency_s": data.get("latency_s")}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n... ({len(text) - MAX_TEXT} more characters not shown)\n"
