"""Strict JSON for the figures the tools print: :mod:`simcore.jsonline`, where the apps' result files
use it too (re-exported here for the validation tools)."""

from simcore.jsonline import dumps, strict

__all__ = ["strict", "dumps"]
