"""NCCL's pipelining physics for the flow-level collectives: link derating, protocol wire bytes,
channels (one CTA, so one SM, each) and a chunk-by-chunk reference of one ring channel.

Sources (NVIDIA/nccl, ``src/include/device.h``, ``src/init.cc``, ``src/graph/search.cc``):

* ``NCCL_STEPS 8`` FIFO slots per connection; the Simple protocol's buffer ``DEFAULT_BUFFSIZE
  (1 << 22)`` = 4 MiB, so one step (slot) moves ``4 MiB / 8`` = 512 KiB (:data:`STEP_BYTES`).
* LL: ``union ncclLLFifoLine { uint32_t data1, flag1, data2, flag2; }``, 8 data bytes per 16-byte
  line, so LL puts 2 bytes on the wire per payload byte; LL128: ``NCCL_LL128_LINESIZE 128`` with
  ``NCCL_LL128_DATAELEMS = LINEELEMS - 1`` (15 of 16 uint64), 128 wire bytes per 120 payload bytes.
* A collective kernel runs one CTA per channel, and a CTA occupies an SM for the kernel's life:
  the channel counts are the Hopper ones of :class:`~simcore.collectives.constants.NcclConstants`
  (``ring_channels`` 16: "16 coll channels ... 16 p2p channels" on an 8-GPU Hopper node,
  NVIDIA/nccl#892; NVLS one channel per local rank up to ``NVLS_NCHANNELS_SM90`` = 16).

Rendering: a ring or tree channel is a pipeline over its edges with finite slots, so every edge moves
at the rate of the slowest link; the network runs it as one flow over all its links
(:meth:`simcore.network.flownet.FlowNetwork.transfer_chains`). :func:`ring_channel_reference` simulates one
channel chunk by chunk; the test suite checks the fluid chain equals it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from simcore.collectives.constants import NcclConstants

__all__ = ["NCCL_STEPS", "BUFFSIZE_BYTES", "STEP_BYTES", "WIRE_FACTOR", "nccl_link_efficiency",
           "kernel_channels", "ring_channel_reference"]

NCCL_STEPS = 8
BUFFSIZE_BYTES = 1 << 22
STEP_BYTES = BUFFSIZE_BYTES // NCCL_STEPS

#: Wire bytes per payload byte by protocol (flags travel with the data).
WIRE_FACTOR = {"ll": 16.0 / 8.0, "ll128": 128.0 / 120.0, "simple": 1.0}

_NETWORK_KINDS = frozenset({"nic", "leaf", "spine"})


def nccl_link_efficiency(graph, constants: NcclConstants, fabric=None) -> Callable[[str, str, dict], float]:
    """Per-link derating for :class:`~simcore.network.flownet.FlowNetwork`: a link that touches a NIC or an
    InfiniBand switch carries ``nic_efficiency`` of its rate (NDR: 46-48 of 50 GB/s), any other
    (NVLink: GPU <-> NVSwitch, GPU <-> GPU) ``nvlink_efficiency`` (what NCCL's ring channels reach
    on H100). The same fractions are the proxy's bandwidths, so an idle link-bound collective takes
    its analytic time, and k of them on one link take k times as long. ``fabric``
    (:class:`~simcore.collectives.constants.Fabric`) selects the fabric's constants where they differ."""
    if fabric is not None and hasattr(constants, "for_fabric"):  # the scale-out network's NIC efficiency
        constants = constants.for_fabric(fabric)
    kinds = dict(graph.nodes(data="kind"))
    nvl, nic = constants.nvlink_efficiency, constants.nic_efficiency

    def efficiency(u: str, v: str, _data: dict) -> float:
        return nic if kinds.get(u) in _NETWORK_KINDS or kinds.get(v) in _NETWORK_KINDS else nvl

    return efficiency


def kernel_channels(algorithm: str, ranks_per_domain: int, constants: NcclConstants) -> int:
    """CTAs (so SMs) the kernel of one collective holds while it runs: NVLS one channel per local
    rank (up to ``nvls_max_channels``), every other algorithm ``ring_channels`` (rings, trees and
    NCCL's p2p channels alike on Hopper)."""
    if algorithm in ("nvls", "nvls_tree"):
        return int(min(max(ranks_per_domain, 1), constants.nvls_max_channels))
    return int(constants.ring_channels)


def ring_channel_reference(rates_bytes_per_s: Sequence[float], bytes_per_rank: float,
                           chunk_bytes: float = STEP_BYTES, slots: int = NCCL_STEPS) -> float:
    """Time (s) of one ring all-gather channel simulated chunk by chunk.

    Rank ``r`` sends to ``r + 1`` over a link of rate ``rates_bytes_per_s[r]``. Each rank's
    ``bytes_per_rank`` is cut into chunks; chunk ``j`` of every rank makes ``n - 1`` hops in steps
    (NCCL's loop: step ``s`` forwards what arrived at step ``s - 1``). A link sends unit ``k`` (chunk
    ``k // (n-1)``, step ``k % (n-1)``) once it sent unit ``k - 1``, the unit arrived from upstream
    (steps >= 1), and the receiver freed the slot of unit ``k - slots`` (forwarded it on, or consumed
    it at the last step). Latency 0: the pure pipeline.
    """
    rates = np.asarray(rates_bytes_per_s, dtype=float)
    n = len(rates)
    if n < 2 or np.any(rates <= 0) or bytes_per_rank <= 0 or chunk_bytes <= 0 or slots < 2:
        raise ValueError("ring_channel_reference: needs >= 2 positive rates and positive sizes")
    chunks = int(np.ceil(bytes_per_rank / chunk_bytes))
    last = bytes_per_rank - (chunks - 1) * chunk_bytes
    units = chunks * (n - 1)
    end = np.zeros((units, n))  # end[k, r]: link r finished sending unit k
    up = np.roll(np.arange(n), 1)  # the link that feeds rank r's outgoing link
    down = np.roll(np.arange(n), -1)
    for k in range(units):
        size = last if k // (n - 1) == chunks - 1 else chunk_bytes
        ready = end[k - 1] if k else np.zeros(n)
        if k % (n - 1):
            ready = np.maximum(ready, end[k - 1, up])
        if k >= slots:  # slot of unit k - slots at the receiver: freed when it forwarded it
            j = k - slots
            freed = end[j + 1, down] if (j % (n - 1)) < n - 2 and j + 1 < k else end[j]
            ready = np.maximum(ready, freed)
        end[k] = ready + size / rates
    return float(end[-1].max())
