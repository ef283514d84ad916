"""Request-level serving simulation: continuous batching, paged KV cache, prefill/decode disaggregation,
Seesaw re-sharding.

Entry point: :func:`simulate_serving` serves a stream of requests (:class:`ServingConfig`) with a
:class:`ServingPlan` (one aggregated pool, prefill and decode pools, or Seesaw workers) and returns TTFT, TPOT,
inter-token and end-to-end latency statistics, throughput and goodput (:class:`ServingMetrics`).

- :mod:`.requests`: requests, length distributions, trace files
- :mod:`.runtime`: vLLM / SGLang / TensorRT-LLM profiles (host cost per step, graphs, budgets)
- :mod:`.deployment`: a deployment's release, weight and KV formats and launch flags, and what each sets
- :mod:`.step_cost`: one step's GPU time from the shared lowering (memoized, exact)
- :mod:`.breakdown`: where one step's time goes (attention, GEMMs, experts, communication, host)
- :mod:`.kvcache`: KV capacity from the memory model and block accounting
- :mod:`.scheduler`: the three runtimes' scheduling policies
- :mod:`.worker`: a worker's host loop and GPU pipeline on SimPy
- :mod:`.simulate`: arrivals, routing, the KV hand-off of disaggregated plans
- :mod:`.seesaw`: workers re-sharding between a prefill and a decode layout, KV parked in host memory
- :mod:`.reshard`: what one such switch moves between the GPUs, and how long it takes
- :mod:`.metrics`: latency and throughput statistics
- :mod:`.trace`: a run as a Chrome / Perfetto trace (requests' spans, workers' steps, pool and link counters)
"""

from simcore.serving.cluster import shape_error
from simcore.serving.metrics import ServingMetrics
from simcore.serving.plan import MODES, Pool, ServingPlan, runtime_sharding, runtime_strategy
from simcore.serving.requests import LengthDist, Request, ServingInputError, read_trace
from simcore.serving.runtime import RUNTIMES, RuntimeProfile, get_runtime
from simcore.serving.simulate import ARRIVALS, ServingConfig, ServingResult, simulate_serving
from simcore.serving.step_cost import GroupBatch, StepCost
from simcore.serving.trace import ServingTrace, write_serving_trace
from simcore.serving.worker import PlanInfeasible

__all__ = ["simulate_serving", "ServingConfig", "ServingResult", "ServingMetrics", "ServingPlan", "Pool",
           "MODES", "runtime_sharding", "runtime_strategy", "ARRIVALS", "LengthDist", "Request", "ServingInputError", "read_trace", "RuntimeProfile",
           "RUNTIMES", "get_runtime", "GroupBatch", "StepCost", "PlanInfeasible", "shape_error", "ServingTrace",
           "write_serving_trace"]
