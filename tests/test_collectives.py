"""Collective cost model (NCCL's formulas, selection, calibration) and its flow-level execution."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.collectives import (
    ALGORITHMS_BY_COLLECTIVE,
    DEFAULT,
    PROTOCOLS,
    Fabric,
    NcclConstants,
    collective_time_s,
    select,
)
from simcore.collectives.cost import entry_costs
from simcore.collectives.flows import double_binary_trees, run_collective, simulate_collective
from simcore.hardware.gpus import get_gpu
from topologies import build_topology

FAB = Fabric.from_gpu(get_gpu("h100-sxm"))
BARE = DEFAULT.with_overrides(launch_overhead_s=0.0, ring_fill_steps_copy=0.0, ring_fill_steps_reduce=0.0,
                              nvls_fill_bytes=0.0, net_latency_s=0.0, net_fill_bytes=0.0)  # NCCL's own model
US = 1e-6


def _latency_us(coll, n, p, algo, proto, size=8.0):
    (_, _, cost), = entry_costs(coll, size, n, p, FAB, algo, proto, BARE)
    return float(cost.latency_s) / US


# ---------------------------------------------------------------- hand-computable formulas
def test_ring_all_reduce_is_latency_plus_bus_volume_over_busbw():
    size = 2.0**30
    busbw = BARE.nvlink_efficiency * 450e9
    expected = (8.4 + 14 * 3.4) * US + 2 * 7 / 8 * size / busbw
    assert collective_time_s("all_reduce", size, 8, 8, FAB, "ring", "simple", BARE) == pytest.approx(expected)


def test_calibrated_extras_add_launch_and_ring_fill():
    size, c = 2.0**30, DEFAULT
    busbw = c.nvlink_efficiency * 450e9
    steps = 14 + c.ring_fill_steps_copy + c.ring_fill_steps_reduce
    expected = (8.4 + 14 * 3.4) * US + c.launch_overhead_s + steps * size / 8 / busbw
    assert collective_time_s("all_reduce", size, 8, 8, FAB, "ring", "simple") == pytest.approx(expected)


@pytest.mark.parametrize(("algo", "proto", "expected_us"), [
    ("ring", "ll", 15.0), ("ring", "ll128", 40.6), ("ring", "simple", 56.0), ("tree", "ll", 15.2),
    ("nvls", "simple", 25.0)])
def test_nccl_worked_examples_8xh100(algo, proto, expected_us):
    assert _latency_us("all_reduce", 8, 8, algo, proto) == pytest.approx(expected_us)


@pytest.mark.parametrize(("algo", "expected_us"), [("tree", 176.4), ("nvls_tree", 192.2), ("ring", 1190.0)])
def test_nccl_worked_examples_16_nodes(algo, expected_us):
    assert _latency_us("all_reduce", 128, 8, algo, "simple") == pytest.approx(expected_us)


def test_multi_node_ring_simple_plateau_multiplies_latency():
    small = _latency_us("all_reduce", 128, 8, "ring", "simple", size=1024.0)
    large = _latency_us("all_reduce", 128, 8, "ring", "simple", size=2.0**30)
    assert large == pytest.approx(small * 1.4)


def test_ll_bandwidth_is_half_capped_by_ll_max_bw():
    size = 2.0**30  # ring LL all-gather on 8 GPUs: busBw = min(141 GB/s, 0.5 x B)
    bus = min(141e9, 0.5 * BARE.nvlink_efficiency * 450e9)
    expected = (6.6 + 7 * 0.6) * US + 7 / 8 * size / bus
    assert collective_time_s("all_gather", size, 8, 8, FAB, "ring", "ll", BARE) == pytest.approx(expected)


def test_nvls_bandwidth_follows_nccl_channel_rule():
    b = BARE.nvlink_efficiency * 450e9
    bw_ch = min(60e9, b / 9)  # 8 channels, a head link carries twice
    alg = 8 * bw_ch * 0.85 * 7 / 8 * 2 * 8 / 14
    t = collective_time_s("all_reduce", 2.0**33, 8, 8, FAB, "nvls", "simple", BARE)
    assert t == pytest.approx(25 * US + 2.0**33 / alg)


def test_nvls_fill_adds_the_unoverlapped_bytes_once_and_never_changes_the_choice():
    fill = 8e6
    with_fill = BARE.with_overrides(nvls_fill_bytes=fill)
    for size in (2.0**20, 2.0**24, 2.0**30):
        bare = collective_time_s("all_reduce", size, 8, 8, FAB, "nvls", "simple", BARE)
        alg = size / (bare - 25 * US)
        filled = collective_time_s("all_reduce", size, 8, 8, FAB, "nvls", "simple", with_fill)
        assert filled - bare == pytest.approx(min(size, fill) / alg, rel=1e-9)
        assert select("all_reduce", size, 8, 8, FAB, constants=with_fill)[:2] == \
            select("all_reduce", size, 8, 8, FAB, constants=BARE)[:2]
    # all-gather has no separate reduce phase to overlap: no fill
    assert collective_time_s("all_gather", 2.0**24, 8, 8, FAB, "nvls", "simple", with_fill) == \
        collective_time_s("all_gather", 2.0**24, 8, 8, FAB, "nvls", "simple", BARE)


def test_all_to_all_is_max_of_nvlink_and_nic_volumes():
    size, n, p = 2.0**30, 32, 8
    t = collective_time_s("all_to_all", size, n, p, FAB, "direct", "simple", BARE)
    intra = size / n * (p - 1) / (BARE.nvlink_efficiency * 450e9)
    inter = size / n * (n - p) / (BARE.nic_efficiency * 50e9)
    assert t == pytest.approx((8.4 + 14.0) * US + max(intra, inter))


def test_send_recv_uses_nvlink_inside_a_domain_and_the_nic_across():
    size = 2.0**28
    intra = collective_time_s("send_recv", size, 2, 2, FAB, "direct", "simple", BARE)
    inter = collective_time_s("send_recv", size, 2, 1, FAB, "direct", "simple", BARE)
    assert intra == pytest.approx((8.4 + 3.4) * US + size / (BARE.nvlink_efficiency * 450e9))
    assert inter == pytest.approx((8.4 + 14.0) * US + size / (BARE.nic_efficiency * 50e9))


def test_hierarchical_is_sum_of_its_ring_phases():
    size, c = 2.0**28, BARE
    rs = collective_time_s("reduce_scatter", size, 8, 8, FAB, "ring", "simple", c)
    ar = collective_time_s("all_reduce", size / 8, 4, 1, FAB, "ring", "simple", c)
    ag = collective_time_s("all_gather", size, 8, 8, FAB, "ring", "simple", c)
    t = collective_time_s("all_reduce", size, 32, 8, FAB, "hierarchical", "simple", c)
    assert t == pytest.approx(rs + ar + ag)


def test_trivial_calls_cost_nothing():
    t = collective_time_s("all_reduce", [0.0, 1e6, 1e6], [8, 1, 8], [8, 1, 8], FAB)
    assert t[0] == 0.0 and t[1] == 0.0 and t[2] > 0


# ----------------------------------------------------------------------------- selection
@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_up_to_four_gpus_per_node(n):
    assert select("all_reduce", 2.0**33, n, n, FAB)[0].item() == "ring"


@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_nvls_from_five_gpus_per_node(n):
    assert select("all_reduce", 2.0**33, n, n, FAB)[0].item() == "nvls"


def test_small_all_reduce_on_8_gpus_is_ring_ll_and_large_is_nvls():
    algos, protos, _ = select("all_reduce", [2.0**15, 2.0**20, 2.0**26], 8, 8, FAB)
    assert list(zip(algos.tolist(), protos.tolist(), strict=True)) == [("ring", "ll"), ("ring", "ll"),
                                                                       ("nvls", "simple")]


def test_nvls_tree_only_across_nodes_and_never_without_nvls():
    assert math.isinf(collective_time_s("all_reduce", 1e9, 8, 8, FAB, "nvls_tree"))
    no_nvls = Fabric(450e9, 50e9, 8, nvls=False)
    assert math.isinf(collective_time_s("all_reduce", 1e9, 8, 8, no_nvls, "nvls"))
    assert select("all_reduce", 1e9, 8, 8, no_nvls)[0].item() == "ring"


def test_choice_follows_nccl_model_not_calibrated_extras():
    heavy = DEFAULT.with_overrides(ring_fill_steps_copy=3.0, ring_fill_steps_reduce=3.0)
    assert select("all_reduce", 2.0**20, 8, 8, FAB, heavy)[:2] == select("all_reduce", 2.0**20, 8, 8, FAB)[:2]


# ------------------------------------------------------------------------ vectorization
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2e10), st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
                          st.sampled_from([1, 2, 4, 8])), min_size=1, max_size=20),
       st.sampled_from(list(ALGORITHMS_BY_COLLECTIVE)))
def test_vectorized_equals_scalar(rows, coll):
    size = np.array([r[0] for r in rows])
    n = np.array([r[1] for r in rows])
    p = np.minimum(np.array([r[2] for r in rows]), n)
    vec = collective_time_s(coll, size, n, p, FAB)
    one = [float(collective_time_s(coll, s, k, q, FAB)) for s, k, q in zip(size, n, p, strict=True)]
    assert vec.shape == size.shape
    np.testing.assert_allclose(vec, one, rtol=1e-12)
    assert np.all(np.isfinite(vec)) and np.all(vec >= 0)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(c, a, p) for c, algos in ALGORITHMS_BY_COLLECTIVE.items()
                        for a in algos for p in PROTOCOLS]),
       st.sampled_from([(8, 8), (4, 4), (32, 8), (16, 2)]))
def test_fixed_entry_time_grows_with_size(entry, group):
    coll, algo, proto = entry
    t = collective_time_s(coll, np.logspace(1, 10, 40), *group, FAB, algo, proto)
    finite = t[np.isfinite(t)]
    assert np.all(np.diff(finite) >= -1e-15)


def test_broadcasts_2d_arrays():
    t = collective_time_s("all_gather", np.full((3, 4), 1e6), np.array([[8], [4], [2]]), 2, FAB)
    assert t.shape == (3, 4) and np.all(t[0] >= t[2])


# ------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"collective": "broadcast"}, "unknown collective 'broadcast'"),
    ({"algorithm": "pat"}, "unknown algorithm 'pat'"),
    ({"algorithm": "tree", "collective": "all_gather"}, "algorithm for all_gather 'tree'"),
    ({"protocol": "ll64"}, "unknown protocol 'll64'"),
    ({"size_bytes": -1.0}, "size_bytes"),
    ({"size_bytes": float("nan")}, "size_bytes"),
    ({"n_ranks": 0}, "n_ranks"),
    ({"ranks_per_node": 16, "n_ranks": 8}, "ranks_per_node"),
    ({"ranks_per_node": 16, "n_ranks": 32}, "NVLink domain size 8"),
])
def test_bad_inputs_rejected_with_one_line(kwargs, needle):
    args = {"collective": "all_reduce", "size_bytes": 1e6, "n_ranks": 8, "ranks_per_node": 8, "fabric": FAB}
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        collective_time_s(**args)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="choose one of: ring, tree, nvls"):
        collective_time_s("all_reduce", 1e6, 8, 8, FAB, algorithm="rings")


def test_constants_overrides_and_checks():
    assert DEFAULT.with_overrides(nvlink_efficiency=0.5).nvlink_efficiency == 0.5
    with pytest.raises(ValueError, match="unknown NcclConstants field.*bogus"):
        DEFAULT.with_overrides(bogus=1)
    with pytest.raises(ValueError, match="nvlink_efficiency"):
        NcclConstants(nvlink_efficiency=1.5)
    with pytest.raises(ValueError, match="launch_overhead_s"):
        NcclConstants(launch_overhead_s=-1.0)
    with pytest.raises(ValueError, match="nvlink_domain_size"):
        Fabric(450e9, 50e9, 0)


def test_fabric_from_topology_matches_from_gpu():
    assert Fabric.from_topology(build_topology("h100-ib-rail", num_nodes=2)) == FAB
    h800 = Fabric.from_topology(build_topology("h800-ib-rail", num_nodes=2))
    assert h800.nvlink_bandwidth_bytes_per_s == 200e9


# ------------------------------------------------------------------ flow execution
HGX = build_topology("hgx-h100")
RAIL4 = build_topology("h100-ib-rail", num_nodes=4)
GROUPS = [(HGX, [f"gpu{i}" for i in range(8)]), (HGX, [f"gpu{i}" for i in range(4)]),
          (RAIL4, [f"gpu{i}" for i in range(32)]), (RAIL4, [f"gpu{i}" for i in range(32) if i % 8 < 2]),
          (RAIL4, [f"gpu{i}" for i in range(24)])]
ENTRIES = [(c, a, p) for c, algos in ALGORITHMS_BY_COLLECTIVE.items() for a in algos for p in PROTOCOLS]


@pytest.mark.parametrize("group", range(len(GROUPS)))
@pytest.mark.parametrize("entry", ENTRIES, ids=["-".join(e) for e in ENTRIES])
def test_idle_fabric_flow_simulation_equals_analytic(entry, group):
    coll, algo, proto = entry
    graph, ranks = GROUPS[group]
    if coll == "send_recv":
        ranks = [ranks[0], ranks[-1]]
    fabric = Fabric.from_topology(graph)
    domains = {graph.nodes[r]["node"] for r in ranks}
    p = len(ranks) // len(domains)
    checked = 0
    for size in (4096.0, 2.0**20, 2.0**28):
        analytic = float(collective_time_s(coll, size, len(ranks), p, fabric, algo, proto))
        if not math.isfinite(analytic):
            with pytest.raises(ValueError, match="cannot run"):
                simulate_collective(graph, coll, size, ranks, algo, proto)
            continue
        assert simulate_collective(graph, coll, size, ranks, algo, proto) == pytest.approx(analytic, rel=0.01)
        checked += 1
    nvls_ok = proto == "simple" and (len(domains) == 1) == (algo == "nvls")
    assert checked == (3 if algo not in ("nvls", "nvls_tree") or nvls_ok else 0)


def test_auto_flow_simulation_equals_auto_analytic():
    for size in (1e3, 1e6, 1e9):
        analytic = float(collective_time_s("all_reduce", size, 32, 8, FAB))
        ranks = [f"gpu{i}" for i in range(32)]
        assert simulate_collective(RAIL4, "all_reduce", size, ranks) == pytest.approx(analytic, rel=0.01)


def test_contention_slows_collectives_down():
    ranks = [f"gpu{i}" for i in range(8)]
    alone = simulate_collective(HGX, "all_gather", 2.0**30, ranks, "ring", "simple")
    shared = simulate_collective(HGX, "all_gather", 2.0**30, ranks, "ring", "simple",
                                 concurrent_groups=[ranks])
    assert alone * 1.2 < shared < alone * 2.0
    # disjoint groups on a non-blocking NVSwitch do not interfere
    halves = [f"gpu{i}" for i in range(4)], [f"gpu{i}" for i in range(4, 8)]
    one = simulate_collective(HGX, "all_reduce", 2.0**30, halves[0])
    assert simulate_collective(HGX, "all_reduce", 2.0**30, halves[0], concurrent_groups=[halves[1]]) == \
        pytest.approx(one, rel=1e-9)


def test_multi_node_ring_crosses_domains_on_rails():
    import simpy

    from simcore.network.flownet import FlowNetwork

    env = simpy.Environment()
    net = FlowNetwork(env, RAIL4)
    env.run(until=run_collective(env, net, "all_gather", 2.0**26, [f"gpu{i}" for i in range(32)], "ring",
                                 "simple"))
    used = net.link_bytes
    assert not any(RAIL4.nodes[u]["kind"] == "spine" or RAIL4.nodes[v]["kind"] == "spine" for u, v in used)
    nic_out = [used.get((f"gpu{i}", f"nic{i}"), 0.0) for i in range(32)]
    assert max(nic_out) == pytest.approx(min(nic_out), rel=1e-9) and min(nic_out) > 0


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13, 16])
def test_double_binary_trees_are_complementary_spanning_trees(n):
    trees = double_binary_trees(n)
    inner = []
    for tree in trees:
        children = [c for _, c in tree]
        assert sorted(children) == sorted(set(children)) and len(tree) == n - 1
        inner.append({u for u, _ in tree})
        assert max(sum(1 for u, _ in tree if u == m) for m in range(n)) <= 2
    assert len(inner[0] & inner[1]) <= n % 2  # only the shifted root may be inner twice (odd n)


def test_flow_rejects_uneven_groups_and_non_gpus():
    with pytest.raises(ValueError, match="same count in every NVLink domain"):
        simulate_collective(RAIL4, "all_reduce", 1e6, ["gpu0", "gpu1", "gpu8"])
    with pytest.raises(ValueError, match="not a GPU"):
        simulate_collective(HGX, "all_reduce", 1e6, ["gpu0", "nvswitch0"])
