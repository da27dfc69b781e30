"""A candidate's process once confined: the requests it serves for the judge.

Everything of a candidate runs in such a process and nowhere else: its build, its host
code and its kernels. It starts either as ``python -m evokernel.evaluate.candidate_main``
(a fresh interpreter that confines itself before importing torch) or forked by the fork
server (zygote.py, torch imported there, never a device touched) and confined in the
fork; either way it then readies the device while it waits as a spare, and serves the
judge's requests on its socket until told to exit or killed:

``ping``      round trip (with a device sync; with ``touch``, one tiny kernel first),
              measured before any candidate code loads
``map``       open shared chunks whose file descriptors came with the message
``load``      build the candidate (or the published reference) into its ``run``
``bind``      the tensors of a shape's slots: views into the shared chunks
``call``      one call on one slot, then a device sync
``capture``   capture calls on a list of slots into one CUDA graph
``batch``     the calls on a list of slots back to back (graph replay or eager), then a sync
``cupti``     per slot: flush L2, sync, one eager call in a CUPTI window, sync (the
              records stay in CUPTI's buffers)
``cupti_collect``  every shape's CUPTI spans since the last collect, in one flush
``cupti_floor``  the same for a one-element kernel of the process's own (before loading)
``warm``      one call a shape on meta tensors of the shape's layout, every Triton launch
              only compiled (triton_warm.py): asked only of a process warming a trusted
              candidate's kernels ahead, from which the judge takes no verdict
``forget``    empty the process's own Triton cache (a warming process, between candidates,
              once the judge kept what it built: the next admission copies only the new)
``exit``

It holds nothing that decides a verdict or a time: the inputs, the expected
outputs, the checker and the clock that counts are in the judge's process, which
reads every output itself. A reply here only says "done" (or why not), plus the
build's facts and CUPTI spans, which the judge treats as claims.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import os
import shutil
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evokernel.candidate import Candidate, Language
from evokernel.evaluate.build import BuildError, build_runner, check_cuda_nvcc, cuda_source
from evokernel.evaluate.channel import Channel, ChannelClosed
from evokernel.evaluate.shared import Chunk, TensorSpec
from evokernel.evaluate.timing import CuptiSpans, L2Flusher


@dataclass
class Slots:
    """The tensors of one shape: per slot, the inputs then the outputs, in call order."""

    args: list[list[torch.Tensor]]
    chunks: set[int]
    graphs: dict[tuple[int, ...], Any] = field(default_factory=dict)


PRELOADED = ("cupy", "cupy.cuda.function", "triton", "triton.language")
"""Imported by a spare on a GPU before any candidate code: trusted, and slow to import."""


def preload_libraries() -> None:
    """Import what candidates' builds import (CUDA launches go through cuPy): in a spare
    or in the fork server, so that their import is not a candidate's load time. None of
    them touches the device on import."""
    for library in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(library)


RELEASE_ABOVE_BYTES = 8 << 30
"""Device memory this process may keep cached between shapes before it empties its cache."""


class CandidateProcess:
    def __init__(self, device: torch.device, scratch: Path, start_steps_s: dict[str, float]) -> None:
        self.device = device
        self.scratch = scratch
        self.start_steps_s = start_steps_s
        """How this process's start went, step by step (reported until a candidate loads)."""
        self.chunks: dict[int, Chunk] = {}
        self.shapes: dict[str, Slots] = {}
        self.run: Any = None
        self.flusher: L2Flusher | None = None
        self.cupti: CuptiSpans | None = None
        self.cupti_windows: dict[str, list[tuple[int, int]]] = {}
        """CUPTI windows recorded per shape, reported at ``cupti_collect``."""
        # every graph of this process draws on one memory pool, so a later shape's
        # capture reuses what an earlier one's held; and a capture that failed once
        # (host syncs, say) is not tried again: each failed try can strand its
        # allocations (the published dsa_topk reference, retried on 128 shapes, held
        # over 100 GB of an H200)
        self.graph_pool: Any = None
        self._touch = torch.zeros(1)
        self.capture_refused: str | None = None
        if device.type == "cuda":
            step = time.perf_counter()
            self._touch = torch.zeros(1, device=device)  # the context, made while a spare
            self.flusher = L2Flusher(device)
            self.start_steps_s["context_s"] = time.perf_counter() - step
            step = time.perf_counter()
            self.cupti = CuptiSpans()
            self.start_steps_s["cupti_s"] = time.perf_counter() - step
            step = time.perf_counter()
            preload_libraries()
            self.start_steps_s["preload_s"] = time.perf_counter() - step
        self.loaded = False

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _release(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- requests --------------------------------------------------------------------

    def ping(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("touch") and self.device.type == "cuda":
            # one tiny kernel of this process's own: the device switches to this
            # process's context, as it must before a timed batch runs
            self._touch.add_(1)
        self.sync()
        # until a candidate is loaded (after it, anything this process says is the
        # candidate's to forge)
        return {} if self.loaded else {"start_steps_s": self.start_steps_s}

    def map(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        live = {int(i) for i in request.get("live", self.chunks)}
        gone = set(self.chunks) - live
        if gone:
            # the judge has closed these: let go, or their device memory stays taken
            for shape in [k for k, v in self.shapes.items() if v.chunks & gone]:
                del self.shapes[shape]
            self._release()
            for chunk_id in gone:
                self.chunks.pop(chunk_id).close()
        for (chunk_id, size, writable), fd in zip(request["chunks"], fds, strict=True):
            self.chunks[int(chunk_id)] = Chunk.open(fd, int(size), self.device,
                                                    writable=bool(writable))
        return {}

    def load(self, request: dict[str, Any]) -> dict[str, Any]:
        self.loaded = True
        if "reference" in request:
            self.run = _reference_runner(request["reference"], int(request["input_count"]))
            return {"resources": {}}
        candidate = Candidate.model_validate(request["candidate"])
        torch.set_num_threads(max(1, int(request.get("threads", 1))))
        if self.device.type == "cpu" and candidate.language is not Language.TORCH:
            return _cpu_only_build(candidate)
        cubin = base64.b64decode(request["cubin"]) if request.get("cubin") else None
        try:
            self.run, resources = build_runner(
                candidate, self.scratch / "build", arch=request.get("arch"),
                arguments=request["arguments"], cubin=cubin,
            )
        except BuildError as exc:
            return {"status": "BUILD_FAILED", "message": str(exc)}
        except Exception as exc:
            return {"status": "BUILD_FAILED",
                    "message": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"}
        return {"resources": resources}

    def bind(self, request: dict[str, Any]) -> dict[str, Any]:
        """Views of a shape's slots; ``ahead``: made before any candidate code, to be
        selected later by a ``bind`` without ``slots``."""
        # one shape at a time: the graphs of the shapes before (and the memory pools they
        # hold, hundreds of MB each) go, or a process judged on 128 shapes fills the
        # device (seen on the H200)
        if not request.get("ahead") and any(s.graphs for s in self.shapes.values()):
            for earlier in self.shapes.values():
                earlier.graphs.clear()
            # handing their memory back to the device costs milliseconds a shape, so only
            # past a bound; until then the next capture takes a new pool (torch does not
            # let a capture join a pool whose graphs are all gone, before it is emptied)
            if torch.cuda.memory_reserved(self.device) > RELEASE_ABOVE_BYTES:
                self._release()
            else:
                self.graph_pool = None
        if request.get("slots") is None:
            if request["shape"] not in self.shapes:
                return {"error": f"shape {request['shape']} was not bound ahead"}
            return {}
        specs = [[TensorSpec.from_json(s) for s in slot] for slot in request["slots"]]
        args = [[self.chunks[s.chunk].tensor(s) for s in slot] for slot in specs]
        self.shapes[request["shape"]] = Slots(args, {s.chunk for slot in specs for s in slot})
        return {}

    def warm(self, request: dict[str, Any]) -> dict[str, Any]:
        from evokernel.evaluate.triton_warm import warm_shapes

        return warm_shapes(self.run, request["shapes"])

    def forget(self, request: dict[str, Any]) -> dict[str, Any]:
        cache = os.environ.get("TRITON_CACHE_DIR")
        if cache and os.path.isdir(cache):
            for entry in os.listdir(cache):
                shutil.rmtree(os.path.join(cache, entry), ignore_errors=True)
        return {}

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        slots = self.shapes[request["shape"]]
        self.run(*slots.args[int(request["slot"])])
        self.sync()
        return {}

    def capture(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.device.type != "cuda":
            return {"captured": False, "why": "no graphs on the CPU"}
        if self.capture_refused is not None:
            return {"captured": False, "why": f"an earlier capture failed: {self.capture_refused}"}
        slots = self.shapes[request["shape"]]
        order = tuple(int(i) for i in request["slots"])
        if self.graph_pool is None:
            self.graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(side):
                for i in order[:2]:  # capture wants a warm-up off the default stream
                    self.run(*slots.args[i])
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                for i in order:
                    self.run(*slots.args[i])
            self.sync()
        except Exception as exc:
            self.capture_refused = f"{type(exc).__name__}: {str(exc)[:300]}"
            with contextlib.suppress(Exception):
                self.sync()
            self._release()
            return {"captured": False, "why": self.capture_refused}
        slots.graphs[order] = graph
        return {"captured": True}

    def batch(self, request: dict[str, Any]) -> dict[str, Any]:
        slots = self.shapes[request["shape"]]
        order = tuple(int(i) for i in request["slots"])
        graph = slots.graphs.get(order) if request.get("graph") else None
        started = time.perf_counter()
        if graph is not None:
            graph.replay()
        else:
            for i in order:
                self.run(*slots.args[i])
        self.sync()
        # a claim, for diagnosis only: the judge's own clock is the figure
        return {"graph": graph is not None, "seconds": time.perf_counter() - started}

    def cupti_spans(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.cupti is None or not self.cupti.available:
            why = self.cupti.why_not if self.cupti is not None else "CUPTI needs a GPU"
            return {"spans_ms": None, "why": why}
        slots = self.shapes[request["shape"]]
        flusher = self.flusher
        assert flusher is not None
        calls = [lambda i=int(i): self.run(*slots.args[i]) for i in request["slots"]]
        self.cupti_windows[request["shape"]] = self.cupti.record(calls, flusher)
        return {"recorded": len(calls), "phases_ms": self.cupti.last_phases_ms}

    def cupti_collect(self, request: dict[str, Any]) -> dict[str, Any]:
        """The spans of every shape's recorded CUPTI calls, by shape (one flush)."""
        if self.cupti is None or not self.cupti.available:
            return {"spans_ms": {}}
        windows, self.cupti_windows = self.cupti_windows, {}
        return {"spans_ms": self.cupti.collect(windows), "phases_ms": self.cupti.last_phases_ms}

    def cupti_floor(self, request: dict[str, Any]) -> dict[str, Any]:
        """CUPTI spans of a one-element kernel of this process's own: the least span a
        call can have on this device (asked before any candidate code is loaded)."""
        if self.cupti is None or not self.cupti.available or self.flusher is None:
            return {"spans_ms": None}

        def touch() -> None:
            self._touch.add_(1)

        return {"spans_ms": self.cupti.measure([touch] * int(request.get("calls", 5)), self.flusher)}


def _reference_runner(source: str, input_count: int) -> Any:
    """The published reference, value-returning as published, wrapped to write outputs."""
    namespace: dict[str, Any] = {"__name__": "published_reference"}
    exec(compile(source, "<published reference>", "exec"), namespace)
    reference = namespace["run"]

    def run(*args: torch.Tensor) -> None:
        with torch.no_grad():
            produced = reference(*args[:input_count])
        produced = produced if isinstance(produced, tuple | list) else (produced,)
        for out, value in zip(args[input_count:], produced, strict=True):
            out.copy_(value)

    return run


def _cpu_only_build(candidate: Candidate) -> dict[str, Any]:
    """On a machine with no GPU: compile CUDA with nvcc for sm_90a; never run it."""
    if candidate.language is Language.TRITON:
        return {"status": "SKIPPED",
                "message": "triton kernels need a GPU; this machine has none, so it was not run"}
    try:
        resources = check_cuda_nvcc(cuda_source(candidate), "sm_90a")
    except BuildError as exc:
        return {"status": "BUILD_FAILED", "message": str(exc)}
    except (FileNotFoundError, OSError) as exc:
        return {"status": "SKIPPED", "message": f"cuda candidate not built: {exc}; it needs a GPU"}
    return {"status": "SKIPPED", "resources": resources,
            "message": "built with nvcc for sm_90a; running it needs a GPU, and this machine has none"}


def serve(channel: Channel, process: CandidateProcess) -> None:
    handlers = {
        "ping": process.ping, "load": process.load, "bind": process.bind, "call": process.call,
        "capture": process.capture, "batch": process.batch, "cupti": process.cupti_spans,
        "cupti_floor": process.cupti_floor, "cupti_collect": process.cupti_collect,
        "warm": process.warm, "forget": process.forget,
    }
    while True:
        request, fds = channel.receive()
        op = request.get("op")
        tag = {k: request.get(k) for k in ("token", "seq", "nonce")}
        if op == "exit":
            channel.send(tag)
            return
        try:
            if op == "map":
                reply = process.map(request, fds)
            elif op in handlers:
                reply = handlers[op](request)
            else:
                reply = {"error": f"unknown request {op!r}"}
        except BaseException as exc:  # the candidate's faults are replies, not crashes
            if isinstance(exc, KeyboardInterrupt):
                raise
            reply = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"}
        channel.send({**tag, **reply})


def run_process(fd: int, device_name: str, scratch: Path, start_steps_s: dict[str, float]) -> None:
    """Serve the judge on socket ``fd`` until told to exit, then end the process. Call
    only once confined (``isolation.confine``), with nothing of a candidate loaded yet."""
    channel = Channel(socket.socket(fileno=fd))
    process = CandidateProcess(torch.device(device_name), scratch, start_steps_s)
    with contextlib.suppress(ChannelClosed):
        serve(channel, process)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip teardown: a kernel may have left state whose destructors crash
