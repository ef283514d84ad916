"""The coarse search space, defined in :mod:`simcore.space` (``shard-sim`` searches it too); re-exported
here for the planners."""

from simcore.space import SearchSpace, powers_of_two

__all__ = ["SearchSpace", "powers_of_two"]
