"""evokernel: evolutionary search over GPU kernel variants, gated on correctness."""

__version__ = "0.1.0"
