"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): config reading, parameters, KV bytes, costs, serving."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, StrategyArrays, _Lowerer
from simcore.models import CONFIG_DIR, ModelConfigError, from_hf_config, get_model, preset_for
from simcore.models import sparse_attention as dsa
from simcore.serving import GroupBatch, LengthDist, ServingConfig, ServingPlan, StepCost, simulate_serving
from simcore.serving.kvcache import kv_bytes_per_token
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload

GLM5 = "glm-5"


def _raw(name: str) -> dict:
    return {k: v for k, v in json.loads((CONFIG_DIR / f"{name}.json").read_text()).items() if not k.startswith("_")}


def _ctx(model=GLM5, gpus=8, kv_precision="bf16"):
    return CostContext(get_model(model), Workload(precision="fp8", kv_precision=kv_precision),
                       Cluster.simple("h200", gpus))


def test_glm5_and_deepseek_v32_read_their_indexer() -> None:
    glm = get_model(GLM5)
    assert (glm.index_topk, glm.index_n_heads, glm.index_head_dim) == (2048, 32, 128) and glm.is_sparse_attention
    assert (glm.num_layers, glm.num_dense_layers, glm.num_experts, glm.top_k) == (78, 3, 256, 8)
    assert (glm.q_lora_rank, glm.kv_lora_rank, glm.qk_nope_head_dim, glm.v_head_dim) == (2048, 512, 192, 256)
    # wq_b [2048, 32 x 128], wk [6144, 128], its LayerNorm (weight, bias), weights_proj [6144, 32]
    assert dsa.indexer_params(glm) == 2048 * 4096 + 6144 * 128 + 2 * 128 + 6144 * 32 == 9_371_904
    assert abs(glm.total_params() / 744e9 - 1) < 0.002
    v32, v3 = get_model("deepseek-v3.2"), get_model("deepseek-v3")
    assert (v32.index_topk, v32.index_n_heads, v32.index_head_dim) == (2048, 64, 128)
    assert v32.total_params() - v3.total_params() == 61 * dsa.indexer_params(v32)
    assert not v3.is_sparse_attention and dsa.indexer_params(v3) == 0
    for model_id in ("zhipuai/GLM-5", "zai-org/GLM-5-FP8", "GLM-5"):
        assert preset_for(model_id) == GLM5
    assert preset_for("deepseek-ai/DeepSeek-V3.2-Exp") == "deepseek-v3.2"


@pytest.mark.parametrize(("changes", "field"), [
    ({"index_n_heads": None}, "index_n_heads"),           # an indexer without heads
    ({"index_topk_freq": 4}, "index_topk_freq"),          # GLM-5.2's shared indexers: not expressed
    ({"indexer_types": ["full", "shared"] * 39}, "indexer_types"),
    ({"head_dim": 100}, "head_dim"),
])
def test_dsa_configs_it_cannot_read_name_the_field(changes, field) -> None:
    cfg = {k: v for k, v in {**_raw(GLM5), **changes}.items() if v is not None}
    with pytest.raises((ModelConfigError, ValueError), match=field):
        from_hf_config(cfg, name="bad")


def test_sparse_attention_needs_mla_and_all_three_fields() -> None:
    from simcore.models import ModelSpec

    base = dict(name="t", num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=4, head_dim=8, ffn_size=64,
                vocab_size=50, index_topk=16, index_n_heads=2, index_head_dim=8)
    with pytest.raises(ValueError, match="index_topk needs MLA"):
        ModelSpec(**base)
    mla = dict(base, head_dim=12, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    assert ModelSpec(**mla).is_sparse_attention
    with pytest.raises(ValueError, match="index_head_dim must be positive"):
        ModelSpec(**dict(mla, index_head_dim=0))


def test_indexer_weights_sit_whole_on_every_rank() -> None:
    from simcore.cost.memory import memory_per_gpu_bytes
    from simcore.strategy.opgraph import model_ops

    glm, v3 = get_model(GLM5), get_model("deepseek-v3")
    qkv = model_ops(glm)["qkv"]
    # the fused [h, out] GEMM rounds its width down to whole columns: within one column of h
    assert qkv.weight_params == pytest.approx(glm.attention_params() - dsa.indexer_params(glm) - 64 * 256 * 6144,
                                              abs=6144)
    assert model_ops(v3)["qkv"].weight_params == pytest.approx(v3.attention_params() - 128 * 128 * 7168, abs=7168)
    # memory: every rank of a TP-8 group holds the 78 indexers whole (FP8), the rest of qkv an eighth
    ctx = CostContext(glm, Workload(precision="fp8", input_len=1), Cluster.simple("h200", 8))
    s = StrategyArrays.from_strategies([megatron_strategy(tp=8)])
    base = float(memory_per_gpu_bytes(ctx, s)[0])
    no_dsa = CostContext(dataclasses.replace(glm, index_topk=0, index_n_heads=0, index_head_dim=0),
                         ctx.workload, ctx.cluster)
    diff = base - float(memory_per_gpu_bytes(no_dsa, s)[0])
    assert diff == pytest.approx(78 * dsa.indexer_params(glm) * 1.0, rel=0.01)


def test_cache_holds_every_token_and_its_fp8_index_key() -> None:
    glm = get_model(GLM5)
    key = 128 + 4  # FP8 key and one FP32 scale per 128 elements, whatever the KV type
    assert dsa.key_bytes(glm) == key
    assert glm.kv_cache_bytes_per_token(2.0) == 78 * ((512 + 64) * 2 + key)
    assert glm.kv_cache_bytes_per_token(1.0) == 78 * (512 + 64 + key)
    ctx = _ctx()
    assert kv_bytes_per_token(ctx, megatron_strategy(tp=8)) == glm.kv_cache_bytes_per_token(2.0)  # MLA: every rank
    assert glm.attention_context(100_000.0) == 100_000.0  # held: the whole context
    assert glm.attended_context(100_000.0) == 2048.0 and glm.attended_context(1000.0) == 1000.0


def test_prefill_pairs_keep_topk_keys_per_query() -> None:
    glm = get_model(GLM5)
    assert glm.prefill_attention_pairs(2048.0) == 2048.0 ** 2 / 2
    assert glm.prefill_attention_pairs(8192.0) == 2048.0 * 8192 - 2048.0 ** 2 / 2
    assert get_model("deepseek-v3").prefill_attention_pairs(8192.0) == 8192.0 ** 2 / 2


def test_indexer_scores_every_cached_token_on_every_rank() -> None:
    ctx = _ctx()
    glm, gpu = ctx.model, ctx.cluster.gpu
    flops = [dsa.indexer_time_s(glm, gpu, np, "decode", 1.0, c, 1.0, 0.0)[1] for c in (4096.0, 65536.0)]
    assert flops[1] == pytest.approx(16 * flops[0]) and flops[0] == pytest.approx(2 * 4096 * 32 * 128)
    prefill = dsa.indexer_time_s(glm, gpu, np, "prefill", 1.0, 0.0, 1024.0, 2048.0)[1]
    assert prefill == pytest.approx(2 * (3072.0 ** 2 / 2 - 2048.0 ** 2 / 2) * 32 * 128)  # a chunk after 2048
    # a sequence within the top-k is prefilled as dense MLA: its keys are stored, nothing is scored
    short_s, short_flops = dsa.indexer_time_s(glm, gpu, np, "prefill", 1.0, 0.0, 1024.0, 1024.0)
    assert short_flops == 0 and short_s == pytest.approx(
        1024 * 132 / (gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency) + 3 * gpu.kernel_overhead_s)  # wk: the caller
    # the indexer is not split by tensor parallelism; the attention core's heads are
    at = {tp: _Lowerer(_ctx(gpus=tp), StrategyArrays.from_strategies([megatron_strategy(tp=tp, batch=8)]),
                       "decode", 65536.0) for tp in (1, 8)}
    core = {tp: float(low._softmax_attention().flops) for tp, low in at.items()}
    projections = 2 * 8 * sum(k * n for k, n in dsa.projection_shapes(glm))  # wq_b, wk, weights_proj, whole
    assert projections == 2 * 8 * (dsa.indexer_params(glm) - 2 * 128)
    index = 8 * 2 * 65536 * 32 * 128 + projections
    core_1 = core[1] - index
    assert core[8] - index == pytest.approx(core_1 / 8)


def test_long_prefill_runs_flashmla_sparse_with_padded_heads() -> None:
    ctx = _ctx()
    glm = ctx.model
    low = _Lowerer(ctx, StrategyArrays.from_strategies([megatron_strategy(tp=8, batch=1)]), "prefill", 0.0)
    flops = {}
    for new in (2048.0, 4096.0):
        low.prefill_chunk = (new, 0.0)
        index = dsa.indexer_time_s(glm, ctx.cluster.gpu, np, "prefill", 1.0, 0.0, new, 0.0)[1]
        shapes = dsa.projection_shapes(glm, scored=dsa.sparse_prefill(glm, new, 0.0))  # wk alone when short
        flops[new] = float(low._softmax_attention().flops) - index - sum(2 * new * k * n for k, n in shapes)
    assert flops[2048.0] == pytest.approx(2 * 2048.0 ** 2 / 2 * 8 * (256 + 256))  # dense MLA, 64 / 8 heads
    # sparse: every query over the top-k slots, absorbed (576 + 512), the 8 heads padded to Hopper's 64
    assert flops[4096.0] == pytest.approx(2 * 4096 * 2048 * 64 * (576 + 512))
    assert dsa.padded_heads(8.0, ctx.cluster.gpu) == 64.0
    assert dsa.padded_heads(8.0, Cluster.simple("b200", 8).gpu) == 128.0


def test_decode_step_grows_past_topk_only_through_the_indexer() -> None:
    ctx = _ctx()
    cost = StepCost(ctx, megatron_strategy(tp=8))
    attn = {c: cost.attention_s(GroupBatch.of([], [c] * 32, 32)) for c in (1024, 2048, 32768, 131072)}
    assert attn[1024] < attn[2048] < attn[32768] < attn[131072]
    dense_ctx = CostContext(get_model("deepseek-v3"), ctx.workload, ctx.cluster)
    dense = StepCost(dense_ctx, megatron_strategy(tp=8))
    dense_attn = {c: dense.attention_s(GroupBatch.of([], [c] * 32, 32)) for c in (2048, 131072)}
    # beyond the top-k the core stops growing: the sparse model's growth is far below the dense one's
    assert attn[131072] - attn[2048] < 0.5 * (dense_attn[131072] - dense_attn[2048])


def test_glm5_serves_on_eight_h200_and_kv_binds_later_in_fp8() -> None:
    plan = ServingPlan.aggregated(megatron_strategy(tp=8), workers=1, max_num_seqs=16)
    cfg = ServingConfig(concurrency=8, num_requests=16, input_len=LengthDist(mean=1024),
                        output_len=LengthDist(mean=64), runtime="sglang")
    result = simulate_serving(_ctx(), plan, cfg)
    assert result.feasible and result.metrics.requests == 16
    assert 0 < result.metrics.tpot_s["mean"] < 0.2 and 0 < result.metrics.ttft_s["mean"] < 5.0
    bf16, fp8 = (kv_bytes_per_token(_ctx(kv_precision=p), megatron_strategy(tp=8)) for p in ("bf16", "fp8"))
    assert fp8 / bf16 == pytest.approx((576 + 132) / (1152 + 132))


def test_layouts_study_runs_and_ends_with_json(capsys) -> None:
    from validation.studies.attention.sparse_layouts import LAYOUTS, main

    out = main(["--isl", "3072", "--osl", "4", "--clients", "2"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == out and set(out) == set(LAYOUTS)
    for layout in out.values():
        assert all(v["ttft_s"] > 0 and v["tpot_s"] > 0 for v in layout.values())


@pytest.mark.parametrize("runtime", ["sglang", "vllm"])
def test_fast_path_equals_reference_across_the_topk(runtime) -> None:
    """Decode contexts crossing ``index_topk`` inside folded runs, and prompts on both sides of it: the
    memoized / folded path equals stepping one by one."""
    from simcore.serving import runtime_strategy

    plan = ServingPlan.aggregated(runtime_strategy(tp=8), workers=1, max_num_seqs=8)
    cfg = ServingConfig(concurrency=6, num_requests=14, runtime=runtime,
                        input_len=LengthDist("uniform", mean=2000, low=1900, high=2100),
                        output_len=LengthDist("uniform", mean=150, low=100, high=200), seed=3)
    fast = simulate_serving(_ctx(), plan, cfg, fast=True)
    slow = simulate_serving(_ctx(), plan, cfg, fast=False)
    assert fast.feasible and slow.feasible
    for key in ("ttft_s", "tpot_s"):
        assert fast.metrics.__getattribute__(key)["mean"] == pytest.approx(slow.metrics.__getattribute__(key)["mean"],
                                                                           rel=1e-9)
    assert fast.metrics.requests == slow.metrics.requests == 14
