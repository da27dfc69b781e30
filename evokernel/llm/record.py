"""Record and replay of LLM exchanges, keyed by a hash of the request.

Each answered request is one file ``<dir>/<key>.json`` holding the request body
(never headers, so never the key) and the reply, written atomically (temporary
file, then rename), so a killed run leaves either the whole exchange or nothing.
The key hashes everything that decides the answer: model, messages, tools,
temperature, max_tokens, seed. A run asks each distinct request at most once.
The agent's tool evaluations are kept alongside (``evals/``), so a replayed agent
sees the very tool results, and so the very requests, of the recorded one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from evokernel.evaluate.result import Evaluation

VERSION = 1


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_key(request: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(request).encode()).hexdigest()[:32]


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Recording:
    """A folder of recorded exchanges."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored exchange, or None if absent or unreadable (a torn file never is)."""
        try:
            data = json.loads(self.path(key).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) and data.get("key") == key else None

    def put(self, key: str, request: dict[str, Any], reply: dict[str, Any], **meta: Any) -> None:
        record = {"version": VERSION, "key": key, "request": request, "reply": reply, **meta}
        write_atomic(self.path(key), json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False))

    def stored_keys(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.stem for p in self.directory.glob("*.json"))

    def models(self) -> list[str]:
        """The models the recorded requests named, most used first."""
        counts: dict[str, int] = {}
        for key in self.stored_keys():
            record = self.get(key)
            model = None if record is None else record.get("request", {}).get("model")
            if isinstance(model, str):
                counts[model] = counts.get(model, 0) + 1
        return sorted(counts, key=lambda m: (-counts[m], m))

    # -- the agent's tool evaluations -------------------------------------------------
    def _eval_path(self, candidate_id: str, shapes: tuple[str, ...]) -> Path:
        tag = hashlib.sha256(canonical(list(shapes)).encode()).hexdigest()[:12]
        return self.directory / "evals" / f"{candidate_id}-{tag}.json"

    def get_evaluation(self, candidate_id: str, shapes: tuple[str, ...]) -> Evaluation | None:
        try:
            return Evaluation.model_validate_json(self._eval_path(candidate_id, shapes).read_text())
        except (OSError, ValueError):
            return None

    def put_evaluation(self, shapes: tuple[str, ...], evaluation: Evaluation) -> None:
        path = self._eval_path(evaluation.candidate_id, shapes)
        write_atomic(path, evaluation.model_dump_json(indent=1))
