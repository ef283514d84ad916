"""Plan export: the launch flags that express a strategy in vLLM, SGLang or Megatron-LM.

:func:`export_plan` maps a strategy onto a target (:mod:`simcore.export.targets`), lists every
per-operator choice (and knob) the target runs differently, and, given a scenario, prices falling
back to the target's defaults with the proxy (each gap alone and all together) and, given a topology
graph, with the simulator. Nothing is dropped silently: a gap is listed even when it costs nothing.

Examples
--------
>>> from simcore.models import get_model
>>> r = export_plan(Strategy(tp=4, pp=2, batch=64), get_model("llama-3.1-70b"), "vllm")
>>> r.flags[:4]
('--tensor-parallel-size', '4', '--pipeline-parallel-size', '2')
"""

from __future__ import annotations

import dataclasses
import json

from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, simulate
from simcore.export.result import ExportResult, Gap, Pricing, gap_lines, relative_change
from simcore.export.targets import MAPPERS, VERSIONS, Deployment, Mapping
from simcore.models import CONFIG_DIR, MODEL_NAMES, ModelSpec, get_model
from simcore.strategy.opgraph import SEARCHABLE_OPS, op_applies
from simcore.strategy.sharding import Strategy

__all__ = ["TARGETS", "ExportError", "ExportResult", "Gap", "Pricing", "export_plan", "check_target",
           "gap_lines", "model_source"]

TARGETS = tuple(MAPPERS)


class ExportError(ValueError):
    """An unknown export target (the message names the valid ones)."""


def check_target(target: str) -> str:
    if target not in MAPPERS:
        raise ExportError(f"export: {target!r} is not a target; valid: {', '.join(TARGETS)}")
    return target


def model_source(model: ModelSpec) -> str | None:
    """The Hugging Face repo id of a catalog preset, or ``None`` (synthetic or unknown model)."""
    path = CONFIG_DIR / f"{model.name}.json"
    if model.name not in MODEL_NAMES or not path.is_file():
        return None
    source = str(json.loads(path.read_text()).get("_source", ""))
    return source if "/" in source and " " not in source else None


#: config.json keys that count a checkpoint's own multi-token-prediction (MTP) modules
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")


def model_has_mtp(model: ModelSpec) -> bool:
    """Whether a catalog preset's checkpoint ships MTP modules a runtime can draft with (DeepSeek-V3/R1,
    GLM-5, Qwen3.5, MiniMax-M2), read from its ``config.json`` (``text_config`` included); False for a
    synthetic or unknown model."""
    path = CONFIG_DIR / f"{model.name}.json"
    if model.name not in MODEL_NAMES or not path.is_file():
        return False
    cfg = json.loads(path.read_text())
    scopes = [cfg, cfg.get("text_config") or {}]
    return any(int(scope.get(k) or 0) > 0 for scope in scopes for k in _MTP_KEYS)


def _gaps(strategy: Strategy, model: ModelSpec, mapping: Mapping) -> list[Gap]:
    gaps = [Gap(op, strategy.sharding[op], mapping.sharding[op]) for op in SEARCHABLE_OPS
            if op_applies(model, op) and strategy.sharding[op] != mapping.sharding[op]]
    if mapping.microbatches != strategy.microbatches:
        gaps.append(Gap("microbatches", str(strategy.microbatches),
                        f"{mapping.microbatches} ({mapping.microbatches_rule})"))
    return gaps


def _apply(strategy: Strategy, gaps: list[Gap], mapping: Mapping) -> Strategy:
    """The plan with the given gaps replaced by what the target runs."""
    sharding = dict(strategy.sharding)
    microbatches = strategy.microbatches
    for g in gaps:
        if g.item == "microbatches":
            microbatches = mapping.microbatches
        else:
            sharding[g.item] = mapping.sharding[g.item]
    return strategy.replace(sharding=sharding, microbatches=microbatches)


def _price(ctx, graph, engine, strategy, gaps, mapping, plan_sim) -> tuple[list[Gap], Pricing]:

    plan = evaluate(ctx, strategy)
    priced = []
    for g in gaps:
        alone = evaluate(ctx, _apply(strategy, [g], mapping))
        change = relative_change(plan.tokens_per_s_per_gpu, alone.tokens_per_s_per_gpu)
        priced.append(dataclasses.replace(g, proxy_change=change, invalid_reasons=tuple(alone.reasons)))
    fallback = evaluate(ctx, _apply(strategy, gaps, mapping))
    sim_plan = sim_fallback = None
    if graph is not None:

        engine = dataclasses.replace(engine or EngineConfig(), trace=False)
        sim_plan = plan_sim if plan_sim is not None else simulate(ctx, graph, strategy, engine).tokens_per_s_per_gpu
        sim_fallback = simulate(ctx, graph, fallback.strategy, engine).tokens_per_s_per_gpu if gaps else sim_plan
    return priced, Pricing(plan.tokens_per_s_per_gpu, fallback.tokens_per_s_per_gpu, fallback.valid,
                           tuple(fallback.reasons), sim_plan, sim_fallback)


def export_plan(strategy: Strategy, model: ModelSpec | str, target: str, *, ctx=None, graph=None,
                engine=None, model_path: str | None = None, gpus_per_node: int | None = None,
                precision: str | None = None, plan_sim: float | None = None) -> ExportResult:
    """Launch flags of ``target`` (one of :data:`TARGETS`) for ``strategy``, with the gaps listed.

    ``ctx`` (a :class:`~simcore.cost.lowering.CostContext`) prices the gaps with the proxy; ``graph`` (and
    ``engine``) add the simulator; ``plan_sim`` reuses an already simulated plan throughput.
    ``gpus_per_node`` defaults to the graph's, ``precision`` to the scenario's workload.
    """
    check_target(target)
    model = get_model(model) if isinstance(model, str) else model
    if gpus_per_node is None and graph is not None:
        gpus_per_node = int(graph.graph.get("gpus_per_node", 0)) or None
    kv_precision = None
    if ctx is not None:
        precision = precision or ctx.workload.precision
        kv_precision = ctx.workload.kv_precision
    source = model_path or model_source(model)
    deployment = Deployment(strategy, model, source or model.name, gpus_per_node, precision, kv_precision)
    mapping = MAPPERS[target](deployment)
    notes = list(mapping.notes)
    if source is None:
        notes.insert(0, f"model {model.name!r} has no published checkpoint: replace the model path")
    gaps = _gaps(strategy, model, mapping)
    pricing = None
    if ctx is not None:
        gaps, pricing = _price(ctx, graph, engine, strategy, gaps, mapping, plan_sim)
    return ExportResult(target=target, version=VERSIONS[target], program=tuple(mapping.program),
                        flags=tuple(mapping.flags), fallback=_apply(strategy, gaps, mapping), env=mapping.env,
                        replicas=mapping.replicas, gaps=tuple(gaps), notes=tuple(notes), pricing=pricing)
