"""Strict JSON for the figures the tools print: :mod:`simcore.files`, where the apps' result files
use it too (re-exported here for the validation tools)."""

from simcore.files import dumps, strict

__all__ = ["strict", "dumps"]
