"""What a plan is: the fused operator graph, tensor layouts, and a sharding strategy over them.

- :mod:`simcore.strategy.opgraph`: a decoder layer as fused operators and each one's sharding choices;
- :mod:`simcore.strategy.layout`: layouts in a tensor-parallel group and the collectives between them;
- :mod:`simcore.strategy.sharding`: :class:`Strategy` (degrees, batch, per-operator choices), YAML I/O,
  the Megatron sharding.
"""

from simcore.strategy.sharding import Strategy, StrategyError, megatron_sharding, megatron_strategy

__all__ = ["Strategy", "StrategyError", "megatron_sharding", "megatron_strategy"]
