"""A prepared :meth:`simcore.network.flownet.FlowNetwork.transfer_chains` call, for callers that repeat it.

A collective's compiled program (:mod:`simcore.collectives.flows`) sends the same chains, sizes
and caps every time it runs (every layer, microbatch and decode step). Normalizing the chains to
tuples, checking the size and cap, and hashing the chains to find their cached routing plan cost
more than the rest of the call, so a :class:`ChainSet` does the first two once and remembers the
plan of the network that last sent it (:meth:`FlowNetwork.send`). The plan is the one
``transfer_chains`` would look up or build, so sending a chain set is exactly that call.
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Sequence

__all__ = ["ChainSet", "check_transfer"]


def check_transfer(size_bytes: float, rate_cap_bytes_per_s: float) -> None:
    """``ValueError`` unless the size is finite and non-negative and the cap positive."""
    if not (isinstance(size_bytes, numbers.Real) and 0 <= size_bytes < math.inf):
        raise ValueError(f"transfer size_bytes must be finite and non-negative, got {size_bytes!r}")
    if not (isinstance(rate_cap_bytes_per_s, numbers.Real) and rate_cap_bytes_per_s > 0):
        raise ValueError(f"transfer rate_cap_bytes_per_s must be positive, got {rate_cap_bytes_per_s!r}")


class ChainSet:
    """One flow of ``size_bytes`` per chain of ``(src, dst)`` legs, capped at ``rate_cap_bytes_per_s``
    (the arguments of :meth:`~simcore.network.flownet.FlowNetwork.transfer_chains`), normalized and checked.

    ``batches`` is filled in by the network that sends it: its plan (one entry per path latency) with
    each batch's flow count and initial remaining bytes, so starting a batch copies instead of
    recomputing them. ``network`` is a weak reference to that network (a program cache keyed weakly
    by its network must not keep it alive).
    """

    __slots__ = ("chains", "keys", "size", "cap", "network", "batches")

    def __init__(self, chains: Sequence[Sequence[tuple[str, str]]], size_bytes: float,
                 rate_cap_bytes_per_s: float = math.inf, flow_keys: Sequence[int] | None = None):
        check_transfer(size_bytes, rate_cap_bytes_per_s)
        self.chains = tuple(tuple(map(tuple, c)) for c in chains)
        self.keys = (0,) * len(self.chains) if flow_keys is None else tuple(int(k) for k in flow_keys)
        if len(self.keys) != len(self.chains):
            raise ValueError(f"transfer_chains: {len(self.keys)} flow_keys for {len(self.chains)} chains")
        self.size, self.cap = size_bytes, rate_cap_bytes_per_s
        self.network: weakref.ref | None = None
        self.batches: list | None = None

    def planned_for(self, network) -> list | None:
        """The batches planned by ``network`` (None when another network, or none, planned them)."""
        return self.batches if self.network is not None and self.network() is network else None
