"""Strict JSON for the figures the tools print and write: a median over no rows is ``nan`` in Python,
and ``json.dumps`` would write it as ``NaN``, which is not JSON (strict parsers, ``jq``, refuse it).
:func:`dumps` writes every non-finite float as ``null``."""

from __future__ import annotations

import json
import math

import numpy as np

__all__ = ["strict", "dumps"]


def strict(value):
    """``value`` with every nan or infinite float (numpy's included) as None, containers and numpy
    arrays walked."""
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return strict(value.tolist())
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(value, **kwargs) -> str:
    """``json.dumps`` of :func:`strict` ``(value)``; refuses to write a non-finite number."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)
