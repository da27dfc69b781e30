"""The dashboard's web app: a few JSON routes, one event stream and static files.

Routes (all GET, all read-only):

    /                  the page (static/index.html); it loads everything else
    /static/...        the page's script and style, and plotly.min.js from the
                       installed ``plotly`` package (nothing is fetched from the network)
    /api/state         the page model (``?run=KEY`` picks a run of a comparison)
    /api/node          one candidate (``?id=ID[&run=KEY]``): source, diffs, evaluation, LLM
    /api/events        server-sent events: the page model again each time the files change

Every answer about the run's files is a 200 with a model, even when the files are
torn or corrupt (the model's ``notices`` say so); an unknown node or run is a 404
with a one-line ``error``; a failure of the dashboard itself is a 500 with a
one-line ``error``, logged with its traceback, and the stream carries on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from evokernel.dashboard import node
from evokernel.dashboard.target import Target

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
KEEPALIVE_S = 15.0


def plotly_js() -> Path:
    """The plotly.js bundle that the ``plotly`` Python package ships."""
    import plotly

    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall the plotly package")
    return path


def clean(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def to_json(value: Any) -> str:
    return json.dumps(clean(value), separators=(",", ":"), allow_nan=False, default=str)


def json_response(value: Any, status: int = 200) -> Response:
    return Response(to_json(value), status_code=status, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


def create_app(root: Path, poll_s: float = 1.0) -> Starlette:
    """The app following ``root`` (a run directory or a comparison folder), polling every ``poll_s``."""
    target = Target(root)
    plotly_path = plotly_js()

    def model(run: str | None) -> dict[str, Any]:
        return target.state(run)

    async def state(request: Request) -> Response:
        try:
            return json_response(await run_in_threadpool(model, request.query_params.get("run")))
        except Exception as exc:  # the dashboard's own fault: say it in one line, keep serving
            log.exception("building the page model failed")
            return json_response({"error": f"dashboard error: {exc}"}, 500)

    async def candidate(request: Request) -> Response:
        cid = request.query_params.get("id", "")
        run = request.query_params.get("run")
        try:
            await run_in_threadpool(target.refresh)
            view = target.run_view(run)
            if view is None:
                return json_response({"error": f"no run {run!r} here" if run else "name a run: ?run=KEY"}, 404)
            return json_response(await run_in_threadpool(node.describe, view, cid))
        except node.UnknownNode as exc:
            return json_response({"error": str(exc)}, 404)
        except Exception as exc:
            log.exception("describing candidate %s failed", cid)
            return json_response({"error": f"dashboard error: {exc}"}, 500)

    async def events(request: Request) -> Response:
        run = request.query_params.get("run")

        async def stream() -> AsyncIterator[str]:
            last: Any = None
            quiet = 0.0
            yield "retry: 2000\n\n"
            while not await request.is_disconnected():
                try:
                    current = await run_in_threadpool(model, run)
                    stamp: Any = (current["version"], (current.get("selected") or {}).get("version"),
                                  current.get("kind"))
                except Exception as exc:
                    log.exception("building the page model failed")
                    current = {"error": f"dashboard error: {exc}"}
                    stamp = current["error"]
                if stamp != last:
                    last, quiet = stamp, 0.0
                    yield f"event: state\ndata: {to_json(current)}\n\n"
                elif quiet >= KEEPALIVE_S:
                    quiet = 0.0
                    yield ": keep-alive\n\n"
                await asyncio.sleep(poll_s)
                quiet += poll_s

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def plotly(request: Request) -> Response:
        return FileResponse(plotly_path, media_type="text/javascript")

    return Starlette(routes=[
        Route("/", index),
        Route("/api/state", state),
        Route("/api/node", candidate),
        Route("/api/events", events),
        Route("/static/plotly.min.js", plotly),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])
