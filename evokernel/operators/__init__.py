"""Variation operators: the protocol, the built-in parameter operators and their registry.

``OPERATORS`` maps a name to a factory called with no arguments that returns an
:class:`Operator`. The built-in knob operators are registered here; strategies
build their own copies with their configured options, and draw any other
registered operator whose rate ``operators.rates`` names. The LLM operators are
made from presets (``operators/presets.yaml``) by kind, registered in
``LLM_KINDS`` (``evokernel.operators.llm``).
"""

from collections.abc import Callable

from evokernel.operators.base import Evaluate, Operator, OperatorContext
from evokernel.operators.knobs import KnobCrossover, KnobMutation
from evokernel.registry import Registry

OPERATORS: Registry[Callable[[], Operator]] = Registry("operator")
OPERATORS.register("knob_mutation", KnobMutation)
OPERATORS.register("knob_crossover", KnobCrossover)

__all__ = ["OPERATORS", "Evaluate", "KnobCrossover", "KnobMutation", "Operator", "OperatorContext"]
