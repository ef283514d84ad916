"""The serving study's row mapping (aiconfigurator's silicon_sample schema -> a serving plan) and its outputs."""

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.studies.serving import FIT_MODELS, duplicates, load_cases, run, split_of
from validation.studies.serving.mapping import map_row

_BASE = {"source_url": "x", "id": "row", "backend": "vllm", "backend_version": "0.12.0", "system": "h200_sxm",
         "precision": "fp8", "mode": "agg", "isl": "1000", "osl": "100", "gemm_quant_mode": "fp8",
         "moe_quant_mode": "fp8", "batch_size": "8", "pp_size": "1", "silicon_ttft_ms": "100",
         "silicon_tpot_ms": "10", "silicon_data_source": "source_file=a.csv; silicon_concurrency=8"}


_SAMPLE = Path(__file__).resolve().parents[1] / "validation" / "data" / "serving_h200_measured.csv"


def _row(**kw) -> dict:
    row = dict(_BASE)
    row.update({k: str(v) for k, v in kw.items()})
    return row


def _qwen_moe(**kw) -> dict:
    return _row(model_path="Qwen/Qwen3-235B-A22B-FP8", **kw)


def _write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_vllm_blank_attention_dp_is_the_moe_world_over_tp():
    case = map_row(_qwen_moe(tp_size=1, attention_dp_size="", moe_tp_size=2, moe_ep_size=1))
    assert not case.skip
    pool = case.plan.pool
    assert (pool.strategy.tp, pool.strategy.ep) == (1, 2)
    assert pool.max_num_seqs == 16  # vLLM's max_num_seqs is per data-parallel engine


@pytest.mark.parametrize("precision", ["fp16", "float16", "bf16"])
def test_sixteen_bit_precisions_map_to_bf16(precision):
    case = map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", precision=precision, tp_size=1,
                        gemm_quant_mode="float16", moe_quant_mode=""))
    assert not case.skip and case.ctx.workload.precision == "bf16"
    assert map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", precision="int8")).skip == \
        "precision: 'int8' is not modelled"


@pytest.mark.parametrize(("change", "reason"), [
    ({"isl": ""}, "isl: a length is needed"),
    ({"osl": "abc"}, "osl: 'abc' is not a number"),
    ({"tp_size": "x"}, "tp_size: 'x' is not a number"),
    ({"tp_size": "2.5"}, "tp_size: must be a whole number, got '2.5'"),
    ({"tp_size": "0"}, "tp_size: must be a positive number, got '0'"),
    ({"isl": "-5"}, "isl: must be a positive number, got '-5'"),
    ({"backend": "lmdeploy"}, "backend: 'lmdeploy' is not one of vllm, sglang, trtllm"),
    ({"mode": "both"}, "mode: 'both' is not one of agg, disagg"),
    ({"silicon_ttft_ms": ""}, "silicon_ttft_ms: '' is not a number"),
    ({"silicon_data_source": "silicon_concurrency=0"}, "silicon_data_source: silicon_concurrency must be >= 1"),
])
def test_a_row_with_a_bad_field_is_skipped_with_that_field_named(change, reason):
    case = map_row(_row(**{"model_path": "meta-llama/Llama-3.1-8B-Instruct", "tp_size": 1, **change}))
    assert case.skip.startswith(reason)


def test_lengths_and_degrees_written_as_floats_are_read():
    case = map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", isl="1000.0", osl="100.0", tp_size="2.0"))
    assert not case.skip and (case.isl, case.osl, case.plan.pool.strategy.tp) == (1000, 100, 2)


def test_the_study_survives_bad_rows(tmp_path):
    rows = [_row(id="good", model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, osl=20,
                 silicon_data_source="x; silicon_concurrency=2"),
            _row(id="bad", model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, silicon_ttft_ms="n/a")]
    summary = run(_write(tmp_path / "rows.csv", rows), tmp_path / "out", SimpleNamespace(jobs=1))
    assert summary["all"]["simulated"] == 1 and summary["skipped"] == {"silicon_ttft_ms: 'n/a' is not a number": 1}


def test_a_data_file_without_rows_is_an_error(tmp_path):
    data = tmp_path / "empty.csv"
    data.write_text(",".join([*_BASE, "model_path"]) + "\n")
    with pytest.raises(ValueError, match="holds no rows"):
        load_cases(data)


def test_explicit_attention_dp_that_disagrees_with_the_experts_is_skipped():
    case = map_row(_qwen_moe(tp_size=1, attention_dp_size=1, moe_tp_size=2, moe_ep_size=1))
    assert case.skip.startswith("layout: attention on tp1 x dp1 GPUs but experts on moe_tp2")


@pytest.mark.parametrize("backend", ["sglang", "trtllm"])
def test_blank_attention_dp_is_inferred_for_vllm_only(backend):
    case = map_row(_qwen_moe(backend=backend, tp_size=1, attention_dp_size="", moe_tp_size=2, moe_ep_size=1))
    assert case.skip.startswith("layout: attention on")


def test_disaggregated_row_without_worker_counts_is_skipped():
    row = _row(model_path="deepseek-ai/DeepSeek-R1", mode="disagg", backend="trtllm", batch_size="",
               **{f"{p}_{k}": v for p in ("prefill", "decode") for k, v in
                  (("tp_size", 8), ("pp_size", 1), ("attention_dp_size", 1), ("moe_tp_size", 1),
                   ("moe_ep_size", 8))})
    assert map_row(row).skip.startswith("layout: a disaggregated row without worker counts")
    row.update(prefill_num_workers="1", decode_num_workers="2")
    case = map_row(row)
    assert not case.skip and case.plan.gpus == 24


@pytest.mark.parametrize(("model", "tp", "moe_tp", "moe_ep"), [("deepseek-ai/DeepSeek-V3", 64, 8, 8),
                                                              ("openai/gpt-oss-120b", 16, 4, 4)])
def test_a_tp_degree_that_is_the_product_of_equal_expert_degrees_is_the_launch_tp_t_ep_t(model, tp, moe_tp, moe_ep):
    row = _row(model_path=model, backend="trtllm", tp_size=tp, attention_dp_size=1, moe_tp_size=moe_tp,
               moe_ep_size=moe_ep)
    case = map_row(row)  # InferenceX's `--tp T --ep T` on T GPUs (mapping module doc)
    assert not case.skip and case.plan.gpus == moe_ep and case.plan.pool.strategy.tp == moe_ep
    row.update(tp_size=str(moe_ep), moe_tp_size="1")  # the same deployment written plainly maps the same
    assert map_row(row).plan == case.plan



def test_a_product_layout_whose_compact_launch_cannot_hold_the_model_is_read_as_written():
    """tp 16 = 4 x 4 reads as `--tp 4 --ep 4` on 4 GPUs where those hold the model (gpt-oss above); for
    DeepSeek-V3 on H100s 4 GPUs cannot (320 GB for 671 GB of FP8 weights), so the row is the 16-GPU
    deployment it says: attention TP 16 over two nodes, which simulates."""
    from validation.studies.serving import simulate_case

    row = _row(model_path="deepseek-ai/DeepSeek-V3", backend="sglang", system="h100_sxm", tp_size=16,
               attention_dp_size=1, moe_tp_size=4, moe_ep_size=4, isl=1024, osl=16,
               silicon_data_source="x; silicon_concurrency=4")
    case = map_row(row)
    assert not case.skip, case.skip
    assert case.plan.gpus == 16 and case.plan.pool.strategy.tp == 16 and case.ctx.cluster.num_gpus == 16
    ttft, tpot, why = simulate_case(case)
    assert not why and ttft > 0 and tpot > 0
    row.update(system="h200_sxm")  # on H200s 4 GPUs cannot hold it either (564 GB): read as written too
    assert map_row(row).plan.gpus == 16
    row.update(tp_size="64", moe_tp_size="8", moe_ep_size="8")  # 8 H200s can: the compact launch
    assert map_row(row).plan.gpus == 8

def test_an_attention_dp_degree_that_is_the_product_of_equal_expert_degrees_is_dp_t_ep_t():
    row = _row(model_path="deepseek-ai/DeepSeek-V3", backend="trtllm", tp_size=1, attention_dp_size=64,
               moe_tp_size=8, moe_ep_size=8, batch_size=2)
    case = map_row(row)
    assert not case.skip and case.plan.gpus == 8 and case.plan.pool.strategy.ep == 8
    # the recorded batch size is per recorded rank: 64 ranks of 2 sequences (InferenceX's c128 rows)
    assert case.plan.pool.max_num_seqs == 128


@pytest.mark.parametrize("backend", ["sglang", "trtllm", "vllm"])
def test_the_recorded_batch_is_per_attention_dp_rank_for_every_backend(backend):
    # the sample's SGLang DP-attention decode pools: batch 8 on 8 DP ranks at 64 clients (cfg434 rows)
    row = _row(model_path="deepseek-ai/DeepSeek-V3", backend=backend, mode="disagg", batch_size="",
               prefill_num_workers=1, decode_num_workers=1, prefill_batch_size=1, decode_batch_size=8,
               **{f"{p}_{k}": v for p, layout in (("prefill", (8, 1, 8, 1)), ("decode", (1, 8, 1, 8)))
                  for k, v in zip(("tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"), layout,
                                  strict=True)})
    case = map_row(row)
    assert not case.skip
    assert case.plan.decode.max_num_seqs == 64 and case.plan.prefill.max_num_seqs == 1


def test_a_tp_degree_that_is_a_product_of_unequal_expert_degrees_is_skipped():
    row = _row(model_path="deepseek-ai/DeepSeek-V3", backend="trtllm", tp_size=32, attention_dp_size=1,
               moe_tp_size=4, moe_ep_size=8)
    assert map_row(row).skip.startswith("layout: tp_size 32 spans")


def test_the_harness_draws_lengths_as_the_measuring_client_did():
    from validation.studies.serving import RANGE_RATIO, REQUESTS_PER_CLIENT, serving_config

    case = map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, isl=1024, osl=100,
                        silicon_data_source="x; silicon_concurrency=16"))
    cfg = serving_config(case)
    assert REQUESTS_PER_CLIENT == 10  # InferenceX sends 10 x concurrency requests
    assert cfg.num_requests == REQUESTS_PER_CLIENT * 16 and cfg.arrival == "closed" and not cfg.stagger
    import numpy as np

    draws = cfg.input_len.draw(np.random.default_rng(0), 4000)
    assert draws.min() == int(RANGE_RATIO * 1024) and draws.max() == 1024  # floor(0.8 L) .. L
    assert cfg.output_len.low == 80 and cfg.output_len.high == 100


def test_unknown_model_and_system_are_skipped_with_why():
    assert map_row(_row(model_path="nobody/NoSuchModel-7B", tp_size=1)).skip.startswith("model: no preset")
    assert map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1,
                        system="mi300x")).skip.startswith("system:")


def test_split_is_by_model():
    assert split_of({"model_path": FIT_MODELS[0]}) == "fit"
    assert split_of({"model_path": "openai/gpt-oss-120b"}) == "test"


def test_no_measurement_of_the_shipped_sample_is_in_both_sets():
    """The sample lists DeepSeek-R1's runs under DeepSeek-V3 too: a split by model must not score the same
    measurement in the test set that the fit saw."""
    from validation.studies.serving.measurement import measurement_groups
    cases = load_cases(_SAMPLE)
    groups = measurement_groups([c.row for c in cases])
    assert all(len({split_of(cases[i].row) for i in g}) == 1 for g in groups)
    assert sum(bool(d) for d in duplicates(cases)) > 100  # the sample's repeats exist and are found


def test_the_sample_copies_rounded_to_a_hundredth_of_a_ms_are_found():
    """Qwen3.5-397B and Kimi-K2.5 are listed a third time, rounded to 0.01 ms (measurement module doc):
    each of those rows stands beside a full-precision copy of its run and is scored once."""
    cases = load_cases(_SAMPLE)
    dup = dict(zip((c.row["id"] for c in cases), duplicates(cases), strict=True))
    rounded = [c.row for c in cases if "gap-analysis.csv" in c.row["silicon_data_source"]]
    assert len(rounded) == 30
    by_id = {c.row["id"]: c.row for c in cases}
    for row in rounded:
        kept = by_id[dup[row["id"]]]  # a duplicate, of a full-precision row listed earlier
        assert "gap-analysis" not in kept["silicon_data_source"]
        assert all(abs(float(kept[f]) - float(row[f])) <= 0.005 for f in ("silicon_ttft_ms", "silicon_tpot_ms"))


def test_distinct_runs_of_the_sample_are_further_apart_than_a_rounded_copy():
    """What makes 0.01 ms copies safe to merge: no two distinct runs of one configuration in the shipped
    sample come within twice a rounded copy's 0.005 ms on both latencies (closest pair: 0.058 ms)."""
    from validation.studies.serving.measurement import measurement_groups, run_key
    rows = [c.row for c in load_cases(_SAMPLE)]
    firsts = [rows[g[0]] for g in measurement_groups(rows)]
    by_run: dict[tuple, list[dict]] = {}
    for row in firsts:
        by_run.setdefault(run_key(row), []).append(row)
    closest = min(max(abs(float(a[f]) - float(b[f])) for f in ("silicon_ttft_ms", "silicon_tpot_ms"))
                  for runs in by_run.values() for i, a in enumerate(runs) for b in runs[i + 1:])
    assert closest > 0.01


def test_duplicates_keep_the_first_simulable_row_and_ignore_float_noise():
    base = dict(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, attention_dp_size=1)
    rows = [_row(id="a", system="mi300x", **base), _row(id="b", **base),
            _row(id="c", silicon_ttft_ms="100.00000000000001", **base),
            _row(id="d", silicon_ttft_ms="100.1", **base), _row(id="e", isl=2000, **base)]
    cases = [map_row(r) for r in rows]
    assert cases[0].skip and not cases[1].skip
    assert duplicates(cases) == ["b", "", "b", "", ""]


def test_duplicates_read_a_rounded_copy_to_its_own_precision():
    """A copy written to 0.01 ms is the run it rounds; a full float 0.006 ms away, or a copy whose other
    latency differs, is another run."""
    base = dict(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, attention_dp_size=1)
    rows = [_row(id="full", silicon_ttft_ms="307.79067178664263", silicon_tpot_ms="10.08063544978878", **base),
            _row(id="rounded", silicon_ttft_ms="307.79", silicon_tpot_ms="10.08", **base),
            _row(id="near", silicon_ttft_ms="307.79667178664263", silicon_tpot_ms="10.08063544978878", **base),
            _row(id="other_tpot", silicon_ttft_ms="307.79", silicon_tpot_ms="10.09", **base)]
    assert duplicates([map_row(r) for r in rows]) == ["", "full", "", ""]


def test_run_scores_each_measurement_once(tmp_path):
    one = _row(id="x", model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, attention_dp_size=1,
               silicon_data_source="silicon_concurrency=4", isl=256, osl=16)
    summary = run(_write(tmp_path / "in.csv", [one, dict(one, id="y")]), tmp_path / "out", SimpleNamespace(jobs=1))
    out = list(csv.DictReader((tmp_path / "out" / "rows.csv").open()))
    assert [r["duplicate_of"] for r in out] == ["", "x"]
    assert out[1]["skipped_reason"] == "duplicate measurement" and out[1]["sim_ttft_ms"] == "nan"
    assert summary["all"] == {**summary["all"], "rows": 1, "simulated": 1}
    assert summary["duplicates"] == 1 and summary["simulated_share"] == 1.0 and summary["skipped"] == {}


def test_run_writes_rows_and_summary(tmp_path):
    rows = [_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, attention_dp_size=1,
                 silicon_data_source="silicon_concurrency=4", isl=256, osl=16),
            _row(model_path="nobody/NoSuchModel-7B", tp_size=1)]
    data = _write(tmp_path / "in.csv", rows)
    summary = run(data, tmp_path / "out", SimpleNamespace(jobs=2))
    out = list(csv.DictReader((tmp_path / "out" / "rows.csv").open()))
    assert [bool(r["skipped_reason"]) for r in out] == [False, True]
    assert float(out[0]["sim_ttft_ms"]) > 0 and float(out[0]["sim_tpot_ms"]) > 0
    assert summary["all"]["simulated"] == 1 and summary["simulated_share"] == 0.5
    assert summary["by_model"]["Llama-3.1-8B-Instruct vllm"]["simulated"] == 1
    assert summary["by_model"]["NoSuchModel-7B vllm"] == {**summary["by_model"]["NoSuchModel-7B vllm"], "simulated": 0}
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["test"]["rows"] == 1  # the 8B model is a fit model
    assert out[0]["clients"] == "4" and summary["fit_by_load"]["1-8 clients"]["simulated"] == 1
    assert summary["fit_by_model_and_load"]["Llama-3.1-8B-Instruct vllm, 1-8 clients"]["simulated"] == 1
    assert summary["fit_by_load"]["1-8 clients"]["median_signed_tpot_error"] == pytest.approx(
        float(out[0]["tpot_rel_error"]))
    run(data, tmp_path / "one", SimpleNamespace(jobs=1))  # worker processes change nothing
    assert (tmp_path / "one" / "rows.csv").read_text() == (tmp_path / "out" / "rows.csv").read_text()


@pytest.mark.parametrize("version, profile", [("0.18.0", "vllm"), ("0.14.1", "vllm"), ("0.12.0", "vllm-sync"),
                                              ("", "vllm-sync")])
def test_vllm_before_async_scheduling_default_is_the_sync_profile(version, profile):
    case = map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, backend_version=version))
    assert case.runtime == profile
    assert map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, backend="sglang")).runtime == "sglang"


def test_vllm_profiles_differ_only_in_host_overlap():
    from simcore.serving import get_runtime

    sync, overlapped = get_runtime("vllm-sync"), get_runtime("vllm")
    assert not sync.overlap_host and overlapped.overlap_host
    assert overlapped.with_overrides(overlap_host=False, name="vllm-sync") == sync


def test_four_bit_experts_on_hopper_run_weight_only_in_bf16():
    case = map_row(_row(model_path="openai/gpt-oss-120b", backend="trtllm", precision="fp4", tp_size=1,
                        attention_dp_size=1, moe_tp_size=1, moe_ep_size=1))
    assert not case.skip
    # 4 bits plus an 8-bit E8M0 scale per 32 weights: the MXFP4 checkpoint's, though the row says nvfp4
    assert (case.ctx.workload.precision, case.ctx.workload.expert_weight_bytes) == ("bf16", 0.53125)
    assert map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", precision="fp4",
                        tp_size=1)).skip.startswith("precision: fp4 weights on a dense model")


def test_the_harness_launch_flags_apply_to_its_own_lengths_only():
    from validation.studies.serving import simulate_case
    from validation.studies.serving.launch import launch_flags

    row = _row(model_path="deepseek-ai/DeepSeek-V3", backend="sglang", tp_size=8, attention_dp_size=1,
               moe_tp_size=8, moe_ep_size=1, isl=8192, osl=1024, batch_size=4,
               silicon_data_source="x; silicon_concurrency=4")
    case = map_row(row)
    assert case.launch == launch_flags("sglang", case.model, 8192, 1024, 4)
    assert case.launch["max_num_batched_tokens"] == 32768  # dsr1_fp8_h200.sh --chunked-prefill-size
    assert launch_flags("trtllm", "deepseek-r1", 8192, 1024, 64)["max_num_batched_tokens"] == 8192 + 64 + 64
    assert launch_flags("sglang", "deepseek-v3", 8000, 1000, 4) == {}  # not one of the harness's runs
    # the flags change the simulation: the same row on the profile's defaults differs
    plain = map_row(row)
    plain.launch = {}
    assert simulate_case(case)[0] != simulate_case(plain)[0]


def test_gpt_oss_on_tensorrt_llm_prices_its_triton_moe_backend_with_the_triton_kernel_constants():
    """TensorRT-LLM runs MXFP4 experts on Hopper through its Triton MoE backend whatever the launch
    (simcore.serving.deployment.moe_kernels): the MoE block takes the Triton kernels' constants fitted on
    their published timings (the prefill-size pair profile vllm holds, the decode-size pair of
    ``fit_moe_kernels --decode``), not vLLM's serving-fitted decode pair. On H100 and H200 alike, at the
    harness's lengths and at others; not on Blackwell, not for DeepSeek's FP8 experts, not on vLLM."""
    from simcore.serving import get_runtime
    from simcore.serving.deployment.moe_kernels import (
        TRITON_FUSED_MOE_DECODE,
        TRITON_MOE_FIELDS,
        moe_kernel_fields,
        triton_moe_fields,
    )

    vllm, trt = get_runtime("vllm"), get_runtime("trtllm")
    fields = triton_moe_fields()
    assert set(fields) == set(TRITON_MOE_FIELDS)
    assert {f: fields[f] for f in ("moe_gemm_efficiency", "moe_fp8_at_bf16_rate")} == {
        "moe_gemm_efficiency": vllm.moe_gemm_efficiency, "moe_fp8_at_bf16_rate": vllm.moe_fp8_at_bf16_rate}
    assert {f: fields[f] for f in ("moe_memory_efficiency", "moe_layer_s")} == TRITON_FUSED_MOE_DECODE
    assert trt.moe_gemm_efficiency != vllm.moe_gemm_efficiency  # so the kernel choice changes the model
    assert (vllm.moe_memory_efficiency, vllm.moe_layer_s) != tuple(TRITON_FUSED_MOE_DECODE.values())
    assert moe_kernel_fields("trtllm", "mxfp4", "h100-sxm") == moe_kernel_fields("trtllm", "mxfp4", "h200") == fields
    assert moe_kernel_fields("trtllm", "mxfp4", "b200") == {}
    assert moe_kernel_fields("trtllm", None, "h200") == moe_kernel_fields("trtllm", "int4_g32", "h200") == {}
    assert moe_kernel_fields("vllm", "mxfp4", "h200") == {}

    gpt_oss = {"model_path": "openai/gpt-oss-120b", "precision": "fp4", "moe_quant_mode": "nvfp4", "backend": "trtllm",
               "tp_size": 4, "moe_tp_size": 4, "moe_ep_size": 1, "batch_size": 16, "attention_dp_size": 1,
               "silicon_data_source": "x; silicon_concurrency=16"}
    for system in ("h200_sxm", "h100_sxm"):
        for isl, osl in ((1024, 1024), (1000, 1000)):  # a harness run, and one of aiconfigurator's own
            case = map_row(_row(**gpt_oss, system=system, isl=isl, osl=osl))
            assert not case.skip, case.skip
            assert {f: case.launch[f] for f in TRITON_MOE_FIELDS} == fields, (system, isl)
    deepseek = map_row(_row(model_path="deepseek-ai/DeepSeek-V3", backend="trtllm", precision="fp8", tp_size=8,
                            moe_tp_size=8, moe_ep_size=1, batch_size=16, attention_dp_size=1, isl=1024, osl=1024,
                            silicon_data_source="x; silicon_concurrency=16"))
    assert not deepseek.skip, deepseek.skip
    assert not set(TRITON_MOE_FIELDS) & set(deepseek.launch)


def test_the_triton_decode_constants_are_what_the_kernel_fit_chooses_on_the_shipped_timings():
    """TRITON_FUSED_MOE_DECODE is the grid point ``python -m validation.studies.moe.fit_kernels --decode`` picks on
    the shipped fused_moe timings (fit rows only, <= 64 tokens): change the data and this fails."""
    from simcore.serving.deployment.moe_kernels import TRITON_FUSED_MOE_DECODE
    from validation.studies.moe import fit_kernels as fit_moe_kernels

    rows = [r for r in fit_moe_kernels.load_rows(fit_moe_kernels._DATA) if r["tokens"] <= 64]
    fit = fit_moe_kernels.fit_decode(rows)
    assert {f: fit[f] for f in TRITON_FUSED_MOE_DECODE} == pytest.approx(TRITON_FUSED_MOE_DECODE, abs=1e-12)
    assert fit["median_abs_log_error"] < 0.1


def test_qwen35_on_sglang_keeps_the_recurrent_state_in_the_dtype_its_launch_sets():
    """qwen3.5_fp8_h200.sh passes ``--mamba-ssm-dtype bfloat16``: the harness's rows simulate a BF16
    Gated DeltaNet state (half the memory and decode traffic), other lengths keep the config's FP32."""
    from validation.studies.serving.launch import launch_model_fields

    def case(isl):
        return map_row(_row(model_path="Qwen/Qwen3.5-397B-A17B", backend="sglang", tp_size=8, attention_dp_size=1,
                            moe_tp_size=1, moe_ep_size=8, isl=isl, osl=1024, batch_size=4, precision="fp8",
                            silicon_data_source="x; silicon_concurrency=4"))

    harness, other = case(1024), case(1000)
    assert launch_model_fields("sglang", harness.model, 1024, 1024) == {"linear_state_bytes": 2}
    assert harness.ctx.model.linear_state_bytes == 2 and other.ctx.model.linear_state_bytes == 4
    assert launch_model_fields("vllm", harness.model, 1024, 1024) == {}


def _harness_row(system: str, **kw) -> dict:
    return _row(**{"system": system, "isl": 1024, "osl": 8192, "batch_size": 64, "attention_dp_size": 1,
                   "silicon_data_source": "x; silicon_concurrency=64", **kw})


def test_an_h100_row_takes_the_flags_of_the_h100_script_that_ran_it():
    """InferenceX launches H100 runs with ``*_h100.sh``: MiniMax-M2.5 on vLLM at 0.90 of the GPU's memory
    (0.95 on H200), gpt-oss on vLLM as on H200; for a runtime and model with no H100 script (DeepSeek on
    SGLang or TensorRT-LLM, gpt-oss on TensorRT-LLM, GLM-5, Qwen3.5) no H200 flag carries over."""
    from simcore.serving.deployment.moe_kernels import triton_moe_fields
    from validation.studies.serving.launch import launch_flags, launch_model_fields, requests_per_client

    def launch(system, **kw):
        case = map_row(_harness_row(system, **kw))
        assert not case.skip, case.skip
        return case

    minimax = {"model_path": "MiniMaxAI/MiniMax-M2.5", "backend_version": "0.16.0", "tp_size": 4, "moe_tp_size": 4,
               "moe_ep_size": 1}
    assert launch("h200_sxm", **minimax).launch == {"mem_fraction": 0.95}
    assert launch("h100_sxm", **minimax).launch == {"mem_fraction": 0.90}
    gpt_oss = {"model_path": "openai/gpt-oss-120b", "precision": "fp4", "tp_size": 2, "moe_tp_size": 2,
               "moe_ep_size": 1}
    assert launch("h100_sxm", **gpt_oss).launch == launch("h200_sxm", **gpt_oss).launch != {}
    # no H100 script: only the runtime's own MoE kernels for MXFP4 on Hopper (deployment.moe_kernels), no H200 flag
    assert launch("h100_sxm", **gpt_oss, backend="trtllm").launch == triton_moe_fields()
    assert launch_flags("trtllm", "gpt-oss-120b", 1024, 1024, 16, tp=4, system="h200_sxm") != {}
    for backend in ("sglang", "trtllm"):
        assert launch_flags(backend, "deepseek-r1", 1024, 1024, 16, system="h200_sxm") != {}
        assert launch_flags(backend, "deepseek-r1", 1024, 1024, 16, system="h100_sxm") == {}
    assert launch_model_fields("sglang", "qwen3.5-397b-a17b", 1024, 1024, "h200_sxm") == {"linear_state_bytes": 2}
    assert launch_model_fields("sglang", "qwen3.5-397b-a17b", 1024, 1024, "h100_sxm") == {}
    assert requests_per_client("sglang", "glm-5", 1024, 1024, "h200_sxm") == 5
    assert requests_per_client("sglang", "glm-5", 1024, 1024, "h100_sxm") == 10
    # a system none of the harness's scripts names keeps the defaults
    assert launch_flags("vllm", "gpt-oss-120b", 1024, 1024, 4, system="b200_sxm") == {}


def test_the_h100_memory_share_changes_what_minimax_holds():
    """The flag is not inert: 0.90 of an 80 GB H100 leaves MiniMax-M2.5 on 4 GPUs a smaller KV cache than 0.95."""
    from simcore.serving import get_runtime
    from simcore.serving.kvcache import kv_capacity_tokens

    case = map_row(_harness_row("h100_sxm", model_path="MiniMaxAI/MiniMax-M2.5", backend_version="0.16.0",
                                tp_size=4, moe_tp_size=4, moe_ep_size=1))
    strategy = case.plan.pool.strategy
    runtime = get_runtime(case.runtime)
    held = kv_capacity_tokens(case.ctx, strategy, runtime.with_overrides(**case.launch))
    more = kv_capacity_tokens(case.ctx, strategy, runtime.with_overrides(mem_fraction=0.95))
    assert 0 < held < more


@pytest.mark.parametrize(("model", "backend", "layout"), [
    ("nvidia/Llama-3.3-70B-Instruct-FP8", "trtllm", {"tp_size": 4}),
    ("Qwen/Qwen3-32B", "sglang", {"tp_size": 2}),
    ("Qwen/Qwen3-30B-A3B-FP8", "vllm", {"tp_size": 1, "moe_tp_size": 1}),
    ("openai/gpt-oss-120b", "vllm", {"precision": "fp4", "tp_size": 2, "moe_tp_size": 2}),
    ("deepseek-ai/DeepSeek-R1", "trtllm", {"tp_size": 1, "attention_dp_size": 16, "moe_ep_size": 16, "batch_size": 1}),
])
def test_h100_rows_of_each_family_map_and_simulate(model, backend, layout):
    """The hold-out's system (h100_sxm): a row of each family maps to a plan that fits the 80 GB GPUs
    (DeepSeek-R1 on two nodes) and simulates to finite TTFT and TPOT."""
    from validation.studies.serving import simulate_case

    row = _row(**{"model_path": model, "backend": backend, "system": "h100_sxm", "isl": 1024, "osl": 32,
                  "silicon_data_source": "x; silicon_concurrency=4", **layout})
    case = map_row(row)
    assert not case.skip, case.skip
    ttft, tpot, why = simulate_case(case)
    assert not why and 0 < ttft < 60 and 0 < tpot < 1


@pytest.mark.parametrize("clients, band", [("1", "1-8 clients"), ("8", "1-8 clients"), ("9", "9-32 clients"),
                                           ("32", "9-32 clients"), ("33", "33+ clients"), ("", "unknown clients")])
def test_load_bands_split_at_8_and_32_clients(clients, band):
    from validation.studies.serving import _load

    assert _load({"clients": clients}) == band


def test_every_shipped_row_relabelled_h100_maps_and_holds_less_kv_cache():
    """The hold-out's kind of row, without reading it: every shipped H200 row with its ``system`` set to
    ``h100_sxm`` maps as on H200 (the same skips, the same plan but where the H200 reading's GPUs cannot hold
    the weights), and each pool of each mapped row holds a
    KV cache no larger than on the H200 (80 GB against 141 GB), none where its weights alone exceed the
    H100's share. A mapping that raised, read an H100 row's layout differently, or sized its memory from
    the wrong GPU would fail here. (The full study on that relabelled file simulates 533 of 760
    measurements; every skip is a layout without worker counts or weights that leave no KV cache:
    validation/reports/serving/history.md.)"""
    from simcore.serving.kvcache import kv_capacity_tokens
    from validation.studies.serving import case_runtime

    data = Path(__file__).resolve().parents[1] / "validation" / "data" / "serving_h200_measured.csv"
    with open(data, newline="") as handle:
        rows = list(csv.DictReader(handle))
    h200 = [map_row(r) for r in rows]
    h100 = [map_row({**r, "system": "h100_sxm"}) for r in rows]
    assert [c.skip for c in h100] == [c.skip for c in h200]
    smaller, none_left, reread = 0, 0, 0
    for a, b in zip(h200, h100, strict=True):
        if a.skip:
            continue
        assert b.ctx.cluster.gpu.name == "h100-sxm" and a.ctx.cluster.gpu.name != "h100-sxm"
        if [(r, p.strategy, p.workers) for r, p in b.plan.pools] != [(r, p.strategy, p.workers) for r, p in a.plan.pools]:
            # only the one reading that depends on the GPU: tp T = moe_tp x moe_ep on T GPUs where they hold
            # the weights, else as written, on more GPUs (test_h100_rows_of_each_family_map_and_simulate)
            assert b.plan.gpus > a.plan.gpus, a.row["id"]
            reread += 1
            continue
        for (_, pa), (_, pb) in zip(a.plan.pools, b.plan.pools, strict=True):
            kv_a = kv_capacity_tokens(a.ctx, pa.strategy, case_runtime(a))
            kv_b = kv_capacity_tokens(b.ctx, pb.strategy, case_runtime(b))
            assert kv_b < kv_a, (a.row["id"], kv_a, kv_b)
            smaller += 1
            none_left += kv_b <= 0
    assert smaller > 700 and 0 < none_left < smaller and reread < 100



# ----------------------------------------------------------------- coverage of the format (mapping)
_SIXTEEN = {"precision": "", "gemm_quant_mode": "", "moe_quant_mode": "", "tp_size": 1}


@pytest.mark.parametrize(("model", "precision", "expert_bytes"), [
    ("Qwen/Qwen3-32B", "bf16", 0.0),  # config.json torch_dtype bfloat16
    ("meta-llama/Llama-3.1-8B-Instruct", "bf16", 0.0),
    ("Qwen/Qwen3-32B-FP8", "fp8", 0.0),  # the id names an FP8 checkpoint
    ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "fp8", 0.0),
    ("deepseek-ai/DeepSeek-R1", "fp8", 0.0),  # quantization_config fp8 over torch_dtype bfloat16
    ("openai/gpt-oss-120b", "bf16", 0.53125),  # MXFP4 experts, weight-only on Hopper
])
def test_a_blank_precision_is_the_checkpoints_own_dtype(model, precision, expert_bytes):
    tp = 8 if "DeepSeek" in model else 4 if "70B" in model or "gpt-oss" in model else 1
    row = _row(model_path=model, backend="sglang", **{**_SIXTEEN, "tp_size": tp},
               **({"moe_tp_size": tp, "moe_ep_size": 1} if "DeepSeek" in model or "gpt-oss" in model else {}))
    case = map_row(row)
    assert not case.skip, case.skip
    assert case.ctx.workload.precision == precision
    assert case.ctx.workload.expert_weight_bytes == pytest.approx(expert_bytes) or not expert_bytes


@pytest.mark.parametrize(("change", "reason"), [
    ({"precision": "", "gemm_quant_mode": "fp8"}, "gemm_quant_mode: 'fp8' is not modelled with bf16 weights "
                                                  "(precision blank: the checkpoint's own)"),
    ({"precision": "fp8", "gemm_quant_mode": "sq"}, "gemm_quant_mode: 'sq' is not modelled with fp8 weights"),
    ({"precision": "fp8", "gemm_quant_mode": "int8_wo"}, "gemm_quant_mode: 'int8_wo'"),
    ({"precision": "bf16", "gemm_quant_mode": "fp8"}, "gemm_quant_mode: 'fp8' is not modelled with bf16 weights"),
    ({"precision": "int8"}, "precision: 'int8' is not modelled"),
    ({"backend_version": "nightly"}, "backend_version: 'nightly' is not a vLLM release the model knows"),
])
def test_a_precision_quantization_or_version_the_model_does_not_know_is_skipped_naming_it(change, reason):
    case = map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, **change))
    assert case.skip.startswith(reason) and "\n" not in case.skip


def test_an_moe_quant_mode_the_model_does_not_price_is_skipped_and_a_known_one_is_read():
    assert map_row(_qwen_moe(tp_size=4, moe_tp_size=4, moe_ep_size=1, moe_quant_mode="w4afp8")).skip.startswith(
        "moe_quant_mode: 'w4afp8' is not modelled with fp8 weights")
    assert not map_row(_qwen_moe(tp_size=4, moe_tp_size=4, moe_ep_size=1, moe_quant_mode="fp8_block")).skip
    # a dense model's rows carry an MoE label the model never reads
    assert not map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, moe_quant_mode="w4afp8")).skip


def test_a_preset_without_a_stated_dtype_and_a_blank_precision_is_skipped(monkeypatch):
    import dataclasses

    from validation.studies.serving import mapping

    real = mapping.get_model
    monkeypatch.setattr(mapping, "get_model", lambda name: dataclasses.replace(real(name), checkpoint_dtype=""))
    case = map_row(_row(model_path="Qwen/Qwen3-32B", **_SIXTEEN))
    assert case.skip.startswith("precision: blank, and neither the id 'Qwen/Qwen3-32B' nor preset qwen3-32b")


def test_runtime_labels_that_name_no_release_are_read_only_where_the_mapping_ignores_them():
    """SGLang's and TensorRT-LLM's profiles price every release alike (the sample's ``glm5-hopper``,
    ``gpt-oss-dev`` builds); vLLM's release picks its profile, so a label naming none is skipped."""
    assert not map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, backend="sglang",
                            backend_version="glm5-hopper")).skip
    assert map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, backend_version="")).runtime \
        == "vllm-sync"


def test_a_row_without_silicon_concurrency_runs_its_batch_and_says_so():
    no_clients = {"silicon_data_source": "source_file=sweep.csv"}
    case = map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, batch_size=16, **no_clients))
    assert not case.skip and case.concurrency == 16 and case.notes == ("concurrency_from_batch",)
    # batch_size is per attention-DP rank: 2 ranks of 8 run 16 sequences
    case = map_row(_qwen_moe(tp_size=2, attention_dp_size=2, moe_tp_size=1, moe_ep_size=4, batch_size=8, **no_clients))
    assert not case.skip and case.concurrency == 16 == case.plan.pool.max_num_seqs
    assert map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, batch_size="", **no_clients)).skip \
        == "silicon_data_source: no silicon_concurrency=N, and no batch_size to read the clients from"
    assert not map_row(_row(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1)).notes  # counted: no note


def test_a_disaggregated_row_without_clients_keeps_its_worker_reason_first():
    row = _row(model_path="deepseek-ai/DeepSeek-R1", mode="disagg", backend="trtllm", batch_size="",
               silicon_data_source="source_file=sweep.csv",
               **{f"{p}_{k}": v for p in ("prefill", "decode") for k, v in
                  (("tp_size", 8), ("pp_size", 1), ("attention_dp_size", 1), ("moe_tp_size", 1), ("moe_ep_size", 8),
                   ("batch_size", 8))})
    assert map_row(row).skip.startswith("layout: a disaggregated row without worker counts")
    row.update(prefill_num_workers="1", decode_num_workers="1")
    assert map_row(row).skip.startswith("silicon_data_source: no silicon_concurrency=N (a disaggregated row")


def test_the_study_writes_the_batch_concurrency_note(tmp_path):
    row = _row(id="b", model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1, attention_dp_size=1, batch_size=2,
               silicon_data_source="source_file=sweep.csv", isl=128, osl=8)
    summary = run(_write(tmp_path / "in.csv", [row]), tmp_path / "out", SimpleNamespace(jobs=1))
    out = list(csv.DictReader((tmp_path / "out" / "rows.csv").open()))
    assert out[0]["notes"] == "concurrency_from_batch" and out[0]["clients"] == "2" and not out[0]["skipped_reason"]
    assert summary["concurrency_from_batch"] == 1
