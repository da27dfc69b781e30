"""Variation operators: the protocol and the built-in parameter operators."""

from evokernel.operators.base import LLMClient, Operator, OperatorContext
from evokernel.operators.knobs import KnobCrossover, KnobMutation

__all__ = ["KnobCrossover", "KnobMutation", "LLMClient", "Operator", "OperatorContext"]
