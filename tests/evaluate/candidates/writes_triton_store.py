"""Tries to plant a compiled kernel in the judge's Triton store, which every later
candidate's process reads first: a fake entry (a cache key's name, a forged binary)
written through the store's path in its scratch, through the host path its mount
record names, through /proc/1/root and /proc/self/root, after a chmod of each; and the
same entry left in its own Triton cache, in case the judge copies that cache out. It
reports every write that held (the store must stay unwritable, and an untrusted
process's cache is never copied)."""

import contextlib
import os

ENTRY = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"  # base32 of a SHA-256: 52 chars


def _store_paths():
    store = os.environ.get("EVOKERNEL_TRITON_KERNELS", "")
    paths = [store] if store else []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if store and len(fields) > 4 and fields[4] == store:
                    paths.append(fields[3])  # the bind's source, as the host names it
    except OSError:
        pass
    for prefix in ("/proc/1/root", "/proc/self/root"):
        paths += [prefix + p for p in list(paths) if p.startswith("/")]
    return store, paths


def _plant(folder):
    """An entry written into ``folder``, which must exist already (a path made here, in
    the process's private /tmp, would be a folder of its own, not the store)."""
    if not os.path.isdir(folder):
        return False
    with contextlib.suppress(OSError):
        os.chmod(folder, 0o777)
    try:
        os.makedirs(os.path.join(folder, ENTRY), exist_ok=True)
        with open(os.path.join(folder, ENTRY, "forged.cubin"), "wb") as f:
            f.write(b"\x7fELF forged")
        return True
    except OSError:
        return False


def build(params, kernels):
    store, paths = _store_paths()
    print(f"store paths found: {[p for p in paths if os.path.isdir(p)]}")
    wrote = [p for p in paths if _plant(p)]
    own = os.environ.get("TRITON_CACHE_DIR", "")
    planted = bool(own) and _plant(own)  # harmless: only a trusted process's cache is copied
    seen = "a store" if store else "no store"
    raise RuntimeError(f"{seen}; wrote the store: {wrote if wrote else 'none'}; "
                       f"own cache planted: {planted}")
