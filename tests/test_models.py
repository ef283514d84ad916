"""Tests for the model catalog (simcore/models/spec.py and simcore/models/configs/)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.models import (
    CONFIG_DIR,
    MODEL_NAMES,
    ModelConfigError,
    ModelSpec,
    from_hf_config,
    get_model,
)

# Exact totals published on the Hugging Face model pages (safetensors metadata / model cards);
# these are independent of the formulas under test.
EXACT_TOTALS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_630_071_296,
}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_preset_loads_and_is_within_2_percent_of_published(name: str) -> None:
    spec = get_model(name)
    assert spec.name == name
    assert spec.published_params > 0
    assert abs(spec.total_params() / spec.published_params - 1) < 0.02


def test_preset_files_match_names() -> None:
    assert {p.stem for p in CONFIG_DIR.glob("*.json")} == set(MODEL_NAMES)
    assert len(set(MODEL_NAMES)) == len(MODEL_NAMES)


@pytest.mark.parametrize(("name", "total"), EXACT_TOTALS.items())
def test_exact_published_totals(name: str, total: int) -> None:
    assert get_model(name).total_params() == total


def test_gptj_hand_count() -> None:
    # embed 50400*4096; per layer: qkvo 4*4096^2, fc_in/out 2*4096*16384 + biases 16384+4096, ln_1 2*4096;
    # ln_f 2*4096; lm_head 50400*4096 + 50400 bias.
    layer = 4 * 4096**2 + 2 * 4096 * 16384 + 16384 + 4096 + 2 * 4096
    expected = 50400 * 4096 + 28 * layer + 2 * 4096 + 50400 * 4096 + 50400
    spec = get_model("gpt-j-6b")
    assert spec.total_params() == expected == 6_050_882_784
    assert not spec.gated_mlp and spec.ffn_size == 16384 and spec.num_kv_heads == 16


def test_falcon_180b_shape() -> None:
    spec = get_model("falcon-180b")
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (232, 8, 64)
    assert spec.tied_embeddings and spec.lm_head_params() == 0
    # qkv (232+16)*64 wide, dense 14848^2, GeLU MLP 2*14848*59392, two LayerNorms with bias.
    layer = 14848 * 248 * 64 + 14848**2 + 2 * 14848 * 59392 + 4 * 14848
    assert spec.total_params() == 65024 * 14848 + 80 * layer + 2 * 14848


def test_deepseek_v3_structure_and_hand_count() -> None:
    spec = get_model("deepseek-v3")
    assert spec.is_moe and spec.is_mla
    assert [spec.layer_is_moe(i) for i in range(4)] == [False, False, False, True]
    assert (spec.num_dense_layers, spec.num_moe_layers) == (3, 58)
    attn = (7168 * 1536 + 1536 + 1536 * 128 * 192  # q_a, q_a_layernorm, q_b
            + 7168 * 576 + 512 + 512 * 128 * 256  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b
            + 128 * 128 * 7168)  # o_proj
    assert spec.attention_params() == attn == 187_107_328
    assert spec.expert_params() == 3 * 7168 * 2048
    assert spec.router_params() == 256 * 7168 + 256
    assert (spec.q_head_dim, spec.v_head_dim) == (192, 128)
    assert spec.total_params() == 671_026_419_200


def test_moe_active_params() -> None:
    mixtral = get_model("mixtral-8x7b")
    assert abs(mixtral.active_params() / 12.9e9 - 1) < 0.02
    deepseek = get_model("deepseek-v3")
    assert abs(deepseek.active_params() / 37e9 - 1) < 0.05
    for name in MODEL_NAMES:
        spec = get_model(name)
        idle = spec.num_moe_layers * (spec.num_experts - spec.top_k) * spec.expert_params()
        assert spec.total_params() - spec.active_params() == idle


# Published parameters per token and the convention of each publisher: Qwen, Meta and Mistral count the
# input embedding, DeepSeek, Moonshot, MiniMax and OpenAI do not (OpenAI's model card is exact: 5.13B).
# Published actives are rounded: "22B" spans +-2.3%, so 3% for two significant digits, 5% for one.
ACTIVE_CONVENTION = {
    "qwen3-235b-a22b": (True, 0.03), "qwen2-57b-a14b": (True, 0.03), "llama-4-scout": (True, 0.03),
    "llama-4-maverick": (True, 0.03), "deepseek-v2": (False, 0.03), "deepseek-v2-lite": (False, 0.03),
    "deepseek-r1": (False, 0.03), "kimi-k2": (False, 0.03), "minimax-m2": (False, 0.05),
    "gpt-oss-120b": (False, 0.005), "gpt-oss-20b": (False, 0.005), "qwen3.5-397b-a17b": (True, 0.03),
    "qwen3-30b-a3b": (True, 0.03), "qwen3-coder-480b-a35b": (True, 0.03), "glm-5": (False, 0.05),
}
# Not here: qwen3-next-80b-a3b, whose "A3B" (3B active) is rounder than its 3.87B with the input
# embedding or 3.56B without (see simcore/models/configs/README.md).


@pytest.mark.parametrize(("name", "convention"), ACTIVE_CONVENTION.items())
def test_published_active_params(name: str, convention: tuple[bool, float]) -> None:
    with_embedding, tolerance = convention
    spec = get_model(name)
    published = json.loads((CONFIG_DIR / f"{name}.json").read_text())["_published_active_params"]
    active = spec.active_params() - (0 if with_embedding else spec.embedding_params())
    assert abs(active / published - 1) < tolerance
    assert spec.active_params() < spec.total_params() / 4  # sparse: most experts idle per token


def test_kv_cache_per_token() -> None:
    assert get_model("llama-3.1-70b").kv_cache_elements_per_token() == 80 * 2 * 8 * 128 == 163_840
    assert get_model("deepseek-v3").kv_cache_elements_per_token() == 61 * (512 + 64)
    assert get_model("gpt-j-6b").kv_cache_elements_per_token() == 28 * 2 * 4096


def test_head_dims_for_non_mla() -> None:
    spec = get_model("llama-3-8b")
    assert (spec.q_head_dim, spec.v_head_dim, spec.head_dim) == (128, 128, 128)
    assert not spec.is_moe and not spec.is_mla and spec.num_moe_layers == 0


def test_synthetic_gpt_moe_design() -> None:
    small, large = get_model("gpt-moe-1.2t"), get_model("gpt-moe-1.6t")
    assert (small.num_layers, large.num_layers) == (96, 128)
    assert small.layer_params(0) == large.layer_params(0)
    assert (small.hidden_size, small.num_heads, small.num_kv_heads, small.num_experts, small.top_k) == \
        (12288, 96, 8, 16, 2)
    assert "_comment" in json.loads((CONFIG_DIR / "gpt-moe-1.2t.json").read_text())
    assert small.published_params == 1.2e12 and large.published_params == 1.6e12


def test_readme_lists_every_preset() -> None:
    readme = (CONFIG_DIR / "README.md").read_text()
    for name in MODEL_NAMES:
        assert f"`{name}`" in readme


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_dict_round_trips(name: str) -> None:
    spec = get_model(name)
    raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    assert from_hf_config(raw, name=name) == spec
    assert from_hf_config(spec.to_dict()) == spec
    assert from_hf_config(json.loads(json.dumps(spec.to_dict()))) == spec


def test_get_model_by_path_and_case() -> None:
    path = CONFIG_DIR / "mistral-7b.json"
    assert get_model(str(path)) == get_model("mistral-7b")
    assert get_model("Mistral-7B") is get_model("mistral-7b")


def test_unknown_preset_names_the_closest_or_lists_the_presets() -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt-oss-121b'.*closest: gpt-oss-120b"):
        get_model("gpt-oss-121b")
    with pytest.raises(ValueError, match="unknown model") as info:
        get_model("zzzz")  # nothing close: every preset is named
    for name in MODEL_NAMES:
        assert name in str(info.value)


def test_falcon_refinedweb_keys() -> None:
    raw = json.loads((CONFIG_DIR / "falcon-180b.json").read_text())
    old = {"model_type": "RefinedWeb", "hidden_size": raw["hidden_size"], "n_head": 232, "n_head_kv": 8,
           "n_layer": 80, "vocab_size": 65024, "bias": False, "parallel_attn": True}
    spec = from_hf_config(old, name="falcon-180b")
    assert dataclasses.replace(spec, published_params=raw["_published_params"],
                               max_position_embeddings=2048) == get_model("falcon-180b")
    seven_b = from_hf_config({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                              "num_hidden_layers": 32, "vocab_size": 65024, "multi_query": True,
                              "new_decoder_architecture": False, "parallel_attn": True})
    assert (seven_b.num_kv_heads, seven_b.norms_per_layer) == (1, 1)
    assert abs(seven_b.total_params() / 6.92e9 - 1) < 0.02  # Falcon-7B, 6.92B published


def test_unknown_model_type_uses_llama_keys() -> None:
    cfg = {"model_type": "my_llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": True}
    spec = from_hf_config(cfg)
    assert spec.name == "my_llama" and spec.head_dim == 16 and spec.num_kv_heads == 4
    assert spec.total_params() == 100 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad-config.json"
    path.write_text(text)
    return path


def _llama_cfg(**changes: object) -> dict[str, object]:
    cfg = json.loads((CONFIG_DIR / "llama-3-8b.json").read_text())
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v != "DROP"}


@pytest.mark.parametrize(("changes", "field"), [
    ({"hidden_size": "DROP"}, "hidden_size"),
    ({"num_hidden_layers": -2}, "num_hidden_layers"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"vocab_size": "32000"}, "vocab_size"),
    ({"intermediate_size": 1.5}, "intermediate_size"),
    ({"num_key_value_heads": 7}, "num_kv_heads"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ({"_published_params": -1}, "_published_params"),
])
def test_malformed_config_names_file_and_field(tmp_path: Path, changes: dict, field: str) -> None:
    path = _write(tmp_path, json.dumps(_llama_cfg(**changes)))
    with pytest.raises(ModelConfigError) as info:
        from_hf_config(path)
    message = str(info.value)
    assert field in message and "bad-config.json" in message and "\n" not in message


def test_invalid_json_and_missing_file(tmp_path: Path) -> None:
    for text in ('{"hidden_size": 4096,,}', "[1, 2]", ""):
        with pytest.raises(ModelConfigError) as info:
            from_hf_config(_write(tmp_path, text))
        assert "bad-config.json" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ModelConfigError, match="cannot read"):
        get_model(str(tmp_path / "missing.json"))
    assert issubclass(ModelConfigError, ValueError)


def test_deepseek_missing_mla_field() -> None:
    cfg = json.loads((CONFIG_DIR / "deepseek-v3.json").read_text())
    del cfg["kv_lora_rank"]
    with pytest.raises(ModelConfigError, match="kv_lora_rank"):
        from_hf_config(cfg)


_BASE = {"name": "t", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
         "ffn_size": 128, "vocab_size": 100}


@pytest.mark.parametrize(("changes", "field"), [
    ({"num_layers": 0}, "num_layers"),
    ({"num_kv_heads": 3}, "num_kv_heads"),
    ({"num_experts": 4, "top_k": 5, "expert_ffn_size": 32}, "top_k"),
    ({"num_experts": 4, "top_k": 2}, "expert_ffn_size"),
    ({"top_k": 2}, "top_k"),
    ({"dense_first_layers": 5}, "dense_first_layers"),
    ({"num_experts": 4, "top_k": 2, "expert_ffn_size": 32, "dense_first_layers": 4}, "dense_first_layers"),
    ({"kv_lora_rank": 32}, "qk_nope_head_dim"),
    ({"qk_rope_head_dim": 8}, "qk_rope_head_dim"),
    ({"v_head_dim": 8}, "v_head_dim"),
])
def test_spec_validation(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ModelSpec(**{**_BASE, **changes})


def test_layer_index_checked() -> None:
    spec = ModelSpec(**_BASE)
    with pytest.raises(ValueError, match="layer"):
        spec.layer_is_moe(4)


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 12), kv=st.sampled_from([1, 2, 4]), group=st.integers(1, 4),
       head_dim=st.sampled_from([8, 16]), experts=st.integers(0, 8), top_k=st.integers(1, 8),
       shared=st.integers(0, 2), dense_first=st.integers(0, 11), gated=st.booleans(), tied=st.booleans())
def test_param_count_invariants(layers: int, kv: int, group: int, head_dim: int, experts: int, top_k: int,
                                shared: int, dense_first: int, gated: bool, tied: bool) -> None:
    moe = {"num_experts": experts, "top_k": min(top_k, experts), "num_shared_experts": shared,
           "expert_ffn_size": 24, "dense_first_layers": min(dense_first, layers - 1)} if experts else {}
    spec = ModelSpec(name="p", num_layers=layers, hidden_size=32, num_heads=kv * group, num_kv_heads=kv,
                     head_dim=head_dim, ffn_size=48, vocab_size=50, gated_mlp=gated, tied_embeddings=tied,
                     **moe)
    assert spec.num_moe_layers + spec.num_dense_layers == layers
    outside = spec.embedding_params() + spec.lm_head_params() + 32
    assert spec.total_params() == outside + sum(spec.layer_params(i) for i in range(layers))
    assert 0 < spec.active_params() <= spec.total_params()
    if not spec.is_moe:
        assert spec.active_params() == spec.total_params()
    assert spec.kv_cache_elements_per_token() == 2 * kv * head_dim * layers
    assert from_hf_config(spec.to_dict()) == spec


@pytest.mark.parametrize("module_name", ["simcore.models.spec", "simcore.models.ids"])
def test_catalog_doctests(module_name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module_name))
    assert result.attempted > 0 and result.failed == 0


def test_checkpoint_dtype_is_the_configs_weight_type() -> None:
    """``ModelSpec.checkpoint_dtype``: ``torch_dtype`` (or ``dtype``, nested under ``text_config`` too), unless a
    ``quantization_config`` says otherwise; a quantization it does not read, or none stated, is ``""``."""
    assert get_model("qwen3-32b").checkpoint_dtype == "bf16"  # torch_dtype bfloat16
    assert get_model("llama-2-7b").checkpoint_dtype == "fp16"  # torch_dtype float16
    assert get_model("deepseek-v3").checkpoint_dtype == "fp8"  # quant_method fp8 over torch_dtype bfloat16
    assert get_model("gpt-oss-120b").checkpoint_dtype == "mxfp4"  # quant_method mxfp4, no torch_dtype
    assert get_model("qwen3.5-397b-a17b").checkpoint_dtype == "bf16"  # text_config.dtype
    base = json.loads((CONFIG_DIR / "qwen3-32b.json").read_text())
    assert from_hf_config({k: v for k, v in base.items() if k != "torch_dtype"}).checkpoint_dtype == ""
    assert from_hf_config(base | {"quantization_config": {"quant_method": "awq"}}).checkpoint_dtype == ""
    int4 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": 32}}}}
    assert from_hf_config(base | {"quantization_config": int4}).checkpoint_dtype == "int4_g32"
    spec = get_model("deepseek-v3")
    assert from_hf_config(spec.to_dict()).checkpoint_dtype == "fp8"  # the round trip keeps it
    with pytest.raises(ValueError, match="checkpoint_dtype"):
        dataclasses.replace(get_model("qwen3-32b"), checkpoint_dtype="int3")
