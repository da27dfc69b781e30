"""A candidate's process from a fresh interpreter: ``python -m evokernel.evaluate.candidate_main FD DEVICE``.

The process confines itself first (isolation.py), before torch or anything of a
candidate is imported, then serves the judge on the socket ``FD``
(candidate_process.py says what it serves and what it holds). The fork server
(zygote.py) starts the same process faster, torch imported once; this is the way
where it is off or cannot run.
"""

from __future__ import annotations

import sys
import time

from evokernel.evaluate.isolation import confine

_BEGUN = time.perf_counter()
SCRATCH = confine()  # before torch or anything else is imported
START_STEPS_S = {"confine_s": time.perf_counter() - _BEGUN}
"""How long this process's start took, step by step (the judge's diagnosis of a spare's
start: ``ping``'s reply until a candidate is loaded)."""

from evokernel.evaluate.candidate_process import run_process  # noqa: E402  (imports torch)

START_STEPS_S["import_s"] = time.perf_counter() - _BEGUN - START_STEPS_S["confine_s"]

if __name__ == "__main__":
    run_process(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cpu", SCRATCH, START_STEPS_S)
