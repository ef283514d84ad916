"""Input that used to be read silently as something else: a file named where it is never read, a rate
beside a trace, a study's CSV in another schema, an error naming the converted field, a serving plan
that cannot split the model. Each is now a one-line error naming the field the user set."""

import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from planner.apps.common import UserError
from planner.serving.config import ServingAppConfig, ServingSearchConfig, build_serving_config
from planner.serving.search import serving_space
from simcore.config import ConfigError, TopologyConfig, WorkloadConfig, build_workload, slo_seconds
from simcore.moe.routing import RoutingConfig
from topologies.scenario import build_graph
from validation.apps.validate import StudyConfig, ValidateAppConfig
from validation.apps.validate import run as validate_run
from validation.studies import inference, kernels, moe
from validation.studies.common import read_csv

ENTRY_SIM = "from planner.apps.sim import main; main()"


def test_a_routing_file_is_refused_unless_the_distribution_reads_it(tmp_path):
    with pytest.raises(ValueError, match=r"routing.path: .*loads.csv is read only under routing.distribution=file"):
        RoutingConfig("zipf", path=str(tmp_path / "loads.csv"))
    assert RoutingConfig("file", path="loads.csv").path == "loads.csv"
    assert RoutingConfig("uniform").path is None


def test_a_topology_file_is_refused_unless_the_topology_is_custom():
    with pytest.raises(ConfigError, match="topology.path: my.yaml is read only under topology=custom"):
        build_graph(TopologyConfig(name="hgx-h100", num_nodes=1, path="my.yaml"), None)
    assert build_graph(TopologyConfig(name="hgx-h100", num_nodes=1), None).number_of_nodes() > 0


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), float("inf")])
def test_an_slo_error_names_the_field_in_milliseconds(bad):
    with pytest.raises(ConfigError, match=r"^workload.tpot_slo_ms must be a positive number of milliseconds"):
        build_workload(WorkloadConfig(tpot_slo_ms=bad))
    with pytest.raises(ConfigError, match=r"^serving.ttft_slo_ms must be"):
        slo_seconds(bad, "serving.ttft_slo_ms")


def test_slo_seconds_converts_at_the_input():
    assert slo_seconds(None, "x") is None
    assert slo_seconds(50, "x") == pytest.approx(0.05)
    assert build_workload(WorkloadConfig(ttft_slo_ms=2000.0)).ttft_slo_s == pytest.approx(2.0)


def test_a_rate_beside_a_trace_is_refused(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_len,output_len\n0,100,10\n0.5,100,10\n")
    node = OmegaConf.structured(ServingAppConfig(trace=str(trace), rate=2.0))
    with pytest.raises(UserError, match="^serving.rate: 2.0 set together with serving.trace"):
        build_serving_config(node)
    alone = build_serving_config(OmegaConf.structured(ServingAppConfig(trace=str(trace))))
    assert alone.arrival == "trace" and alone.num_requests == 2
    assert build_serving_config(OmegaConf.structured(ServingAppConfig(rate=2.0))).arrival == "poisson"


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("pp", [0], "serving.search.pp must list positive integers"),
    ("max_num_seqs", [0, 64], "serving.search.max_num_seqs must list positive integers"),
    ("max_num_seqs", [], "serving.search.max_num_seqs: an empty list"),
    ("pp", [], "serving.search.pp: an empty list"),
    ("ep", [-2], "serving.search.ep must list positive integers"),
])
def test_serving_search_lists_are_checked_naming_the_field(field, value, needle):
    search = OmegaConf.structured(ServingSearchConfig(**{field: value}))
    with pytest.raises(UserError, match=needle):
        serving_space(None, None, search, "random")  # refused before the space is built


def test_read_csv_names_the_option_and_the_missing_columns(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(" kernel ,value\n gemm , 1.5 \nshort\n")
    header, rows = read_csv(path, ("kernel",))
    assert header == ["kernel", "value"] and rows == [{"kernel": "gemm", "value": "1.5"}, {"kernel": "short", "value": ""}]
    with pytest.raises(ValueError, match=r"^--data: .*a.csv lacks column\(s\) unit, dtype$"):
        read_csv(path, ("kernel", "unit", "dtype"), "--data")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match=r"^data: .*empty.csv is empty \(no header row\)$"):
        read_csv(tmp_path / "empty.csv", ())


@pytest.mark.parametrize("study", [kernels, inference, moe])
def test_a_study_csv_in_another_schema_is_bad_input_not_skipped_rows(tmp_path, study):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"^data: .*other.csv lacks column\(s\) "):
        study.run(path, tmp_path / "out")


def test_an_inference_csv_without_one_usable_row_is_bad_input(tmp_path):
    header = ("source_url,model,hardware,gpus,tp,pp,ep,dp,precision,scenario,batch,input_len,output_len,metric,"
              "value,unit,note,split")
    path = tmp_path / "inf.csv"
    path.write_text(header + "\nx,gpt-7,h100-sxm,1,1,1,1,1,fp8,static,1,1,1,output_tokens_per_s_per_gpu,1,u,n,fit\n")
    with pytest.raises(ValueError, match=r"^data: no usable rows in .*inf.csv \(1 skipped; line 2: unknown model"):
        inference.run(path, tmp_path / "out", simulate_too=False)


@pytest.mark.parametrize("name", ["fidelity", "rewrites"])
def test_a_study_without_input_refuses_data(tmp_path, name):
    cfg = OmegaConf.structured(ValidateAppConfig(study=StudyConfig(name=name), data=str(tmp_path / "x.csv")))
    with pytest.raises(UserError, match=f"^data: study {name} reads no CSV"):
        validate_run(cfg)


def test_a_serving_plan_that_cannot_split_the_model_exits_2_naming_the_pool(tmp_path):
    proc = subprocess.run([sys.executable, "-c", ENTRY_SIM, "experiment=dense-70b-1node", "workload=serving",
                           "serving.plan.pool.tp=3", f"hydra.run.dir={tmp_path}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: serving.plan.pool: heads_divisibility"), proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def _serving_cfg(*overrides: str):
    from hydra import compose, initialize_config_module

    import planner.apps.sim  # noqa: F401  (registers sim_schema, the config group the sim app composes over)

    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="sim", overrides=["experiment=dense-70b-1node", "workload=serving", *overrides])


def test_a_request_longer_than_the_models_context_window_is_refused():
    from planner.serving.config import build_serving_context

    assert build_serving_context(_serving_cfg("serving.isl=130560", "serving.osl=512")).model.name == "llama-3.1-70b"
    with pytest.raises(UserError, match=r"^serving.isl \+ serving.osl: 130561 \+ 512 tokens exceed llama-3.1-70b's "
                                        r"context window of 131072"):
        build_serving_context(_serving_cfg("serving.isl=130561", "serving.osl=512"))


def test_shard_sim_serving_exports_the_plans_launch(tmp_path, monkeypatch):
    """``export=`` was accepted and ignored by ``shard-sim workload=serving``; it now writes the launch that
    ``shard-search workload=serving`` writes for the same plan and target, and refuses what it cannot launch."""
    from planner.apps.serve import run_serving_sim

    monkeypatch.setattr("planner.apps.serve.run_dir", lambda: tmp_path)  # where run_serving_sim looks it up
    cfg = _serving_cfg("serving.plan.pool.tp=8", "serving.num_requests=16", "serving.concurrency=4",
                       "export=sglang")
    run_serving_sim(cfg)
    script = (tmp_path / "launch_sglang.sh").read_text()
    assert "sglang.launch_server" in script and "--tp-size 8" in script
    with pytest.raises(UserError, match="^export: 'megatron' is not a serving target"):
        run_serving_sim(_serving_cfg("serving.plan.pool.tp=8", "export=megatron"))
    with pytest.raises(UserError, match="^export: no released vLLM, SGLang or TensorRT-LLM re-shards"):
        run_serving_sim(_serving_cfg("serving.plan.mode=seesaw", "export=vllm"))


def test_a_static_batch_workload_field_typed_for_a_serving_run_is_refused(tmp_path):
    """``workload.ttft_slo_ms=500`` beside ``workload=serving`` was dropped: serving reads ``serving.*``."""
    proc = subprocess.run([sys.executable, "-c", ENTRY_SIM, "experiment=dense-70b-1node", "workload=serving",
                           "workload.ttft_slo_ms=500", f"hydra.run.dir={tmp_path}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("error: workload.ttft_slo_ms: not read under workload=serving (requests carry "
                                   "their own lengths and SLOs; set serving.ttft_slo_ms)"), proc.stderr


def test_typed_keys_outside_hydra_is_empty_so_pure_runs_keep_the_experiments_own_fields():
    from planner.apps.common import typed_keys
    from planner.apps.unread import check_typed_keys
    from planner.serving.config import build_serving_context

    assert typed_keys() == set()
    cfg = _serving_cfg()
    assert cfg.workload.tpot_slo_ms == 50  # the experiment's own, not the user's: not refused
    check_typed_keys(cfg, set(), "shard-sim")
    assert build_serving_context(cfg).workload.tpot_slo_s is None  # and not read: serving.* holds the SLOs


@pytest.mark.parametrize(("key", "needle"), [
    ("workload.input_len", "set serving.isl"), ("workload.tpot_slo_ms", "set serving.tpot_slo_ms"),
    ("strategy.tp", "serving.plan.* or plan=FILE"), ("sim.contention", "reads sim.routing.* alone"),
    ("planner.max_tp", "serving.search.*"), ("planner.batch", "serving.search.*")])
def test_a_static_runs_key_typed_for_a_serving_run_is_refused(key, needle):
    from planner.apps.unread import check_typed_keys

    with pytest.raises(UserError, match=rf"^{re.escape(key)}: not read under workload=serving \(.*{re.escape(needle)}"):
        check_typed_keys(_serving_cfg(), {"serving.isl", key}, "shard-sim")


def test_what_a_serving_run_reads_is_not_refused():
    from planner.apps.unread import check_typed_keys

    read = {"workload", "sim", "sim.routing.distribution", "serving.isl", "planner.name", "planner.population",
            "workload.precision", "model", "experiment", "seed", "serving.concurrency", "serving.search.tp"}
    check_typed_keys(_serving_cfg(), read, "shard-sim")  # a search's command line replays its plan with plan=
    check_typed_keys(_serving_cfg(), read, "shard-search")
    check_typed_keys(_serving_cfg("serving.plan.mode=disagg"), {"serving.plan.prefill.tp", "serving.plan.decode.tp"},
                     "shard-sim")
    check_typed_keys(_serving_cfg("serving.plan.mode=seesaw"), {"serving.plan.host_kv_bytes_per_gpu"}, "shard-sim")
    check_typed_keys(_serving_cfg("serving.spec_tokens=1"), {"serving.spec_accept"}, "shard-sim")
    check_typed_keys(_serving_cfg("serving.search.spec_tokens=[0,1]"), {"serving.spec_accept"}, "shard-search")


@pytest.mark.parametrize(("overrides", "key", "app", "needle"), [
    ((), "serving.plan.pool.tp", "shard-search", "shard-search searches the plan"),
    (("plan=p.yaml",), "serving.plan.pool.tp", "shard-sim", "plan=p.yaml gives the plan"),
    (("serving.plan.mode=disagg",), "serving.plan.pool.tp", "shard-sim", "serves with serving.plan.prefill and"),
    ((), "serving.plan.prefill.tp", "shard-sim", "serving.plan.mode=agg serves with serving.plan.pool"),
    ((), "serving.plan.host_kv_bytes_per_gpu", "shard-sim", "read only under serving.plan.mode=seesaw, got agg"),
    (("serving.rate=4",), "serving.concurrency", "shard-sim", "closed-loop clients are the arrivals only"),
    ((), "serving.spec_accept", "shard-search", "read only with serving.spec_tokens > 0")])
def test_a_serving_key_this_serving_run_does_not_read_is_refused(overrides, key, app, needle):
    from planner.apps.unread import check_typed_keys

    with pytest.raises(UserError, match=rf"^{re.escape(key)}: .*{re.escape(needle)}"):
        check_typed_keys(_serving_cfg(*overrides), {key}, app)


def test_a_serving_key_typed_for_a_static_run_is_refused():
    from hydra import compose, initialize_config_module

    import planner.apps.sim  # noqa: F401
    from planner.apps.unread import check_typed_keys

    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="sim", overrides=["experiment=dense-70b-1node"])
    check_typed_keys(cfg, {"strategy.tp", "sim.contention", "workload.input_len"}, "shard-sim")
    with pytest.raises(UserError, match=r"^serving.concurrency: read only under workload=serving, got workload.phase "
                                        r"decode$"):
        check_typed_keys(cfg, {"serving.concurrency", "strategy.tp"}, "shard-sim")


def _sim_cfg(*overrides: str):
    from hydra import compose, initialize_config_module

    import planner.apps.sim  # noqa: F401

    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="sim", overrides=["experiment=dense-70b-1node", *overrides])


def test_a_strategy_beside_a_plan_file_and_a_space_bound_beside_either_are_refused():
    from planner.apps.unread import check_typed_keys

    planned = _sim_cfg("plan=best_plan.yaml")
    with pytest.raises(UserError, match=r"^strategy.tp: plan=best_plan.yaml gives the strategy; pass one of"):
        check_typed_keys(planned, {"plan", "strategy.tp"}, "shard-sim")
    with pytest.raises(UserError, match=r"^planner.max_tp: bounds the Megatron search shard-sim runs only when"):
        check_typed_keys(planned, {"plan", "planner.max_tp"}, "shard-sim")
    with pytest.raises(UserError, match=r"^planner.batch: bounds the Megatron search"):
        check_typed_keys(_sim_cfg("strategy.tp=8"), {"strategy.tp", "planner.batch"}, "shard-sim")
    check_typed_keys(_sim_cfg("strategy.tp=8"), {"strategy.tp", "sim.contention"}, "shard-sim")  # both read
    check_typed_keys(_sim_cfg("planner.max_tp=4"), {"planner.max_tp"}, "shard-sim")  # bounds the Megatron search it runs


@pytest.mark.parametrize(("name", "field", "value", "readers"), [
    ("serving", "engine", "flow", "collectives"), ("collectives", "jobs", 2, "serving"),
    ("inference", "gpu", "h200", "kernels"), ("moe", "quick", True, "fidelity, rewrites, fabric"),
    ("rewrites", "strategies", 3, "fidelity"), ("kernels", "harness", "xla", "collectives")])
def test_a_study_field_the_chosen_study_does_not_read_is_refused(tmp_path, name, field, value, readers):
    cfg = OmegaConf.structured(ValidateAppConfig(study=StudyConfig(name=name, **{field: value})))
    with pytest.raises(UserError, match=rf"^study.{field}: study {name} does not read it \(read by: {readers}\)"):
        validate_run(cfg)


def test_every_study_field_is_read_by_some_study_and_a_studys_own_fields_pass():
    from dataclasses import fields

    from validation.apps.validate import READS, STUDIES, _check_read

    assert set(READS) == set(STUDIES)
    assert {f.name for f in fields(StudyConfig)} - {"name", "data"} == set().union(*READS.values())
    _check_read("kernels", OmegaConf.structured(StudyConfig(name="kernels", gpu="h200")))
    _check_read("fidelity", OmegaConf.structured(StudyConfig(name="fidelity", quick=True, strategies=3)))


def test_shard_report_names_a_file_given_for_its_directory(tmp_path):
    from validation.apps.report import ReportAppConfig
    from validation.apps.report import run as report_run

    (tmp_path / "x.csv").write_text("a\n")
    with pytest.raises(UserError, match=r"^dir: .*x.csv is a file, not a run directory$"):
        report_run(OmegaConf.structured(ReportAppConfig(dir=str(tmp_path / "x.csv"))))
    with pytest.raises(UserError, match=r"^dir: no such directory .*nothing$"):
        report_run(OmegaConf.structured(ReportAppConfig(dir=str(tmp_path / "nothing"))))
