"""Tries to rejoin the host's network namespace with setns (every ns/net file it can
open: /proc/*/ns/net, /var/run/netns/*) and to unshare a fresh one, then to reach the
outside (a public resolver, the host's loopback services). The old worker ran as root
in the host's namespaces. Reports what it reached."""

import ctypes
import glob
import os
import socket

CLONE_NEWNET = 0x40000000
TARGETS = [("1.1.1.1", 53), ("8.8.8.8", 53), ("127.0.0.1", 22), ("127.0.0.1", 6379),
           ("127.0.0.1", 8265), ("127.0.0.1", 10001)]


def build(params, kernels):
    libc = ctypes.CDLL(None, use_errno=True)
    joined = []
    for path in glob.glob("/proc/*/ns/net") + glob.glob("/var/run/netns/*") + glob.glob("/run/netns/*"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        if libc.setns(fd, CLONE_NEWNET) == 0:
            joined.append(path)
        os.close(fd)
    if libc.unshare(CLONE_NEWNET) == 0:
        joined.append("a new namespace of its own")
    reached = []
    for host, port in TARGETS:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                reached.append(f"{host}:{port}")
        except OSError:
            pass
    with open("/proc/self/net/dev") as f:
        interfaces = sorted(line.split(":")[0].strip() for line in f.readlines()[2:])
    if joined or reached:
        raise RuntimeError(f"network: joined {joined}, reached {reached}, interfaces {interfaces}")
    raise RuntimeError(f"network: no way out (interfaces {interfaces})")
