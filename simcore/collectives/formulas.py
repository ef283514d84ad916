"""Latency and bandwidth of one (collective, algorithm, protocol) entry, the way NCCL's tuning model has it.

Each function takes numpy arrays (already broadcast) of ``size_bytes`` S, ranks ``n``, ranks per NVLink
domain ``p`` and domains ``N = ceil(n / p)`` and returns an :class:`EntryCost`. NCCL predicts
``latency + S / algBw``; ``algBw`` is the bus bandwidth ``busBw`` (``nChannels x bw`` from its topology
search) after per-protocol refinements, times ``n / nsteps`` (ring, NVLS, NVLSTree) or 0.5 (tree).

Our stand-in for NCCL's topology search, so that any fabric works (all per GPU per direction):

* ``B_nvl = nvlink_efficiency x NVLink rate``: what a set of ring/tree channels reaches inside a domain.
* ``B_nic = nic_efficiency x NIC rate``; ``X = p x B_nic``: the NICs of the group's GPUs in one domain.
* A multi-domain ring's bus bandwidth is ``min(B_nvl, X)`` (each domain sends busBw across the network).
* NVLS uses one channel per local rank (``nCh = min(p, 16)``); a channel's head link carries twice,
  so ``bw_ch = min(60 GB/s, B_nvl / (nCh + 1))``, NCCL's search rule. This is what makes NCCL pick ring
  up to 4 GPUs per node and NVLS from 5.

Deviations from NCCL (documented):

* a 2-node tree's bandwidth is capped by the NICs (``2 X``: a 2-node double binary tree moves S per
  domain), where NCCL uses the intra-node rate alone;
* NVLSTree's algBw is capped by what its inter-domain double binary tree can move through the NICs
  (``X`` at 2 domains, ``X / 2`` beyond), which NCCL's ``n / nsteps`` conversion slightly exceeds at
  small rank counts;
* NVLS needs one domain (multi-node NVLS needs CollNet/SHARP, not modelled); PAT and CollNet are not
  modelled.

The constants are those of the fabric (:meth:`~.constants.NcclConstants.for_fabric`): its scale-out
network's NIC efficiency and latency (InfiniBand, EFA, RoCE) and NCCL's Blackwell rows on Blackwell.

Calibrated extras (not part of NCCL's prediction, so they never change its choice): ``extra_latency_s``
(the fitted per-collective launch overhead) and ``fill_s`` (fitted un-overlapped ring steps, NVLS fill,
and across NVLink domains the network pipeline's fill, a smooth min(bandwidth term, the time one NIC
takes to send ``net_fill_bytes``)).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simcore.collectives.constants import Fabric, NcclConstants

__all__ = ["EntryCost", "Shape", "entry_cost", "hierarchical_phases", "PROTO_INDEX", "ring_bus_bandwidth",
           "nvls_channel_bandwidth", "p2p_bandwidths"]

PROTO_INDEX = {"ll": 0, "ll128": 1, "simple": 2}
_SIMPLE = 2


class EntryCost(NamedTuple):
    """Cost pieces of one entry, seconds (arrays): NCCL's latency and S/algBw, plus calibrated extras."""

    latency_s: np.ndarray        # NCCL's latency term
    bandwidth_s: np.ndarray      # NCCL's S / algBw (tree correction included)
    extra_latency_s: np.ndarray  # calibrated: launch overhead
    fill_s: np.ndarray           # calibrated: un-overlapped ring fill steps

    @property
    def nccl_time_s(self) -> np.ndarray:
        """What NCCL's own model predicts (used to choose, as NCCL does)."""
        return self.latency_s + self.bandwidth_s

    @property
    def time_s(self) -> np.ndarray:
        """Our prediction: NCCL's plus the calibrated extras."""
        return self.latency_s + self.bandwidth_s + self.extra_latency_s + self.fill_s


class Shape(NamedTuple):
    """Broadcast float arrays describing calls: bytes, ranks, ranks per domain, domains."""

    size: np.ndarray
    n: np.ndarray
    p: np.ndarray
    nodes: np.ndarray


def _bucket(nodes: np.ndarray) -> np.ndarray:
    """NCCL's node-count index: 0 for 1 node, 1 for 2, 2 for 3+."""
    return np.where(nodes <= 1, 0, np.where(nodes <= 2, 1, 2))


def _log2i(x: np.ndarray) -> np.ndarray:
    return np.floor(np.log2(np.maximum(x, 1.0)))


def _p2p_bw(bw, proto: int, shape: Shape, c: NcclConstants) -> np.ndarray:
    """Protocol refinement of a ring/p2p bus bandwidth (Ring LL and LL128 rules of tuning.cc)."""
    if proto == 0:
        return np.minimum(np.asarray(c.ll_max_bw)[_bucket(shape.nodes)], bw * c.ll_bw_factor)
    if proto == 1:
        factor = np.where(shape.p < 2, c.ll128_bw_factor_one_gpu_per_node, c.ll128_bw_factor)
        return np.minimum(bw * factor, c.ring_channels * c.ring_ll128_channel_max_bw)
    return np.asarray(bw, dtype=float)


def _inter_hop(proto: int, shape: Shape, c: NcclConstants) -> np.ndarray:
    """Per-step network latency of a ring (Tree's NET value at 1 GPU per node), plus latencyInter."""
    hop = np.where(shape.p <= 1, c.tree_net_hop_latency_s[proto], c.ring_net_hop_latency_s[proto])
    return hop + c.net_latency_s * (2.0 if proto == _SIMPLE else 1.0)


def _zero_if_trivial(cost: EntryCost, shape: Shape) -> EntryCost:
    trivial = (shape.n <= 1) | (shape.size <= 0)
    return EntryCost(*(np.where(trivial, 0.0, part) for part in cost))


def ring_bus_bandwidth(shape: Shape, fabric: Fabric, c: NcclConstants) -> np.ndarray:
    """Ring busBw before protocol refinements: NVLink inside a domain, min(NVLink, NICs) across."""
    c = c.for_fabric(fabric)
    b_nvl = c.nvlink_efficiency * fabric.nvlink_bandwidth_bytes_per_s
    b_nics = shape.p * c.nic_efficiency * fabric.nic_bandwidth_bytes_per_s
    return np.where(shape.nodes > 1, np.minimum(b_nvl, b_nics), b_nvl)


def _with_net_fill(cost: EntryCost, shape: Shape, fabric: Fabric, c: NcclConstants) -> EntryCost:
    """An entry that crosses NVLink domains pays the network pipeline's fill: the time one NIC takes to
    put F = ``net_fill_bytes`` on the wire at its achieved rate, T = F / (nic_efficiency x NIC rate),
    added as a smooth min(bandwidth_s, T) = bandwidth_s T / (bandwidth_s + T) (T for long transfers, the
    transfer itself for short ones, so the fit sees a gradient at every size). The fill is bytes in
    flight per NIC (proxy hand-off, chunks before the steady state), so it is a time per NIC, the same
    for an all-reduce and an all-to-all of any size or node count; calibrated, not NCCL's, so it never
    changes NCCL's choice."""
    fill_s = c.net_fill_bytes / (c.nic_efficiency * fabric.nic_bandwidth_bytes_per_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        extra = np.where((shape.nodes > 1) & (shape.size > 0) & np.isfinite(cost.bandwidth_s),
                         cost.bandwidth_s * fill_s / (cost.bandwidth_s + fill_s), 0.0)
    return cost._replace(fill_s=cost.fill_s + extra)


def _ring(coll: str, shape: Shape, fabric: Fabric, proto: int, c: NcclConstants) -> EntryCost:
    S, n, nodes = shape.size, shape.n, shape.nodes
    ar = coll == "all_reduce"
    nsteps = 2.0 * (n - 1) if ar else n - 1.0
    inter = 2.0 * (nodes - 1) if ar else nodes - 1.0
    bus = _p2p_bw(ring_bus_bandwidth(shape, fabric, c), proto, shape, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        bandwidth = S * nsteps / (n * bus)
        step_s = S / (n * bus)
    overhead = np.where(nodes > 1, c.net_overhead_s * (3.0 if proto == _SIMPLE else 1.0), 0.0)
    intra_hop = np.maximum(c.ring_nvlink_hop_latency_s[proto], overhead)
    inter_hop = _inter_hop(proto, shape, c)
    latency = c.ring_base_latency_s[proto] + (nsteps - inter) * intra_hop + inter * inter_hop
    if ar and proto == _SIMPLE:
        with np.errstate(divide="ignore", invalid="ignore"):
            plateau = (nodes > 1) & (S / (c.ring_channels * n) >= c.ring_plateau_min_bytes)
        latency = np.where(plateau, latency * c.ring_plateau_factor, latency)
    fill_steps = {"all_reduce": c.ring_fill_steps_copy + c.ring_fill_steps_reduce,
                  "all_gather": c.ring_fill_steps_copy, "reduce_scatter": c.ring_fill_steps_reduce}[coll]
    return EntryCost(latency, bandwidth, np.full_like(S, c.launch_overhead_s), fill_steps * step_s)


def _tree_correction(S: np.ndarray, proto: int, c: NcclConstants) -> np.ndarray:
    table = np.asarray(c.tree_correction[proto])
    with np.errstate(divide="ignore"):
        idx = np.floor(np.log2(np.maximum(S, 1.0) / 64.0))
    ok = (S >= 64) & (idx < len(table))
    return np.where(ok, table[np.clip(idx, 0, len(table) - 1).astype(int)], 1.0)


def _tree(shape: Shape, fabric: Fabric, proto: int, c: NcclConstants) -> EntryCost:
    S, p, nodes = shape.size, shape.p, shape.nodes
    bucket = _bucket(nodes)
    b_nvl = c.nvlink_efficiency * fabric.nvlink_bandwidth_bytes_per_s
    b_nics = p * c.nic_efficiency * fabric.nic_bandwidth_bytes_per_s
    bus = np.where(nodes <= 1, b_nvl, np.minimum(b_nvl, np.where(nodes <= 2, 2.0, 1.0) * b_nics))
    bus = np.minimum(bus * c.tree_bw_factor, c.ring_channels * np.asarray(c.tree_channel_max_bw)[bucket])
    if proto == 0:
        bus = np.minimum(bus / c.tree_ll_bw_divisor, np.asarray(c.ll_max_bw)[bucket])
    elif proto == 1:
        factor = np.where(nodes <= 1, c.tree_ll128_bw_factor[0], c.tree_ll128_bw_factor[1])
        bus = np.minimum(bus * factor, c.ring_channels * np.asarray(c.tree_ll128_channel_max_bw)[bucket])
    alg = bus * 0.5 * _tree_correction(S, proto, c)
    inter_hop = c.tree_net_hop_latency_s[proto] + c.net_latency_s * (2.0 if proto == _SIMPLE else 1.0)
    latency = c.tree_base_latency_s[proto] + 2.0 * ((p - 1) * c.tree_nvlink_hop_latency_s[proto]
                                                    + _log2i(nodes) * inter_hop)
    return EntryCost(latency, S / alg, np.full_like(S, c.launch_overhead_s), np.zeros_like(S))


def nvls_channel_bandwidth(p: np.ndarray, fabric: Fabric, c: NcclConstants) -> tuple[np.ndarray, np.ndarray]:
    """(channels, per-channel bw) of NVLS: one channel per local rank, head link counted twice."""
    nch = np.minimum(p, c.nvls_max_channels)
    b_nvl = c.nvlink_efficiency * fabric.nvlink_bandwidth_bytes_per_s
    return nch, np.minimum(c.max_channel_bw_intra, b_nvl / (nch + 1.0))


def _nvls(coll: str, shape: Shape, fabric: Fabric, proto: int, c: NcclConstants) -> EntryCost:
    S, n, p, nodes = shape.size, shape.n, shape.p, shape.nodes
    ar = coll == "all_reduce"
    ok = (nodes <= 1) & (p >= 2) & fabric.nvls & (proto == _SIMPLE) & (ar | (p <= c.nvls_max_arity))
    nch, bw_ch = nvls_channel_bandwidth(p, fabric, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = bw_ch * c.nvls_efficiency * (nch - 1) / nch * (2.0 if ar else (p - 1) / p)
        alg = nch * intra * (n / (2.0 * (n - 1)) if ar else 1.0)
        bandwidth = np.where(ok, S / alg, np.inf)
    latency = np.full_like(S, c.nvls_nvlink_latency_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        fill = np.where(ok & ar, np.minimum(S, c.nvls_fill_bytes) / alg, 0.0)
    return EntryCost(latency, bandwidth, np.full_like(S, c.launch_overhead_s), fill)


def _nvls_tree(shape: Shape, fabric: Fabric, proto: int, c: NcclConstants) -> EntryCost:
    S, n, p, nodes = shape.size, shape.n, shape.p, shape.nodes
    ok = (nodes > 1) & (p >= 2) & fabric.nvls & (proto == _SIMPLE)
    nch, bw_ch = nvls_channel_bandwidth(p, fabric, c)
    b_nics = p * c.nic_efficiency * fabric.nic_bandwidth_bytes_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        intra = bw_ch * c.nvls_efficiency * (nch - 1) / nch * 2.0
        inter = b_nics / nch * np.where(nodes <= 2, 2.0, 1.0)
        cap = np.asarray(c.nvls_tree_channel_max_bw)[_bucket(nodes)]
        alg = nch * np.minimum(np.minimum(intra, inter), cap) * n / (2.0 * (n - 1))
        # physical cap: the inter-domain double binary tree moves S (2 domains) or 2S (more) per domain
        alg = np.minimum(alg, b_nics * np.where(nodes <= 2, 1.0, 0.5))
        bandwidth = np.where(ok, S / alg, np.inf)
    latency = c.nvls_tree_nvlink_latency_s + 2.0 * _log2i(nodes) * (c.nvls_tree_net_latency_s
                                                                   + 2.0 * c.net_latency_s)
    return EntryCost(latency, bandwidth, np.full_like(S, c.launch_overhead_s), np.zeros_like(S))


def hierarchical_phases(coll: str, shape: Shape) -> list[tuple[str, Shape]]:
    """The 3-phase schedule: (sub-collective, sub-shape) in order; 1-rank phases cost nothing.

    all_reduce = reduce-scatter in the domain, all-reduce of S/p across domains (p rail rings at
    once, one GPU per domain each), all-gather in the domain. all_gather = all-gather of S/p across
    domains then in the domain; reduce_scatter = the reverse.
    """
    S, p, nodes = shape.size, shape.p, shape.nodes
    intra = Shape(S, p, p, np.ones_like(S))
    inter = Shape(S / p, nodes, np.ones_like(S), nodes)
    return {"all_reduce": [("reduce_scatter", intra), ("all_reduce", inter), ("all_gather", intra)],
            "all_gather": [("all_gather", inter), ("all_gather", intra)],
            "reduce_scatter": [("reduce_scatter", intra), ("reduce_scatter", inter)]}[coll]


def _hierarchical(coll: str, shape: Shape, fabric: Fabric, proto: int, c: NcclConstants) -> EntryCost:
    c0 = c.with_overrides(launch_overhead_s=0.0)  # one launch for the whole schedule
    parts = [_zero_if_trivial(_with_net_fill(_ring(sub, sub_shape, fabric, proto, c0), sub_shape, fabric, c0), sub_shape)
             for sub, sub_shape in hierarchical_phases(coll, shape)]
    total = [sum(part[i] for part in parts) for i in range(4)]
    return EntryCost(total[0], total[1], total[2] + c.launch_overhead_s, total[3])


def p2p_bandwidths(shape: Shape, fabric: Fabric, proto: int,
                   c: NcclConstants) -> tuple[np.ndarray, np.ndarray]:
    """(NVLink, NIC) per-GPU bandwidth of point-to-point traffic under ``proto``."""
    c = c.for_fabric(fabric)
    b_nvl = c.nvlink_efficiency * fabric.nvlink_bandwidth_bytes_per_s
    b_nic = c.nic_efficiency * fabric.nic_bandwidth_bytes_per_s
    return _p2p_bw(b_nvl, proto, shape, c), _p2p_bw(b_nic, proto, shape, c)


def _p2p_hop(proto: int, shape: Shape, c: NcclConstants) -> np.ndarray:
    return np.where(shape.nodes > 1, _inter_hop(proto, shape, c), c.ring_nvlink_hop_latency_s[proto])


def _all_to_all(algo: str, shape: Shape, fabric: Fabric, proto: int, c: NcclConstants) -> EntryCost:
    S, n, p, nodes = shape.size, shape.n, shape.p, shape.nodes
    f_nvl, f_nic = p2p_bandwidths(shape, fabric, proto, c)
    hop = _p2p_hop(proto, shape, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        if algo == "direct":
            bandwidth = np.maximum(S / n * (p - 1) / f_nvl, S / n * (n - p) / f_nic)
            steps = np.ones_like(S)
        else:  # pairwise: n-1 steps; with more than one domain every step has a cross-domain pair
            bandwidth = (n - 1) * S / n / np.where(nodes > 1, f_nic, f_nvl)
            steps = n - 1
    latency = c.ring_base_latency_s[proto] + steps * hop
    return EntryCost(latency, bandwidth, np.full_like(S, c.launch_overhead_s), np.zeros_like(S))


def _send_recv(shape: Shape, fabric: Fabric, proto: int, c: NcclConstants) -> EntryCost:
    S, nodes = shape.size, shape.nodes
    f_nvl, f_nic = p2p_bandwidths(shape, fabric, proto, c)
    bandwidth = S / np.where(nodes > 1, f_nic, f_nvl)
    hop = _p2p_hop(proto, shape, c)
    latency = c.ring_base_latency_s[proto] + hop
    return EntryCost(latency, bandwidth, np.full_like(S, c.launch_overhead_s), np.zeros_like(S))


def entry_cost(coll: str, algo: str, proto: str, shape: Shape, fabric: Fabric, c: NcclConstants) -> EntryCost:
    """Cost of one (collective, algorithm, protocol) entry; inf where it cannot run, 0 if trivial."""
    c = c.for_fabric(fabric)  # the scale-out network's NIC efficiency/latency, NCCL's Blackwell rows
    k = PROTO_INDEX[proto]
    if algo == "ring":
        cost = _ring(coll, shape, fabric, k, c)
    elif algo == "tree":
        cost = _tree(shape, fabric, k, c)
    elif algo == "nvls":
        cost = _nvls(coll, shape, fabric, k, c)
    elif algo == "nvls_tree":
        cost = _nvls_tree(shape, fabric, k, c)
    elif algo == "hierarchical":
        return _zero_if_trivial(_hierarchical(coll, shape, fabric, k, c), shape)  # fill inside, per phase
    elif coll == "all_to_all":
        cost = _all_to_all(algo, shape, fabric, k, c)
    else:
        cost = _send_recv(shape, fabric, k, c)
    return _zero_if_trivial(_with_net_fill(cost, shape, fabric, c), shape)
