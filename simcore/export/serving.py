"""Launch configurations of a serving plan for vLLM, SGLang and TensorRT-LLM, disaggregated pools included.

Each pool's worker is one launch of its ``(tp, ep, pp)`` strategy, mapped by the static plan mappers of
:mod:`simcore.export.targets` (``ep`` attention data-parallel groups of ``tp`` GPUs, experts split
``ep x moe_ep`` ways; ``max_num_seqs`` per worker), repeated ``workers`` times. Workers take consecutive GPUs,
prefill workers first, as :func:`simcore.serving.simulate_serving` places them; each launch says which
node and GPUs it runs on.

- vLLM: ``vllm serve`` per worker (aggregated); disaggregated pools run Dynamo-style
  (``python -m dynamo.frontend``, ``python -m dynamo.vllm ... --is-prefill-worker`` for prefill, the
  same without it for decode; KV over NIXL).
- SGLang: ``python -m sglang.launch_server`` per worker with ``--disaggregation-mode prefill|decode``,
  and ``python -m sglang_router.launch_router`` in front (``--pd-disaggregation`` for split pools).
- TensorRT-LLM: ``trtllm-serve`` per worker with an ``--extra_llm_api_options`` YAML per pool
  (parallel sizes, attention DP, batch and token limits, the KV-cache transceiver when split) and
  ``trtllm-serve disaggregated -c`` over the context and generation servers.

Flags assume vLLM 0.10-0.11, SGLang 0.5, TensorRT-LLM 1.0-1.1 and Dynamo 0.5+; check ``--help``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import yaml

from simcore.export import model_has_mtp as has
from simcore.export import model_source
from simcore.export.targets import MAPPERS, Deployment
from simcore.models import ModelSpec
from simcore.serving import Pool, ServingPlan
from simcore.serving.runtime import RuntimeProfile, get_runtime

#: placeholder for an EAGLE-3 draft checkpoint, where the model has no MTP module of its own
_DRAFT = "${EAGLE3_DRAFT_MODEL}"


def model_has_mtp(model: ModelSpec) -> bool:

    return has(model)

__all__ = ["LaunchConfig", "serving_launch", "SERVING_TARGETS"]

SERVING_TARGETS = ("vllm", "sglang", "trtllm")
_BASE_PORT = {"vllm": 8100, "sglang": 30000, "trtllm": 8300}


@dataclass
class LaunchConfig:
    """A target's launch script and the files it reads, with notes on what it cannot express."""

    target: str
    script: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        body = "\n".join(self.script)
        notes = "".join(f"# note: {n}\n" for n in self.notes)
        return f"#!/usr/bin/env bash\n# {self.target} launch of the serving plan\n{notes}{body}\n"


def _workers(plan: ServingPlan, gpus_per_node: int | None):
    """``(role, pool, index, where, port offset)`` of every worker, GPUs placed in order."""
    gpu0, k = 0, 0
    for role, pool in plan.pools:
        for w in range(pool.workers):
            n = pool.gpus_per_worker
            if gpus_per_node:
                node, local = divmod(gpu0, gpus_per_node)
                where = (f"node {node}, GPUs {local}-{local + n - 1}" if local + n <= gpus_per_node
                         else f"nodes {node}-{(gpu0 + n - 1) // gpus_per_node} ({n} GPUs)")
            else:
                where = f"GPUs {gpu0}-{gpu0 + n - 1}"
            yield role, pool, w, where, k
            gpu0, k = gpu0 + n, k + 1


def _label(role: str) -> str:
    return "worker" if role == "both" else f"{role} worker"


def _mapping(target: str, pool: Pool, model: ModelSpec, model_path: str, gpn, dtypes: tuple):
    """The static mapper's flags for one pool; ``dtypes``: the weights' and the KV cache's precision."""
    s = pool.strategy.replace(dp=1, batch=pool.max_num_seqs)
    return MAPPERS[target](Deployment(s, model, model_path, gpn, *dtypes, moe_ep=pool.moe_ep))


def _cuda_env(where: str) -> str:
    if where.startswith("node ") and "GPUs" in where:
        lo, hi = (int(x) for x in where.split("GPUs ")[1].split("-"))
        return "CUDA_VISIBLE_DEVICES=" + ",".join(str(g) for g in range(lo, hi + 1)) + " "
    return ""


def _vllm(plan, model, path, gpn, dtypes, runtime: RuntimeProfile, out: LaunchConfig) -> None:
    disagg = plan.mode == "disagg"
    if disagg:
        out.script.append("python -m dynamo.frontend --http-port 8000 &   # Dynamo: OpenAI endpoint, prefill router")
    for role, pool, w, where, k in _workers(plan, gpn):
        m = _mapping("vllm", pool, model, path, gpn, dtypes)
        flags = m.flags + ["--max-num-batched-tokens", str(runtime.max_num_batched_tokens),
                           "--gpu-memory-utilization", f"{runtime.mem_fraction:g}"]
        if runtime.spec_tokens and role != "prefill":
            spec = {"method": "mtp"} if model_has_mtp(model) else {"method": "eagle3", "model": _DRAFT}
            spec["num_speculative_tokens"] = runtime.spec_tokens
            flags += ["--speculative-config", f"'{json.dumps(spec)}'"]
        env = "".join(f"{a}={b} " for a, b in m.env.items()) + _cuda_env(where)
        out.script.append(f"# {_label(role)} {w}: {where}")
        if disagg:
            extra = " --is-prefill-worker" if role == "prefill" else ""
            out.script.append(f"{env}python -m dynamo.vllm --model {path} {' '.join(flags)}{extra} &")
        else:
            out.script.append(f"{env}vllm serve {path} {' '.join(flags)} --port {_BASE_PORT['vllm'] + k} &")
        out.notes += [n for n in m.notes if n not in out.notes]
    if not disagg and plan.pool.workers > 1:
        out.notes.append(f"{plan.pool.workers} independent vLLM servers (ports {_BASE_PORT['vllm']}+): put a load "
                         "balancer in front that routes to the least-loaded one, as the simulation does")
    if disagg:
        out.notes.append("vLLM without Dynamo: --kv-transfer-config '{\"kv_connector\":\"NixlConnector\","
                         "\"kv_role\":\"kv_both\"}' on both pools plus a prefill-then-decode proxy")


def _sglang(plan, model, path, gpn, dtypes, runtime, out: LaunchConfig) -> None:
    disagg = plan.mode == "disagg"
    urls: dict[str, list[str]] = {"prefill": [], "decode": [], "both": []}
    for role, pool, w, where, k in _workers(plan, gpn):
        m = _mapping("sglang", pool, model, path, gpn, dtypes)
        port = _BASE_PORT["sglang"] + k
        flags = m.flags + ["--chunked-prefill-size", str(runtime.max_num_batched_tokens), "--port", str(port)]
        if runtime.moe_a2a_backend == "deepep" and model.is_moe:  # DeepEP all-to-alls, DeepGEMM grouped GEMMs
            flags += ["--moe-a2a-backend", "deepep"]
        if runtime.two_batch_overlap and model.is_moe:  # each micro-batch's all-to-alls behind the other's compute
            flags += ["--enable-two-batch-overlap"]
        if runtime.mem_fraction is not None:  # the fraction the plan's KV cache was sized with
            flags += ["--mem-fraction-static", f"{runtime.mem_fraction:g}"]
        if runtime.spec_tokens and role != "prefill":  # SGLang runs MTP drafts as EAGLE with top-1 chains
            k = runtime.spec_tokens
            flags += (["--speculative-algorithm", "EAGLE"] if model_has_mtp(model) else
                      ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", _DRAFT])
            flags += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                      "--speculative-num-draft-tokens", str(k + 1)]
        if disagg:
            flags += ["--disaggregation-mode", role, "--disaggregation-ib-device", "${IB_DEVICE}"]
        env = "".join(f"{a}={b} " for a, b in m.env.items()) + _cuda_env(where)
        out.script.append(f"# {_label(role)} {w}: {where}")
        out.script.append(f"{env}{' '.join(m.program)} {' '.join(flags)} &")
        urls[role].append(f"http://${{HOST_{role.upper()}_{w}}}:{port}")
        out.notes += [n for n in m.notes if n not in out.notes]
    if disagg:
        out.script.append("python -m sglang_router.launch_router --pd-disaggregation "
                          + " ".join(f"--prefill {u}" for u in urls["prefill"]) + " "
                          + " ".join(f"--decode {u}" for u in urls["decode"]) + " --host 0.0.0.0 --port 8000")
    elif len(urls["both"]) > 1:
        out.script.append("python -m sglang_router.launch_router --worker-urls " + " ".join(urls["both"])
                          + " --host 0.0.0.0 --port 8000")


def _trtllm_options(pool: Pool, model: ModelSpec, runtime: RuntimeProfile, dtypes, role: str, isl: int) -> dict:
    s = pool.strategy
    width = s.tp * s.ep
    attn_dp = s.ep > 1
    per_rank = math.ceil(pool.max_num_seqs / (width if attn_dp else 1))
    opts = {"tensor_parallel_size": width, "pipeline_parallel_size": s.pp, "enable_attention_dp": attn_dp,
            "max_batch_size": per_rank, "max_num_tokens": runtime.max_num_batched_tokens,
            "kv_cache_config": {"free_gpu_memory_fraction": runtime.mem_fraction}}
    if model.is_moe:  # experts: EP over the attention-DP groups and moe_ep ways inside each TP group
        opts |= {"moe_expert_parallel_size": s.ep * pool.moe_ep, "moe_tensor_parallel_size": s.tp // pool.moe_ep}
    if Deployment(s, model, "", None, *dtypes).kv_fp8:
        opts["kv_cache_config"]["dtype"] = "fp8"
    if role != "prefill":
        opts["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": per_rank}
    if role != "both":
        opts["cache_transceiver_config"] = {"backend": "DEFAULT", "max_tokens_in_buffer": int(isl)}
    if role == "prefill":
        opts["disable_overlap_scheduler"] = True  # not supported on context servers
    if runtime.spec_tokens and role != "prefill":
        opts["speculative_config"] = (
            {"decoding_type": "MTP", "num_nextn_predict_layers": runtime.spec_tokens} if model_has_mtp(model) else
            {"decoding_type": "Eagle", "max_draft_len": runtime.spec_tokens, "speculative_model_dir": _DRAFT})
    return opts


def _trtllm(plan, model, path, gpn, dtypes, runtime, out: LaunchConfig, isl: int) -> None:
    urls: dict[str, list[str]] = {"prefill": [], "decode": [], "both": []}
    for role, pool in plan.pools:
        out.files[f"trtllm_{role}.yaml"] = yaml.safe_dump(_trtllm_options(pool, model, runtime, dtypes, role, isl),
                                                          sort_keys=False)
        s = pool.strategy
        if s.tp > 1 and s.ep > 1:
            out.notes.append(f"{role} pool: TensorRT-LLM's attention DP runs attention on one GPU per rank; the "
                             f"plan's {s.ep} attention groups of tp={s.tp} are not expressible (experts map "
                             f"exactly: moe EP {s.ep} x moe TP {s.tp})")
    for role, pool, w, where, k in _workers(plan, gpn):
        s = pool.strategy
        port = _BASE_PORT["trtllm"] + k
        launch = f"mpirun -n {pool.gpus_per_worker} --hostfile ${{HOSTFILE}} trtllm-llmapi-launch " \
            if gpn and pool.gpus_per_worker > gpn else _cuda_env(where)
        out.script.append(f"# {_label(role)} {w}: {where}")
        out.script.append(f"{launch}trtllm-serve {path} --host 0.0.0.0 --port {port} --backend pytorch "
                          f"--tp_size {s.tp * s.ep} --pp_size {s.pp} --ep_size {s.ep * pool.moe_ep} "
                          f"--max_batch_size {_trtllm_options(pool, model, runtime, dtypes, role, isl)['max_batch_size']} "
                          f"--max_num_tokens {runtime.max_num_batched_tokens} "
                          f"--extra_llm_api_options trtllm_{role}.yaml &")
        urls[role].append(f"${{HOST_{role.upper()}_{w}}}:{port}")
    if plan.mode == "disagg":
        config = {"hostname": "0.0.0.0", "port": 8000, "backend": "pytorch",
                  "context_servers": {"num_instances": len(urls["prefill"]), "urls": urls["prefill"]},
                  "generation_servers": {"num_instances": len(urls["decode"]), "urls": urls["decode"]}}
        out.files["trtllm_disagg.yaml"] = yaml.safe_dump(config, sort_keys=False)
        out.script.append("trtllm-serve disaggregated -c trtllm_disagg.yaml   # router: context then generation")


def serving_launch(plan: ServingPlan, model: ModelSpec, target: str, *, model_path: str | None = None,
                   gpus_per_node: int | None = None, precision: str | None = None,
                   runtime: RuntimeProfile | str | None = None, isl: int = 4096,
                   kv_precision: str | None = None) -> LaunchConfig:
    """The launch of ``plan`` on ``target`` (one of :data:`SERVING_TARGETS`); token budgets and the
    memory fraction come from ``runtime`` (default: the target's own profile), speculative decoding from the
    plan where it sets it, else from ``runtime``; the KV cache's type is
    ``kv_precision`` (``None``: as ``precision``, as ``Workload.kv_precision``)."""

    if target not in SERVING_TARGETS:
        raise ValueError(f"export: {target!r} is not a serving target; valid: {', '.join(SERVING_TARGETS)}")
    if plan.mode == "seesaw":
        raise ValueError("export: no released vLLM, SGLang or TensorRT-LLM re-shards a worker between a prefill "
                         "and a decode layout; a seesaw plan has no launch configuration")
    runtime = get_runtime(runtime or target) if not isinstance(runtime, RuntimeProfile) else runtime
    runtime = plan.runtime_for(runtime)  # a searched plan's speculative decoding
    path = model_path or model_source(model) or model.name
    out = LaunchConfig(target)
    dtypes = (precision, kv_precision)
    if target == "vllm":
        _vllm(plan, model, path, gpus_per_node, dtypes, runtime, out)
    elif target == "sglang":
        _sglang(plan, model, path, gpus_per_node, dtypes, runtime, out)
    else:
        _trtllm(plan, model, path, gpus_per_node, dtypes, runtime, out, isl)
    if runtime.spec_tokens:
        draft = "the checkpoint's own MTP module" if model_has_mtp(model) else f"an EAGLE-3 draft model ({_DRAFT})"
        out.notes.append(f"speculative decoding: {runtime.spec_tokens} draft token(s) per step from {draft}; the "
                         "simulation assumed the acceptance rates it was given (serving.spec_accept)")
    out.script.append("wait")
    return out
