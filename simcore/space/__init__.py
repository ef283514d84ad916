"""Which plans a search may pick, and the Megatron heuristic's exhaustive pick among them.

- :mod:`simcore.space.bounds`: :class:`SearchSpace` (degrees, batch sizes, microbatches, replicas);
- :mod:`simcore.space.megatron`: Megatron's sharding held fixed, exhaustive over the degrees under the
  proxy (``shard-sim``'s default plan and the planners' baseline).
"""

from simcore.space.bounds import SearchSpace, powers_of_two
from simcore.space.megatron import megatron_search

__all__ = ["SearchSpace", "megatron_search", "powers_of_two"]
