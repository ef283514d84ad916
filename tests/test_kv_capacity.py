"""`python -m validation.studies.serving.kv_capacity`: the simulator's KV-cache size against the runtimes' start-up logs."""

import csv

import pytest

from simcore.serving import get_runtime
from simcore.serving.kvcache import kv_capacity_tokens
from validation.studies.common.cli import BadInput
from validation.studies.serving import case_runtime
from validation.studies.serving import kv_capacity as kc
from validation.studies.serving.mapping import map_row

_HEAD = ["source_url", "runtime", "runtime_version", "system", "model_path", "weights_precision", "kv_cache_dtype",
         "tp_size", "pp_size", "dp_size", "expert_parallel", "memory_fraction", "max_num_batched_tokens",
         "max_model_len", "max_num_seqs", "logged_weights_gib", "logged_kv_memory_gib", "logged_kv_tokens",
         "logged_gpu_blocks", "block_size", "quote"]


def _row(**changes) -> dict:
    row = dict.fromkeys(_HEAD, "")
    row |= {"source_url": "https://example.org/log", "runtime": "vllm", "runtime_version": "0.11.0",
            "system": "h100_sxm", "model_path": "meta-llama/Llama-3.1-70B-Instruct", "weights_precision": "fp8",
            "tp_size": "4", "logged_kv_tokens": "500000", "quote": "GPU KV cache size: 500,000 tokens"}
    return row | changes


def _write(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=_HEAD)
        w.writeheader()
        w.writerows(rows)
    return path


def _serving_row(runtime: str, model: str, tp: int, system: str) -> dict:
    """A serving-schema row of the same runtime, model and layout, at lengths no harness flag applies to."""
    return {"backend": runtime, "backend_version": "0.11.0", "mode": "agg", "model_path": model, "system": system,
            "precision": "fp8", "isl": "1000", "osl": "100", "tp_size": str(tp), "batch_size": "8",
            "silicon_data_source": "silicon_concurrency=8", "silicon_ttft_ms": "100", "silicon_tpot_ms": "10"}


@pytest.mark.parametrize("runtime", ["vllm", "sglang", "trtllm"])
def test_a_row_is_priced_as_the_serving_study_sizes_that_runtime_model_and_layout(tmp_path, runtime):
    """One source of truth: the tool's KV tokens are the study's own capacity for that worker."""
    model, tp, system = "meta-llama/Llama-3.1-70B-Instruct", 4, "h100_sxm"
    p = kc.price_row(kc.load_rows(_write(tmp_path / "a.csv", [_row(runtime=runtime)]))[0])
    case = map_row(_serving_row(runtime, model, tp, system))
    assert not p.skip and not case.skip
    assert p.sim_tokens == kv_capacity_tokens(case.ctx, case.plan.pool.strategy, case_runtime(case))
    assert p.sim_tokens > 0 and 60 < p.sim_weights_gib * 2**30 / 1e9 * 4 < 80  # 70B FP8 over 4 GPUs


def test_the_row_s_memory_fraction_and_token_budget_are_the_launch_s(tmp_path):
    rows = kc.load_rows(_write(tmp_path / "a.csv", [_row(memory_fraction="0.80"), _row(memory_fraction="0.95"),
                                                     _row(memory_fraction="0.95", max_num_batched_tokens="65536")]))
    low, high, big_step = (kc.price_row(p).sim_tokens for p in rows)
    assert low < high and big_step < high  # the larger step's activations come out of the cache


def test_blocks_count_as_tokens_of_the_block_size_vllm_s_16_by_default(tmp_path):
    rows = kc.load_rows(_write(tmp_path / "a.csv", [_row(logged_kv_tokens="", logged_gpu_blocks="1000"),
                                                     _row(logged_kv_tokens="", logged_gpu_blocks="1000",
                                                          block_size="32")]))
    assert [p.logged_tokens for p in rows] == [16000, 32000]


def test_fp8_kv_halves_the_bytes_a_token_costs(tmp_path):
    rows = kc.load_rows(_write(tmp_path / "a.csv", [_row(kv_cache_dtype="auto"), _row(kv_cache_dtype="fp8")]))
    bf16, fp8 = (kc.price_row(p) for p in rows)
    assert fp8.sim_tokens == pytest.approx(2 * bf16.sim_tokens, rel=1e-3)
    assert fp8.sim_kv_gib == pytest.approx(bf16.sim_kv_gib, rel=1e-3)


def test_a_model_that_does_not_fit_prices_zero_and_one_without_a_preset_is_skipped(tmp_path):
    rows = kc.load_rows(_write(tmp_path / "a.csv", [_row(model_path="deepseek-ai/DeepSeek-V3", tp_size="8"),
                                                     _row(model_path="acme/unknown-model")]))
    full, unknown = (kc.price_row(p) for p in rows)
    assert full.sim_tokens == 0 and full.kv_error == -1.0
    assert unknown.skip.startswith("model:") and unknown.sim_tokens is None


@pytest.mark.parametrize(("change", "field"), [
    ({"runtime": "tgi"}, "runtime"), ({"system": "a100"}, "system"), ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
    ({"tp_size": "0"}, "tp_size"), ({"tp_size": "2.5"}, "tp_size"), ({"memory_fraction": "1.5"}, "memory_fraction"),
    ({"memory_fraction": "x"}, "memory_fraction"), ({"logged_kv_tokens": ""}, "logged_kv_tokens"),
    ({"logged_kv_tokens": "-4"}, "logged_kv_tokens")])
def test_bad_input_is_one_line_naming_its_line_and_column(tmp_path, change, field):
    with pytest.raises(BadInput) as err:
        kc.load_rows(_write(tmp_path / "a.csv", [_row(), _row(**change)]))
    assert "line 3" in str(err.value) and field in str(err.value) and "\n" not in str(err.value)


def test_a_file_without_the_columns_or_rows_is_refused(tmp_path):
    (tmp_path / "b.csv").write_text("source_url,runtime\nx,vllm\n")
    with pytest.raises(BadInput, match="missing"):
        kc.load_rows(tmp_path / "b.csv")
    with pytest.raises(BadInput, match="cannot read"):
        kc.load_rows(tmp_path / "none.csv")


def test_the_cli_exits_2_on_a_bad_argument(capsys):
    with pytest.raises(SystemExit) as exit_:
        from validation.studies.common.cli import run_script
        run_script(lambda: kc.main(["--nope"]))
    assert exit_.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_vllm_s_reserve_comes_out_of_its_kv_cache_byte_for_byte(tmp_path):
    """``reserved_bytes`` is memory the runtime holds: the cache shrinks by it, in tokens of the row's size."""
    p = kc.load_rows(_write(tmp_path / "a.csv", [_row()]))[0]
    none, some = kc.price_row(kc.replace(p), 0.0), kc.price_row(kc.replace(p), 3 * 2**30)
    per_token = none.sim_kv_gib * 2**30 / none.sim_tokens
    assert none.sim_tokens - some.sim_tokens == pytest.approx(3 * 2**30 / per_token, abs=1.0)
    sglang = kc.load_rows(_write(tmp_path / "b.csv", [_row(runtime="sglang")]))[0]
    assert kc.price_row(kc.replace(sglang), 0.0).sim_tokens == kc.price_row(kc.replace(sglang), 3 * 2**30).sim_tokens


def test_the_fit_recovers_the_reserve_the_logs_were_made_with(tmp_path):
    """Logs written from the simulator at a 2.5 GiB reserve are fitted back to 2.5 GiB, error ~0."""
    made = []
    for tp, model in ((1, "meta-llama/Llama-3.1-8B-Instruct"), (2, "Qwen/Qwen3-32B"), (4, "meta-llama/Llama-3.1-70B")):
        p = kc.load_rows(_write(tmp_path / "a.csv", [_row(tp_size=str(tp), model_path=model)]))[0]
        made.append(_row(tp_size=str(tp), model_path=model, logged_kv_tokens=str(kc.price_row(p, 2.5 * 2**30).sim_tokens)))
    reserve, err = kc.fit_reserve(kc.load_rows(_write(tmp_path / "b.csv", made)))
    assert reserve == 2.5 * 2**30 and err < 1e-4


def test_the_shipped_reserve_is_what_the_fit_chooses_on_the_fit_source_and_the_test_rows_are_scored_apart():
    out = kc.main(["--fit"])
    assert out["vllm_reserved_gib"] * 2**30 == get_runtime("vllm").reserved_bytes == get_runtime("vllm-sync").reserved_bytes
    assert out["fit"]["rows"] >= 5 and out["test"]["rows"] >= 8 and out["priced"] >= 0.8 * out["rows"]
    assert set(out["by_runtime"]) <= {"vllm", "sglang", "trtllm"}
    # what the reserve was fitted for, held out of sample: vLLM 0.19 and issue logs within 10% at the median
    assert out["test"]["median_abs_kv_error"] < 0.10
    assert get_runtime("sglang").reserved_bytes == get_runtime("trtllm").reserved_bytes == 0.0
    assert get_runtime("sglang").mem_fraction is None  # a row without --mem-fraction-static: SGLang's default


def test_sglangs_static_pool_matches_its_logged_launches_out_of_sample():
    """SGLang's KV pool (its static memory fraction less the weights, nothing fitted) against its start-up
    logs: the shipped launches of other sources than the vLLM fit (test rows), each priced on its own."""
    out = kc.main([])
    sglang = out["by_runtime"]["sglang"]
    assert sglang["rows"] >= 4 and sglang["priced"] == sglang["rows"]
    assert sglang["median_abs_kv_error"] < 0.05
    rows = [r for r in kc.load_rows(kc._DATA) if r.row["runtime"] == "sglang"]
    assert {r.split for r in rows} == {"test"}


def test_reserve_gib_scores_vllm_at_another_reserve_and_refuses_a_bad_one(capsys):
    """``--reserve-gib 0`` is the model before the fit: every vLLM launch holds more cache than at the
    shipped reserve, SGLang's the same; a negative reserve or one beside ``--fit`` is one line, exit 2."""
    zero, shipped = kc.main(["--reserve-gib", "0"]), kc.main([])
    assert zero["vllm_reserved_gib"] == 0.0 and zero["test"]["median_signed_kv_error"] > shipped["test"]["median_signed_kv_error"]
    assert zero["by_runtime"]["sglang"] == shipped["by_runtime"]["sglang"]
    for bad in (["--reserve-gib", "-1"], ["--reserve-gib", "nan"], ["--reserve-gib", "0", "--fit"]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            from validation.studies.common.cli import run_script
            run_script(lambda bad=bad: kc.main(bad))
        assert exit_.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
