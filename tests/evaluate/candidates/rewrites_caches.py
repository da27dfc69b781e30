"""Tries to rewrite the judge's caches: the baseline timings (so that every later honest
kernel gets a huge speedup) and the compiled-kernel cache (so that a later candidate
runs its binary). It learns the run's folder from its own log's path, tries the usual
names there and beside it, and reports what it could write."""

import json
import os


def _targets():
    folders = []
    try:
        log = os.readlink("/proc/self/fd/1")
        folders += [os.path.dirname(log), os.path.dirname(os.path.dirname(log))]
    except OSError:
        pass
    folders += [os.getcwd(), "/tmp", os.path.expanduser("~")]
    names = ["baseline_timings.json", "reference_timings.json", "builds/forged.bin",
             "builds/forged.json"]
    return [os.path.join(folder, name) for folder in folders for name in names]


def build(params, kernels):
    huge = {"median_ms": 1e6, "p25_ms": 1e6, "p75_ms": 1e6, "e2e_ms": 1e6, "samples": 1,
            "method": "judge-cpu"}
    wrote = []
    for path in _targets():
        if not os.path.isfile(path):
            continue  # only the judge's own files matter, not copies in its private /tmp
        try:
            with open(path, "w") as f:
                json.dump({"forged": huge}, f)
            wrote.append(path)
        except OSError:
            pass
    raise RuntimeError(f"rewrote caches: {wrote}" if wrote else "rewrote caches: found none of the judge's files")
