"""Plan export: each target's flags for a dense TP/PP plan and an MoE EP plan, gaps listed and priced,
nothing dropped silently, bad targets rejected in one line."""

import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig
from simcore.export import TARGETS, export_plan
from simcore.models import get_model
from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS, op_applies
from simcore.strategy.sharding import Strategy, megatron_sharding
from tests.conftest import make_ctx

LLAMA = get_model("llama-3.1-70b")
DEEPSEEK = get_model("deepseek-v3")
DENSE_PLAN = Strategy(tp=4, pp=2, batch=64, microbatches=2)
MOE_PLAN = Strategy(tp=2, ep=8, pp=1, dp=4, batch=512)


def flag(result, name: str) -> str | None:
    """The value after ``name`` (``""`` for a switch), or ``None`` when absent."""
    flags = list(result.flags)
    if name not in flags:
        return None
    i = flags.index(name)
    nxt = flags[i + 1] if i + 1 < len(flags) else "--"
    return "" if nxt.startswith("--") else nxt


def test_dense_tp_pp_plan_flags():
    vllm, sglang, megatron = (export_plan(DENSE_PLAN, LLAMA, t, precision="bf16") for t in TARGETS)
    assert vllm.program[:3] == ("vllm", "serve", "meta-llama/Llama-3.1-70B")
    assert (flag(vllm, "--tensor-parallel-size"), flag(vllm, "--pipeline-parallel-size")) == ("4", "2")
    assert flag(vllm, "--max-num-seqs") == "64" and flag(vllm, "--dtype") == "bfloat16"
    assert flag(vllm, "--enable-expert-parallel") is None and flag(vllm, "--data-parallel-size") is None
    assert (flag(sglang, "--tp-size"), flag(sglang, "--pp-size"), flag(sglang, "--max-running-requests")) == \
        ("4", "2", "64")
    assert flag(sglang, "--enable-dp-attention") is None and flag(sglang, "--ep-size") is None
    assert flag(megatron, "--tensor-model-parallel-size") == "4"
    assert flag(megatron, "--pipeline-model-parallel-size") == "2"
    assert flag(megatron, "--sequence-parallel") == ""
    assert flag(megatron, "--micro-batch-size") == "32"  # 64 sequences in 2 microbatches
    assert flag(megatron, "--expert-model-parallel-size") is None
    for r in (vllm, sglang, megatron):  # Megatron's sharding, pp microbatches: all expressible
        assert r.gaps == () and r.replicas == 1 and not r.env  # 80 layers split evenly


def test_moe_ep_plan_flags():
    vllm, sglang, megatron = (export_plan(MOE_PLAN, DEEPSEEK, t, precision="fp8", gpus_per_node=8) for t in TARGETS)
    assert flag(vllm, "--tensor-parallel-size") == "2"
    assert flag(vllm, "--data-parallel-size") == "8" and flag(vllm, "--enable-expert-parallel") == ""
    assert flag(vllm, "--max-num-seqs") == "64" and vllm.replicas == 4  # 512 sequences over 8 groups
    assert any("EP=16" in n for n in vllm.notes)  # vLLM's EP spans tp*ep: stated, not hidden
    assert flag(sglang, "--tp-size") == "16" and flag(sglang, "--dp-size") == "8"
    assert flag(sglang, "--enable-dp-attention") == "" and flag(sglang, "--ep-size") == "8"
    assert flag(sglang, "--max-running-requests") == "512" and sglang.replicas == 4
    assert flag(sglang, "--nnodes") == "2" and flag(sglang, "--kv-cache-dtype") == "fp8_e4m3"
    assert [g.item for g in sglang.gaps] == ["embedding"]  # replicated under DP attention
    assert flag(megatron, "--expert-model-parallel-size") == "8"
    assert flag(megatron, "--expert-tensor-parallel-size") == "2"
    assert flag(megatron, "--inference-max-requests") == "64" and flag(megatron, "--fp8-format") == "hybrid"
    assert megatron.program[:5] == ("torchrun", "--nnodes", "8", "--nproc-per-node", "8")
    assert megatron.gaps == ()


def test_replicated_experts_per_target():
    plan = MOE_PLAN.replace(sharding=megatron_sharding() | {"expert_ffn1": "replicated",
                                                            "expert_ffn2": "replicated"})
    megatron = export_plan(plan, DEEPSEEK, "megatron")
    assert flag(megatron, "--expert-tensor-parallel-size") == "1" and megatron.gaps == ()
    sglang = export_plan(plan, DEEPSEEK, "sglang")
    assert flag(sglang, "--moe-dp-size") == "2" and "expert_ffn1" not in [g.item for g in sglang.gaps]
    vllm = export_plan(plan, DEEPSEEK, "vllm")
    assert [(g.item, g.ours, g.target) for g in vllm.gaps] == [
        ("expert_ffn1", "replicated", "dim1"), ("expert_ffn2", "replicated", "dim0")]


def test_uneven_pipeline_split_is_carried():
    plan = Strategy(tp=8, ep=4, pp=2, batch=256, microbatches=2)  # 61 layers: 31 + 30
    assert export_plan(plan, DEEPSEEK, "vllm").env == {"VLLM_PP_LAYER_PARTITION": "31,30"}
    assert export_plan(plan, DEEPSEEK, "sglang").env == {"SGLANG_PP_LAYER_PARTITION": "31,30"}
    megatron = export_plan(plan, DEEPSEEK, "megatron")
    assert flag(megatron, "--decoder-first-pipeline-num-layers") == "31"
    assert flag(megatron, "--decoder-last-pipeline-num-layers") == "30"


def test_unsupported_choice_is_listed_with_its_fallback_cost():
    ctx = make_ctx("llama-3.1-70b", gpus=8)
    plan = Strategy(tp=2, pp=2, dp=2, batch=256, microbatches=4,
                    sharding=megatron_sharding() | {"out_proj": "dim1"})
    r = export_plan(plan, LLAMA, "vllm", ctx=ctx)
    assert [(g.item, g.ours, g.target) for g in r.gaps] == [("out_proj", "dim1", "dim0"),
                                                          ("microbatches", "4", "2 (= pp)")]
    base = evaluate(ctx, plan).tokens_per_s_per_gpu
    alone = evaluate(ctx, plan.replace(sharding=megatron_sharding())).tokens_per_s_per_gpu
    both = evaluate(ctx, plan.replace(sharding=megatron_sharding(), microbatches=2)).tokens_per_s_per_gpu
    assert r.gaps[0].proxy_change == pytest.approx(alone / base - 1, rel=1e-12)
    assert r.gaps[0].proxy_change != 0.0
    assert r.pricing.proxy_plan == pytest.approx(base) and r.pricing.proxy_fallback == pytest.approx(both)
    assert r.fallback == plan.replace(sharding=megatron_sharding(), microbatches=2)
    assert r.pricing.sim_plan is None  # no graph: proxy only, said so
    text = r.to_text()
    assert "out_proj" in text and f"{r.gaps[0].proxy_change:+.1%}" in text and r.command() in text


def test_fallback_is_simulated_when_a_graph_is_given():
    from topologies import build_topology

    ctx = make_ctx("llama-3.1-70b", gpus=8)
    plan = Strategy(tp=2, pp=2, dp=2, batch=256, microbatches=2, sharding=megatron_sharding() | {"qkv": "dim0"})
    r = export_plan(plan, LLAMA, "megatron", ctx=ctx, graph=build_topology("hgx-h100", num_nodes=1),
                    engine=EngineConfig(decode_steps=2))
    assert [g.item for g in r.gaps] == ["qkv"]
    assert r.pricing.sim_plan > 0 and r.pricing.sim_fallback > 0 and r.pricing.sim_change is not None
    assert "simulator" in r.to_text()


def test_command_is_copy_pasteable():
    r = export_plan(Strategy(tp=8, ep=4, pp=2, batch=256, microbatches=2), DEEPSEEK, "megatron",
                    gpus_per_node=8)
    words = shlex.split(r.command().replace("\\\n", " "))
    assert words == [f"{k}={v}" for k, v in r.env.items()] + r.argv
    assert "${CHECKPOINT}" in r.command()  # placeholders stay expandable
    assert export_plan(Strategy(tp=8, batch=8), LLAMA, "vllm", model_path="/models/my llama").command() \
        .startswith("vllm serve '/models/my llama'")


def test_unknown_target_names_the_valid_ones():
    with pytest.raises(ValueError, match="vllm, sglang, megatron"):
        export_plan(DENSE_PLAN, LLAMA, "tensorrt")


def test_synthetic_model_says_to_replace_the_path():
    r = export_plan(Strategy(tp=8, ep=2, batch=64), get_model("gpt-moe-1.2t"), "vllm")
    assert "no published checkpoint" in r.notes[0]


_DEGREE = st.sampled_from([1, 2, 4, 8])


@settings(max_examples=60, deadline=None)
@given(tp=_DEGREE, ep=_DEGREE, pp=_DEGREE, dp=_DEGREE, mb=_DEGREE, target=st.sampled_from(TARGETS),
       model=st.sampled_from(["llama-3.1-70b", "deepseek-v3", "mixtral-8x7b"]),
       choices=st.lists(st.sampled_from(CHOICES), min_size=len(SEARCHABLE_OPS), max_size=len(SEARCHABLE_OPS)))
def test_nothing_is_dropped_silently(tp, ep, pp, dp, mb, target, model, choices):
    spec = get_model(model)
    ep = ep if spec.is_moe else 1
    plan = Strategy(tp=tp, ep=ep, pp=pp, dp=dp, batch=64, microbatches=mb,
                    sharding=dict(zip(SEARCHABLE_OPS, choices, strict=True)))
    r = export_plan(plan, spec, target)
    listed = {g.item for g in r.gaps}
    for op in SEARCHABLE_OPS:  # what the target runs equals the plan, or the difference is listed
        if op_applies(spec, op):
            assert (r.fallback.sharding[op] == plan.sharding[op]) != (op in listed)
    assert (r.fallback.microbatches == plan.microbatches) != ("microbatches" in listed)
    assert r.fallback.replace(sharding=plan.sharding, microbatches=plan.microbatches) == plan


def test_shard_sim_export(tmp_path):
    entry = "from planner.apps.sim import main; main()"
    args = ["experiment=dense-70b-1node", "strategy.tp=2", "strategy.pp=2", "strategy.dp=2", "strategy.batch=256",
            "strategy.microbatches=2", "strategy.sharding.out_proj=dim1", "sim.decode_steps=2"]
    ok = subprocess.run([sys.executable, "-c", entry, *args, "export=sglang", f"hydra.run.dir={tmp_path}"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    text = (tmp_path / "export_sglang.txt").read_text()
    assert "python -m sglang.launch_server" in text and "out_proj" in text and "--tp-size 2" in ok.stdout
    bad = subprocess.run([sys.executable, "-c", entry, *args, "export=trt", f"hydra.run.dir={tmp_path / 'bad'}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "vllm, sglang, megatron" in bad.stderr
