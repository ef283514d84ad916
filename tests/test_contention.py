"""Contention from physics: derated links, pipelined ring/tree channels, protocol wire bytes, ECMP per
channel and adaptive routing, and SM sharing between NCCL kernels and compute (hand-computable)."""

from __future__ import annotations

import networkx as nx
import pytest
import simpy

from simcore.collectives import DEFAULT, Fabric
from simcore.collectives.cost import entry_costs
from simcore.collectives.flows import run_collective, simulate_collective
from simcore.collectives.pipeline import STEP_BYTES, WIRE_FACTOR, kernel_channels, ring_channel_reference
from simcore.engine.executor import Executor
from simcore.engine.program import Op, StageProgram
from simcore.hardware.gpus import get_gpu
from simcore.network.flownet import FlowNetwork
from topologies import build_topology, ib_fattree

FAB = Fabric.from_gpu(get_gpu("h100-sxm"))
HGX = build_topology("hgx-h100")
EIGHT = [f"gpu{i}" for i in range(8)]
MIB = 2**20


def _pieces(coll, size, algo, proto, n=8, p=8):
    ((_, _, cost),) = entry_costs(coll, size, n, p, FAB, algo, proto, DEFAULT)
    return float(cost.latency_s + cost.extra_latency_s), float(cost.bandwidth_s + cost.fill_s)


# ------------------------------------------------------------------ k collectives take k times one
@pytest.mark.parametrize(("coll", "size"), [("all_gather", 256 * MIB), ("all_reduce", 1024 * MIB),
                                            ("reduce_scatter", 64 * MIB)])
@pytest.mark.parametrize("k", [2, 3])
def test_k_identical_ring_collectives_on_one_bottleneck_take_k_times_one(coll, size, k):
    latency, bandwidth = _pieces(coll, size, "ring", "simple")
    one = simulate_collective(HGX, coll, size, EIGHT, "ring", "simple")
    many = simulate_collective(HGX, coll, size, EIGHT, "ring", "simple", concurrent_groups=[EIGHT] * (k - 1))
    assert one == pytest.approx(latency + bandwidth, rel=1e-6)  # the calibrated time, alone
    assert many == pytest.approx(latency + k * bandwidth, rel=1e-6)  # the link is shared k ways
    assert (many - latency) / (one - latency) == pytest.approx(k, rel=0.05)


def test_two_1gib_all_gathers_take_twice_one_within_5_percent():
    one = simulate_collective(HGX, "all_gather", 2.0**30, EIGHT, "ring", "simple")
    two = simulate_collective(HGX, "all_gather", 2.0**30, EIGHT, "ring", "simple", concurrent_groups=[EIGHT])
    assert two / one == pytest.approx(2.0, rel=0.05)


def test_ll_is_sm_bound_so_two_share_the_link_less_than_twice():
    """Ring LL on 8 GPUs runs at llMaxBw = 141 GB/s (its kernel's ceiling), 282 GB/s of wire bytes: two
    need 564 of the link's 359 GB/s, so each gets 179.4 GB/s of wire (89.7 of payload): 1.57x slower."""
    size = 64 * MIB
    latency, bandwidth = _pieces("all_gather", size, "ring", "ll")
    two = simulate_collective(HGX, "all_gather", size, EIGHT, "ring", "ll", concurrent_groups=[EIGHT])
    link = DEFAULT.nvlink_efficiency * 450e9
    assert two == pytest.approx(latency + bandwidth * 141e9 / (link / 2 / WIRE_FACTOR["ll"]), rel=1e-6)


# --------------------------------------------------------------------------- protocol wire bytes
@pytest.mark.parametrize("proto", ["ll", "ll128", "simple"])
def test_links_carry_the_protocols_wire_bytes(proto):
    env = simpy.Environment()
    net = FlowNetwork(env, HGX)
    size = 8 * MIB
    env.run(until=run_collective(env, net, "all_gather", size, EIGHT, "ring", proto))
    carried = net.link_bytes[("gpu0", "nvswitch0")]
    assert carried == pytest.approx(7 / 8 * size * WIRE_FACTOR[proto], rel=1e-9)
    assert net.capacity[("gpu0", "nvswitch0")] == pytest.approx(DEFAULT.nvlink_efficiency * 450e9)


# ---------------------------------------------------------- pipelined channels: the slowest link rules
def _ring_graph(rates):
    """GPUs in a directed ring, gpu i -> gpu i+1 at ``rates[i]`` bytes/s, no latency."""
    g = nx.DiGraph()
    n = len(rates)
    for i, r in enumerate(rates):
        g.add_node(f"gpu{i}", kind="gpu")
        g.add_edge(f"gpu{i}", f"gpu{(i + 1) % n}", bandwidth_bytes_per_s=r, latency_s=0.0)
    return g


@pytest.mark.parametrize("slow", [None, 3])
def test_chain_flow_equals_chunk_by_chunk_ring_reference(slow):
    rates = [20e9] * 8
    if slow is not None:
        rates[slow] = 5e9
    per_rank = 96 * MIB  # one channel's share of each rank's data, NCCL's 512 KiB steps
    env = simpy.Environment()
    net = FlowNetwork(env, _ring_graph(rates))
    legs = [(f"gpu{i}", f"gpu{(i + 1) % 8}") for i in range(8)]
    done = net.transfer_chains([legs], 7 * per_rank)
    env.run(until=done)
    reference = ring_channel_reference(rates, per_rank, STEP_BYTES)
    assert done.value == pytest.approx(reference, rel=0.01)
    assert done.value == pytest.approx(7 * per_rank / min(rates), rel=1e-9)


def test_reference_pipeline_is_bounded_by_its_slowest_link_and_slots():
    fast, slow = [10e9] * 4, [10e9, 10e9, 2e9, 10e9]
    assert ring_channel_reference(fast, 8 * MIB) == pytest.approx(3 * 8 * MIB / 10e9, rel=1e-9)
    assert ring_channel_reference(slow, 8 * MIB) == pytest.approx(3 * 8 * MIB / 2e9, rel=0.02)
    with pytest.raises(ValueError, match="positive"):
        ring_channel_reference([1e9], 1.0)


def test_one_shared_link_slows_every_edge_of_the_ring():
    """A 4-GPU ring chain and a competing flow on gpu0 -> switch: the ring moves at half the link on
    every edge, so gpu1's uplink runs half empty and the ring ends when the shared link says."""
    g = nx.DiGraph()
    g.add_node("sw", kind="nvswitch")
    for i in range(4):
        g.add_node(f"gpu{i}", kind="gpu")
        for u, v in ((f"gpu{i}", "sw"), ("sw", f"gpu{i}")):
            g.add_edge(u, v, bandwidth_bytes_per_s=1e9, latency_s=0.0)
    env = simpy.Environment()
    net = FlowNetwork(env, g, record=True)
    ring = net.transfer_chains([[(f"gpu{i}", f"gpu{(i + 1) % 4}") for i in range(4)]], 1e9)
    other = net.transfer("gpu0", "gpu2", 1e9)
    env.run(until=env.all_of([ring, other]))
    assert ring.value == pytest.approx(2.0) and other.value == pytest.approx(2.0)
    assert net.utilization()[("gpu1", "sw")][0] == (0.0, 0.5)


# ------------------------------------------------------------------------------------ routing
def test_channels_of_one_rail_hash_onto_different_spines():
    g = ib_fattree(2, nodes_per_leaf=1, spines=8)
    env = simpy.Environment()
    net = FlowNetwork(env, g)
    env.run(until=run_collective(env, net, "all_gather", 256 * MIB, [f"gpu{i}" for i in range(16)], "ring",
                                 "simple"))
    spines = {v for (u, v) in net.link_bytes if g.nodes[v]["kind"] == "spine"}
    assert len(spines) > 1  # channel c and c + 8 cross on the same rail, each on its own hash


def test_adaptive_routing_spreads_flows_that_ecmp_may_stack():
    g = ib_fattree(2, nodes_per_leaf=1, spines=2)
    pairs = [(f"gpu{i}", f"gpu{8 + i}") for i in range(8)]
    env = simpy.Environment()
    net = FlowNetwork(env, g, routing="adaptive")
    done = net.transfer_group(pairs, 1e9)
    env.run(until=done)
    ups = [net.link_bytes[("leaf0", f"spine{s}")] for s in range(2)]
    assert ups == pytest.approx([4e9, 4e9])  # four flows per uplink, least loaded first
    assert done.value == pytest.approx(1e9 / 50e9 + net.path_latency("gpu0", "gpu8"), rel=1e-6)
    with pytest.raises(ValueError, match="routing"):
        FlowNetwork(env, g, routing="random")


def test_routing_study_adaptive_balances_uplinks_and_reaches_the_idle_time():
    """A 1 GiB ring all-gather over 64 GPUs on a 2:1 fat tree: adaptive routing spreads the 16 channels
    crossing each leaf evenly over its 4 spines, so the ring is never uplink-bound and takes its
    analytic time; ECMP's hash stacks channels on some uplink for some seeds."""
    from simcore.collectives import collective_time_s
    from validation.studies.collectives.network_routing import run_workload

    g = ib_fattree(8, oversubscription=2.0, nodes_per_leaf=2)
    adaptive = run_workload(g, "ring_allgather", "adaptive")
    assert adaptive["imbalance"] == pytest.approx(1.0)
    idle = float(collective_time_s("all_gather", 1024 * MIB, 64, 8, FAB, "ring", "simple"))
    assert adaptive["time_s"] == pytest.approx(idle, rel=1e-6)
    ecmp = [run_workload(g, "ring_allgather", "ecmp", seed)["time_s"] for seed in range(3)]
    assert min(ecmp) >= adaptive["time_s"] * (1 - 1e-9) and max(ecmp) > adaptive["time_s"] * 1.05


# --------------------------------------------------------------------------------- SM sharing
class _HalfTheSms:
    """Comm stub: ops take their duration; a collective holds 66 of 132 SMs."""

    num_sms = 132

    def kernel_sms(self, stage, op):
        return 66

    def run(self, env, stage, op):
        yield env.timeout(op.duration_s)


def test_compute_overlapping_a_collective_runs_at_the_sms_left():
    """Two microbatches of [compute 1 s, collective 0.5 s]: microbatch 1 computes while microbatch 0's
    collective holds half the SMs (0.5 s of wall = 0.25 s of work), then at full speed: 1 + 0.5 + 0.75
    = 2.25 s, and its collective ends at 2.75 s (2.5 s without SM sharing)."""
    ops = [Op("gemm", "gemm", 0, False, 1.0), Op("ar", "ar", 0, True, 0.5, "all_reduce", "tp", 1e6)]
    env = simpy.Environment()
    ex = Executor(env, [StageProgram(0, ops)], _HalfTheSms(), overlap=True)
    finish = ex.run_pipeline(2, 1)
    assert finish[0] == pytest.approx([1.5, 2.75])
    gemm1 = [i for i in ex.intervals if i.microbatch == 1 and i.stream == "compute"]
    assert sum(i.end - i.start for i in gemm1) == pytest.approx(1.25)


def test_kernel_channels_follow_nccl():
    assert kernel_channels("ring", 8, DEFAULT) == 16 and kernel_channels("nvls", 4, DEFAULT) == 4
    assert kernel_channels("nvls", 72, DEFAULT) == 16
