"""The store of compiled seed kernels: what it admits, whom it trusts, how a candidate's
process reads it, and that no candidate process can write it (triton_store.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sysconfig
from pathlib import Path

import pytest
from triton.runtime.cache import FileCacheManager

from evokernel.candidate import Language, Param
from evokernel.evaluate import triton_store
from evokernel.evaluate.isolation import TRITON_KERNELS_VARIABLE, namespaces_permitted, probe
from evokernel.evaluate.triton_reader import StoreFirstCacheManager
from evokernel.evaluate.triton_store import TritonStore
from evokernel.workload import load_workload

from .test_isolation import confined_report

KEY = "A" * 52
OTHER = "B" * 52
FULLY_CONFINED = namespaces_permitted() and os.geteuid() == 0


def compiled(cache: Path, key: str, monkeypatch: pytest.MonkeyPatch, payload: bytes = b"\x7fELF cubin") -> None:
    """An entry as Triton's compiler leaves it: its files put one by one, then the group."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    manager = FileCacheManager(key)
    group = {name: manager.put(data, name) for name, data in
             (("kernel.cubin", payload), ("kernel.ttir", "module {}"), ("kernel.json", '{"name": "kernel"}'))}
    manager.put_group("kernel.json", group)


def store(tmp_path: Path) -> TritonStore:
    return TritonStore(tmp_path / "triton", load_workload("fused_moe").seeds())


def always() -> bool:
    return True


def test_a_complete_entry_is_admitted_and_found_first_by_the_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = store(tmp_path)
    compiled(tmp_path / "process", KEY, monkeypatch)
    assert kernels.admit(tmp_path, "process", always) == 1
    entry = kernels.kernels / KEY
    # the group names its files by name alone: the store is bound elsewhere in a process
    assert json.loads((entry / "__grp__kernel.json").read_text()) == {"child_paths": {
        "kernel.cubin": "kernel.cubin", "kernel.ttir": "kernel.ttir", "kernel.json": "kernel.json"}}
    assert (entry / "kernel.cubin").read_bytes() == b"\x7fELF cubin"
    # a process's own cache is empty: the reader answers from the store
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv(TRITON_KERNELS_VARIABLE, str(kernels.kernels))
    reader = StoreFirstCacheManager(KEY)
    group = reader.get_group("kernel.json")
    assert group == {name: str(entry / name) for name in ("kernel.cubin", "kernel.ttir", "kernel.json")}
    assert reader.get_file("kernel.cubin") == str(entry / "kernel.cubin")
    # what the store lacks is the process's own business: compiled and put in its cache
    other = StoreFirstCacheManager(OTHER)
    assert other.get_group("kernel.json") is None
    put = other.put(b"mine", "kernel.cubin")
    assert Path(put).parent == tmp_path / "fresh" / OTHER
    assert other.get_file("kernel.cubin") == put


def test_a_launcher_module_is_admitted_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton caches a module it built with the host compiler (a kernel's launcher) as one
    file with no group, and looks it up by ``get_file``. Other lone files are not kept: an
    autotuner's timings, a module that is no ELF file, loose files."""
    cache = tmp_path / "process"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    launcher = "__triton_launcher" + sysconfig.get_config_var("EXT_SUFFIX")
    FileCacheManager(KEY).put(b"\x7fELF launcher", launcher)
    FileCacheManager("C" * 52).put(b'{"configs_timings": []}', "kernel.autotune.json")
    FileCacheManager("D" * 52).put(b"#!/bin/sh", launcher)
    loose = FileCacheManager(OTHER)
    loose.put(b"\x7fELF a", "a" + sysconfig.get_config_var("EXT_SUFFIX"))
    loose.put(b"\x7fELF b", "b" + sysconfig.get_config_var("EXT_SUFFIX"))
    kernels = store(tmp_path)
    assert kernels.admit(tmp_path, "process", always) == 1
    assert [p.name for p in kernels.kernels.iterdir()] == [KEY]
    monkeypatch.setenv(TRITON_KERNELS_VARIABLE, str(kernels.kernels))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh"))
    found = StoreFirstCacheManager(KEY).get_file(launcher)
    assert found is not None and Path(found).read_bytes() == b"\x7fELF launcher"


def test_only_whole_entries_of_plain_files_are_admitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "process"
    names = {"in_progress": "C" * 52, "linked": "D" * 52, "missing": "E" * 52,
             "large": "F" * 52, "good": "G" * 52}
    for key in names.values():
        compiled(cache, key, monkeypatch)
    (cache / names["in_progress"] / "tmp.pid_7_abc").mkdir()  # a compile not over
    (cache / names["linked"] / "kernel.cubin").unlink()
    (cache / names["linked"] / "kernel.cubin").symlink_to("/etc/hostname")
    (cache / names["missing"] / "kernel.ttir").unlink()  # the group names it
    (cache / names["large"] / "kernel.cubin").write_bytes(b"x" * 2048)
    (cache / "not-a-key").mkdir()
    monkeypatch.setattr(triton_store, "FILE_LIMIT", 1024)
    kernels = store(tmp_path)
    assert kernels.admit(tmp_path, "process", always) == 1
    assert sorted(p.name for p in kernels.kernels.iterdir()) == [names["good"]]


def test_links_and_pipes_are_never_followed_or_waited_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``/proc/<pid>/root`` a link resolves against the judge's root, and reading a
    pipe would wait for ever: neither a linked cache folder nor a linked entry is read,
    and an entry holding a pipe is skipped at once."""
    real = tmp_path / "real"
    compiled(real, KEY, monkeypatch)
    compiled(real, OTHER, monkeypatch)
    os.mkfifo(real / OTHER / "kernel.ttir.fifo")
    (tmp_path / "linked").symlink_to(real)
    kernels = store(tmp_path)
    assert kernels.admit(tmp_path, "linked", always) == 0  # the cache folder is a link
    (tmp_path / "entries").mkdir()
    (tmp_path / "entries" / KEY).symlink_to(real / KEY)
    assert kernels.admit(tmp_path, "entries", always) == 0  # an entry is a link
    assert kernels.admit(tmp_path, "real", always) == 1  # the pipe's entry is skipped
    assert [p.name for p in kernels.kernels.iterdir()] == [KEY]


def test_lookups_of_stored_kernels_are_not_counted_as_compiled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton makes the folder of every key it looks up, found in the store or not: a
    process that compiled nothing offers nothing."""
    kernels = store(tmp_path)
    compiled(tmp_path / "first", KEY, monkeypatch)
    kernels.admit(tmp_path, "first", always)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "second"))
    monkeypatch.setenv(TRITON_KERNELS_VARIABLE, str(kernels.kernels))
    assert StoreFirstCacheManager(KEY).get_group("kernel.json") is not None
    assert (tmp_path / "second" / KEY).is_dir()  # the empty folder the lookup left
    kernels.admit(tmp_path, "second", always)
    assert kernels.offered == 1 and kernels.admitted == 1


def test_a_judge_that_may_not_read_processes_says_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Reading another user's process's root needs CAP_SYS_PTRACE (a container may drop it)."""
    def refused(root: Path, relative: str) -> int:
        raise PermissionError(13, "Permission denied", str(root))

    monkeypatch.setattr(triton_store, "_open_beneath", refused)
    kernels = store(tmp_path)
    for _ in range(3):
        assert kernels.admit(tmp_path, "process", always) == 0
    assert caplog.text.count("CAP_SYS_PTRACE") == 1


def test_what_a_dead_judge_left_staged_is_cleared_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Evaluators in other processes may share a store: only an admission whose process
    is gone is cleared."""
    kernels = tmp_path / "triton" / "kernels"
    child = subprocess.Popen(["true"])
    child.wait()  # a process number no process has now (reaped)
    dead = kernels / f"{triton_store.STAGED}{child.pid}-0123"
    live = kernels / f"{triton_store.STAGED}{os.getpid()}-4567"
    for folder in (dead, live):
        (folder / KEY).mkdir(parents=True)
    store(tmp_path)
    assert not dead.exists() and live.exists()


def test_nothing_is_kept_from_a_process_that_died_during_the_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its number may be another process's by the end of the copy."""
    compiled(tmp_path / "process", KEY, monkeypatch)
    kernels = store(tmp_path)
    assert kernels.admit(tmp_path, "process", lambda: False) == 0
    assert list(kernels.kernels.iterdir()) == []


def test_the_first_copy_of_an_entry_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = store(tmp_path)
    compiled(tmp_path / "first", KEY, monkeypatch, b"first")
    compiled(tmp_path / "second", KEY, monkeypatch, b"second")
    assert kernels.admit(tmp_path, "first", always) == 1
    assert kernels.admit(tmp_path, "second", always) == 0
    assert (kernels.kernels / KEY / "kernel.cubin").read_bytes() == b"first"


def test_a_full_store_admits_nothing_more_and_says_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    compiled(tmp_path / "process", KEY, monkeypatch)
    compiled(tmp_path / "process", OTHER, monkeypatch)
    monkeypatch.setattr(triton_store, "STORE_LIMIT", 10)
    kernels = store(tmp_path)
    assert kernels.admit(tmp_path, "process", always) == 0
    assert kernels.admit(tmp_path, "process", always) == 0
    assert caplog.text.count("no more kernels are kept") == 1
    assert kernels.offered == 4  # what the process compiled, kept or not


def test_the_store_is_reached_through_its_bind_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its folder is its owner's only: a candidate's process, another user, cannot walk to
    it on the host; the kernels and their files are readable, never writable, by others."""
    kernels = store(tmp_path)
    compiled(tmp_path / "process", KEY, monkeypatch)
    kernels.admit(tmp_path, "process", always)
    assert stat.S_IMODE(kernels.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(kernels.kernels.stat().st_mode) == 0o755
    for path in (kernels.kernels / KEY).iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_only_a_shipped_seeds_code_is_trusted(tmp_path: Path) -> None:
    workload = load_workload("fused_moe")
    kernels = TritonStore(tmp_path / "triton", workload.seeds())
    seed = next(s for s in workload.seeds() if s.language is Language.TRITON)
    assert kernels.trusts(seed)
    name, spec = next(iter(seed.knob_space.items()))
    variant = seed.with_params(knobs={name: spec.choices[-1]}, operator="test")
    assert kernels.trusts(variant)  # any values among the seed's choices
    file = next(iter(seed.sources))
    edited = seed.model_copy(update={"sources": {**seed.sources, file: seed.sources[file] + "\n# edited\n"}})
    assert not kernels.trusts(edited)
    widened = seed.model_copy(update={"knob_space": {
        **seed.knob_space, name: Param(choices=(*spec.choices, "injected"), default=spec.default)}})
    assert not kernels.trusts(widened)
    torch_seed = next(s for s in workload.seeds() if s.language is Language.TORCH)
    assert kernels.trusts(torch_seed)  # any shipped seed's code: its process ran nothing else
    # a CUDA seed that hands some batches to the Triton pipeline it ships
    assert kernels.trusts(next(s for s in workload.seeds() if s.name == "cuda_small_batch"))
    assert not kernels.trusts(torch_seed.model_copy(update={"name": "renamed", "sources": {
        name: text + "\n" for name, text in torch_seed.sources.items()}}))
    # a value equal to a choice but of another type (4.0 for 4, True for 1): not the seed's
    number = next(n for n, p in {**seed.knob_space, **seed.launch_space}.items()
                  if all(type(c) is int for c in p.choices))
    value = seed.params[number]
    where = "knobs" if number in seed.knob_space else "launch"
    assert kernels.trusts(seed.with_params(**{where: {number: value}}, operator="test"))
    assert not kernels.trusts(seed.with_params(**{where: {number: float(value)}}, operator="test"))


@pytest.mark.skipif(not FULLY_CONFINED, reason="needs root and permission to create namespaces")
def test_a_confined_process_reads_the_store_and_cannot_write_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = store(tmp_path)
    compiled(tmp_path / "process", KEY, monkeypatch)
    kernels.admit(tmp_path, "process", always)
    seen = confined_report(probe(), kernels.environment())
    view = seen["triton_store"]
    assert view is not None and view["listing"] == [KEY], view
    assert view["at"] != str(kernels.kernels)  # bound in its scratch, not the host's path
    assert view["writable"] is False
    assert list(kernels.kernels.iterdir()) == [kernels.kernels / KEY]


LEAVES_AN_ENTRY = '''

import json as _json
import os as _os

_KEY = "{key}"
_SEEN = "{seen}"


def _leave_an_entry():
    """At build: a Triton-like cache entry in the private cache, and a try at the store;
    it fails where the store does not show the entry ``_SEEN`` (when one is named)."""
    store = _os.environ.get("EVOKERNEL_TRITON_KERNELS", "")
    if _SEEN and not _os.path.isfile(_os.path.join(store, _SEEN, "kernel.cubin")):
        raise RuntimeError("the judge's store does not show " + _SEEN + " at " + repr(store))
    entry = _os.path.join(_os.environ["TRITON_CACHE_DIR"], _KEY)
    _os.makedirs(entry, exist_ok=True)
    for name, data in (("kernel.cubin", "cubin of " + _KEY), ("kernel.json", "{{}}")):
        with open(_os.path.join(entry, name), "w") as f:
            f.write(data)
    with open(_os.path.join(entry, "__grp__kernel.json"), "w") as f:
        _json.dump({{"child_paths": {{n: _os.path.join(entry, n) for n in ("kernel.cubin", "kernel.json")}}}}, f)
    try:
        _os.makedirs(_os.path.join(store, "{planted}"))
    except OSError:
        pass
'''


def leaves_an_entry(key: str, seen: str = "") -> str:
    """The honest row-at-a-time solver of the red team, which at build leaves a cache entry
    named ``key`` in its private Triton cache and tries to write the judge's store (and
    fails unless the store shows the entry ``seen``, where one is named)."""
    from .redteam import CANDIDATES, HONEST

    honest = (CANDIDATES / HONEST).read_text()
    assert "def build(params, kernels):\n" in honest
    return (honest.replace("def build(params, kernels):\n", "def build(params, kernels):\n    _leave_an_entry()\n")
            + LEAVES_AN_ENTRY.format(key=key, seen=seen, planted="PLANTED" + key[:8]))


@pytest.mark.skipif(not FULLY_CONFINED, reason="needs root and permission to create namespaces")
def test_the_judge_keeps_what_a_trusted_process_compiled_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on the CPU: the judge copies a trusted process's entries out of its
    private cache before killing it; an untrusted one's stay there and die with it, and
    neither could write the store."""
    from evokernel.candidate import load_candidate
    from evokernel.evaluate.result import Status
    from evokernel.evaluate.sandbox import SandboxEvaluator

    from .redteam import config_for

    def candidate(key: str, seen: str = "") -> object:
        path = tmp_path / f"compiles_{key[0].lower()}.py"
        path.write_text(leaves_an_entry(key, seen))
        return load_candidate(path, "dsa_topk")

    # the second, forked from the fork server like every process, reads the first's entry
    trusted, untrusted = candidate(KEY), candidate(OTHER, seen=KEY)
    monkeypatch.setattr(TritonStore, "trusts", lambda self, c: c.id == trusted.id)  # type: ignore[attr-defined]
    shape = "30cecff1-7ea4-474b-90fc-7f4a87206d8e"
    with SandboxEvaluator("dsa_topk", work_dir=tmp_path / "work", config=config_for("cpu")) as ev:
        assert ev.triton_store is not None and "Triton store" in ev.environment()["sandbox"]
        for each in (trusted, untrusted):
            result = ev.evaluate(each, [shape])  # type: ignore[arg-type]
            assert result.status is Status.PASSED, result.feedback
            ev.wait_retired()  # the first's entries are admitted as its process retires
        kept = sorted(p.name for p in ev.triton_store.kernels.iterdir())
        assert kept == [KEY]
        assert (ev.triton_store.kernels / KEY / "kernel.cubin").read_text() == f"cubin of {KEY}"
        assert ev.triton_store.admitted == 1
