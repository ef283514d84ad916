"""Bad input of ``shard-sim workload=serving``: a tensor- or expert-parallel group that does not fit the
topology's nodes, and a ``topology.fabric`` the preset does not know, each one line naming the field, exit 2."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

from planner.apps.common import UserError
from planner.apps.serve import _group_error, run_serving_sim
from simcore.config import ConfigError, TopologyConfig
from topologies.scenario import build_graph

ENTRY_SIM = "from planner.apps.sim import main; main()"


def _cfg(*overrides: str):
    import planner.apps.sim  # noqa: F401  (registers sim_schema)

    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="sim", overrides=["workload=serving", "model=deepseek-v3", "serving.isl=256",
                                                     "serving.osl=8", "serving.concurrency=4",
                                                     "serving.num_requests=8", *overrides])


@pytest.mark.parametrize(("size", "node", "gpus", "expected"), [
    (16, 8, 64, None), (8, 8, 64, None), (4, 8, 64, None), (64, 8, 64, None),  # whole nodes or a divisor
    (12, 8, 64, "spans nodes of 8 GPUs unevenly"), (6, 8, 64, "would straddle nodes of 8 GPUs"),
    (128, 8, 64, "needs more GPUs than the topology's 64"),
    (16, 72, 72, None),  # a rack-scale NVLink domain takes any group that fits it
])
def test_a_group_fits_the_nodes_as_whole_nodes_or_a_divisor_of_one(size, node, gpus, expected):
    reason = _group_error(size, node, gpus)
    assert (reason is None) if expected is None else expected in reason


@pytest.mark.parametrize(("overrides", "line"), [
    (["topology=h100-ib-rail", "topology.num_nodes=2", "serving.plan.pool.ep=12"],
     "serving.plan.pool.ep: the expert-parallel group (tp 1 x ep 12) is 12 GPUs and spans nodes of 8 GPUs"),
    (["topology=h100-ib-rail", "topology.num_nodes=2", "serving.plan.pool.tp=2", "serving.plan.pool.ep=6"],
     "serving.plan.pool.ep: the expert-parallel group (tp 2 x ep 6) is 12 GPUs"),
    (["topology=hgx-h100", "topology.num_nodes=1", "serving.plan.pool.ep=16"],
     "serving.plan.pool.ep: the expert-parallel group (tp 1 x ep 16) is 16 GPUs and needs more GPUs than the "
     "topology's 8"),
    (["topology=hgx-h100", "topology.num_nodes=1", "serving.plan.mode=disagg", "serving.plan.decode.ep=4",
      "serving.plan.prefill.tp=16"],
     "serving.plan.prefill.tp: the tensor-parallel group is 16 GPUs and needs more GPUs than the topology's 8"),
])
def test_a_group_that_does_not_fit_the_nodes_names_the_field(tmp_path, monkeypatch, overrides, line):
    monkeypatch.setattr("planner.apps.serve.run_dir", lambda: tmp_path)
    with pytest.raises(UserError) as exc:
        run_serving_sim(_cfg(*overrides))
    assert str(exc.value).startswith(line), str(exc.value)


def test_whole_node_groups_across_nodes_are_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr("planner.apps.serve.run_dir", lambda: tmp_path)
    payload = run_serving_sim(_cfg("topology=h100-ib-rail", "topology.num_nodes=2", "serving.plan.pool.ep=16"))
    assert payload["result"]["feasible"] and payload["result"]["plan"]["both"]["ep"] == 16


def test_topology_fabric_sets_a_presets_network_and_refuses_one_it_does_not_know():
    assert build_graph(TopologyConfig(name="h100-ib-rail", num_nodes=2, fabric="roce"), None).graph["fabric"] == "roce"
    assert build_graph(TopologyConfig(name="h100-efa", num_nodes=2, fabric="efa"), None).graph["fabric"] == "efa"
    with pytest.raises(ConfigError, match=r"^topology.fabric: unknown fabric 'infiniband' \(closest: ib; known: "
                                          r"ib, efa, roce\)$"):
        build_graph(TopologyConfig(name="h100-ib-rail", fabric="infiniband"), None)
    with pytest.raises(ConfigError, match=r"^topology.fabric: topology h100-efa is efa by name, got 'ib'"):
        build_graph(TopologyConfig(name="h100-efa", fabric="ib"), None)
    with pytest.raises(ConfigError, match=r"^topology.fabric: a custom topology names its fabric in its file"):
        build_graph(TopologyConfig(name="custom", path="x.yaml", fabric="ib"), None)


@pytest.mark.parametrize(("args", "start"), [
    (["topology=h100-ib-rail", "topology.num_nodes=2", "serving.plan.pool.ep=12"], "error: serving.plan.pool.ep: "),
    (["topology=h100-ib-rail", "topology.fabric=rcoe"], "error: topology.fabric: unknown fabric 'rcoe' (closest: roce"),
])
def test_the_cli_says_it_in_one_line_and_exits_2(tmp_path, args, start):
    proc = subprocess.run([sys.executable, "-c", ENTRY_SIM, "workload=serving", "model=deepseek-v3", *args,
                           f"hydra.run.dir={tmp_path}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(start) and proc.stderr.strip().count("\n") == 0, proc.stderr
