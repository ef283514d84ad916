"""Tensor layouts inside a tensor-parallel group and the collectives that convert between them.

Every fused operator reads its input in one layout and writes its output in another (see
``simcore.strategy.opgraph``). When a producer's output layout differs from what its consumer needs, the
group runs the collective below. This table is the only source of communication for the proxy and
the simulator alike.

Layouts (codes are small ints so strategies can be evaluated as numpy arrays):

- ``R``: replicated, every rank holds the whole tensor.
- ``S_TOK``: sharded along the token (row) dimension.
- ``S_FEAT``: sharded along the feature (last) dimension.
- ``P``: partial sums, every rank holds a full-size addend (after a row-parallel GEMM).

Sizes follow nccl-tests conventions: all-reduce of the buffer, all-gather of the total output,
reduce-scatter of the total input, all-to-all of the per-rank buffer.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "R", "S_TOK", "S_FEAT", "P", "LAYOUT_NAMES",
    "NONE", "ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "SEND_RECV", "COLLECTIVE_NAMES",
    "transition", "transition_arrays",
]

R, S_TOK, S_FEAT, P = 0, 1, 2, 3
LAYOUT_NAMES = ("replicated", "token-sharded", "feature-sharded", "partial-sum")

NONE, ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV = 0, 1, 2, 3, 4, 5
COLLECTIVE_NAMES = ("none", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")

# _COLLECTIVE[src][dst]: the collective that turns layout src into layout dst.
# _PER_RANK[src][dst]: True when the nccl-tests size is the per-rank share (full tensor / group size).
_COLLECTIVE = np.array([
    # to:  R           S_TOK           S_FEAT          P
    [NONE,       NONE,           NONE,           NONE],        # from R: slicing is free
    [ALL_GATHER, NONE,           ALL_TO_ALL,     NONE],        # from S_TOK
    [ALL_GATHER, ALL_TO_ALL,     NONE,           NONE],        # from S_FEAT
    [ALL_REDUCE, REDUCE_SCATTER, REDUCE_SCATTER, NONE],        # from P
], dtype=np.int64)
_PER_RANK = np.zeros((4, 4), dtype=bool)
_PER_RANK[S_TOK, S_FEAT] = _PER_RANK[S_FEAT, S_TOK] = True


def transition(src: int, dst: int, full_size_bytes: float, group_size: int) -> tuple[int, float]:
    """The collective (code) and its nccl-tests size that convert ``src`` into ``dst``.

    ``full_size_bytes`` is the size of the whole logical tensor held by the group. A group of one
    rank never communicates.

    >>> transition(P, R, 1024.0, 8)   # row-parallel output to a replicated input: all-reduce
    (1, 1024.0)
    >>> transition(S_TOK, S_FEAT, 1024.0, 8)  # re-shard: all-to-all of each rank's share
    (4, 128.0)
    """
    if dst == P:
        raise ValueError("a consumer never requires partial sums")
    if group_size <= 1:
        return NONE, 0.0
    coll = int(_COLLECTIVE[src, dst])
    if coll == NONE:
        return NONE, 0.0
    size = full_size_bytes / group_size if _PER_RANK[src, dst] else full_size_bytes
    return coll, float(size)


def transition_arrays(src: np.ndarray, dst: np.ndarray, full_size_bytes: np.ndarray,
                      group_size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized :func:`transition`: codes and sizes for arrays of layouts (one entry per strategy)."""
    coll = _COLLECTIVE[src, dst]
    coll = np.where(group_size > 1, coll, NONE)
    size = np.where(_PER_RANK[src, dst], full_size_bytes / group_size, full_size_bytes)
    size = np.where(coll == NONE, 0.0, size)
    return coll, size
