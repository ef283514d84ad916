"""One formula, two backends: numpy for arrays of strategies, plain Python for a single one.

Cost formulas are written once against a small namespace (``xp.where``, ``xp.maximum``, ``xp.ceil``
...). With arrays they run on numpy (10^5 strategies per call); with Python numbers they run on
``math`` and builtins, which is ~20x cheaper per operation than numpy on one-element arrays and
keeps the scalar path of the proxy and the simulator fast without a second copy of any formula.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SCALAR", "namespace", "is_array"]


class _ScalarOps:
    """The subset of numpy the cost formulas use, on Python floats."""

    @staticmethod
    def ceil(x: float) -> float:
        return float(math.ceil(x))

    @staticmethod
    def floor(x: float) -> float:
        return float(math.floor(x))

    @staticmethod
    def maximum(a: float, b: float) -> float:
        return a if a >= b else b

    @staticmethod
    def minimum(a: float, b: float) -> float:
        return a if a <= b else b

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def select(conds, choices, default):
        for cond, choice in zip(conds, choices, strict=True):
            if cond:
                return choice
        return default


SCALAR = _ScalarOps()


def is_array(value) -> bool:
    return isinstance(value, np.ndarray) and value.ndim > 0


def namespace(*values):
    """``numpy`` if any value is a non-scalar array, else the scalar backend."""
    return np if any(is_array(v) for v in values) else SCALAR
