"""The discrete-event simulator: a strategy runs as stage programs on SimPy (see :mod:`.simulate`)."""

from simcore.engine.rank_loads import RoutingConfig
from simcore.engine.simulate import EngineConfig, simulate

__all__ = ["EngineConfig", "RoutingConfig", "simulate"]
