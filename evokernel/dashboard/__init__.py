"""A live web dashboard of a run directory or a comparison folder.

``python -m evokernel.dashboard runs/<run or comparison>`` serves a local page
that follows the run's files while the search writes them: best-so-far over
evaluations and device seconds (per island; per strategy with a band over seeds for
a comparison), status counts, evaluation rate, budget used, the lineage of the best
candidate with each node's source, diff, per-shape evaluation and LLM exchange,
MAP-Elites grids, islands and Optuna studies.

Why these libraries: Starlette (with uvicorn as its server) is a small, well-kept
ASGI toolkit that gives routing, static files and streaming responses, which is all
a read-only page with server-sent events needs; Dash or Streamlit would bring a
second application model, a bigger dependency tree and their own front-end
bundles. Plotly.js draws the charts with zoom, hover and click events; it is served
from the file the ``plotly`` Python package ships, so the page fetches nothing from
the network. The page itself is one static HTML file with a small script.

Modules: ``files`` (tolerant readers of the run directory's files), ``run_view``
and ``comparison_view`` (the page models), ``populations``, ``lineage``,
``optuna_studies`` and ``node`` (their parts), ``target`` (what the path is),
``server`` (the Starlette app) and ``__main__`` (the command).

It only reads: nothing in the run directory is written, created or locked.
"""
