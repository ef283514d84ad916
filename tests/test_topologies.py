"""Cluster topology builders, presets, YAML loader and validation."""

from __future__ import annotations

import doctest
from pathlib import Path

import networkx as nx
import pytest

import topologies
from simcore.network import cluster_graph as graph
from topologies import (
    TOPOLOGY_NAMES,
    build_topology,
    builders,
    custom,
    dump_topology_yaml,
    gpu_nodes,
    hgx_h100,
    ib_fattree,
    ib_rail,
    load_topology_yaml,
    node_of,
    nvl72,
    presets,
    topology_from_dict,
    validate_topology,
)

EXAMPLE = Path(topologies.__file__).parent / "examples" / "small_cluster.yaml"


def kinds(g: nx.DiGraph, kind: str) -> list[str]:
    return [n for n, k in g.nodes(data="kind") if k == kind]


def one_line_error(excinfo: pytest.ExceptionInfo, *words: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("module", [builders, custom, graph, presets])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_every_preset_builds_and_validates(name):
    g = build_topology(name)
    assert validate_topology(g) is g
    assert g.graph["name"] == name
    assert g.graph["num_gpus"] == len(gpu_nodes(g)) == g.graph["num_nodes"] * g.graph["gpus_per_node"]
    for u, v, data in g.edges(data=True):
        assert g.has_edge(v, u)
        assert data["bandwidth_bytes_per_s"] > 0 and data["latency_s"] >= 0


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_presets_accept_the_config_parameters(name):
    # topologies.scenario.build_graph passes num_nodes and oversubscription to every preset
    g = build_topology(name, num_nodes=1, oversubscription=1.0)
    assert g.graph["num_nodes"] == 1


def test_counts_rail():
    g = build_topology("h100-ib-rail", num_nodes=4)
    counts = [len(kinds(g, kind)) for kind in ("gpu", "nic", "leaf", "spine")]
    assert counts == [32, 32, 8, 8]
    assert len(kinds(g, "nvswitch")) == 4
    assert g["gpu0"]["nvswitch0"]["bandwidth_bytes_per_s"] == 450e9
    assert g["gpu0"]["nic0"]["bandwidth_bytes_per_s"] == 50e9


def test_counts_fattree_hgx_nvl72():
    g = ib_fattree(9, nodes_per_leaf=4)
    assert (len(kinds(g, "gpu")), len(kinds(g, "nic")), len(kinds(g, "leaf"))) == (72, 72, 3)
    h = hgx_h100()
    assert (len(kinds(h, "gpu")), len(kinds(h, "nic")), len(kinds(h, "nvswitch"))) == (8, 0, 1)
    one = nvl72()
    assert (one.graph["num_gpus"], one.graph["nvlink_domain_size"]) == (72, 72)
    assert len(kinds(one, "nvswitch")) == 1
    assert one.graph["gpu"] == "gb200" and "approximation" not in one.graph
    two = nvl72(2)
    assert (len(kinds(two, "gpu")), len(kinds(two, "nic")), len(kinds(two, "leaf"))) == (144, 144, 72)
    assert two["gpu80"]["nvswitch1"]["bandwidth_bytes_per_s"] == 900e9


def test_gpu_rates_follow_the_catalog():
    assert build_topology("h800-ib-rail")["gpu3"]["nvswitch0"]["bandwidth_bytes_per_s"] == 200e9
    assert build_topology("h200-ib-rail").graph["gpu"] == "h200"
    assert build_topology("b200-ib-rail")["gpu3"]["nvswitch0"]["bandwidth_bytes_per_s"] == 900e9


@pytest.mark.parametrize(("name", "fabric", "layout"), [
    ("h100-ib-rail", "ib", "rail"), ("h100-ib-fattree", "ib", "fattree"), ("h100-efa", "efa", "fattree"),
    ("h200-efa", "efa", "fattree"), ("h100-roce", "roce", "rail"), ("gb200-nvl72", "ib", "none")])
def test_presets_carry_their_fabric_into_the_cost_model(name, fabric, layout):
    from simcore.cost.cluster import Cluster

    g = build_topology(name)
    assert (g.graph["fabric"], g.graph["layout"]) == (fabric, layout)
    assert Cluster.from_graph(g).fabric.scale_out == fabric
    # all three fabrics are 400 Gb/s per GPU on these nodes: the links are the same, only the model differs
    assert g["gpu0"]["nic0"]["bandwidth_bytes_per_s"] == 50e9 if name != "gb200-nvl72" else True


def test_fabric_is_a_parameter_of_the_generic_presets_and_is_checked():
    assert build_topology("h100-ib-rail", fabric="roce").graph["fabric"] == "roce"
    with pytest.raises(ValueError, match="fabric: unknown fabric 'eth'; choose one of: ib, efa, roce"):
        build_topology("h100-ib-fattree", fabric="eth")
    with pytest.raises(ValueError, match="fixes fabric"):
        build_topology("h100-efa", fabric="ib")


def test_gb200_nvl72_runs_blackwell_compute_and_nvlink5():
    from simcore.cost.cluster import Cluster

    cluster = Cluster.from_graph(build_topology("gb200-nvl72"))
    assert cluster.gpu.name == "gb200" and cluster.gpu.arch == "blackwell"
    assert cluster.gpu.peak_flops_per_s["fp8"] == 5000e12 and cluster.gpu.hbm_bytes == 186e9
    assert (cluster.fabric.arch, cluster.fabric.nvlink_bandwidth_bytes_per_s) == ("blackwell", 900e9)
    assert cluster.nvlink_domain_size == 72


def test_rail_property():
    g = ib_rail(5)
    for gpu in gpu_nodes(g):
        local = g.nodes[gpu]["local"]
        nic = next(v for v in g.successors(gpu) if g.nodes[v]["kind"] == "nic")
        assert [v for v in g.successors(nic) if g.nodes[v]["kind"] == "leaf"] == [f"leaf{local}"]


def test_rail_groups_and_fattree_leaves():
    g = ib_rail(6, nodes_per_leaf=4)  # groups of 4 and 2 servers, 8 rail leaves each
    assert len(kinds(g, "leaf")) == 16
    assert "leaf13" in g.successors("nic45")  # node 5 (group 1), rail 5
    f = ib_fattree(8, nodes_per_leaf=4)
    for node in range(8):
        nics = [f"nic{node * 8 + i}" for i in range(8)]
        leaves = {v for nic in nics for v in f.successors(nic) if f.nodes[v]["kind"] == "leaf"}
        assert leaves == {f"leaf{node // 4}"}


def test_oversubscription_reduces_uplink_capacity():
    full, half = ib_rail(4), ib_rail(4, oversubscription=2.0)
    # leaf downlink 4 x 50e9 = 200e9, spread over 8 spines, divided by the oversubscription
    assert full["leaf0"]["spine0"]["bandwidth_bytes_per_s"] == pytest.approx(25e9)
    assert half["leaf0"]["spine0"]["bandwidth_bytes_per_s"] == pytest.approx(12.5e9)
    tree = ib_fattree(8, oversubscription=4.0)  # 32 NICs per leaf, 2 spines
    assert tree["leaf1"]["spine1"]["bandwidth_bytes_per_s"] == pytest.approx(32 * 50e9 / 4 / 2)


def test_gpu_nodes_rank_order_and_node_of():
    g = ib_rail(2)
    assert gpu_nodes(g)[8:11] == ["gpu8", "gpu9", "gpu10"]
    assert [node_of(g, x) for x in ("gpu0", "gpu7", "gpu8", "gpu15")] == [0, 0, 1, 1]
    with pytest.raises(ValueError) as err:
        node_of(g, "nic3")
    one_line_error(err, "nic3")


def test_yaml_example_loads():
    g = load_topology_yaml(EXAMPLE)
    assert (g.graph["num_gpus"], g.graph["num_nodes"], g.graph["nvlink_domain_size"]) == (8, 2, 4)
    assert g["gpu5"]["nvswitch1"]["latency_s"] == pytest.approx(0.25e-6)
    assert g["leaf0"]["nic7"]["bandwidth_bytes_per_s"] == pytest.approx(50e9)


@pytest.mark.parametrize("make", [lambda: ib_rail(2, oversubscription=1.5),
                                  lambda: ib_fattree(3, nodes_per_leaf=2)])
def test_yaml_round_trip(tmp_path, make):
    g = make()
    path = tmp_path / "cluster.yaml"
    dump_topology_yaml(g, path)
    back = load_topology_yaml(path)
    assert set(back.edges) == set(g.edges)
    for u, v, data in g.edges(data=True):
        assert back[u][v]["bandwidth_bytes_per_s"] == data["bandwidth_bytes_per_s"]
        assert back[u][v]["latency_s"] == data["latency_s"]
    assert {n: k for n, k in back.nodes(data="kind")} == {n: k for n, k in g.nodes(data="kind")}
    for key in ("gpu", "num_nodes", "gpus_per_node", "num_gpus", "nvlink_domain_size"):
        assert back.graph[key] == g.graph[key]


def _spec(**changes):
    spec = {"name": "t", "gpu": "h100-sxm", "num_nodes": 1, "gpus_per_node": 2,
            "nodes": [{"name": "sw", "kind": "nvswitch"}],
            "links": [{"a": ["gpu0", "gpu1"], "b": "sw", "bandwidth_GBps": 450, "latency_us": 0.25}]}
    spec.update(changes)
    return spec


def test_yaml_schema_errors():
    assert topology_from_dict(_spec()).graph["num_gpus"] == 2
    cases = [
        (_spec(colour="red"), ["colour"]),
        (_spec(links=[{"a": "gpu0", "b": "sw9", "bandwidth_GBps": 1, "latency_us": 1}]), ["sw9"]),
        (_spec(links=[{"a": "gpu0", "b": "sw", "latency_us": 1}]), ["bandwidth_GBps"]),
        (_spec(nodes=[{"name": "sw", "kind": "router"}]), ["sw", "router"]),
        (_spec(gpu="a100"), ["a100"]),
    ]
    for spec, words in cases:
        with pytest.raises(ValueError) as err:
            topology_from_dict(spec)
        one_line_error(err, *words)


def test_disconnected_graph_is_rejected():
    g = ib_rail(2)
    g.add_node("leaf99", kind="leaf")
    with pytest.raises(ValueError) as err:
        validate_topology(g)
    one_line_error(err, "disconnected", "leaf99")


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf")])
def test_non_positive_capacity_is_rejected(bad):
    g = hgx_h100()
    g["gpu3"]["nvswitch0"]["bandwidth_bytes_per_s"] = bad
    with pytest.raises(ValueError) as err:
        validate_topology(g)
    one_line_error(err, "'gpu3'", "'nvswitch0'", "bandwidth_bytes_per_s")


def test_negative_latency_is_rejected():
    g = hgx_h100()
    g["nvswitch0"]["gpu1"]["latency_s"] = -1e-6
    with pytest.raises(ValueError) as err:
        validate_topology(g)
    one_line_error(err, "'gpu1'", "latency_s")


def test_gpu_without_nic_in_multi_node_cluster_is_rejected():
    g = ib_rail(2)
    g.remove_node("nic11")
    with pytest.raises(ValueError) as err:
        validate_topology(g)
    one_line_error(err, "gpu11", "NIC")


def test_gpu_reachable_only_through_another_gpu_is_rejected():
    spec = _spec(gpus_per_node=3, links=[
        {"a": ["gpu0", "gpu1"], "b": "sw", "bandwidth_GBps": 450, "latency_us": 0.25},
        {"a": "gpu1", "b": "gpu2", "bandwidth_GBps": 450, "latency_us": 0.25},
    ])
    with pytest.raises(ValueError) as err:
        topology_from_dict(spec)
    one_line_error(err, "cannot reach", "gpu2")


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_topology("a100-pod")
    one_line_error(err, "a100-pod", *TOPOLOGY_NAMES)


@pytest.mark.parametrize("call, word", [
    (lambda: ib_rail(0), "num_nodes"),
    (lambda: ib_rail(2, oversubscription=0.0), "oversubscription"),
    (lambda: ib_fattree(2, nodes_per_leaf=0), "nodes_per_leaf"),
    (lambda: build_topology("hgx-h100", num_nodes=2), "num_nodes"),
    (lambda: build_topology("h100-ib-rail", gpu="h200"), "gpu"),
    (lambda: build_topology("h100-ib-rail", racks=2), "racks"),
    (lambda: ib_rail(2, gpu="b300"), "b300"),
])
def test_bad_builder_arguments(call, word):
    with pytest.raises(ValueError) as err:
        call()
    one_line_error(err, word)
