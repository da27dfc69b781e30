"""The evaluator as it was before the judge (commit d01210f), kept only to be measured.

benchmarks/evaluator_throughput.py times it side by side with the judge in one run,
which is how issue 10's throughput figure is stated. It is not part of the library:
candidate code runs in the same process as its checker and clock here, which is the
flaw the judge fixes. Only the import paths and the checker call were changed.
"""
