"""The coarse search space, defined in :mod:`simcore.space.bounds` (``shard-sim`` searches it too); re-exported
here for the planners."""

from simcore.space.bounds import SearchSpace, powers_of_two

__all__ = ["SearchSpace", "powers_of_two"]
