"""Static checks of a candidate's sources, before anything of it runs.

They catch the cheap, common ways to cheat or escape (calling a vendor kernel
library, spawning processes, opening sockets, reaching into the harness). They are
a first filter, not the defence: the runtime checks and the process isolation are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from evokernel.candidate import Candidate
from evokernel.workload import Workload

# Forbidden in every workload: ways out of the sandbox or into the harness.
UNIVERSAL = [
    (re.compile(r"\b(import|from)\s+(subprocess|socket|multiprocessing|urllib|http|requests)\b"),
     "spawning processes or opening network connections is not allowed"),
    (re.compile(r"\bos\.(system|popen|exec\w*|fork|spawn\w*|kill|_exit)\b"),
     "process control from a kernel is not allowed"),
    (re.compile(r"\bevokernel\b"), "a candidate may not import or patch the evaluator"),
    (re.compile(r"\b(sys\.modules|builtins|__builtins__|importlib)\b"),
     "reaching into the interpreter is not allowed"),
    (re.compile(r"\b(time\.(perf_counter|time|monotonic)|torch\.cuda\.Event|elapsed_time)\b"),
     "reading clocks or timers in a kernel is not allowed"),
]


def policy_rules(workload: Workload, policies: Sequence[str]) -> list[tuple[re.Pattern[str], str]]:
    """The rules of the named policies; an unknown name is a ValueError."""
    unknown = [p for p in policies if p not in workload.policies]
    if unknown:
        known = ", ".join(sorted(workload.policies)) or "none"
        raise ValueError(f"workload {workload.name} has no policy {unknown[0]!r} (known: {known})")
    return [rule for p in policies for rule in workload.policies[p]]


def static_violations(
    candidate: Candidate, workload: Workload, policies: Sequence[str] = ()
) -> list[str]:
    """Why the candidate is rejected before it runs; empty if it is not."""
    found = []
    rules = [*UNIVERSAL, *workload.forbidden, *policy_rules(workload, policies)]
    for path, source in sorted(candidate.sources.items()):
        for pattern, why in rules:
            match = pattern.search(source)
            if match:
                line = source.count("\n", 0, match.start()) + 1
                found.append(f"{path}:{line}: {why} ({match.group(0)!r})")
    return found
