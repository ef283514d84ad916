"""Expert parallelism inside a tensor-parallel group (``Pool.moe_ep``): whole experts per GPU on the group's
replicated tokens, the busiest GPU under sampled routing, the launches that run it, and the study's rows."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, routed_experts
from simcore.hardware.kernels import gemm_time_s
from simcore.models import get_model
from simcore.moe import RoutingConfig, expected_max_loads
from simcore.serving import (
    GroupBatch,
    Pool,
    ServingInputError,
    ServingPlan,
    StepCost,
    get_runtime,
    runtime_strategy,
)
from simcore.serving.kvcache import kv_capacity_tokens
from simcore.serving.step_cost import _NoAttention
from simcore.workload import Workload

MODEL = "qwen3-235b-a22b"  # 128 experts, top 8, hidden 4096, expert FFN 1536
SAMPLED = RoutingConfig(sampled=True)


def _ctx(routing=None, model: str = MODEL) -> CostContext:
    return CostContext(get_model(model), Workload(precision="fp8"), Cluster.simple("h200", 8), routing=routing)


def _cost(moe_ep: int, routing=None, tp: int = 8, runtime: str = "sglang") -> StepCost:
    return StepCost(_ctx(routing), runtime_strategy(tp=tp), get_runtime(runtime), moe_ep)


def _expert_tasks(cost: StepCost, tokens: int) -> list[float]:
    """The two expert GEMMs of one MoE layer of a ``tokens``-token step, as ``cost`` lowers them."""
    low = _NoAttention(cost.ctx, cost._arrays, "prefill", cost.w.input_len, cost.expert_load(tokens))
    low.tokens, low.seqs = float(tokens), float(tokens)
    low.expert_groups = cost.moe_ep
    return [float(t.time_s) for t in low.layer(moe=True) if t.name in ("expert_ffn1", "expert_ffn2")]


def _experts_s(cost: StepCost, tokens: int) -> float:
    return sum(_expert_tasks(cost, tokens))


def test_whole_experts_per_gpu_by_hand():
    """tp 8, moe_ep 8, balanced routing: each GPU holds 16 of the 128 experts whole (gate/up 4096 -> 2 x
    1536, down 1536 -> 4096); 4 tokens route 32 copies, so each of its experts is active with
    probability 1 - (1 - 1/128)^32, and its GEMMs are dense FP8 GEMMs of those experts at their token
    share, as the lowering prices any grouped expert GEMM."""
    cost = _cost(8)
    p_active, per_expert = routed_experts(4 * 8, 128)
    active = 16 * p_active
    gpu = cost.gpu
    ffn1 = gemm_time_s(per_expert, 2 * 1536, 4096, gpu, "fp8", count=active)
    ffn2 = gemm_time_s(per_expert, 4096, 1536, gpu, "fp8", count=active)
    assert _expert_tasks(cost, 4) == pytest.approx([ffn1, ffn2], rel=1e-12)


def test_moe_ep_1_is_expert_tensor_parallelism_exactly():
    """The default changes nothing: moe_ep 1 and no moe_ep price every step the same, bit for bit."""
    ctx = _ctx(SAMPLED)
    base = StepCost(ctx, runtime_strategy(tp=8), get_runtime("sglang"))
    one = StepCost(ctx, runtime_strategy(tp=8), get_runtime("sglang"), 1)
    for seqs in (1, 4, 64):
        batch = [GroupBatch.of([(512, 0)], [1000] * seqs, seqs + 1)]
        assert base.stage_times(batch) == one.stage_times(batch)
        assert base.expert_load(seqs) == one.expert_load(seqs) == 1.0  # one expert rank: nothing to balance


def test_same_work_and_weights_per_gpu_as_expert_tp():
    """E / 8 whole experts or 1/8 of every expert: each GPU computes the same FLOPs on the same weight
    elements (n x k x active experts, summed over both GEMMs) at any batch, so the memory model, which
    sees the strategy alone, rightly gives both layouts one KV capacity."""
    def work(moe_ep: int, tokens: int) -> tuple[float, float]:
        cost = _cost(moe_ep)
        low = _NoAttention(cost.ctx, cost._arrays, "prefill", cost.w.input_len)
        low.tokens, low.seqs = float(tokens), float(tokens)
        low.expert_groups = moe_ep
        tasks = [t for t in low.layer(moe=True) if t.name in ("expert_ffn1", "expert_ffn2")]
        return sum(float(t.flops) for t in tasks), len(tasks)

    for tokens in (4, 4096):
        ep_flops, n_ep = work(8, tokens)
        tp_flops, n_tp = work(1, tokens)
        assert n_ep == n_tp == 2 and ep_flops == pytest.approx(tp_flops, rel=1e-12)
    assert work(2, 64)[0] == pytest.approx(work(1, 64)[0], rel=1e-12)  # moe_tp 4 x moe_ep 2 too
    assert kv_capacity_tokens(_ctx(), Pool(runtime_strategy(tp=8), moe_ep=8).strategy, get_runtime("sglang")) > 0


def test_balanced_routing_reads_the_same_expert_bytes_as_expert_tp():
    """Without a routing config (the proxy's balanced routing) each GPU reads, in expectation, the same
    expert bytes under either layout; at a decode size, where the weights' reads set the time, the expert
    GEMMs take within a few percent of each other (the whole experts' wider tiles differ a little)."""
    for tokens in (4, 64):
        assert _experts_s(_cost(8), tokens) == pytest.approx(_experts_s(_cost(1), tokens), rel=0.15)


def test_sampled_routing_makes_a_step_wait_for_its_busiest_gpu():
    """Under sampled routing the expert GPUs' loads are binomial: at 4 decoding tokens (32 copies over 8
    GPUs) the busiest takes 1.7x its share and its expert GEMMs take over 1.2x expert TP's (their fixed
    kernel time does not grow), at 256 tokens 1.08x, where the whole experts' wider GEMMs win it back;
    expert TP splits every expert evenly whatever the routing. The load is :func:`expected_max_loads`
    over the 8 ranks."""
    assert _cost(8, SAMPLED).expert_load(4) == pytest.approx(
        float(expected_max_loads(SAMPLED, 128, 8, 4 * 8)), rel=1e-12)
    assert _cost(8, SAMPLED).expert_load(4) > 1.6 > 1.1 > _cost(8, SAMPLED).expert_load(256) > 1.0
    excess = {t: _experts_s(_cost(8, SAMPLED), t) / _experts_s(_cost(1, SAMPLED), t) for t in (4, 256)}
    assert excess[4] > 1.2
    assert excess[256] < 1.0 < excess[4]
    assert _experts_s(_cost(1, SAMPLED), 4) == _experts_s(_cost(1), 4)  # expert TP: no busiest GPU


def test_attention_dp_groups_and_moe_ep_compose_into_one_expert_rank_count():
    """ep 2 attention groups of tp 4 with moe_ep 4: experts over 8 ranks, 16 per GPU, the busiest of 8."""
    ctx = _ctx(SAMPLED)
    cost = StepCost(ctx, runtime_strategy(tp=4, ep=2), get_runtime("sglang"), 4)
    assert cost.expert_load(4) == pytest.approx(float(expected_max_loads(SAMPLED, 128, 8, 4 * 2 * 8)), rel=1e-12)
    low_tp = StepCost(ctx, runtime_strategy(tp=4, ep=2), get_runtime("sglang"))
    assert low_tp.expert_load(4) == pytest.approx(float(expected_max_loads(SAMPLED, 128, 2, 4 * 2 * 8)), rel=1e-12)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tp": 8, "moe_ep": 3}, "pool.moe_ep"),
    ({"tp": 8, "moe_ep": 0}, "pool.moe_ep"),
    ({"tp": 4, "moe_ep": 8}, "pool.moe_ep"),
    ({"tp": 8, "moe_ep": True}, "pool.moe_ep"),
])
def test_a_moe_ep_the_pool_cannot_take_is_a_one_line_error(kwargs, field):
    with pytest.raises(ServingInputError, match=field) as err:
        Pool(runtime_strategy(tp=kwargs["tp"]), moe_ep=kwargs["moe_ep"])
    assert "\n" not in str(err.value)


def test_a_model_the_layout_cannot_split_is_refused_naming_the_field():
    with pytest.raises(ServingInputError, match="no routed experts"):
        StepCost(_ctx(model="llama-3.1-70b"), runtime_strategy(tp=8), get_runtime("vllm"), 8)
    mixtral = CostContext(get_model("mixtral-8x7b"), Workload(precision="bf16"), Cluster.simple("h200", 8))
    assert get_model("mixtral-8x7b").num_experts == 8
    StepCost(mixtral, runtime_strategy(tp=8), get_runtime("vllm"), 8)  # 8 experts over 8 ranks: fine
    with pytest.raises(ServingInputError, match="do not split evenly"):
        StepCost(mixtral, runtime_strategy(tp=4, ep=4), get_runtime("vllm"), 4)  # 16 ranks, 8 experts


def test_a_deepep_runtime_keeps_its_experts_over_the_dp_groups():
    """DeepEP's dispatch inside a TP group is not priced: refused in one line, not priced as free."""
    with pytest.raises(ServingInputError, match="pool.moe_ep: runtime sglang-deepep") as err:
        StepCost(_ctx(), runtime_strategy(tp=8), get_runtime("sglang-deepep"), 8)
    assert "\n" not in str(err.value)
    StepCost(_ctx(), runtime_strategy(tp=1, ep=8), get_runtime("sglang-deepep"), 1)  # its own layout


def test_a_seesaw_plan_keeps_expert_tp():
    """Its re-layout prices experts sharded by TP; an expert-parallel layout is refused, not mispriced."""
    with pytest.raises(ServingInputError, match="moe_ep"):
        ServingPlan("seesaw", prefill=Pool(runtime_strategy(pp=8)), decode=Pool(runtime_strategy(tp=8), moe_ep=8))


def test_describe_and_dict_name_moe_ep_only_when_set():
    assert "moe_ep" not in Pool(runtime_strategy(tp=8)).describe()
    assert "moe_ep" not in Pool(runtime_strategy(tp=8)).to_dict()
    pool = Pool(runtime_strategy(tp=8), moe_ep=8)
    assert "moe_ep8" in pool.describe() and pool.to_dict()["moe_ep"] == 8


def test_a_plan_file_carries_moe_ep_through_the_app():
    from planner.serving.config import plan_from_dict

    plan = ServingPlan("agg", pool=Pool(runtime_strategy(tp=8), workers=1, max_num_seqs=64, moe_ep=8))
    again = plan_from_dict(plan.to_dict())
    assert again.pool.moe_ep == 8 and again.pool.strategy == plan.pool.strategy


def test_launches_carry_the_expert_parallel_layout():
    """vLLM: --enable-expert-parallel (EP = tp, what it runs, so no caveat); SGLang: --ep-size; TensorRT-LLM:
    --ep_size and moe EP / TP sizes of the layout, moe_tp = tp / moe_ep."""
    from simcore.export.serving import serving_launch

    model = get_model(MODEL)
    ep8 = ServingPlan("agg", pool=Pool(runtime_strategy(tp=8), max_num_seqs=64, moe_ep=8))
    vllm = serving_launch(ep8, model, "vllm")
    assert "--enable-expert-parallel" in vllm.to_text() and "--data-parallel-size" not in vllm.to_text()
    assert not any("expert parallelism spans" in n for n in vllm.notes)
    assert "--ep-size 8" in serving_launch(ep8, model, "sglang").to_text()
    trt = serving_launch(ep8, model, "trtllm")
    opts = yaml.safe_load(trt.files["trtllm_both.yaml"])
    assert (opts["moe_expert_parallel_size"], opts["moe_tensor_parallel_size"]) == (8, 1)
    assert "--ep_size 8 " in trt.to_text()
    half = ServingPlan("agg", pool=Pool(runtime_strategy(tp=8), max_num_seqs=64, moe_ep=2))
    opts = yaml.safe_load(serving_launch(half, model, "trtllm").files["trtllm_both.yaml"])
    assert (opts["moe_expert_parallel_size"], opts["moe_tensor_parallel_size"]) == (2, 4)
    assert any("moe_ep=8 is what vLLM runs" in n for n in serving_launch(half, model, "vllm").notes)
    tp_only = ServingPlan("agg", pool=Pool(runtime_strategy(tp=8), max_num_seqs=64))
    assert "--enable-expert-parallel" not in serving_launch(tp_only, model, "vllm").to_text()
    assert "--ep-size" not in serving_launch(tp_only, model, "sglang").to_text()


def _row(**fields) -> dict:
    row = {"backend": "sglang", "backend_version": "0.5.9", "model_path": "Qwen/Qwen3.5-397B-A17B", "system": "h200_sxm",
           "precision": "fp8", "mode": "agg", "isl": "1024", "osl": "1024", "gemm_quant_mode": "fp8",
           "moe_quant_mode": "fp8_block", "batch_size": "4", "tp_size": "8", "pp_size": "1", "attention_dp_size": "1",
           "moe_tp_size": "1", "moe_ep_size": "8", "silicon_data_source": "x; silicon_concurrency=4; y",
           "silicon_ttft_ms": "300", "silicon_tpot_ms": "10"}
    return row | fields


@pytest.mark.parametrize(("fields", "tp", "ep", "moe_ep"), [
    ({}, 8, 1, 8),  # --tp 8 --ep 8: attention TP, experts EP inside it
    ({"tp_size": "64", "moe_tp_size": "8", "moe_ep_size": "8"}, 8, 1, 8),  # the same launch recorded as 8 x 8
    ({"tp_size": "1", "attention_dp_size": "64", "moe_tp_size": "8", "moe_ep_size": "8"}, 1, 8, 1),  # dp-attn
    ({"tp_size": "8", "moe_tp_size": "8", "moe_ep_size": "1"}, 8, 1, 1),  # expert TP
    ({"model_path": "openai/gpt-oss-120b", "backend": "trtllm", "backend_version": "gpt-oss-dev", "precision": "fp4",
      "tp_size": "4", "moe_tp_size": "2", "moe_ep_size": "2"}, 4, 1, 2),  # moe_tp 2 x moe_ep 2
])
def test_the_study_reads_each_rows_expert_layout(fields, tp, ep, moe_ep):
    from validation.studies.serving.mapping import map_row

    case = map_row(_row(**fields))
    assert not case.skip, case.skip
    pool = case.plan.pool
    assert (pool.strategy.tp, pool.strategy.ep, pool.moe_ep) == (tp, ep, moe_ep)
    assert case.ctx.routing == SAMPLED  # every MoE row: the busiest expert rank


def test_dense_rows_keep_balanced_routing():
    from validation.studies.serving.mapping import map_row

    case = map_row(_row(model_path="meta-llama/Llama-3.1-70B", backend="vllm", backend_version="", moe_tp_size="8",
                        moe_ep_size="1"))
    assert not case.skip and case.ctx.routing is None and case.plan.pool.moe_ep == 1


def test_expert_parallel_rows_decode_slower_than_the_same_row_read_as_expert_tp():
    """What the layout does to a measured row: Qwen3.5 at --tp 8 --ep 8 with 4 clients decodes slower as
    EP (the busiest of 8 GPUs) than the same row priced as expert TP, as the study did before."""
    from validation.studies.serving import simulate_case
    from validation.studies.serving.mapping import map_row

    case = map_row(_row())
    ep_ttft, ep_tpot, why = simulate_case(case)
    assert not why
    case.plan = ServingPlan("agg", pool=dataclasses.replace(case.plan.pool, moe_ep=1))
    tp_ttft, tp_tpot, _ = simulate_case(case)
    assert ep_tpot > tp_tpot and math.isfinite(ep_ttft + tp_ttft)
