"""Analytic collective time: NCCL's (algorithm, protocol) table, its argmin choice, and our calibration.

This is the one formula the fast proxy uses and the flow simulator reproduces on an idle fabric
(:mod:`simcore.collectives.flows`). Sizes follow nccl-tests: ``all_gather`` = total output,
``reduce_scatter`` = total input, ``all_to_all`` = per-rank buffer, ``all_reduce`` = buffer,
``send_recv`` = bytes sent. See :mod:`simcore.collectives.formulas` for the per-entry formulas.

>>> from simcore.hardware.gpus import get_gpu
>>> fab = Fabric.from_gpu(get_gpu("h100-sxm"))
>>> select("all_reduce", 2**30, 8, 8, fab)[0].item()
'nvls'
>>> select("all_reduce", 2**30, 4, 4, fab)[0].item()
'ring'
"""

from __future__ import annotations

import numpy as np

from simcore.collectives.constants import (
    ALGORITHMS,
    ALGORITHMS_BY_COLLECTIVE,
    COLLECTIVES,
    DEFAULT,
    PROTOCOLS,
    Fabric,
    NcclConstants,
)
from simcore.collectives.formulas import EntryCost, Shape, entry_cost

__all__ = ["collective_time_s", "select", "entry_costs", "candidates", "make_shape", "AUTO_ALGORITHMS"]

#: What NCCL itself may choose among (``auto``); ``hierarchical`` must be asked for explicitly.
AUTO_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "nvls", "nvls_tree"),
    "all_gather": ("ring", "nvls"),
    "reduce_scatter": ("ring", "nvls"),
    "all_to_all": ("direct", "pairwise"),
    "send_recv": ("direct",),
}


def _check_name(kind: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; choose one of: {', '.join(valid)}")


def candidates(collective: str, algorithm: str = "auto", protocol: str = "auto") -> list[tuple[str, str]]:
    """The (algorithm, protocol) entries considered; ``ValueError`` names a bad or inapplicable name."""
    _check_name("collective", collective, COLLECTIVES)
    if algorithm != "auto":
        _check_name("algorithm", algorithm, ALGORITHMS + ("auto",))
        valid = ALGORITHMS_BY_COLLECTIVE[collective] + ("auto",)
        _check_name(f"algorithm for {collective}", algorithm, valid)
    if protocol != "auto":
        _check_name("protocol", protocol, PROTOCOLS + ("auto",))
    algos = AUTO_ALGORITHMS[collective] if algorithm == "auto" else (algorithm,)
    protos = PROTOCOLS if protocol == "auto" else (protocol,)
    # NVLS and NVLSTree run Simple only: with protocol "auto" the other entries are not even costed.
    return [(a, p) for a in algos for p in protos
            if protocol != "auto" or p == "simple" or a not in ("nvls", "nvls_tree")]


def make_shape(size_bytes, n_ranks, ranks_per_node, fabric: Fabric) -> Shape:
    """Broadcast and check the call arrays; nodes = ceil(n_ranks / ranks_per_node)."""
    size, n, p = np.broadcast_arrays(np.asarray(size_bytes, dtype=float), np.asarray(n_ranks, dtype=float),
                                     np.asarray(ranks_per_node, dtype=float))
    ok_size = np.isfinite(size) & (size >= 0)
    if not np.all(ok_size):
        raise ValueError(f"size_bytes must be finite and >= 0, got {_first_bad(size, ~ok_size)}")
    ok_n = (n >= 1) & (n == np.round(n))
    if not np.all(ok_n):
        raise ValueError(f"n_ranks must be a positive integer, got {_first_bad(n, ~ok_n)}")
    ok_p = (p >= 1) & (p == np.round(p)) & (p <= n)
    if not np.all(ok_p):
        raise ValueError(f"ranks_per_node must be an integer in [1, n_ranks], got {_first_bad(p, ~ok_p)}")
    if np.any(p > fabric.nvlink_domain_size):
        raise ValueError(f"ranks_per_node {_first_bad(p, p > fabric.nvlink_domain_size)} exceeds the NVLink "
                         f"domain size {fabric.nvlink_domain_size}")
    return Shape(size.astype(float), n.astype(float), p.astype(float), np.ceil(n / p))


def _first_bad(values: np.ndarray, mask: np.ndarray) -> float:
    return values[mask].flat[0].item()


def entry_costs(collective: str, size_bytes, n_ranks, ranks_per_node, fabric: Fabric,
                algorithm: str = "auto", protocol: str = "auto",
                constants: NcclConstants = DEFAULT) -> list[tuple[str, str, EntryCost]]:
    """Every considered entry with its cost pieces (see :class:`~.formulas.EntryCost`)."""
    entries = candidates(collective, algorithm, protocol)
    shape = make_shape(size_bytes, n_ranks, ranks_per_node, fabric)
    return [(a, p, entry_cost(collective, a, p, shape, fabric, constants)) for a, p in entries]


def _choose(costs: list[tuple[str, str, EntryCost]]) -> tuple[np.ndarray, np.ndarray]:
    """Index of NCCL's argmin (by NCCL's own prediction) and our time of that entry."""
    nccl = np.stack([c.nccl_time_s for _, _, c in costs])
    ours = np.stack([c.time_s for _, _, c in costs])
    idx = np.argmin(nccl, axis=0)
    return idx, np.take_along_axis(ours, idx[None], axis=0)[0]


def collective_time_s(collective: str, size_bytes, n_ranks, ranks_per_node, fabric: Fabric,
                      algorithm: str = "auto", protocol: str = "auto",
                      constants: NcclConstants = DEFAULT) -> np.ndarray:
    """Time in seconds of a collective (arrays broadcast together).

    ``n_ranks`` ranks, ``ranks_per_node`` of them in each NVLink domain. ``auto`` picks the entry with
    the smallest NCCL-model time, as NCCL does; a forced algorithm/protocol that cannot run a
    configuration gives ``inf`` there. ``n_ranks == 1`` or ``size_bytes == 0`` costs 0.
    """
    _, time = _choose(entry_costs(collective, size_bytes, n_ranks, ranks_per_node, fabric, algorithm,
                                  protocol, constants))
    return time


def select(collective: str, size_bytes, n_ranks, ranks_per_node, fabric: Fabric,
           constants: NcclConstants = DEFAULT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NCCL's choice: (algorithm names, protocol names, time in seconds); ``'none'`` where trivial."""
    costs = entry_costs(collective, size_bytes, n_ranks, ranks_per_node, fabric, constants=constants)
    idx, time = _choose(costs)
    algos = np.array([a for a, _, _ in costs])[idx]
    protos = np.array([p for _, p, _ in costs])[idx]
    shape = make_shape(size_bytes, n_ranks, ranks_per_node, fabric)
    trivial = (shape.n <= 1) | (shape.size <= 0)
    return np.where(trivial, "none", algos), np.where(trivial, "none", protos), time
