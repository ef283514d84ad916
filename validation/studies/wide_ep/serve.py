"""One published deployment as a serving plan, its phase under the published load, its throughput per node.

The deployment (:func:`deployment_plan`) is the disaggregated plan the source ran: a prefill pool and a
decode pool of ``tp x ep`` GPUs each, DP attention with experts split ``ep`` ways and the source's
redundant experts. The sources measured each phase alone, the other "assumed unlimited", so the study
simulates the measured pool alone, as one worker on a rail-optimized InfiniBand topology of the row's
nodes (:func:`simulate_case`):

- ``prefill``: prompts only (one output token each), closed-loop clients enough to keep every attention
  group's step full at ``tokens_per_gpu_step`` prompt tokens (twice the requests one step takes: the next
  step's prompts wait while one runs), :data:`PREFILL_WAVES` waves of them. Input tokens/s per node = prompt
  tokens over the whole run (its first step starts full, its last ends full) / nodes. Six waves are twelve
  steps; a longer run changes the figure by the request path's 0.13 s at the start, under 1%.
- ``decode``: ``batch_per_gpu`` sequences per GPU at context ``kv_len`` sent at once, decoding
  :data:`DECODE_TOKENS` tokens in lock-step. Output tokens/s per node = sequences per node over the median
  time between two tokens (the decode step at the full batch; the few gaps that wait for other requests'
  prompts at the start are outside the median). The decode step's rate is steady over these tokens, so a
  longer run gives the same figure (the mean context moves by ``DECODE_TOKENS / 2`` tokens).

Both phases run SGLang with DeepEP and DeepGEMM (profile ``sglang-deepep``), two-batch overlap where the
runtime profile has the switch (both sources overlap two micro-batches), the source's tokens per step as
the step's token budget. DeepSeek's own engine is not SGLang; it runs the same kernels (DeepEP, DeepGEMM,
FlashMLA), which is what the profile prices. The routing is uniform: a perfectly balanced EPLB.

``sim`` is the simulator with the topology graph (the steps' collectives as flows where the simulator
routes them so, KV hand-offs of disaggregated plans as flows), ``proxy`` the same run with contention
off (``simulate_serving(..., contention=False)``) where ``simulate_serving`` takes that switch; where it
does not, the proxy column repeats the simulator's and ``proxy_is_sim`` says so.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.models import get_model
from simcore.serving import RUNTIMES, LengthDist, ServingConfig, simulate_serving
from simcore.serving.plan import Pool, ServingPlan, runtime_strategy
from simcore.serving.runtime import RuntimeProfile
from simcore.workload import Workload
from topologies import build_topology
from validation.studies.wide_ep.rows import WideEpCase

__all__ = ["RUNTIME", "DECODE_TOKENS", "PREFILL_WAVES", "CONTENTION_SWITCH", "TBO_SWITCH", "deployment_plan", "runtime_of",
           "simulate_case"]

RUNTIME = "sglang-deepep"
DECODE_TOKENS = 32  # decode steps per sequence (module doc: the step's rate is steady over them)
PREFILL_WAVES = 6  # closed-loop waves of prompts (module doc)
#: whether ``simulate_serving`` takes ``contention`` (the proxy switch); without it the proxy repeats the sim
CONTENTION_SWITCH = "contention" in inspect.signature(simulate_serving).parameters
#: whether the runtime profiles have two-batch overlap (``RuntimeProfile.two_batch_overlap``)
TBO_SWITCH = "two_batch_overlap" in {f.name for f in dataclasses.fields(RuntimeProfile)}


def _pool(case: WideEpCase, seqs: int) -> Pool:
    strategy = runtime_strategy(tp=case.tp, ep=case.ep).replace(redundant_experts=case.redundant_experts)
    return Pool(strategy, workers=1, max_num_seqs=seqs)


def deployment_plan(prefill: WideEpCase, decode: WideEpCase | None = None) -> ServingPlan:
    """The disaggregated plan of a source's deployment (its prefill row's pool, its decode row's pool; a
    source without one of them repeats the other's layout)."""
    decode = decode or prefill
    return ServingPlan.disaggregated(_pool(prefill, 1 << 20), _pool(decode, decode.ep * max(decode.batch_per_gpu, 1)))


def runtime_of(case: WideEpCase, overlap: bool = True) -> RuntimeProfile:
    """``sglang-deepep`` with the row's tokens per prefill step, and two-batch overlap (``overlap``) where
    the profile has the switch."""
    changes = {"max_num_batched_tokens": case.tokens_per_gpu_step * case.tp}  # one attention group's budget
    if TBO_SWITCH:
        changes["two_batch_overlap"] = overlap
    return RUNTIMES[RUNTIME].with_overrides(**changes)


def _load(case: WideEpCase) -> tuple[ServingConfig, Pool]:
    if case.phase == "prefill":
        per_step = case.ep * math.ceil(case.tokens_per_gpu_step * case.tp / case.input_len)
        clients = 2 * per_step
        cfg = ServingConfig(concurrency=clients, num_requests=PREFILL_WAVES * clients,
                            input_len=LengthDist(mean=case.input_len), output_len=LengthDist(mean=1),
                            runtime=RUNTIME)
        return cfg, _pool(case, clients)
    seqs = case.ep * case.batch_per_gpu
    cfg = ServingConfig(concurrency=seqs, num_requests=seqs, input_len=LengthDist(mean=case.kv_len),
                        output_len=LengthDist(mean=DECODE_TOKENS), runtime=RUNTIME)
    return cfg, _pool(case, seqs)


def _per_node(case: WideEpCase, result) -> float:
    m = result.metrics
    if case.phase == "prefill":
        return m.requests_per_s * case.input_len / case.nodes
    return case.gpus_per_node * case.batch_per_gpu / m.itl_s["p50"]


def simulate_case(case: WideEpCase, contention: bool = True, overlap: bool = True) -> dict:
    """The row's pool under its load (``overlap``: with two-batch overlap): throughput per node, the
    median inter-token gap, mean TTFT, preemptions, the simulated steps."""
    graph = build_topology(case.topology, num_nodes=case.nodes)
    cfg, pool = _load(case)
    isl, osl = int(cfg.input_len.mean), int(cfg.output_len.mean)
    ctx = CostContext(get_model(case.model), Workload(precision=case.precision, input_len=isl, output_len=osl),
                      Cluster.from_graph(graph))
    extra = {"contention": contention} if CONTENTION_SWITCH else {}
    result = simulate_serving(ctx, ServingPlan("agg", pool=pool), cfg, graph=graph, runtime=runtime_of(case, overlap),
                              **extra)
    if not result.feasible:
        return {"feasible": False, "reason": result.reason, "per_node": None}
    m = result.metrics
    return {"feasible": True, "reason": "", "per_node": _per_node(case, result), "preemptions": m.preemptions,
            "itl_p50_ms": m.itl_s["p50"] * 1e3, "ttft_ms": m.ttft_s["mean"] * 1e3, "steps": result.steps,
            "wall_s": result.wall_s}
