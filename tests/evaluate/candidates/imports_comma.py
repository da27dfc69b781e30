"""``import json, subprocess``: the old screen read only the first name of an import
line. It then starts a detached shell whose argv carries ``evk-redteam`` (so the test
can look for survivors) and fails its build. The AST screen sees every name; with the
screen off, the process's namespace must still take the shell down with it."""

import json
import subprocess


def build(params, kernels):
    subprocess.Popen(["/bin/sh", "-c", "exec -a evk-redteam-shell sleep 600"],
                     start_new_session=True, stdin=subprocess.DEVNULL)
    raise RuntimeError(json.dumps({"started": "evk-redteam-shell"}))
