"""Looks for secrets (an API key the test plants in its own environment) in every
environment it can read: its own, /proc/<ppid>/environ, /proc/1/environ and every
/proc/*/environ, and in the usual credential files. Reports what it saw."""

import os
import re

SECRET = re.compile(rb"(KEY|TOKEN|SECRET|PASSWORD)[A-Z_]*=[^\x00]+")
FILES = ["~/.netrc", "~/.config/openai/key", "/root/.netrc", "/root/.bash_history",
         "/etc/environment"]


def build(params, kernels):
    found = []
    blobs = [("own environment", "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode())]
    pids = {str(os.getppid()), "1"} | {p for p in os.listdir("/proc") if p.isdigit()}
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                blobs.append((f"/proc/{pid}/environ", f.read()))
        except OSError:
            pass
    for path in FILES:
        try:
            with open(os.path.expanduser(path), "rb") as f:
                blobs.append((path, f.read()))
        except OSError:
            pass
    for where, blob in blobs:
        found += [f"{where}: {m.group(0).decode(errors='replace')}" for m in SECRET.finditer(blob)]
    raise RuntimeError(f"secrets seen: {found}" if found else "secrets seen: none")
