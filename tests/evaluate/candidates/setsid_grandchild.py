"""Starts a grandchild in a session of its own (double fork + setsid, through ``from os
import fork``, which the static screen misses) that would outlive the evaluation and
disturb later ones; its argv carries the marker ``evk-redteam`` so that the test can
look for it in the host's process table afterwards. Then it fails its build."""

import time
from os import _exit, execv, fork, setsid, waitpid


def _orphan():
    if fork() == 0:
        setsid()
        if fork() == 0:
            execv("/bin/sleep", ["evk-redteam-orphan", "600"])
        _exit(0)


def build(params, kernels):
    _orphan()
    time.sleep(0.5)  # let it start
    waitpid(-1, 0)
    raise RuntimeError("started a setsid grandchild evk-redteam-orphan")
