"""The current model families read from config.json: MoE layouts, sliding windows, sinks, refusals."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.cost.lowering import StrategyArrays, lower
from simcore.cost.memory import memory_per_gpu_bytes, stage_layers
from simcore.models import CONFIG_DIR, ModelConfigError, ModelSpec, from_hf_config, get_model
from simcore.strategy.sharding import megatron_strategy
from tests.conftest import make_ctx


def _raw(name: str) -> dict:
    return {k: v for k, v in json.loads((CONFIG_DIR / f"{name}.json").read_text()).items() if not k.startswith("_")}


def _tiny(model_type: str, **changes) -> dict:
    cfg = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 4, "intermediate_size": 96, "vocab_size": 100, "head_dim": 16}
    cfg.update(changes)
    return cfg


def _refused(cfg: dict, *words: str) -> str:
    with pytest.raises(ModelConfigError) as info:
        from_hf_config(cfg)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    return message


def test_qwen3_moe_config_is_moe_not_dense() -> None:
    spec = get_model("qwen3-235b-a22b")
    assert spec.is_moe and spec.num_moe_layers == 94 and (spec.num_experts, spec.top_k) == (128, 8)
    assert spec.expert_params() == 3 * 4096 * 1536 and spec.qk_norm == "head"
    # the case: the same keys under a dense model_type are refused, naming what would be ignored
    _refused({**_raw("qwen3-235b-a22b"), "model_type": "qwen3"}, "num_experts", "moe_intermediate_size")
    _refused({**_raw("qwen3-235b-a22b"), "model_type": "some_new_moe"}, "num_experts")


def test_qwen_moe_layer_pattern_and_hand_count() -> None:
    cfg = _tiny("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                decoder_sparse_step=1, mlp_only_layers=[0, 2])
    spec = from_hf_config(cfg)
    assert spec.moe_layers == (1, 3) and [spec.layer_is_moe(i) for i in range(4)] == [False, True, False, True]
    attn = 64 * (64 + 2 * 32) + 64 * 64 + 2 * 16  # q, k, v, o + per-head q/k norms
    dense, moe = 3 * 64 * 96, 4 * 3 * 64 * 32 + 4 * 64
    assert spec.total_params() == 2 * 100 * 64 + 64 + 4 * (attn + 2 * 64) + 2 * dense + 2 * moe
    assert from_hf_config(_tiny("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                decoder_sparse_step=2)).moe_layers == (1, 3)
    _refused(_tiny("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   mlp_only_layers=[0, 1, 2, 3]), "mlp_only_layers")


def test_qwen2_shared_expert_of_its_own_width() -> None:
    spec = get_model("qwen2-57b-a14b")
    assert spec.qkv_bias and not spec.attention_bias and spec.shared_expert_gate
    assert spec.num_shared_experts * spec.expert_ffn_size == 20480  # one shared MLP of 20480
    layer = (3584 * (3584 + 2 * 512) + 3584 * 3584 + 3584 + 2 * 512  # q/k/v/o and q/k/v biases
             + 64 * 3 * 3584 * 2560 + 3 * 3584 * 20480 + 64 * 3584 + 3584 + 2 * 3584)  # experts, gates, norms
    assert spec.layer_params(0) == layer
    _refused({**_raw("qwen2-57b-a14b"), "shared_expert_intermediate_size": 20000},
             "shared_expert_intermediate_size")


def test_qwen2_dense_has_qkv_biases() -> None:
    spec = from_hf_config(_tiny("qwen2", num_key_value_heads=4, head_dim=None, tie_word_embeddings=True))
    assert spec.attention_params() == 4 * 64 * 64 + 3 * 64


def test_gpt_oss_windows_sinks_and_biases() -> None:
    spec = get_model("gpt-oss-120b")
    assert spec.window_layers == tuple(range(0, 36, 2)) and spec.sliding_window == 128
    assert spec.attention_sinks and spec.router_bias and spec.mlp_bias and spec.attention_bias
    assert spec.attention_params() == 2880 * (4096 + 1024) + 4096 * 2880 + (4096 + 1024 + 2880) + 64
    assert spec.expert_params() == 3 * 2880 * 2880 + 2 * 2880 + 2880
    assert spec.attention_context(4096.0) == (18 * 4096 + 18 * 128) / 36
    assert spec.attention_context(100.0) == 100.0
    np.testing.assert_allclose(spec.attention_context(np.array([64.0, 8192.0])), [64.0, (8192 + 128) / 2])
    assert spec.prefill_attention_pairs(1000.0) == (1000.0**2 / 2 + 128 * 1000 - 128**2 / 2) / 2
    _refused({**_raw("gpt-oss-120b"), "experts_per_token": 2}, "experts_per_token=2", "num_experts_per_tok=4")


def test_unwindowed_model_is_unchanged() -> None:
    spec = get_model("llama-3.1-70b")
    assert spec.attention_context(4096.0) == 4096.0 and spec.prefill_attention_pairs(512.0) == 512.0**2 / 2


def test_decode_attention_and_kv_memory_use_the_window() -> None:
    ctx = make_ctx("gpt-oss-120b", 8, "decode", input_len=8192, output_len=1)
    full = dataclasses.replace(ctx, model=dataclasses.replace(ctx.model, sliding_window=0, window_layers=()))
    s = StrategyArrays.from_strategies([megatron_strategy(tp=8, batch=8)])

    def attention_flops(c):
        return next(t.flops for t in lower(c, s, "decode", 8192.0)["moe_layer"] if t.name == "attention")

    ratio = float(attention_flops(ctx)[0] / attention_flops(full)[0])
    assert ratio == pytest.approx((8192 + 128) / 2 / 8192)
    kv_full = full.model.kv_cache_elements_per_token() / 36 * ctx.workload.kv_bytes
    saved = 36 * kv_full * (ctx.workload.max_context - ctx.model.attention_context(ctx.workload.max_context)) * 8 / 8
    freed = memory_per_gpu_bytes(full, s)[0] - memory_per_gpu_bytes(ctx, s)[0]
    assert freed == pytest.approx(saved)


def test_llama4_interleaved_moe_and_chunked_attention() -> None:
    scout, maverick = get_model("llama-4-scout"), get_model("llama-4-maverick")
    assert scout.num_moe_layers == 48 and maverick.moe_layers == tuple(range(1, 48, 2))
    assert (maverick.ffn_size, maverick.expert_ffn_size, maverick.num_shared_experts) == (16384, 8192, 1)
    assert scout.window_layers == tuple(i for i in range(48) if (i + 1) % 4) and scout.sliding_window == 8192
    dense, moe, _ = stage_layers(maverick, np.array([2, 4]))
    assert dense[0].tolist() == [12, 12, 0, 0] and moe[0].tolist() == [12, 12, 0, 0]
    assert dense[1].tolist() == [6, 6, 6, 6] and moe[1].tolist() == [6, 6, 6, 6]
    text = _raw("llama-4-maverick")["text_config"]
    _refused({**text, "interleave_moe_layer_step": 1}, "moe_layers", "interleave_moe_layer_step")


def test_dense_first_layers_stay_at_the_front() -> None:
    dense, moe, _ = stage_layers(get_model("deepseek-v3"), np.array([4]))
    assert dense[0].tolist() == [3, 0, 0, 0] and (dense + moe)[0].tolist() == [16, 15, 15, 15]


def test_multimodal_nesting_reads_the_text_model() -> None:
    k2 = get_model("kimi-k2")
    k25 = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
           "vision_config": {"hidden_size": 1152}, "text_config": _raw("kimi-k2")}
    assert from_hf_config(k25, name="kimi-k2") == dataclasses.replace(k2, published_params=0.0)
    assert (k2.num_experts, k2.num_heads, k2.dense_first_layers) == (384, 64, 1)


@pytest.mark.parametrize(("model_type", "reason"), [
    ("kimi_linear", "linear attention"), ("minimax_text_01", "linear attention"),
    ("jamba", "state-space"), ("minimax_m1", "linear attention"),
])
def test_architectures_it_cannot_express_are_refused(model_type: str, reason: str) -> None:
    _refused(_tiny(model_type), model_type, reason)
    _refused({"model_type": "wrapper", "text_config": _tiny(model_type)}, model_type)


def test_linear_attention_layers_are_refused() -> None:
    _refused(_tiny("my_hybrid", layer_types=["linear_attention", "full_attention"] * 2), "linear_attention")
    _refused({**_raw("minimax-m2"), "attn_type_list": [0] + [1] * 61}, "attn_type_list")
    _refused(_tiny("gpt_oss", num_local_experts=4, num_experts_per_tok=2,
                   layer_types=["sliding_attention", "linear_attention"] * 2), "linear_attention")


def test_minimax_m2_shape() -> None:
    spec = get_model("minimax-m2")
    assert spec.qk_norm == "layer" and spec.router_bias and spec.num_shared_experts == 0
    assert spec.attention_params() == 3072 * (6144 + 2 * 1024) + 6144 * 3072 + 6144 + 1024


def test_cli_refuses_moe_keys_it_would_ignore(tmp_path) -> None:
    from tests.test_apps import app

    path = tmp_path / "qwen3-moe-as-dense.json"
    path.write_text(json.dumps({**_raw("qwen3-235b-a22b"), "model_type": "qwen3"}))
    proc = app("sim", f"model.name={path}", "strategy.tp=8", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and "num_experts" in line and "qwen3-moe-as-dense.json" in line


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 12), pattern=st.integers(1, 2**12 - 1), window=st.integers(1, 64),
       windowed=st.integers(1, 2**12 - 1), pp=st.sampled_from([1, 2, 4]), context=st.floats(1.0, 1e5))
def test_layer_patterns_add_up(layers, pattern, window, windowed, pp, context) -> None:
    moe = tuple(i for i in range(layers) if pattern >> i & 1) or (0,)
    win = tuple(i for i in range(layers) if windowed >> i & 1) or (layers - 1,)
    spec = ModelSpec(name="p", num_layers=layers, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                     ffn_size=48, vocab_size=50, num_experts=4, top_k=2, expert_ffn_size=16, moe_layers=moe,
                     sliding_window=window, window_layers=win)
    assert spec.num_moe_layers == len(moe) and [spec.layer_is_moe(i) for i in moe] == [True] * len(moe)
    dense, moe_count, _ = stage_layers(spec, np.array([min(pp, layers)]))
    assert (dense.sum(), moe_count.sum()) == (spec.num_dense_layers, spec.num_moe_layers)
    span = spec.attention_context(context)
    assert min(context, window) <= span + 1e-9 and span <= context + 1e-9
    assert from_hf_config(spec.to_dict()) == spec


def test_published_model_ids_map_to_presets() -> None:
    from simcore.models import preset_for

    assert get_model("moonshotai/Kimi-K2.5") is get_model("kimi-k2")
    assert preset_for("MiniMax-M2.5") == "minimax-m2" and preset_for("openai/gpt-oss-20b") == "gpt-oss-20b"
    assert preset_for("Qwen/Qwen3-235B-A22B-Instruct-2507") == "qwen3-235b-a22b"
    # the same shapes under the ids a serving sample names them by (H100 hold-out: issue 15)
    assert preset_for("meta-llama/Llama-3.3-70B-Instruct") == "llama-3.1-70b"
    assert preset_for("Qwen/Qwen3-30B-A3B-FP8") == "qwen3-30b-a3b"
    assert preset_for("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8") == "qwen3-coder-480b-a35b"
    assert preset_for("Qwen/Qwen2.5-72B-Instruct") == "qwen2.5-72b"
    assert preset_for("zai-org/GLM-4.5-Air-FP8") == "glm-4.5-air"
    assert preset_for("some-org/unknown-model") is None
    for model_id in ("MiniMaxAI/MiniMax-M1-80k", "MiniMax-M1-80k"):
        with pytest.raises(ModelConfigError, match="minimax_m1.*linear attention"):
            get_model(model_id)


def test_glm4_moe_reads_dense_then_moe_layers_with_a_shared_expert() -> None:
    spec = get_model("glm-4.5-air")  # 46 layers: 1 dense, 45 MoE of 128 routed + 1 shared expert, top-8
    assert (spec.num_dense_layers, spec.num_moe_layers, spec.num_experts, spec.top_k) == (1, 45, 128, 8)
    assert spec.num_shared_experts == 1 and spec.router_bias and spec.qkv_bias and not spec.attention_bias
    assert spec.qk_norm == "none" and spec.ffn_size == 10944 and spec.expert_ffn_size == 1408
    assert from_hf_config({**_raw("glm-4.5-air"), "use_qk_norm": True}).qk_norm == "head"
    _refused({**_raw("glm-4.5-air"), "decoder_sparse_step": 2}, "decoder_sparse_step")
