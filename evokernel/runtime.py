"""Where populations live and where evaluations run: in process, or on Ray.

Core classes stay plain Python; this module wraps them into Ray actors at the
edge (``ray.remote(cls)`` at runtime, never decorators), so tests and the
``local`` runtime need no Ray at all. On Ray, each island population is an actor
(``num_cpus=0``: it holds data, not a core) and each evaluator actor owns one GPU
(``num_gpus=1``), or one CPU slot on a machine without GPUs. ``ray`` is imported
only when the Ray runtime is built.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol

from evokernel.candidate import Candidate
from evokernel.evaluate import Evaluator, Preparing, Warming, concurrent_calls
from evokernel.evaluate.result import Evaluation, Status
from evokernel.populations import Population
from evokernel.registry import Registry

logger = logging.getLogger(__name__)

EvaluatorFactory = Callable[[], Evaluator]
Work = deque[tuple[Any, Candidate]]
"""Pending ``(tag, candidate)`` pairs. ``evaluate_stream`` takes from the left; its
caller may append more between two results, and the stream runs until it is empty."""


class Runtime(Protocol):
    n_evaluators: int

    def host(self, build: Callable[[], Population]) -> Population:
        """A live population built by ``build``: here, or inside an actor."""
        ...

    def evaluate(self, candidates: Sequence[Candidate], shapes: Sequence[str]) -> Iterator[tuple[int, Evaluation]]:
        """Evaluate all, yielding ``(index, evaluation)`` as each finishes."""
        ...

    def evaluate_stream(self, work: Work, shapes: Sequence[str]) -> Iterator[tuple[Any, Evaluation]]:
        """Evaluate ``work`` as evaluators free up, yielding ``(tag, evaluation)``; work
        appended while the stream runs is taken too (what lets generations overlap)."""
        ...

    def fingerprint(self) -> dict[str, str] | None:
        """The evaluators' environment, if they can say it before evaluating anything."""
        ...

    def close(self) -> None: ...


EVALUATORS: Registry[Callable[..., Evaluator]] = Registry("evaluator")
"""Evaluator classes (or factories) by name, each called as ``Class(workload_name, **options)``
with ``evaluator.options`` of the run config. A new evaluator is one registration."""
EVALUATORS.register("sandbox", "evokernel.evaluate.sandbox:SandboxEvaluator")
EVALUATORS.register("replay", "evokernel.analysis.landscape:replay_evaluator")
EVALUATORS.register("fake", "evokernel.testing:FakeEvaluator")


def evaluator_factory(spec: str, workload: str, options: dict[str, Any]) -> EvaluatorFactory:
    """A picklable zero-argument factory (Ray ships it to every evaluator actor) for the
    evaluator registered as ``spec`` (or at the import path ``spec``)."""
    return functools.partial(EVALUATORS.get(spec), workload, **options)


def crashed(candidate: Candidate, exc: BaseException) -> Evaluation:
    """An evaluator that raised costs one evaluation, never the run."""
    logger.warning("the evaluator failed on candidate %s (%s: %s); it counts as one RUNTIME_ERROR",
                   candidate.id, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
    return Evaluation(
        candidate_id=candidate.id,
        status=Status.RUNTIME_ERROR,
        feedback=f"evaluator crashed: {type(exc).__name__}: {exc}"[:500],
        log=text,
    )


def _fingerprint_of(evaluator: object) -> dict[str, str] | None:
    probe = getattr(evaluator, "environment", None)
    return dict(probe()) if callable(probe) else None


class LocalRuntime:
    """Everything in this process; one evaluator, candidates one after another."""

    n_evaluators = 1

    def __init__(self, factory: EvaluatorFactory) -> None:
        self.evaluator = factory()
        self._warmed: set[tuple[str, ...]] = set()

    def host(self, build: Callable[[], Population]) -> Population:
        return build()

    def evaluate(self, candidates: Sequence[Candidate], shapes: Sequence[str]) -> Iterator[tuple[int, Evaluation]]:
        return self.evaluate_stream(deque(enumerate(candidates)), shapes)

    def evaluate_stream(self, work: Work, shapes: Sequence[str]) -> Iterator[tuple[Any, Evaluation]]:
        """Evaluations of ``work`` (which may grow between results), each as it finishes:
        in order where the evaluator takes one call at a time, else up to its
        ``concurrent_calls`` in flight, each in a thread of its own. A ``Warming``
        evaluator is warmed up first, once per list of shapes."""
        if work and isinstance(self.evaluator, Warming) and tuple(shapes) not in self._warmed:
            self._warmed.add(tuple(shapes))
            warm_up(self.evaluator, shapes)
        in_flight = concurrent_calls(self.evaluator)
        if in_flight == 1:
            yield from self._one_at_a_time(work, shapes)
            return
        prepared: set[str] = set()
        with ThreadPoolExecutor(in_flight, thread_name_prefix="evaluate") as pool:
            running: dict[Future[Evaluation], tuple[Any, Candidate]] = {}
            while work or running:
                self._prepare(work, prepared)
                while work and len(running) < in_flight:
                    tag, cand = work.popleft()
                    running[pool.submit(self._evaluate_one, cand, shapes)] = (tag, cand)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: list(running).index(f)):
                    tag, _ = running.pop(future)
                    yield tag, future.result()

    def _one_at_a_time(self, work: Work, shapes: Sequence[str]) -> Iterator[tuple[Any, Evaluation]]:
        prepared: set[str] = set()
        while work:
            self._prepare(work, prepared)
            tag, cand = work.popleft()
            yield tag, self._evaluate_one(cand, shapes)

    def _prepare(self, work: Work, prepared: set[str]) -> None:
        """``prepare`` the candidates of ``work`` not handed to it before."""
        fresh = [c for _, c in work if c.id not in prepared]
        if fresh and isinstance(self.evaluator, Preparing):
            with contextlib.suppress(Exception):  # building ahead only saves time
                self.evaluator.prepare(fresh)
        prepared.update(c.id for c in fresh)

    def _evaluate_one(self, cand: Candidate, shapes: Sequence[str]) -> Evaluation:
        try:
            return self.evaluator.evaluate(cand, shapes)
        except Exception as exc:  # a broken evaluator must not end the run
            return crashed(cand, exc)

    def fingerprint(self) -> dict[str, str] | None:
        return _fingerprint_of(self.evaluator)

    def close(self) -> None:
        self.evaluator.close()


def warm_up(evaluator: Warming, shapes: Sequence[str]) -> None:
    """``evaluator.warm_up(shapes)``; a failure is logged, not raised: ``evaluate`` does
    that work itself as it goes (and fails the candidates if it must)."""
    try:
        evaluator.warm_up(list(shapes))
    except Exception as exc:  # the evaluations that follow say what is wrong, per candidate
        logger.warning("the evaluator's warm-up failed (%s: %s); its first candidates do it",
                       type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


class Hosted:
    """Actor body: holds any object made by a builder and forwards method calls to it."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.obj = build()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.obj, method)(*args, **kwargs)

    def warm_up(self, shapes: Sequence[str]) -> None:
        """``runtime.warm_up`` of the hosted evaluator, if it is ``Warming``."""
        if isinstance(self.obj, Warming):
            warm_up(self.obj, shapes)

    def hint(self, method: str, *args: Any) -> None:
        """Call an optional method (such as ``prepare``) if the object has one.

        Hints only save time, so a missing method or a failure is not an error:
        nobody waits for the answer.
        """
        fn = getattr(self.obj, method, None)
        if callable(fn):
            with contextlib.suppress(Exception):
                fn(*args)

    def has(self, method: str) -> bool:
        return callable(getattr(self.obj, method, None))

    def concurrency(self) -> int:
        """``evokernel.evaluate.concurrent_calls`` of the hosted object."""
        return concurrent_calls(self.obj)


class RemoteProxy:
    """Synchronous stand-in for an object living in a ``Hosted`` actor."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def __getattr__(self, name: str) -> Callable[..., Any]:
        import ray

        def method(*args: Any, **kwargs: Any) -> Any:
            return ray.get(self._actor.call.remote(name, *args, **kwargs))

        return method

    def __len__(self) -> int:
        return int(self.__getattr__("__len__")())


MAX_CALLS_PER_EVALUATOR = 2
"""Most ``evaluate`` calls in flight on one evaluator actor (its threads)."""

_SHIP_EXCLUDES = [".venv/", ".git/", "runs/", "**/__pycache__/", ".mypy_cache/",
                  ".ruff_cache/", ".pytest_cache/", "benchmarks/results/"]


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


class RayRuntime:
    """Island actors and one evaluator actor per GPU (or per CPU slot)."""

    def __init__(
        self,
        factory: EvaluatorFactory,
        *,
        address: str | None = None,
        evaluators: int | None = None,
        num_cpus: int | None = None,
        object_store_mb: int = 256,
    ) -> None:
        import ray

        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            runtime_env: dict[str, Any]
            if address:
                # Ship the repository (engine + workloads/) to the cluster's workers.
                runtime_env = {"working_dir": _package_root(), "excludes": _SHIP_EXCLUDES}
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=False,
                         logging_level=logging.WARNING)
            else:
                runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                    p for p in (_package_root(), os.environ.get("PYTHONPATH", "")) if p)}}
                ray.init(
                    address="local",  # never attach to a leftover `ray start` cluster by accident
                    num_cpus=num_cpus or os.cpu_count() or 1,
                    include_dashboard=False,
                    object_store_memory=object_store_mb * 2**20,
                    runtime_env=runtime_env,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            self._started = True
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        self.use_gpu = gpus > 0
        self.n_evaluators = evaluators or (gpus if gpus else 1)
        self._factory = factory
        # threaded actors: an evaluator that takes concurrent calls (``Concurrent``) gets
        # them; the others get one at a time (``_in_flight``)
        self._evaluator_cls = ray.remote(Hosted).options(
            num_gpus=1 if self.use_gpu else 0, num_cpus=0 if self.use_gpu else 1, max_restarts=0,
            max_concurrency=MAX_CALLS_PER_EVALUATOR,
        )
        self._host_cls = ray.remote(Hosted).options(num_cpus=0)
        self._actors: list[Any] = [self._evaluator_cls.remote(factory) for _ in range(self.n_evaluators)]
        self._in_flight = [self._calls_for(actor) for actor in self._actors]
        self._warmed: list[set[tuple[str, ...]]] = [set() for _ in self._actors]
        """Per evaluator actor, the lists of shapes it was warmed up on."""
        self._populations: list[Any] = []

    def host(self, build: Callable[[], Population]) -> Population:
        actor = self._host_cls.remote(build)
        self._populations.append(actor)
        return RemoteProxy(actor)  # type: ignore[return-value]

    def evaluate(self, candidates: Sequence[Candidate], shapes: Sequence[str]) -> Iterator[tuple[int, Evaluation]]:
        return self.evaluate_stream(deque(enumerate(candidates)), shapes)

    def evaluate_stream(self, work: Work, shapes: Sequence[str]) -> Iterator[tuple[Any, Evaluation]]:
        ray = self._ray
        if work:
            self._warm_up(shapes)
        free = [slot for slot, calls in enumerate(self._in_flight) for _ in range(calls)]
        running: dict[Any, tuple[Any, Candidate, int]] = {}  # ref -> (tag, candidate, actor slot)
        hinted: set[str] = set()
        while work or running:
            self._hint_prepare([c for _, c in work if c.id not in hinted])
            hinted.update(c.id for _, c in work)
            while work and free:
                tag, cand = work.popleft()
                slot = free.pop(0)
                running[self._actors[slot].call.remote("evaluate", cand, list(shapes))] = (tag, cand, slot)
            done, _ = ray.wait(list(running), num_returns=1)
            tag, cand, slot = running.pop(done[0])
            try:
                evaluation = ray.get(done[0])
            except ray.exceptions.RayActorError as exc:  # the worker died: replace it
                logger.warning("evaluator actor %d died; starting a new one", slot)
                self._actors[slot] = self._evaluator_cls.remote(self._factory)
                self._in_flight[slot] = self._calls_for(self._actors[slot])
                self._warmed[slot] = set()
                self._warm_up(shapes)
                evaluation = crashed(cand, exc)
            except ray.exceptions.RayTaskError as exc:
                evaluation = crashed(cand, exc)
            free.append(slot)
            yield tag, evaluation

    def _warm_up(self, shapes: Sequence[str]) -> None:
        """Every evaluator actor not yet warmed up on ``shapes`` is, all at once; waits."""
        key = tuple(shapes)
        cold = [slot for slot, warmed in enumerate(self._warmed) if key not in warmed]
        refs = [self._actors[slot].warm_up.remote(list(shapes)) for slot in cold]
        for slot, ref in zip(cold, refs, strict=True):
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayError as exc:  # its evaluations will say what broke
                logger.warning("evaluator actor %d failed to warm up: %s", slot, exc)
            self._warmed[slot].add(key)

    def _calls_for(self, actor: Any) -> int:
        """Calls to keep in flight on one evaluator actor (its ``concurrent_calls``)."""
        return max(1, min(MAX_CALLS_PER_EVALUATOR, int(self._ray.get(actor.concurrency.remote()))))

    def _hint_prepare(self, candidates: list[Candidate]) -> None:
        """Build ahead: each evaluator starts compiling its likely share (slot k takes
        about every k-th candidate); fire and forget, it only saves time."""
        if not candidates:
            return
        for k, actor in enumerate(self._actors):
            share = candidates[k :: len(self._actors)]
            if share:
                actor.hint.remote("prepare", share)

    def fingerprint(self) -> dict[str, str] | None:
        ray = self._ray
        actor = self._actors[0]
        if not ray.get(actor.has.remote("environment")):
            return None
        return dict(ray.get(actor.call.remote("environment")))

    def close(self) -> None:
        ray = self._ray
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.get(actor.call.remote("close"), timeout=30)
        for actor in [*self._actors, *self._populations]:
            ray.kill(actor)
        self._actors, self._populations = [], []
        if self._started:
            ray.shutdown()


def make_runtime(kind: str, factory: EvaluatorFactory, **options: Any) -> Runtime:
    if kind == "local":
        return LocalRuntime(factory)
    if kind == "ray":
        return RayRuntime(factory, **options)
    raise ValueError(f"unknown runtime {kind!r}; choose 'ray' or 'local'")
