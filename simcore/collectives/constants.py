"""NCCL's tuning constants (Hopper values) plus the few physical parameters we calibrate, and the fabric.

Everything is SI (seconds, bytes, bytes/s). The NCCL numbers are copied from ``src/graph/tuning.cc``,
``topo.h`` and ``search.cc`` as summarised in ``shared/reference/simulators.md`` section 3; tuples
indexed by protocol are ordered ``(ll, ll128, simple)`` and tuples indexed by node count are ordered
``(1 node, 2 nodes, 3+ nodes)`` exactly as NCCL's tables are. The calibrated fields at the end are fitted
by ``python -m validation.studies.collectives.fit`` on ``validation/data/collectives_calibration.csv``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from simcore.hardware.gpus import GpuSpec, get_gpu

__all__ = ["COLLECTIVES", "ALGORITHMS", "PROTOCOLS", "ALGORITHMS_BY_COLLECTIVE", "FABRICS", "ARCHITECTURES",
           "NcclConstants", "Fabric", "DEFAULT", "check_fabric"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "hierarchical", "direct", "pairwise")
PROTOCOLS = ("ll", "ll128", "simple")

#: Which algorithms apply to which collective. ``ring``/``tree``/``nvls``/``nvls_tree`` are NCCL's own
#: (NCCL allows NVLS for all-gather/reduce-scatter, tree and NVLSTree only for all-reduce);
#: ``hierarchical`` is the explicit 3-phase intra/inter/intra schedule (never chosen by ``auto``, NCCL
#: has no such algorithm); all-to-all is NCCL's grouped send/recv, ``direct`` (all peers at once) or
#: ``pairwise`` (n-1 steps, one peer each); send/recv is one ``direct`` path.
ALGORITHMS_BY_COLLECTIVE: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "nvls", "nvls_tree", "hierarchical"),
    "all_gather": ("ring", "nvls", "hierarchical"),
    "reduce_scatter": ("ring", "nvls", "hierarchical"),
    "all_to_all": ("direct", "pairwise"),
    "send_recv": ("direct",),
}

#: Scale-out networks with their own calibrated NIC efficiency and inter-node latency (see ``Fabric``):
#: ``ib`` InfiniBand NDR (ConnectX-7, 400 Gb/s per GPU; DGX H100 user guide), ``efa`` AWS Elastic Fabric
#: Adapter (p5.48xlarge: 32 x 100 Gb/s EFAv2 = 3200 Gb/s per instance, i.e. 4 x 100 Gb/s = 400 Gb/s per GPU,
#: SRD transport through the aws-ofi-nccl plugin; p5en: 16 x 200 Gb/s EFAv3, the same 400 Gb/s per GPU),
#: ``roce`` RDMA over Converged Ethernet (ConnectX-7 / BlueField-3 400 GbE per GPU, e.g. Spectrum-X).
#: All three give one 400 Gb/s (50e9 B/s) port per GPU on H100 nodes, so the NIC rate stays the GPU's
#: (``GpuSpec.nic_bandwidth_bytes_per_s``); they differ in what NCCL reaches and in per-message latency.
FABRICS = ("ib", "efa", "roce")
#: NCCL's compute-capability rows of its tuning tables that the catalog GPUs fall in.
ARCHITECTURES = ("hopper", "blackwell")

_US = 1e-6
_GB = 1e9


def _us(*values: float) -> tuple[float, ...]:
    return tuple(v * _US for v in values)


def _gbps(*values: float) -> tuple[float, ...]:
    return tuple(v * _GB for v in values)


# NCCL treeCorrectionFactor[proto][log2(bytes/64)], 64 B .. 512 MiB (cost_model.cc).
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)


@dataclass(frozen=True)
class NcclConstants:
    """NCCL's latency/bandwidth model constants (Hopper) and our calibrated physical parameters.

    Latency fields are seconds, bandwidth fields bytes/s, factors dimensionless.
    """

    # ---- latencies (tuning.cc baseLat / hwLat), per protocol (ll, ll128, simple) ----
    ring_base_latency_s: tuple[float, ...] = _us(6.6, 14.0, 8.4)   # Ring baseLat; also p2p (a2a, send/recv)
    tree_base_latency_s: tuple[float, ...] = _us(6.8, 14.0, 8.4)   # Tree baseLat
    ring_nvlink_hop_latency_s: tuple[float, ...] = _us(0.6, 1.9, 3.4)  # Ring hwLat[NVLINK], per step
    tree_nvlink_hop_latency_s: tuple[float, ...] = _us(0.6, 1.25, 4.0)  # Tree hwLat[NVLINK], per level
    ring_net_hop_latency_s: tuple[float, ...] = _us(2.7, 4.0, 14.0)  # Ring hwLat[NET], per inter step
    tree_net_hop_latency_s: tuple[float, ...] = _us(5.0, 8.5, 14.0)  # Tree hwLat[NET]; Ring's at 1 GPU/node
    nvls_nvlink_latency_s: float = 25.0 * _US       # NVLS hwLat[NVLINK] (Simple); replaces the base
    nvls_net_latency_s: float = 18.0 * _US          # NVLS hwLat[NET] (multi-node NVLS, needs CollNet)
    nvls_tree_nvlink_latency_s: float = 25.0 * _US  # NVLSTree hwLat[NVLINK]
    nvls_tree_net_latency_s: float = 20.9 * _US     # NVLSTree hwLat[NET], per tree level
    net_overhead_s: float = 1.0 * _US               # getNetOverhead (Intel/default CPU); x3 for Simple
    net_latency_s: float = 1.278 * _US              # latencyInter (InfiniBand); 2x for Simple; prior 0
    efa_net_latency_s: float = 22.77 * _US          # EFA; prior 20 us = NET_LATENCY of aws-ofi-nccl's tuner
    roce_net_latency_s: float = 1.278 * _US         # RoCE: InfiniBand's (no RoCE row < 1 MiB in the fit set)
    # Bytes per NIC that do not overlap with the rest of a multi-node collective: the network pipeline's
    # fill (proxy hand-off, chunks in flight before the steady state). Its time at the NIC's achieved
    # rate, T = F / (nic_efficiency x NIC rate), is added to every entry that crosses NVLink domains as a
    # smooth min(bandwidth term, T); it carries the measured rise of multi-node busbw from 16 MiB to ~1 GiB.
    # A time per NIC, not a share of the collective's size: the same bytes in flight whatever the
    # collective or node count (a share of S, the earlier form, fitted on all-reduce rows, priced EFA
    # all-to-all at 2-8 nodes 12-18% too slow). Per fabric like the two above; fitted on multi-node rows >= 1 MiB.
    net_fill_bytes: float = 8.18e6
    efa_net_fill_bytes: float = 24.43e6
    roce_net_fill_bytes: float = 8.18e6              # InfiniBand's (the RoCE fit rows have one size each)
    ring_plateau_factor: float = 1.4                # multi-node Ring/Simple all-reduce latency x1.4 (sm80+)
    ring_plateau_min_bytes: float = 64.0            # ... once bytes / (channels x ranks) reaches this
    # ---- bandwidth refinements (tuning.cc) ----
    ll_bw_factor: float = 0.5                       # Ring LL: busBw x 0.5 ...
    ll_max_bw: tuple[float, ...] = _gbps(141.0, 39.0, 20.4)  # ... capped by llMaxBw (1 node Hopper; Intel)
    ll128_bw_factor: float = 0.92                   # Ring LL128: busBw x 0.92 ...
    ll128_bw_factor_one_gpu_per_node: float = 0.7  # ... x 0.7 when ppn < 2
    ring_ll128_channel_max_bw: float = 36.7 * _GB   # ... capped by nChannels x 36.7 GB/s
    tree_bw_factor: float = 0.92                    # Tree: busBw x 0.92 ...
    tree_channel_max_bw: tuple[float, ...] = _gbps(38.7, 41.4, 36.0)  # ... capped by nCh x perChMaxTreeBw
    tree_ll_bw_divisor: float = 3.8                 # Tree LL: busBw / 3.8, capped by llMaxBw
    tree_ll128_bw_factor: tuple[float, float] = (7.0 / 9.0, 120.0 / 128.0)  # Tree LL128 (1 node, multi)
    tree_ll128_channel_max_bw: tuple[float, ...] = _gbps(36.7, 36.7, 29.0)  # perChMaxTreeLL128Bw
    # treeCorrectionFactor[proto][log2(bytes / 64)], applied to tree all-reduce bandwidth
    tree_correction: tuple[tuple[float, ...], ...] = _TREE_CORRECTION
    nvls_efficiency: float = 0.85                   # nvlsEfficiency, Hopper (Blackwell 0.74)
    nvls_tree_channel_max_bw: tuple[float, ...] = _gbps(0.0, 57.7, 45.5)  # perChMaxNVLSTreeBw (2 / 3+ nodes)
    # ---- channel counts (topology search, search.cc / nvls.cc) ----
    ring_channels: int = 16                         # ring/tree channels on an HGX H100 node
    nvls_max_channels: int = 16                     # NVLS_NCHANNELS_SM90 (one channel per local rank)
    nvls_max_arity: int = 32                        # NCCL_MAX_NVLS_ARITY: NVLS all-gather/reduce-scatter
    max_channel_bw_intra: float = 60.0 * _GB        # fastest per-channel speed NCCL's sm90 search tries
    # ---- calibrated physical parameters: fitted by `python -m validation.studies.collectives.fit` ----
    # on the fit set validation/data/collectives_calibration.csv (450 rows, split=fit; the NVLink terms on
    # its 298 single-node rows: bandwidth terms on those >= 1 GiB, the NVLS fill on those >= 1 MiB, each
    # row charged its measuring harness's per-call overhead; the fabric terms below on its 152 multi-node
    # rows).
    # Fraction of the per-direction NVLink rate a set of ring channels reaches (0.797 x 450 = 359 GB/s;
    # NCCL itself assumes 20.6 GB/s x 18 links = 370.8 GB/s = 0.824). Blackwell keeps this Hopper fit (no
    # Blackwell row in the fit set): 0.797 x 900 = 717 GB/s, where NCCL assumes 40.1 x 18 = 722 GB/s.
    nvlink_efficiency: float = 0.7973
    # Per scale-out fabric (``Fabric.scale_out``): the fraction of the NIC line rate NCCL reaches, the
    # network latency added per inter-node hop (NCCL's ``latencyInter``, twice for Simple) and the network
    # pipeline fill below. Fitted by ``python -m validation.studies.collectives.fit`` on the multi-node rows of the
    # fit set (validation/data/collectives_calibration.csv, split=fit): efficiency and fill on rows >= 1 MiB,
    # latency on nccl-tests rows < 1 MiB. The plain fields are InfiniBand's: 106 rows of NVIDIA/nccl-tests
    # issue 309 (2, 4, 8 HGX H100 nodes); 0.840 is below the 0.92-0.96 NCCL's maintainers expect of NDR
    # because one of the two clusters there reaches 320 GB/s busbw at 4-8 nodes where the other reaches 365.
    # EFA: 44 rows (p5.48xlarge all_reduce at 2-16 nodes, p5en at 4 nodes, 2-node p5 latencies). RoCE: 2
    # rows (NVIDIA/nccl issue 2409, 2 nodes, after the poster's fix): too few for a latency or a fill, so
    # those are InfiniBand's (same ConnectX-7 NICs and NCCL IB verbs transport); its efficiency is 0.978
    # (its 1 GiB send/recv reached 48.4 of 50 GB/s and also pays InfiniBand's fill).
    nic_efficiency: float = 0.8403
    efa_nic_efficiency: float = 0.8472
    roce_nic_efficiency: float = 0.9776
    # What a serving runtime adds to each collective beyond NCCL's own latency (launch, enqueue, the
    # framework's call): the same kind of cost as a measuring harness's per-call overhead
    # (validation/studies/collectives/harness.py), but no harness in the collectives data is a serving runtime, so
    # fit_collectives cannot see it (each of its rows is charged its own harness's cost instead, and
    # nccl-tests' base is a prior, 0). Fitted with the host time per step (GpuSpec.iteration_overhead_s)
    # by `python -m validation.studies.inference.fit` on the fit rows of validation/data/inference_calibration.csv
    # (TensorRT-LLM C++ benchmarks), searched between nccl-tests' 0 and eager torch.distributed's 22.24 us:
    # it lands on that bound (median |error| 7.0%; 18 us: 7.4%, 0 us: 9.9%), so these rows' tensor-parallel
    # collectives cost more than NCCL's latency plus any harness's call; the surface is flat above 12 us.
    launch_overhead_s: float = 22.24 * _US
    # Un-overlapped steps added to the bandwidth term of one ring pass (pipeline fill and drain), for
    # passes that copy (all-gather) and that reduce (reduce-scatter); all-reduce has one of each. They
    # carry the measured fall of ring busbw at 2 and 4 GPUs (XLA table; nccl-tests at 8 GPUs shows less).
    ring_fill_steps_copy: float = 0.2371
    ring_fill_steps_reduce: float = 0.6682
    # Bytes of an NVLS all-reduce whose reduce (multimem ld_reduce) and multicast-store phases do not
    # overlap: min(S, this) / algBw is added. Carries the measured dip of NVLS busbw at 2-64 MiB (XLA,
    # torch and nccl-tests alike: ~25% below latency + S / bandwidth at 8-32 MiB), ~42 us at most.
    nvls_fill_bytes: float = 11.42e6

    def __post_init__(self) -> None:
        for name in ("nvlink_efficiency", "nic_efficiency", "efa_nic_efficiency", "roce_nic_efficiency",
                     "nvls_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"NcclConstants.{name} must be in (0, 1], got {value!r}")
        for name in ("launch_overhead_s", "net_overhead_s", "net_latency_s", "efa_net_latency_s",
                     "roce_net_latency_s", "net_fill_bytes", "efa_net_fill_bytes", "roce_net_fill_bytes",
                     "ring_fill_steps_copy",
                     "ring_fill_steps_reduce", "nvls_fill_bytes"):
            value = getattr(self, name)
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"NcclConstants.{name} must be finite and >= 0, got {value!r}")
        for name in ("ring_channels", "nvls_max_channels", "nvls_max_arity"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"NcclConstants.{name} must be a positive int, got {value!r}")

    def with_overrides(self, **changes: object) -> NcclConstants:
        """A copy with some fields replaced; unknown names raise ``ValueError``."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown NcclConstants field(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def for_fabric(self, fabric: Fabric) -> NcclConstants:
        """The constants NCCL uses on ``fabric``: its scale-out network's NIC efficiency, latency and
        fill in the plain ``nic_efficiency`` / ``net_latency_s`` / ``net_fill_bytes`` fields, and NCCL's Blackwell (sm100) rows
        on a Blackwell GPU. InfiniBand on Hopper returns ``self`` unchanged (no copy)."""
        if fabric.scale_out == "ib" and fabric.arch == "hopper":
            return self
        return _for_fabric(self, fabric.scale_out, fabric.arch)


# NCCL's Blackwell (sm100) rows where they differ from Hopper's: tuning.cc ncclTunerConstantsDefaults
# (NCCL v2.28.7, lines 169-198: llMaxBws, perChMax{RingLL128,TreeLL128,Tree,NVLSTree}Bws), src/tuning/
# nvls.cc (nvlsEfficiency 0.74), search.cc (sm100SpeedArrayIntra tops at 90 GB/s per channel) and
# nvls.cc (NVLS_NCHANNELS_SM100 32, 24 inside one NVL72 domain: NVLS_NCHANNELS_SM100_NVL). Read through
# two mirrors of those files, not the NVIDIA tree itself. Multi-node LL caps stay as NCCL indexes them,
# by CPU vendor. Latencies (baseLat, hwLat) are not indexed by architecture in NCCL: Hopper's apply.
_BLACKWELL = {
    "ll_max_bw": _gbps(282.0, 39.0, 20.4),
    "ring_ll128_channel_max_bw": 40.0 * _GB,
    "tree_channel_max_bw": _gbps(70.0, 42.8, 24.0),
    "tree_ll128_channel_max_bw": _gbps(55.6, 31.67, 20.0),
    "nvls_tree_channel_max_bw": _gbps(0.0, 96.0, 80.0),
    "nvls_efficiency": 0.74,
    "nvls_max_channels": 24,
    "max_channel_bw_intra": 90.0 * _GB,
}


@functools.lru_cache(maxsize=64)
def _for_fabric(c: NcclConstants, scale_out: str, arch: str) -> NcclConstants:
    # cached: the flow simulator and the vectorized proxy ask for the same few (constants, fabric) pairs
    # many times, and a dataclass copy with validation costs ~20 us
    changes: dict[str, object] = dict(_BLACKWELL) if arch == "blackwell" else {}
    if scale_out != "ib":
        changes.update(nic_efficiency=getattr(c, f"{scale_out}_nic_efficiency"),
                       net_latency_s=getattr(c, f"{scale_out}_net_latency_s"),
                       net_fill_bytes=getattr(c, f"{scale_out}_net_fill_bytes"))
    return dataclasses.replace(c, **changes)


def check_fabric(name: str) -> str:
    """``name`` if it is a known scale-out fabric; ``ValueError`` naming the choices otherwise."""
    if name not in FABRICS:
        raise ValueError(f"unknown fabric {name!r}; choose one of: {', '.join(FABRICS)}")
    return name


DEFAULT = NcclConstants()


@dataclass(frozen=True)
class Fabric:
    """What a communicator's GPUs are connected by; bandwidths per GPU per direction (bytes/s).

    ``scale_out`` is the network between NVLink domains (one of :data:`FABRICS`), ``arch`` the GPU's row
    of NCCL's tuning tables (one of :data:`ARCHITECTURES`); :meth:`NcclConstants.for_fabric` turns both
    into the constants NCCL uses.
    """

    nvlink_bandwidth_bytes_per_s: float
    nic_bandwidth_bytes_per_s: float
    nvlink_domain_size: int
    nvls: bool = True  # NVSwitch SHARP (multicast/in-switch reduction) available
    scale_out: str = "ib"
    arch: str = "hopper"

    def __post_init__(self) -> None:
        for name in ("nvlink_bandwidth_bytes_per_s", "nic_bandwidth_bytes_per_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"Fabric.{name} must be positive and finite, got {value!r}")
        if not (isinstance(self.nvlink_domain_size, int) and self.nvlink_domain_size >= 1):
            raise ValueError(f"Fabric.nvlink_domain_size must be a positive int, got "
                             f"{self.nvlink_domain_size!r}")
        if self.scale_out not in FABRICS:
            raise ValueError(f"Fabric.scale_out: unknown fabric {self.scale_out!r}; choose one of: "
                             f"{', '.join(FABRICS)}")
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"Fabric.arch must be one of {', '.join(ARCHITECTURES)}, got {self.arch!r}")

    @classmethod
    def from_gpu(cls, gpu: GpuSpec, nvlink_domain_size: int | None = None, scale_out: str = "ib") -> Fabric:
        """The fabric of HGX-style nodes of ``gpu`` (domain = ``gpu.gpus_per_node`` unless given)."""
        domain = gpu.gpus_per_node if nvlink_domain_size is None else int(nvlink_domain_size)
        return cls(gpu.nvlink_bandwidth_bytes_per_s, gpu.nic_bandwidth_bytes_per_s, domain,
                   scale_out=scale_out, arch=gpu.arch)

    @classmethod
    def from_topology(cls, graph) -> Fabric:
        """The fabric a topology graph describes (see :mod:`simcore.network.cluster_graph`).

        Reads graph attributes ``gpu`` (catalog name), ``nvlink_domain_size`` and, when present,
        ``nvlink_bandwidth_bytes_per_s`` / ``nic_bandwidth_bytes_per_s`` / ``nvls``; otherwise the
        rates of a GPU's links to its ``nvswitch`` and ``nic`` neighbours, then the GPU spec. The
        scale-out network is graph attribute ``fabric`` (``ib`` when absent).
        """
        attrs = graph.graph
        gpu = get_gpu(attrs["gpu"])
        nvlink, nic = _link_rates(graph)
        nvlink = attrs.get("nvlink_bandwidth_bytes_per_s", nvlink or gpu.nvlink_bandwidth_bytes_per_s)
        nic = attrs.get("nic_bandwidth_bytes_per_s", nic or gpu.nic_bandwidth_bytes_per_s)
        return cls(float(nvlink), float(nic), int(attrs.get("nvlink_domain_size", gpu.gpus_per_node)),
                   nvls=bool(attrs.get("nvls", True)), scale_out=str(attrs.get("fabric", "ib")), arch=gpu.arch)


def _link_rates(graph) -> tuple[float | None, float | None]:
    """(NVLink, NIC) rate of ``gpu0``'s links to an ``nvswitch`` and a ``nic`` node, if any."""
    if "gpu0" not in graph:
        return None, None
    rates: dict[str, float] = {}
    for _, v, data in graph.out_edges("gpu0", data=True):
        rates.setdefault(graph.nodes[v].get("kind", ""), float(data["bandwidth_bytes_per_s"]))
    return rates.get("nvswitch"), rates.get("nic")
