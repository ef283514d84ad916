"""The discrete-event simulator: a strategy runs as stage programs on SimPy (see :mod:`.simulate`)."""

from .routing import RoutingConfig
from .simulate import EngineConfig, simulate

__all__ = ["EngineConfig", "RoutingConfig", "simulate"]
