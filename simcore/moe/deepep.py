"""DeepEP's dispatch and combine as two all-to-all algorithms with their own costs.

- ``normal`` (high-throughput, prefill): a token goes through the RDMA path once per destination
  node (to the GPU of its own rail there; its own node's share included, as DeepEP's measured rates
  say: they stay at 43-46 GB/s per GPU from 2 to 8 nodes, which with remote bytes alone would put
  2 nodes' NVLink forwarding at 240 GB/s, above H800's 200 GB/s), and that GPU forwards it over
  NVLink once per destination rank; the RDMA and NVLink stages are pipelined, so the slower one
  sets the time. Within one node it is a direct NVLink copy, once per destination rank.
- ``low_latency`` (decode): every token copy is written straight into the buffer of its expert's
  rank: over NVLink to ranks of the same node (DeepEP since PR #173, 2025-06; ``ll_nvlink``) and
  by RDMA to the others, each rank paying a fixed cost plus a small cost per peer.

A rank's time is ``fixed + max(nvlink_bytes / (eta_nvl x NVLink), rdma_bytes / (eta_rdma x NIC))``
with each link's bytes the larger of what the rank sends and receives on it; an op lasts as long
as its slowest rank (combine cannot finish before the last expert rank has sent its outputs).
Combine moves the same tokens back, so it is the same formula at the combine's bytes per token.
:func:`link_tokens` says which GPU sends which tokens to which over each link class (what the
engine runs as flows, :mod:`simcore.moe.deepep_exchange`); :func:`pair_times_s` prices exactly those.

Link rates are the GPU catalog's (:mod:`simcore.hardware.gpus`), so constants fitted on H800 (NVLink
200 GB/s per direction) carry over to H100 (450 GB/s) as efficiencies; the NIC (400 Gb/s CX7) is
the same on both. Constants: ``python -m validation.studies.moe.fit`` on the DeepEP README rows of
2025-02-24 (``validation/data/ep_alltoall_deepep.csv``; the later README rows are the test set).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MODES", "DeepEPConstants", "DEFAULT_DEEPEP", "kernel_time_s", "pair_times_s", "uniform_time_s",
           "mode_for_phase", "fp8_token_bytes", "LinkTokens", "link_tokens", "fixed_time_s", "kernel_sms"]

MODES = ("normal", "low_latency")


@dataclass(frozen=True)
class DeepEPConstants:
    """Fitted physical constants (SI; ``python -m validation.studies.moe.fit``, 20 rows of H800:
    median |error| 1.2%, each row's busiest rank at the expected load of DeepEP's benchmark routing,
    random top-8 of 256 experts). ``normal_latency_s`` is a prior: the normal-mode rows give
    bandwidths at 4096 tokens only, where a fixed cost of microseconds does not show."""

    nvlink_efficiency: float = 0.794  # normal mode: fraction of the GPU's per-direction NVLink rate
    rdma_efficiency: float = 0.900  # normal mode: fraction of the NIC rate
    ll_rdma_efficiency: float = 0.884  # low-latency mode: fraction of the NIC rate
    ll_latency_s: float = 6.08e-6  # low-latency: fixed cost of one dispatch or combine
    ll_per_peer_s: float = 0.004e-6  # low-latency: per destination rank (its writes and signal)
    normal_latency_s: float = 20e-6  # normal mode: fixed cost (prior: notify + barrier, as NCCL's ~20 us)
    ll_nvlink: bool = True  # low-latency kernels reach same-node ranks over NVLink
    # SMs a kernel holds while its data moves (what compute overlapping it loses): normal mode
    # DeepEP's ``Buffer.num_sms`` default (20); low latency with the receive hook that decode
    # overlap uses ("does not occupy any SM resource", DeepEP's README): none
    normal_sms: int = 20
    ll_sms: int = 0

    def __post_init__(self) -> None:
        for name in ("nvlink_efficiency", "rdma_efficiency", "ll_rdma_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"DeepEPConstants.{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("ll_latency_s", "ll_per_peer_s", "normal_latency_s", "normal_sms", "ll_sms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"DeepEPConstants.{name} must be >= 0, got {getattr(self, name)}")


DEFAULT_DEEPEP = DeepEPConstants()


def mode_for_phase(phase: str) -> str:
    """DeepEP's deployment choice: normal kernels for prefill, low-latency kernels for decode."""
    return "normal" if phase == "prefill" else "low_latency"


def fixed_time_s(mode: str, ep: int, c: DeepEPConstants = DEFAULT_DEEPEP) -> float:
    """The fixed part of one kernel's time on ``ep`` ranks (what :func:`kernel_time_s` adds to the
    bandwidth term): normal mode's notify and barrier, low latency's launch plus its per-peer cost."""
    if mode not in MODES:
        raise ValueError(f"DeepEP mode must be one of {', '.join(MODES)}, got {mode!r}")
    return c.normal_latency_s if mode == "normal" else c.ll_latency_s + c.ll_per_peer_s * (ep - 1)


def kernel_sms(mode: str, c: DeepEPConstants = DEFAULT_DEEPEP) -> int:
    """SMs one rank's kernel holds while its dispatch or combine moves data."""
    return int(c.normal_sms if mode == "normal" else c.ll_sms)


def fp8_token_bytes(hidden: int) -> float:
    """Bytes of one FP8 token as DeepEP dispatches it: the values plus one FP32 scale per 128."""
    return hidden + hidden / 128 * 4.0


def kernel_time_s(mode: str, nvlink_bytes, rdma_bytes, peers, gpu, c: DeepEPConstants = DEFAULT_DEEPEP):
    """One rank's time (vectorized) from the bytes it moves on each link class."""
    if mode not in MODES:
        raise ValueError(f"DeepEP mode must be one of {', '.join(MODES)}, got {mode!r}")
    nvl_bw = c.nvlink_efficiency * gpu.nvlink_bandwidth_bytes_per_s
    if mode == "normal":
        rdma_bw, fixed = c.rdma_efficiency * gpu.nic_bandwidth_bytes_per_s, c.normal_latency_s
    else:
        rdma_bw = c.ll_rdma_efficiency * gpu.nic_bandwidth_bytes_per_s
        fixed = c.ll_latency_s + c.ll_per_peer_s * np.asarray(peers, dtype=float)
    return fixed + np.maximum(np.asarray(nvlink_bytes) / nvl_bw, np.asarray(rdma_bytes) / rdma_bw)


def pair_times_s(mode: str, pair_tokens: np.ndarray, tokens_per_rank, top_k: int, token_bytes: float,
                 ranks_per_node: int, gpu, c: DeepEPConstants = DEFAULT_DEEPEP) -> np.ndarray:
    """Each rank's time for the copies ``pair_tokens[i, j]`` (rank ``i`` to rank ``j``), ranks
    numbered node by node (``ranks_per_node`` consecutive ranks share a node and its NVLink)."""
    t = link_tokens(mode, pair_tokens, tokens_per_rank, top_k, ranks_per_node, c)
    return kernel_time_s(mode, t.nvlink_rank * token_bytes, t.rdma_rank * token_bytes, len(t.nvlink) - 1, gpu, c)


@dataclass(frozen=True)
class LinkTokens:
    """Where one dispatch's (or combine's) token copies travel, ranks numbered node by node.

    ``nvlink[s, d]``: tokens ``s`` writes into ``d``'s buffer over NVLink (normal mode: ``s`` is the
    forwarding GPU, on ``d``'s node and the source's rail); ``rdma[s, d]``: tokens ``s`` sends ``d``
    over RDMA (normal mode: ``d`` is the GPU of ``s``'s rail on the destination node, one copy per
    node; the diagonal is the source's own node's share, which the kernel pipelines like the others
    but which crosses no link). ``nvlink_rank`` and ``rdma_rank``: per rank, the larger of what it
    sends and receives on that link class (its own-node RDMA share included), the bytes
    :func:`kernel_time_s` charges, over ``token_bytes``."""

    nvlink: np.ndarray
    rdma: np.ndarray
    nvlink_rank: np.ndarray
    rdma_rank: np.ndarray


def link_tokens(mode: str, pair_tokens: np.ndarray, tokens_per_rank, top_k: int, ranks_per_node: int,
                c: DeepEPConstants = DEFAULT_DEEPEP) -> LinkTokens:
    """The link traffic of DeepEP's kernels for the copies ``pair_tokens[i, j]`` (module docstring):
    low latency writes every copy straight to its rank; normal sends each token once per destination
    node over RDMA (to its own rail there) and forwards it once per destination rank over NVLink."""
    if mode not in MODES:
        raise ValueError(f"DeepEP mode must be one of {', '.join(MODES)}, got {mode!r}")
    pair = np.asarray(pair_tokens, dtype=float)
    ep = len(pair)
    rpn = max(1, min(int(ranks_per_node), ep))
    node, local = np.arange(ep) // rpn, np.arange(ep) % rpn
    same_node = node[:, None] == node[None, :]
    off_diag = ~np.eye(ep, dtype=bool)
    if mode == "low_latency":
        nvl_pairs = pair * (same_node & off_diag) if c.ll_nvlink else np.zeros_like(pair)
        rdma_pairs = pair * off_diag - nvl_pairs
        nvl = np.maximum(nvl_pairs.sum(axis=1), nvl_pairs.sum(axis=0))
        rdma = np.maximum(rdma_pairs.sum(axis=1), rdma_pairs.sum(axis=0))
        return LinkTokens(nvl_pairs, rdma_pairs, nvl, rdma)
    tokens = np.broadcast_to(np.asarray(tokens_per_rank, dtype=float), (ep,))
    frac = pair / np.maximum(tokens * top_k, 1e-30)[:, None]  # share of a source's copies per rank
    distinct = tokens[:, None] * (1.0 - (1.0 - np.clip(frac, 0, 1)) ** top_k)  # tokens i sends j
    on_node = np.eye(node.max() + 1)[node]  # [ep, nodes]
    on_local = np.eye(rpn)[local]  # [ep, rpn]
    node_frac = frac @ on_node
    per_node = tokens[:, None] * (1.0 - (1.0 - np.clip(node_frac, 0, 1)) ** top_k)  # [ep, nodes]
    multi = float(on_node.shape[1] > 1)  # one node: the intranode kernels, no RDMA at all
    rdma_send = per_node.sum(axis=1) * multi
    rdma_recv = (on_local.T @ per_node)[local, node] * multi  # arriving on this rank's rail
    fwd = distinct * ~(local[:, None] == local[None, :])  # NVLink hops (own rail's tokens skip them)
    nvl_send = (on_local.T @ fwd @ on_node)[local, node]  # what this rank forwards in its node
    nvl_recv = fwd.sum(axis=0)
    same_rail = on_local @ on_local.T  # [ep, ep]: 1 where two ranks share a local index (a rail)
    rdma_pairs = (per_node @ on_node.T) * same_rail * multi  # i -> the GPU of its rail on each node
    nvl_pairs = (same_rail @ fwd) * same_node  # that GPU -> each destination rank of its node
    return LinkTokens(nvl_pairs, rdma_pairs, np.maximum(nvl_send, nvl_recv), np.maximum(rdma_send, rdma_recv))


def uniform_time_s(mode: str, tokens_per_rank, top_k: int, token_bytes, ep, ranks_per_node, gpu,
                   load=1.0, c: DeepEPConstants = DEFAULT_DEEPEP):
    """Closed form of :func:`pair_times_s` for the busiest rank when every rank routes uniformly
    and that rank receives ``load`` times the mean (vectorized over strategies)."""
    ep = np.asarray(ep, dtype=float)
    rpn = np.minimum(np.asarray(ranks_per_node, dtype=float), ep)
    copies = np.asarray(tokens_per_rank, dtype=float) * top_k
    hot = np.maximum(np.asarray(load, dtype=float), 1.0)  # the busiest rank sends its mean, receives more
    if mode == "low_latency":
        local, remote = copies * (rpn - 1) / ep, copies * (ep - rpn) / ep
        nvl, rdma = (local, remote) if c.ll_nvlink else (0.0 * local, local + remote)
        return kernel_time_s(mode, hot * nvl * token_bytes, hot * rdma * token_bytes, ep - 1, gpu, c)
    t = np.asarray(tokens_per_rank, dtype=float)
    nodes = ep / rpn
    d = t * (1.0 - (1.0 - 1.0 / ep) ** top_k)  # distinct tokens one rank sends another
    d_hot = t * (1.0 - (1.0 - np.minimum(hot / ep, 1.0)) ** top_k)  # ... to the hot rank
    per_node = t * (1.0 - (1.0 - rpn / ep) ** top_k)
    per_node_hot = t * (1.0 - (1.0 - np.minimum((rpn - 1 + hot) / ep, 1.0)) ** top_k)  # the hot rank's node
    rdma = np.where(nodes > 1, nodes, 0.0) * np.maximum(per_node, per_node_hot)
    nvl = np.maximum(nodes * (rpn - 1) * d, (ep - nodes) * d_hot)
    return kernel_time_s(mode, nvl * token_bytes, rdma * token_bytes, ep - 1, gpu, c)
