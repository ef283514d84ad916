"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): config reading, parameters, costs, state memory, serving."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, StrategyArrays, _Lowerer
from simcore.cost.memory import memory_per_gpu_bytes, reason_names, structural_reasons
from simcore.models import CONFIG_DIR, ModelConfigError, from_hf_config, get_model, preset_for
from simcore.models import linear_attention as gdn
from simcore.serving import GroupBatch, LengthDist, ServingConfig, ServingPlan, StepCost, simulate_serving
from simcore.serving.kvcache import KvCache, kv_bytes_per_token, state_blocks, state_bytes_per_sequence
from simcore.serving.requests import Request
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload

Q35 = "qwen3.5-397b-a17b"


def _raw(name: str) -> dict:
    return {k: v for k, v in json.loads((CONFIG_DIR / f"{name}.json").read_text()).items() if not k.startswith("_")}


def _tiny(**changes) -> dict:
    cfg = {"model_type": "qwen3_5_moe_text", "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "linear_num_key_heads": 2,
           "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 16,
           "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 32, "full_attention_interval": 4}
    cfg.update(changes)
    return cfg


def _ctx(model=Q35, precision="fp8", gpus=8):
    return CostContext(get_model(model), Workload(precision=precision), Cluster.simple("h200", gpus))


def test_nested_and_flat_configs_read_the_same_model() -> None:
    nested = _raw(Q35)
    flat = dict(nested["text_config"])
    spec = from_hf_config(nested, name=Q35)
    assert from_hf_config(flat, name=Q35) == spec
    assert from_hf_config({**flat, "model_type": "qwen3_5_moe"}, name=Q35) == spec  # flat under the outer type
    inner = {k: v for k, v in flat.items() if k != "model_type"}  # the inner type comes from the wrapper
    assert from_hf_config({"model_type": "qwen3_5_moe", "text_config": inner}, name=Q35) == spec
    no_types = {k: v for k, v in flat.items() if k != "layer_types"}  # full_attention_interval alone
    assert from_hf_config(no_types, name=Q35) == spec
    assert spec.num_layers == 60 and spec.linear_layers == tuple(i for i in range(60) if (i + 1) % 4)
    assert (spec.linear_key_heads, spec.linear_value_heads, spec.linear_key_head_dim) == (16, 64, 128)
    assert spec.linear_state_bytes == 4 and spec.attn_output_gate and spec.qk_norm == "head"
    assert (spec.num_experts, spec.top_k, spec.expert_ffn_size, spec.num_shared_experts) == (512, 10, 1024, 1)
    nxt = get_model("qwen3-next-80b-a3b")
    assert nxt.linear_state_bytes == 2 and nxt.num_attention_layers == 12 and nxt.shared_expert_gate


def test_tiny_hybrid_hand_count() -> None:
    spec = from_hf_config(_tiny())
    h = 64
    attn = h * (2 * 4 * 16 + 2 * 2 * 16) + 4 * 16 * h + 2 * 16  # gated q, k, v, o, q/k norms
    key, value = 2 * 8, 4 * 16
    lin = h * (2 * key + 2 * value) + h * 2 * 4 + (2 * key + value) * 4 + 2 * 4 + 16 + value * h
    moe = 4 * 3 * h * 32 + 3 * h * 32 + 4 * h + h  # routed, shared, router, shared gate
    assert spec.attention_params() == attn and spec.linear_attention_params() == lin
    assert spec.total_params() == 2 * 100 * h + h + 2 * attn + 6 * lin + 8 * (moe + 2 * h)
    assert spec.kv_cache_elements_per_token() == 2 * 2 * 16 * 2  # two softmax-attention layers
    conv, rec = (2 * key + value) * 3, 4 * 8 * 16
    assert spec.linear_state_bytes_per_sequence() == 6 * (2 * conv + 2 * rec)  # bf16 state by default


def test_published_parameter_counts() -> None:
    q35, nxt = get_model(Q35), get_model("qwen3-next-80b-a3b")
    assert abs(q35.total_params() / 397e9 - 1) < 0.02 and abs(nxt.total_params() / 80e9 - 1) < 0.02
    assert abs(q35.active_params() / 17e9 - 1) < 0.03  # Qwen counts the input embedding
    assert preset_for("Qwen/Qwen3.5-397B-A17B") == preset_for("Qwen/Qwen3.5-397B-A17B-FP8") == Q35
    assert preset_for("Qwen/Qwen3-Next-80B-A3B-Instruct-FP8") == "qwen3-next-80b-a3b"


@pytest.mark.parametrize(("changes", "field"), [
    ({"layer_types": ["linear_attention"] * 3 + ["full_attention"] * 5}, "full_attention_interval"),
    ({"layer_types": ["linear_attention", "sliding_attention"] * 4}, "layer_types"),
    ({"layer_types": ["linear_attention"] * 7}, "layer_types"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ({"linear_num_key_heads": 0}, "linear_num_key_heads"),
    ({"mamba_ssm_dtype": "float8"}, "mamba_ssm_dtype"),
    ({"full_attention_interval": 1}, "linear_layers"),  # fine: every layer softmax attention
    ({"linear_extra_gate": 2}, "linear_extra_gate"),
])
def test_bad_linear_attention_configs_name_the_field(changes, field) -> None:
    if changes == {"full_attention_interval": 1}:
        assert not from_hf_config(_tiny(**changes)).is_hybrid
        return
    with pytest.raises(ModelConfigError) as info:
        from_hf_config(_tiny(**changes))
    assert field in str(info.value) and "\n" not in str(info.value)


def test_decode_cost_grows_with_context_only_through_softmax_attention() -> None:
    ctx = _ctx()
    spec = ctx.model
    s = StrategyArrays.from_strategies([megatron_strategy(tp=8, batch=32)])
    short, long = (_Lowerer(ctx, s, "decode", c) for c in (1024, 65536))
    assert float(short._linear_mixer().time_s) == float(long._linear_mixer().time_s) > 0
    grow_attn = float(long._softmax_attention().time_s) - float(short._softmax_attention().time_s)
    grow_mean = float(long._attention().time_s) - float(short._attention().time_s)
    assert grow_attn > 0
    assert spec.num_layers * grow_mean == pytest.approx(spec.num_attention_layers * grow_attn)
    cost = StepCost(ctx, megatron_strategy(tp=8, ep=1))
    step = [cost.stage_times([GroupBatch.of([], [c] * 32, 32)])[0][0] for c in (1024, 65536)]
    group = [GroupBatch.of([], [c] * 32, 32) for c in (1024, 65536)]
    assert step[1] - step[0] == pytest.approx(15 * (cost.attention_s(group[1]) - cost.attention_s(group[0])))
    assert cost.linear_attention_s(group[0]) == cost.linear_attention_s(group[1]) > 0


def test_prefill_mixer_is_chunked_and_linear_in_tokens() -> None:
    spec, gpu = get_model(Q35), _ctx().cluster.gpu
    flops = [gdn.mixer_time_s(spec, gpu, "fp8", np, "prefill", 1.0, n)[1] for n in (64.0, 128.0, 100.0)]
    assert flops[1] == pytest.approx(2 * flops[0]) and flops[2] == flops[1]  # 100 tokens = two chunks
    per_token_head = 6 * 64 * 128 + 4 * 64 * 128 + 6 * 128 * 128 + 2 * 64 * 64 / 3
    assert flops[0] == pytest.approx(64 * 64 * per_token_head)


def test_kv_counts_only_softmax_layers_and_state_is_per_sequence() -> None:
    ctx = _ctx()
    spec, strategy = ctx.model, megatron_strategy(tp=8)
    assert spec.kv_cache_elements_per_token() == 15 * 2 * 2 * 256
    # TP 8 over 2 KV heads: each GPU holds one KV head of each of the 15 softmax-attention layers
    assert kv_bytes_per_token(ctx, strategy) == 15 * 2 * 256 * 1.0
    conv, rec = gdn.state_elements(spec)
    assert (conv, rec) == ((2 * 16 * 128 + 64 * 128) * 3, 64 * 128 * 128)
    per_seq = 45 * (conv * 2 + rec * 4)
    assert spec.linear_state_bytes_per_sequence() == per_seq
    assert state_bytes_per_sequence(ctx, strategy) == pytest.approx(per_seq / 8)
    mem = [memory_per_gpu_bytes(CostContext(spec, Workload(precision="fp8", input_len=1), ctx.cluster),
                                StrategyArrays.from_strategies([megatron_strategy(tp=8, batch=b)]))[0]
           for b in (1, 65)]
    extra_per_seq = (mem[1] - mem[0]) / 64
    kv_per_seq = 15 * 2 * 256 * 1.0  # one token of context
    assert extra_per_seq == pytest.approx(per_seq / 8 + kv_per_seq, rel=0.05)  # activations grow a little
    blocks = state_blocks(ctx, strategy, 16)
    assert blocks == -(-per_seq / 8 // (kv_bytes_per_token(ctx, strategy) * 16))
    cache = KvCache(100_000, 16, blocks)
    req = Request(rid=1, arrival_s=0.0, input_len=100, output_len=10)
    assert cache.need(req, 100) == 7 + blocks
    assert cache.grow(req, 100) and cache.need(req, 112) == 0 and cache.need(req, 113) == 1
    cache.release(req)
    assert cache.free_blocks == cache.total_blocks


def test_linear_heads_must_divide_the_tensor_parallel_group() -> None:
    ctx = _ctx(gpus=32)
    s = StrategyArrays.from_strategies([megatron_strategy(tp=32), megatron_strategy(tp=8, ep=4)])
    masks = structural_reasons(ctx, s)
    assert "heads_divisibility" in reason_names(masks[0]) and "heads_divisibility" not in reason_names(masks[1])


def test_qwen35_serves_on_eight_h200() -> None:
    ctx = _ctx()
    plan = ServingPlan.aggregated(megatron_strategy(tp=8), workers=1, max_num_seqs=16)
    cfg = ServingConfig(concurrency=8, num_requests=20, input_len=LengthDist(mean=1024),
                        output_len=LengthDist(mean=64), runtime="sglang")
    result = simulate_serving(ctx, plan, cfg)
    assert result.feasible and result.metrics.requests == 20
    assert 0 < result.metrics.tpot_s["mean"] < 0.2 and 0 < result.metrics.ttft_s["mean"] < 5.0


def test_delta_rule_cost_by_hand_at_the_fitted_constants() -> None:
    """Decode: the state read and written (plus q, k, v, o) at GDN_HBM_EFFICIENCY of peak, one kernel's
    fixed cost. Prefill on few heads: the chunk chain adds what each step's bytes leave of the latency."""
    spec, gpu = get_model(Q35), _ctx().cluster.gpu
    bw = gpu.hbm_bandwidth_bytes_per_s * gdn.GDN_HBM_EFFICIENCY
    hv, hk = 64 / 8, 16 / 8
    state = 2 * hv * 128 * 128 * 4
    time, _ = gdn.core_time_s(spec, gpu, "bf16", np, "decode", 32.0, head_div=8.0)
    assert float(time) == pytest.approx(32 * (state + 2 * hk * 128 * 2 + 2 * hv * 128 * 2) / bw + gpu.kernel_overhead_s)
    step = hv * (64 * (2 * 128 + 2 * 128) + 128 * 128) * 2 / bw  # one chunk's bytes in the state pass
    assert step < gdn.GDN_CHUNK_LATENCY_S
    chain = float(gdn.chain_s(spec, gpu, np, 1.0, 4096.0, 8.0))
    assert chain == pytest.approx(64 * (gdn.GDN_CHUNK_LATENCY_S - step))
    assert float(gdn.chain_s(spec, gpu, np, 1.0, 4096.0, 1.0)) == 0.0  # 64 heads: bandwidth covers the chain
    with_chain, _ = gdn.core_time_s(spec, gpu, "bf16", np, "prefill", 1.0, 4096.0, head_div=8.0)
    without, _ = gdn.core_time_s(spec, gpu, "bf16", np, "prefill", 1.0, 4096.0, head_div=8.0, chunk_latency_s=0.0)
    assert float(with_chain) - float(without) == pytest.approx(chain)


def test_mixer_is_the_delta_rule_plus_conv_and_gated_norm() -> None:
    spec, gpu = get_model(Q35), _ctx().cluster.gpu
    from simcore.hardware.kernels import memory_time_s

    for phase, seqs, new in (("decode", 16.0, 1.0), ("prefill", 2.0, 3000.0)):
        core, flops = gdn.core_time_s(spec, gpu, "fp8", np, phase, seqs, new, 0.0, 4.0)
        mixer, mixer_flops = gdn.mixer_time_s(spec, gpu, "fp8", np, phase, seqs, new, 0.0, 4.0)
        tokens, conv = seqs * new, gdn.conv_channels(spec) / 4
        conv_bytes = seqs * conv * 2 * 8 if phase == "decode" else tokens * conv * 2 * 2 + seqs * conv * 3 * 2
        norm_bytes = tokens * 64 * 128 / 4 * 2 * 3
        assert mixer_flops == flops
        assert float(mixer) == pytest.approx(float(core) + float(memory_time_s(conv_bytes, gpu))
                                             + float(memory_time_s(norm_bytes, gpu)))


def test_chunks_batched_in_one_step_wait_on_the_longest_chain_only() -> None:
    ctx = _ctx()
    cost = StepCost(ctx, megatron_strategy(tp=8, ep=1))
    one = [cost.linear_attention_s(GroupBatch.of([(n, 0)], [], 0)) for n in (4096, 1024)]
    both = cost.linear_attention_s(GroupBatch.of([(4096, 0), (1024, 0)], [], 0))
    cost._attn.seqs = 1.0
    short_chain = float(cost._attn.linear_chain_s(1024.0))
    fixed = gdn.MIXER_KERNELS["prefill"] * ctx.cluster.gpu.kernel_overhead_s
    assert short_chain > 0
    assert both == pytest.approx(one[0] + one[1] - fixed - short_chain)
