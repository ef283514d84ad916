"""Flow-level network: routing, max-min sharing, timing, accounting and the group fast path."""

from __future__ import annotations

import doctest
import math

import networkx as nx
import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.network import maxmin
from simcore.network.flownet import FlowNetwork
from simcore.network.maxmin import max_min_rates, unsettled_flows
from topologies import build_topology, gpu_nodes, ib_fattree, ib_rail
from validation.bench.network import alltoall, hierarchical_allreduce, ring_allreduce, run_case

GB = 1e9


def star(num_gpus: int, bandwidth: float = GB, latency: float = 1e-6) -> nx.DiGraph:
    """GPUs around one switch; every GPU <-> switch link has ``bandwidth`` and ``latency``."""
    g = nx.DiGraph()
    g.add_node("sw", kind="nvswitch")
    for i in range(num_gpus):
        g.add_node(f"gpu{i}", kind="gpu")
        for u, v in ((f"gpu{i}", "sw"), ("sw", f"gpu{i}")):
            g.add_edge(u, v, bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    return g


def pair(bandwidth: float = GB, latency: float = 1e-6) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(["gpu0", "gpu1"], kind="gpu")
    g.add_edge("gpu0", "gpu1", bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    g.add_edge("gpu1", "gpu0", bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    return g


def simulate(graph, starts, seed=0, record=False, grouped=False):
    """Run ``starts`` = [(t_start, src, dst, size, cap)] and return (net, completion times)."""
    env = simpy.Environment()
    net = FlowNetwork(env, graph, seed=seed, record=record)
    events = [None] * len(starts)

    def launch(i, t, src, dst, size, cap):
        yield env.timeout(t)
        events[i] = net.transfer(src, dst, size, rate_cap_bytes_per_s=cap, tag=i)

    for i, flow in enumerate(starts):
        env.process(launch(i, *flow))
    env.run()
    return net, [e.value for e in events]


# ------------------------------------------------------------------ hand-computable cases
def test_single_transfer_is_latency_plus_size_over_bandwidth():
    _, (t,) = simulate(pair(2 * GB, 3e-6), [(0.0, "gpu0", "gpu1", 1e6, math.inf)])
    assert t == pytest.approx(3e-6 + 1e6 / (2 * GB), rel=1e-12)


def test_two_flows_sharing_a_link_get_half_each():
    _, times = simulate(pair(GB, 0.0), [(0.0, "gpu0", "gpu1", 1e6, math.inf)] * 2)
    assert times == pytest.approx([2e-3, 2e-3], rel=1e-12)


def test_rates_change_on_arrival_and_departure():
    # A alone for 0.5 ms (0.5 MB left), then A and B share 0.5 GB/s: A ends at 1.5 ms;
    # B then has 0.5 MB left at full rate and ends at 2.0 ms.
    flows = [(0.0, "gpu0", "gpu1", 1e6, math.inf), (0.5e-3, "gpu0", "gpu1", 1e6, math.inf)]
    _, times = simulate(pair(GB, 0.0), flows)
    assert times == pytest.approx([1.5e-3, 2.0e-3], rel=1e-9)


def test_departure_speeds_up_the_survivor():
    # the small flow leaves at 0.2 ms (both at 0.5 GB/s); the big one then runs alone
    flows = [(0.0, "gpu0", "gpu1", 1e6, math.inf), (0.0, "gpu0", "gpu1", 1e5, math.inf)]
    _, times = simulate(pair(GB, 0.0), flows)
    assert times == pytest.approx([0.2e-3 + 0.9e6 / GB, 0.2e-3], rel=1e-9)


def test_rate_cap_below_link_rate():
    flows = [(0.0, "gpu0", "gpu1", 1e6, GB / 4), (0.0, "gpu0", "gpu1", 1.5e6, math.inf)]
    _, times = simulate(pair(GB, 1e-6), flows)
    # capped flow at 0.25 GB/s; the other gets the remaining 0.75 GB/s (max-min with a cap)
    assert times[0] == pytest.approx(1e-6 + 4e-3, rel=1e-9)
    assert times[1] == pytest.approx(1e-6 + 2e-3, rel=1e-9)


def test_path_latency_sums_links_and_routes_over_the_switch():
    env = simpy.Environment()
    net = FlowNetwork(env, star(4, latency=2e-6))
    assert net.path("gpu0", "gpu3") == [("gpu0", "sw"), ("sw", "gpu3")]
    assert net.path_latency("gpu0", "gpu3") == pytest.approx(4e-6)
    assert net.path("gpu2", "gpu2") == []


def test_zero_size_and_self_transfer_complete_immediately():
    env = simpy.Environment()
    net = FlowNetwork(env, star(2))
    events = [net.transfer("gpu0", "gpu0", 1e6), net.transfer("gpu0", "gpu1", 0),
              net.transfer_group([("gpu1", "gpu1")], 5.0), net.transfer_group([], 5.0)]
    env.run()
    assert [e.value for e in events] == [0.0] * 4
    assert net.link_bytes == {}


def test_max_min_textbook_example():
    # f0 on link0 (cap 10); f1 on links 0 and 1; f2 on link1 (cap 4): f1 = f2 = 2, f0 = 8
    rates = max_min_rates(np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), np.array([10.0, 4.0]),
                          np.full(3, np.inf))
    assert rates.tolist() == pytest.approx([8.0, 2.0, 2.0])


def test_maxmin_doctest():
    assert doctest.testmod(maxmin).failed == 0


# -------------------------------------------------------------- accounting and invariants
def ring_pairs(ranks):
    return [(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))]


def test_ring_allreduce_time_bytes_and_symmetry():
    g = build_topology("hgx-h100")
    ranks, n, size = gpu_nodes(g), 8, 2.0**30
    env = simpy.Environment()
    net = FlowNetwork(env, g, record=True)
    step_ends = []

    def ring():
        for _ in range(2 * (n - 1)):
            events = [net.transfer(a, b, size / n) for a, b in ring_pairs(ranks)]
            yield env.all_of(events)
            step_ends.append({e.value for e in events})

    env.run(env.process(ring()))
    assert all(len(ends) == 1 for ends in step_ends)  # every rank finishes each step together
    step = 0.5e-6 + size / n / 450e9
    assert env.now == pytest.approx(2 * (n - 1) * step, rel=1e-9)
    for a, _ in ring_pairs(ranks):
        assert net.link_bytes[(a, "nvswitch0")] == pytest.approx(2 * (n - 1) * size / n, rel=1e-9)


def alltoall_pairs(ranks):
    return [(a, b) for a in ranks for b in ranks if a != b]


def run_group(graph, pairs, size, seed=0, record=False, grouped=True):
    env = simpy.Environment()
    net = FlowNetwork(env, graph, seed=seed, record=record)
    if grouped:
        done = net.transfer_group(pairs, size)
        times = None
    else:
        events = [net.transfer(a, b, size) for a, b in pairs]
        done = env.all_of(events)
    env.run(done)
    if not grouped:
        times = [e.value for e in events]
    return net, env.now, times


def test_group_equals_per_flow_simulation():
    g = ib_rail(2, spines=3)  # ECMP over 3 spines: unequal rates inside the group
    pairs = alltoall_pairs(gpu_nodes(g))
    grouped, t_group, _ = run_group(g, pairs, 3e6)
    single, t_single, times = run_group(g, pairs, 3e6, grouped=False)
    assert t_group == pytest.approx(t_single, rel=1e-12)
    assert max(times) == pytest.approx(t_single, rel=1e-12)
    assert len(set(np.round(times, 15))) > 3  # rates really differ across the flows
    assert grouped.link_bytes.keys() == single.link_bytes.keys()
    for link, carried in grouped.link_bytes.items():
        assert carried == pytest.approx(single.link_bytes[link], rel=1e-9)


def test_bytes_delivered_equal_bytes_sent_and_capacity_respected():
    g = ib_rail(2, spines=3)
    pairs = alltoall_pairs(gpu_nodes(g))
    size = 2e6
    net, makespan, _ = run_group(g, pairs, size, record=True)
    expected: dict[tuple[str, str], float] = {}
    for a, b in pairs:
        for link in net.path(a, b):
            expected[link] = expected.get(link, 0.0) + size
    assert net.link_bytes.keys() == expected.keys()
    for link, carried in net.link_bytes.items():
        assert carried == pytest.approx(expected[link], rel=1e-9)
    for link, timeline in net.utilization().items():
        assert all(frac <= 1 + 1e-9 for _, frac in timeline), link
        assert [t for t, _ in timeline] == sorted(t for t, _ in timeline)
    capacity = {(u, v): d["bandwidth_bytes_per_s"] for u, v, d in g.edges(data=True)}
    assert makespan >= max(b / capacity[link] for link, b in expected.items())


def test_same_seed_same_result_and_seeds_change_ecmp():
    g = ib_rail(2, spines=4)
    pairs = alltoall_pairs(gpu_nodes(g))
    a, t_a, _ = run_group(g, pairs, 1e6, seed=7)
    b, t_b, _ = run_group(g, pairs, 1e6, seed=7)
    assert t_a == t_b and a.link_bytes == b.link_bytes
    c = FlowNetwork(simpy.Environment(), g, seed=8)
    assert any(a.path(x, y) != c.path(x, y) for x, y in pairs)
    spines = {link[1] for k in range(40) for link in a.path("gpu0", "gpu9", flow_key=k) if "spine" in link[1]}
    assert len(spines) > 1  # ECMP spreads flow keys over the spines


def test_routes_are_shortest_and_never_transit_a_gpu():
    g = ib_fattree(3, nodes_per_leaf=2)
    net = FlowNetwork(simpy.Environment(), g)
    gpus = gpu_nodes(g)
    for a, b in [("gpu0", "gpu5"), ("gpu0", "gpu9"), ("gpu3", "gpu20"), ("gpu17", "gpu1")]:
        path = net.path(a, b)
        fabric = g.subgraph([n for n in g if n not in gpus or n in (a, b)])
        assert len(path) == nx.shortest_path_length(fabric, a, b)
        assert all(v not in gpus for _, v in path[:-1])


def test_simultaneous_arrivals_share_one_rate_solve():
    env = simpy.Environment()
    net = FlowNetwork(env, star(16))
    events = [net.transfer(f"gpu{i}", f"gpu{(i + 1) % 16}", 1e6) for i in range(16)]
    env.run(env.all_of(events))
    assert net.events_processed <= 3  # one solve at arrival, one completion, one empty solve


def test_input_errors():
    env = simpy.Environment()
    net = FlowNetwork(env, star(2))
    for call, word in [(lambda: net.transfer("gpu0", "gpu1", -1.0), "size_bytes"),
                       (lambda: net.transfer("gpu0", "gpu1", 1.0, rate_cap_bytes_per_s=0.0), "rate_cap"),
                       (lambda: net.transfer("gpu0", "gpu9", 1.0), "gpu9"),
                       (lambda: FlowNetwork(env, star(2), seed=1.5), "seed")]:
        with pytest.raises(ValueError, match=word):
            call()
    with pytest.raises(RuntimeError, match="record"):
        net.utilization()
    bad = star(2)
    bad["sw"]["gpu1"]["bandwidth_bytes_per_s"] = 0.0
    with pytest.raises(ValueError, match="bandwidth"):
        FlowNetwork(env, bad)


# ---------------------------------------------------- derated links, chains, adaptive routing
def test_link_efficiency_derates_capacity_for_every_flow():
    env = simpy.Environment()
    net = FlowNetwork(env, star(2), link_efficiency=lambda u, v, data: 0.8)
    one = net.transfer("gpu0", "gpu1", 1e9)
    env.run(until=one)
    assert one.value == pytest.approx(2e-6 + 1e9 / 0.8e9)
    assert net.capacity[("gpu0", "sw")] == pytest.approx(0.8e9)
    for factor in (0.0, 1.5):
        with pytest.raises(ValueError, match="efficiency must be in"):
            FlowNetwork(env, star(2), link_efficiency=lambda u, v, d, f=factor: f)


def test_chain_crossing_a_link_twice_moves_at_half_its_rate():
    """gpu0 -> gpu1 -> gpu0 -> gpu1: the chain crosses gpu0 -> sw twice, so it carries 2 x rate there."""
    env = simpy.Environment()
    net = FlowNetwork(env, star(2, latency=0.0))
    done = net.transfer_chains([[("gpu0", "gpu1"), ("gpu1", "gpu0"), ("gpu0", "gpu1")]], 1e9)
    env.run(until=done)
    assert done.value == pytest.approx(2.0)
    assert net.link_bytes[("gpu0", "sw")] == pytest.approx(2e9)
    with pytest.raises(ValueError, match="flow_keys"):
        net.transfer_chains([[("gpu0", "gpu1")]], 1.0, flow_keys=[0, 1])


def test_chain_latency_is_its_longest_leg_and_equal_pairs_cost_nothing():
    env = simpy.Environment()
    net = FlowNetwork(env, star(3, latency=1e-6))
    done = net.transfer_chains([[("gpu0", "gpu1"), ("gpu1", "gpu2")], [("gpu2", "gpu2")]], 1e9)
    env.run(until=done)
    assert done.value == pytest.approx(2e-6 + 1.0)


def test_adaptive_routing_is_deterministic_and_releases_its_load():
    g = ib_fattree(2, nodes_per_leaf=1, spines=4)
    pairs = [(f"gpu{i}", f"gpu{8 + i}") for i in range(8)]
    used = []
    for _ in range(2):
        env = simpy.Environment()
        net = FlowNetwork(env, g, routing="adaptive")
        env.run(until=net.transfer_group(pairs, 1e8))
        env.run(until=net.transfer_group(pairs, 1e8))  # after the first finished: same spread again
        used.append(sorted(net.link_bytes.items()))
        assert not net._flows_on.any()  # every finished flow gave its load back
        spines = [v for (u, v) in net.link_bytes if u == "leaf0"]
        assert [net.link_bytes[("leaf0", s)] for s in sorted(spines)] == pytest.approx([4e8] * 4)
    assert used[0] == used[1]


# ------------------------------------------------------------------------ property tests
def reference_max_min(flows, links, capacity, caps):
    """Textbook progressive filling, one level per round, pure Python."""
    paths = [[] for _ in caps]
    for f, link in zip(flows, links, strict=True):
        paths[f].append(link)
    rate, frozen, remaining = [0.0] * len(caps), [not p for p in paths], list(capacity)
    for f, p in enumerate(paths):
        if not p:
            rate[f] = caps[f]
    while not all(frozen):
        count = [0] * len(capacity)
        for f, p in enumerate(paths):
            for link in p if not frozen[f] else ():
                count[link] += 1
        share = [remaining[k] / count[k] if count[k] else math.inf for k in range(len(capacity))]
        level = min(min(share), min(caps[f] for f in range(len(caps)) if not frozen[f]))
        for f, p in enumerate(paths):
            hit = caps[f] <= level * (1 + 1e-12) or any(share[k] <= level * (1 + 1e-12) for k in p)
            if not frozen[f] and hit:
                rate[f], frozen[f] = level, True
                for k in p:
                    remaining[k] -= level
    return np.array(rate)


@st.composite
def rate_problems(draw):
    num_links = draw(st.integers(1, 6))
    capacity = np.array(draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 7.0]), min_size=num_links,
                                      max_size=num_links)))
    path = st.lists(st.integers(0, num_links - 1), min_size=1, max_size=num_links, unique=True)
    paths = draw(st.lists(path, min_size=1, max_size=8))
    caps = np.array(draw(st.lists(st.sampled_from([math.inf, math.inf, 0.5, 1.5]), min_size=len(paths),
                                  max_size=len(paths))))
    flows = np.array([f for f, p in enumerate(paths) for _ in p])
    links = np.array([k for p in paths for k in p])
    return flows, links, capacity, caps


@settings(max_examples=200, deadline=None)
@given(rate_problems(), st.randoms(use_true_random=False))
def test_max_min_matches_reference_and_has_bottlenecks(problem, rnd):
    flows, links, capacity, caps = problem
    order = np.array(rnd.sample(range(len(flows)), len(flows)))
    rates = max_min_rates(flows[order], links[order], capacity, caps)
    assert rates == pytest.approx(reference_max_min(flows, links, capacity, caps), rel=1e-9)
    load = np.bincount(links, weights=rates[flows], minlength=len(capacity))
    assert np.all(load <= capacity * (1 + 1e-9))
    assert not unsettled_flows(flows, links, capacity, caps, rates).any()
    # warm start from a perturbed allocation (some flows new) gives the same answer
    guess = rates.copy()
    guess[rnd.sample(range(len(caps)), len(caps) // 3)] = np.nan
    assert max_min_rates(flows, links, capacity, caps, guess=guess) == pytest.approx(rates, rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(rate_problems(), st.lists(st.integers(1, 3), min_size=8, max_size=8), st.randoms(use_true_random=False))
def test_weighted_flow_equals_that_many_identical_flows(problem, weights, rnd):
    """A flow of weight w (merged identical channels) gets what each of w copies of it would."""
    flows, links, capacity, caps = problem
    w = np.array(weights[:len(caps)], dtype=float)
    copies = [f for f in range(len(caps)) for _ in range(int(w[f]))]  # copy i stands for flow copies[i]
    paths = [[k for g, k in zip(flows, links, strict=True) if g == f] for f in range(len(caps))]
    exp_flows = np.array([i for i, f in enumerate(copies) for _ in paths[f]])
    exp_links = np.array([k for f in copies for k in paths[f]])
    expanded = max_min_rates(exp_flows, exp_links, capacity, caps[copies])
    weighted = max_min_rates(flows, links, capacity, caps, weight=w)
    assert weighted[copies] == pytest.approx(expanded, rel=1e-9)
    guess = weighted.copy()
    guess[rnd.sample(range(len(caps)), len(caps) // 3)] = np.nan
    assert max_min_rates(flows, links, capacity, caps, guess=guess, weight=w) == pytest.approx(weighted, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=12),
       st.lists(st.floats(1e-3, 1e12), min_size=6, max_size=6),
       st.sampled_from([math.inf, 0.5, 3.0, 1e9, float("nan")]),
       st.sampled_from([None, 1.0, 2.0, 16.0, 3.7, 0.1]))
def test_one_flow_fast_path_equals_progressive_filling(links, capacity, cap, weight):
    """A lone flow (repeated links, caps, weights) skips progressive filling: bit for bit its answer."""
    links, capacity = np.array(links, dtype=np.intp), np.array(capacity)
    flows, caps = np.zeros(len(links), dtype=np.intp), np.array([cap])
    w = None if weight is None else np.array([weight])
    fast = max_min_rates(flows, links, capacity, caps, weight=w, guess=np.array([np.nan]))
    slow = maxmin._fill(flows, links, capacity, caps, 1e-9, w)
    assert fast.tobytes() == slow.tobytes()


@st.composite
def flow_sets(draw):
    gpus = [f"gpu{i}" for i in range(16)]
    num = draw(st.integers(1, 25))
    flows = []
    for _ in range(num):
        src, dst = draw(st.sampled_from(gpus)), draw(st.sampled_from(gpus))
        start = draw(st.sampled_from([0.0, 0.0, 1e-6, 5e-6, 2e-5]))
        size = draw(st.sampled_from([0.0, 1e3, 1e5, 1e6, 4e6]))
        cap = draw(st.sampled_from([math.inf, math.inf, math.inf, 10 * GB, 100 * GB]))
        flows.append((start, src, dst, size, cap))
    return flows


SMALL_RAIL = ib_rail(2, spines=2)
SMALL_CAPACITY = {(u, v): d["bandwidth_bytes_per_s"] for u, v, d in SMALL_RAIL.edges(data=True)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow_sets(), st.integers(0, 3))
def test_random_flow_sets_respect_physics(flows, seed):
    net, times = simulate(SMALL_RAIL, flows, seed=seed, record=True)
    expected: dict[tuple[str, str], float] = {}
    for (start, src, dst, size, cap), end in zip(flows, times, strict=True):
        path = net.path(src, dst)
        assert end is not None and end >= start - 1e-15
        if size and src != dst:
            slowest = min([cap] + [SMALL_CAPACITY[link] for link in path])
            assert end >= start + net.path_latency(src, dst) + size / slowest * (1 - 1e-9)
            for link in path:
                expected[link] = expected.get(link, 0.0) + size
    assert net.link_bytes.keys() == expected.keys()
    for link, carried in net.link_bytes.items():
        assert carried == pytest.approx(expected[link], rel=1e-6)
        assert max(times) >= carried / SMALL_CAPACITY[link] * (1 - 1e-9)
    for timeline in net.utilization().values():
        assert all(0 <= frac <= 1 + 1e-9 for _, frac in timeline)
    assert net.active_flows == 0


# --------------------------------------------------------------------- benchmark drivers
def test_benchmark_drivers_match_hand_formulas():
    hgx = build_topology("hgx-h100")
    ring = run_case(hgx, lambda net: ring_allreduce(net, gpu_nodes(hgx), 8e6))
    assert ring["sim_time_s"] == pytest.approx(14 * (0.5e-6 + 1e6 / 450e9), rel=1e-9)
    rail = ib_rail(2)
    # all-to-all of 16 ranks: a NIC uplink carries 8 inter-node flows of size/16
    a2a = run_case(rail, lambda net: alltoall(net, gpu_nodes(rail), 16e6))
    assert a2a["sim_time_s"] >= 8 * 1e6 / 50e9
    hier = run_case(rail, lambda net: hierarchical_allreduce(net, rail, 16e6))
    # RS and AG: 7 NVLink steps of size/8 each; inter-node ring of 2 nodes: 2 steps of size/16
    nvlink_step, nic_step = 0.5e-6 + 2e6 / 450e9, 1.65e-6 + 1e6 / 50e9
    assert hier["sim_time_s"] == pytest.approx(14 * nvlink_step + 2 * nic_step, rel=1e-6)
