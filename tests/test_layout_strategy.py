"""Layout propagation and the strategy representation."""

import numpy as np
import pytest

from simcore.models import get_model
from simcore.strategy import layout as L
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS, input_layout, model_ops, output_layout
from simcore.strategy.sharding import Strategy, StrategyError, megatron_sharding, megatron_strategy


@pytest.mark.parametrize(("src", "dst", "coll", "size"), [
    (L.P, L.R, L.ALL_REDUCE, 800.0),          # Megatron row-parallel -> replicated
    (L.P, L.S_FEAT, L.REDUCE_SCATTER, 800.0),  # sequence-parallel style
    (L.S_FEAT, L.R, L.ALL_GATHER, 800.0),      # the paper's rewrite: all-gather instead of all-reduce
    (L.S_TOK, L.R, L.ALL_GATHER, 800.0),
    (L.S_TOK, L.S_FEAT, L.ALL_TO_ALL, 100.0),  # per-rank share of the tensor
    (L.R, L.S_FEAT, L.NONE, 0.0),              # slicing a replicated tensor is free
    (L.S_FEAT, L.S_FEAT, L.NONE, 0.0),
])
def test_transition_table(src, dst, coll, size):
    assert L.transition(src, dst, 800.0, 8) == (coll, size)


def test_single_rank_group_never_communicates():
    assert L.transition(L.P, L.R, 800.0, 1) == (L.NONE, 0.0)


def test_consumer_never_needs_partial_sums():
    with pytest.raises(ValueError, match="partial"):
        L.transition(L.R, L.P, 1.0, 2)


def test_vectorized_transition_equals_scalar():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 4, 200)
    dst = rng.integers(0, 3, 200)
    size = rng.uniform(1, 1e6, 200)
    group = rng.choice([1, 2, 4, 8], 200)
    coll, nbytes = L.transition_arrays(src, dst, size, group)
    for i in range(200):
        assert (coll[i], nbytes[i]) == pytest.approx(L.transition(src[i], dst[i], size[i], group[i]))


def test_megatron_mlp_needs_one_all_reduce_and_rewrite_two_all_gathers():
    meg = megatron_sharding()
    f1, f2 = meg["dense_ffn1"], meg["dense_ffn2"]
    assert (f1, f2) == ("dim1", "dim0")
    out1, in2 = output_layout("dense_ffn1", CHOICES.index(f1)), input_layout("dense_ffn2", CHOICES.index(f2))
    assert L.transition(out1, in2, 1.0, 4)[0] == L.NONE
    out2 = output_layout("dense_ffn2", CHOICES.index(f2))
    assert L.transition(out2, input_layout("qkv", 1), 1.0, 4)[0] == L.ALL_REDUCE
    # Appendix B: FFN2 sharded on the hidden (output) dimension -> all-gathers only
    rewrite = CHOICES.index("dim1")
    assert L.transition(out1, input_layout("dense_ffn2", rewrite), 1.0, 4)[0] == L.ALL_GATHER
    assert L.transition(output_layout("dense_ffn2", rewrite), input_layout("qkv", 1), 1.0, 4)[0] == L.ALL_GATHER


def test_operator_graph_has_the_twelve_searchable_ops_for_moe_with_shared_experts():
    assert len(SEARCHABLE_OPS) == 12
    ops = model_ops(get_model("deepseek-v3"))
    assert set(ops) == set(SEARCHABLE_OPS)
    assert ops["expert_ffn1"].num_weights == 256
    dense = model_ops(get_model("llama-3.1-70b"))
    assert "router" not in dense and dense["dense_ffn1"].out_features == 2 * 28672


def test_strategy_yaml_round_trip(tmp_path):
    s = megatron_strategy(tp=4, pp=2, dp=1, batch=32, microbatches=2).replace(
        sharding=megatron_sharding() | {"dense_ffn2": "dim1"})
    path = tmp_path / "plan.yaml"
    path.write_text(s.to_yaml())
    assert Strategy.from_yaml(path) == s
    assert Strategy.from_yaml(s.to_yaml()).key() == s.key()


@pytest.mark.parametrize(("data", "match"), [
    ({"tp": 0}, "strategy.tp"),
    ({"tp": 2, "warp": 3}, "unknown field.*warp"),
    ({"sharding": {"ffn9": "dim0"}}, "unknown operator.*ffn9"),
    ({"sharding": {"qkv": "dim7"}}, "strategy.sharding.qkv"),
])
def test_bad_strategy_names_the_field(data, match):
    with pytest.raises(StrategyError, match=match) as info:
        Strategy.from_dict(data)
    assert "\n" not in str(info.value)


def test_partial_sharding_is_completed_with_megatron():
    s = Strategy(tp=2, sharding={"qkv": "replicated"})
    assert s.sharding["qkv"] == "replicated" and s.sharding["dense_ffn2"] == "dim0"
