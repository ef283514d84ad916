"""The serving study's ``command`` column reruns its rows with the product, ``shard-sim workload=serving``.

The study writes, beside each simulated row, the command line that simulates it again
(``validation.studies.serving.command``); a sample of rows of the three runtimes, dense and MoE models,
is run through the app and must give the study's ``sim_ttft_ms`` and ``sim_tpot_ms``. The deployment
fields those commands use (``serving.runtime_version``, ``serving.expert_format``, ``serving.kv_dtype``, the
launch flags) are checked here too, each against the setting of ``simcore.serving.deployment`` it maps onto.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest
from conftest import run_app, write_rows

from planner.errors import UserError
from planner.serving.config import build_serving_config, build_serving_context
from simcore.models.quantization import EXPERT_FORMATS, FORMAT_BYTES, checkpoint_expert_format
from simcore.serving.deployment.versions import DEEPGEMM_BLOCK_ROWS
from validation.studies.serving import harness_lengths, run

_SAMPLE = Path(__file__).resolve().parents[1] / "validation" / "data" / "serving_h200_measured.csv"

#: (backend, model, version, clients) of the rows run: vLLM gpt-oss (MXFP4 experts held in Marlin's padding,
#: a versioned release), TensorRT-LLM gpt-oss (its Triton MoE kernels), SGLang DeepSeek-V3 (the harness's
#: flags), vLLM Llama-3.1-70B (dense, unversioned: vllm-sync, FP8 KV flag), vLLM 0.12 Qwen3-235B (the
#: release's DeepGEMM MoE default)
_PICKS = [("vllm", "openai/gpt-oss-120b", "0.18.0", "4"), ("trtllm", "openai/gpt-oss-120b", "", "4"),
          ("sglang", "deepseek-ai/DeepSeek-V3", "0.5.9", "4"), ("vllm", "meta-llama/Llama-3.1-70B", "", "4"),
          ("vllm", "Qwen/Qwen3-235B-A22B-FP8", "0.12.0", "8")]


def _pick(rows: list[dict], backend: str, model: str, version: str, clients: str) -> dict:
    return next(r for r in rows if (r["backend"], r["model_path"], r["backend_version"]) == (backend, model, version)
                and f"silicon_concurrency={clients};" in r["silicon_data_source"] + ";")


@pytest.fixture(scope="module")
def study_rows(tmp_path_factory) -> list[dict]:
    """The study's rows.csv over the picked rows, one each."""
    with _SAMPLE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = tmp_path_factory.mktemp("study")
    run(write_rows(out / "picked.csv", [_pick(rows, *p) for p in _PICKS]), out)
    with (out / "rows.csv").open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("index", range(len(_PICKS)), ids=[f"{b}-{m.split('/')[1]}" for b, m, _, _ in _PICKS])
def test_the_command_column_reruns_the_row_with_shard_sim(study_rows, index, tmp_path):
    row = study_rows[index]
    assert not row["skipped_reason"] and row["command"].startswith("shard-sim workload=serving "), row
    args = shlex.split(row["command"])
    proc = run_app("sim", *args[1:], f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "result.json").read_text())["result"]["metrics"]
    assert metrics["ttft_ms"]["mean"] == pytest.approx(float(row["sim_ttft_ms"]), rel=5e-3)
    assert metrics["tpot_ms"]["mean"] == pytest.approx(float(row["sim_tpot_ms"]), rel=5e-3)


def test_commands_carry_the_rows_deployment(study_rows):
    """Each setting the study mapped is spelled out: the release, the formats, the harness's flags."""
    commands = {(r["backend"], r["model_path"]): r["command"] for r in study_rows}
    gpt_oss = commands[("vllm", "openai/gpt-oss-120b")]
    assert "serving.runtime=vllm serving.runtime_version=0.18.0" in gpt_oss
    assert "workload.precision=bf16" in gpt_oss and "serving.expert_format=mxfp4" in gpt_oss
    assert "serving.max_num_batched_tokens=8192" in gpt_oss and "serving.cuda_graph_max_bs=2048" in gpt_oss
    assert "serving.runtime=vllm-sync" in commands[("vllm", "meta-llama/Llama-3.1-70B")]  # no version: the old runs
    assert "serving.kv_dtype=fp8" in commands[("vllm", "meta-llama/Llama-3.1-70B")]  # the harness's flag
    assert "serving.runtime_version=0.12.0" in commands[("vllm", "Qwen/Qwen3-235B-A22B-FP8")]
    assert "serving.range_ratio=0.8" in gpt_oss and "serving.num_requests=40" in gpt_oss


def _compose(*overrides):
    from hydra import compose, initialize_config_module

    import planner.apps.sim  # noqa: F401  (registers sim_schema, the config group the sim app composes over)

    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="sim", overrides=["topology=h200-ib-rail", "topology.num_nodes=1",
                                                     "workload=serving", *overrides])


def _built(*overrides):
    cfg = _compose(*overrides)
    return build_serving_config(cfg.serving, model=cfg.model.name), build_serving_context(cfg)


def test_runtime_version_picks_the_releases_profile():
    assert _built("serving.runtime_version=0.12.0")[0].runtime_profile().name == "vllm-sync"
    assert _built("serving.runtime_version=0.14.1")[0].runtime_profile().name == "vllm"
    assert _built()[0].runtime_profile().name == "vllm"  # no release: the profile as it is
    assert not _built("serving.runtime_version=0.16.0", "serving.async_scheduling=false")[0] \
        .runtime_profile().overlap_host


def test_launch_flags_set_the_profile_fields():
    scfg, _ = _built("serving.max_num_batched_tokens=16384", "serving.cuda_graph_max_bs=128",
                     "serving.deep_gemm_moe=true", "serving.mem_fraction=0.8")
    p = scfg.runtime_profile()
    assert (p.max_num_batched_tokens, p.graph_max_tokens, p.moe_padded_rows, p.mem_fraction) == \
        (16384, 128, DEEPGEMM_BLOCK_ROWS, 0.8)
    trt = _built("serving.runtime=trtllm", "serving.batch_wait_timeout_iters=20",
                 "serving.attention_dp_balance=true")[0].runtime_profile()
    assert trt.batch_wait_timeout_iters == 20 and trt.attention_dp_balance
    with pytest.raises(UserError, match=r"^serving.batch_wait_timeout_iters: a TensorRT-LLM setting"):
        _built("serving.batch_wait_timeout_iters=20")


def test_expert_format_null_is_the_checkpoints():
    assert checkpoint_expert_format("gpt-oss-120b") == "mxfp4"  # the shipped config.json's quantization_config
    assert checkpoint_expert_format("moonshotai/Kimi-K2.5") == "int4_g32"  # a published id the table names
    assert checkpoint_expert_format("deepseek-v3") is None and checkpoint_expert_format("llama-3.1-8b") is None
    scfg, ctx = _built("model=gpt-oss-120b", "workload.precision=bf16")
    assert ctx.workload.expert_weight_bytes == FORMAT_BYTES["mxfp4"] and scfg.deployment.expert_format == "mxfp4"
    _, fp8 = _built("model=gpt-oss-120b", "workload.precision=bf16", "serving.expert_format=fp8")
    assert fp8.workload.expert_weight_bytes == EXPERT_FORMATS["fp8"]
    _, dense = _built("model=deepseek-v3")
    assert dense.workload.expert_weight_bytes is None  # FP8 experts at workload.precision


def test_kv_dtype_null_is_the_runtimes_choice_at_its_release():
    def kv(*o):
        return _built("model=nvidia/Llama-3.1-8B-Instruct-FP8", "workload.precision=fp8", *o)[1].workload.kv_precision

    assert kv("serving.runtime_version=0.12.0") == "bf16"  # vLLM follows ModelOpt's FP8 KV from v0.13
    assert kv("serving.runtime_version=0.13.0") == "fp8"
    assert kv("serving.kv_dtype=bf16", "serving.runtime_version=0.13.0") == "bf16"
    assert _built("model=deepseek-v3", "workload.precision=fp8")[1].workload.kv_precision == "bf16"  # block FP8
    with pytest.raises(UserError, match=r"^serving.kv_dtype: 'fp8' differs from workload.kv_precision"):
        _built("serving.kv_dtype=fp8", "workload.kv_precision=bf16")


def test_range_ratio_draws_the_harness_lengths():
    scfg, _ = _built("serving.isl=1024", "serving.osl=8192", "serving.range_ratio=0.8")
    assert (scfg.input_len, scfg.output_len) == (harness_lengths(1024, "serving.isl"),
                                                 harness_lengths(8192, "serving.osl"))
    with pytest.raises(UserError, match=r"^serving.range_ratio must be in"):
        _built("serving.range_ratio=0")


@pytest.mark.parametrize(("override", "message"), [
    ("serving.expert_format=fp3", "error: serving.expert_format: unknown format 'fp3'"),
    ("serving.runtime_version=nightly", "error: serving.runtime_version: 'nightly' is not a release"),
])
def test_an_unknown_format_or_release_is_one_line_exit_2(tmp_path, override, message):
    proc = run_app("sim", "workload=serving", override, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(message), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
