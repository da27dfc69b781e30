"""The comparison and reporting side: what reads runs and compares strategies.

``compare`` (``python -m evokernel.analysis.compare``) runs strategies at equal budgets
over several seeds (``experiment``), replaying a recorded ``landscape`` where one
exists; ``report`` (``python -m evokernel.analysis.report``) turns a comparison or a run
into ``tables``, ``stats``, ``plots`` and ``summary.md``; ``export`` and ``summary``
write what a finished run hands on. Nothing in the engine depends on this package
except the run's final outputs (``Run.finish``).
"""
