"""``simulate_serving``: requests arriving at a serving plan, step by step, on SimPy.

Arrivals (:class:`ServingConfig`): ``closed`` (``concurrency`` clients, each sending its next request
the moment one completes, as ``vllm bench serve --max-concurrency``, SGLang's ``bench_serving`` and
genai-perf do; all at once, or with ``stagger`` spread over one unloaded request's duration, the state a
benchmark's warm-up leaves them in: with fixed lengths, clients that start together stay in lock-step), ``poisson`` at ``rate`` requests/s, or a ``trace`` CSV (``arrival_s,input_len,output_len``).
A router sends each request to the worker with the fewest outstanding requests (on a decode pool,
the hand-offs already routed to a worker whose KV is still in transit count: :attr:`Worker.load`).

Disaggregated plans: a prefill worker computes the prompt and samples the first token, then the
prompt's KV cache moves to the least-loaded decode worker. With a topology graph the move is network
flows (each prefill GPU sends its shard to a decode GPU, contending with every other transfer on the
same links; prefill workers are placed on the first GPUs, decode workers after them); without one it
takes the idle-fabric time of the same bytes. The client sees the first token only with the decode
worker's output, at the end of its first step on the request (:meth:`Request.hold_first`), so TTFT is
the prefill, the KV transfer, the wait for the decode worker's next step and that step, as the runtimes
stream it: TensorRT-LLM's disaggregated serving returns the first token through the generation worker
("TTFT = prefill computation time + full KV transfer time", NVIDIA/TensorRT-LLM issue #9212; returning
it from the context worker ahead of time was proposed in PR #6512 and closed, its discussion noting
that "other frameworks return the first token via generation worker"); vLLM's P/D proxies stream the
decode instance only (the prefill's response carries ``kv_transfer_params`` and is not streamed,
vllm-project/vllm issue #36308); SGLang's router sends each request to both servers and streams the
decode server, which polls the transfer and then admits the request (``disaggregation/decode.py``:
transfer queue, prebuilt batch, running batch; it streams the prefill's token at admission, one decode
step before this model does).

Seesaw plans (``mode`` ``seesaw``): each worker alternates a prefill and a decode layout over the same
GPUs, parking prefilled KV in host memory in between (:mod:`.seesaw`; no network flows).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import simpy

from simcore.cost.lowering import CostContext
from simcore.serving.cluster import PoolCluster, RequestIntake, shape_error
from simcore.serving.deployment import Deployment
from simcore.serving.metrics import ServingMetrics, summarize
from simcore.serving.plan import ServingPlan
from simcore.serving.requests import LengthDist, Request, ServingInputError, read_trace
from simcore.serving.runtime import RuntimeProfile
from simcore.serving.seesaw import SeesawCluster
from simcore.serving.speculative import check_accept
from simcore.serving.step_cost import GroupBatch
from simcore.serving.trace import ServingTrace
from simcore.serving.worker import PlanInfeasible, Worker

__all__ = ["ServingConfig", "ServingResult", "simulate_serving", "shape_error", "ARRIVALS"]

ARRIVALS = ("closed", "poisson", "trace")


@dataclass
class ServingConfig:
    """What arrives and what serves it; SLOs in seconds (``None``: no target)."""

    arrival: str = "closed"
    concurrency: int = 64
    rate: float = 0.0
    trace: str | None = None
    num_requests: int = 1000
    input_len: LengthDist = field(default_factory=lambda: LengthDist(mean=1024, name="serving.input_len"))
    output_len: LengthDist = field(default_factory=lambda: LengthDist(mean=1024, name="serving.output_len"))
    runtime: str = "vllm"
    #: the runtime's memory fraction for this run (vLLM ``--gpu-memory-utilization``, SGLang
    #: ``--mem-fraction-static``, TensorRT-LLM ``free_gpu_memory_fraction``); ``None``: its profile's
    mem_fraction: float | None = None
    #: speculative decoding for this run (:mod:`.speculative`): draft tokens per step (0: off) and the
    #: conditional acceptance of each draft position (``None``: aiconfigurator's default rates)
    spec_tokens: int = 0
    spec_accept: tuple[float, ...] | None = None
    #: host time per streamed token of the runtime's frontend process for this run
    #: (:mod:`.frontend`; ``None``: its profile's, 0 in every shipped profile)
    frontend_token_s: float | None = None
    #: the runtime's release, the experts' format and the launch flags (:mod:`.deployment`; the default
    #: changes nothing): the profile of ``runtime`` at that release with those flags, and for each plan
    #: its MoE kernels, its release's defaults for the layout and the experts' padding
    deployment: Deployment = field(default_factory=Deployment)
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    seed: int = 0
    warmup: int = 0  # the first requests sent, simulated but left out of the metrics (the opening burst)
    stagger: bool = False  # closed loop: clients start spread over one unloaded request's duration

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ServingInputError(f"serving.arrival: {self.arrival!r} is not one of {', '.join(ARRIVALS)}")
        if self.arrival == "closed" and (isinstance(self.concurrency, bool) or self.concurrency < 1):
            raise ServingInputError(f"serving.concurrency must be a positive integer, got {self.concurrency!r}")
        if self.arrival == "poisson" and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ServingInputError(f"serving.rate must be positive for poisson arrivals, got {self.rate!r}")
        if self.arrival == "trace" and not self.trace:
            raise ServingInputError("serving.trace: a trace CSV path is required for trace arrivals")
        if self.num_requests < 1:
            raise ServingInputError(f"serving.num_requests must be positive, got {self.num_requests!r}")
        if not 0 <= self.warmup < self.num_requests:
            raise ServingInputError(f"serving.warmup must be in [0, num_requests), got {self.warmup!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ServingInputError(f"serving.seed must be an integer >= 0, got {self.seed!r}")
        for name in ("ttft_slo_s", "tpot_slo_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ServingInputError(f"serving.{name} must be positive, got {v!r}")
        if self.mem_fraction is not None and not 0 < self.mem_fraction <= 1:
            raise ServingInputError(f"serving.mem_fraction must be in (0, 1], got {self.mem_fraction!r}")
        if self.frontend_token_s is not None and not (0 <= self.frontend_token_s < 1e-2):
            raise ServingInputError(f"serving.frontend_token_us must be in [0, 10000), got "
                                    f"{self.frontend_token_s * 1e6!r}")
        self.runtime_profile()

    def runtime_profile(self) -> RuntimeProfile:
        """The profile of ``runtime`` at the deployment's release with its launch flags, and with this run's
        memory fraction and speculative decoding, if it sets them."""
        profile = self.deployment.runtime_profile(self.runtime)
        if self.mem_fraction is not None:
            profile = profile.with_overrides(mem_fraction=self.mem_fraction)
        if self.frontend_token_s is not None:
            profile = profile.with_overrides(frontend_token_s=self.frontend_token_s)
        if self.spec_tokens or self.spec_accept is not None:
            accept = tuple(self.spec_accept) if self.spec_accept is not None else profile.spec_accept
            check_accept(self.spec_tokens, accept, "serving")
            profile = profile.with_overrides(spec_tokens=self.spec_tokens, spec_accept=accept)
        return profile


@dataclass
class ServingResult:
    plan: ServingPlan
    metrics: ServingMetrics | None
    feasible: bool
    reason: str = ""
    steps: int = 0
    lowerings: int = 0
    kv_tokens_per_group: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    reshard_s: float = 0.0  # seesaw: worker-seconds spent re-sharding between the two layouts
    switches: int = 0  # seesaw: layout switches over all workers
    pool_stats: dict[str, dict] = field(default_factory=dict)  # per role: :func:`pool_stats`
    #: the run's network counters (:func:`~simcore.serving.fabric.network_report`): flows, bytes per tier,
    #: the busiest link and its utilization, the share of step time spent waiting on the network
    network: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {"plan": self.plan.to_dict(), "feasible": self.feasible, "reason": self.reason, "steps": self.steps,
               "lowerings": self.lowerings, "kv_tokens_per_group": self.kv_tokens_per_group,
               "wall_s": self.wall_s, "metrics": None if self.metrics is None else self.metrics.to_ms_dict(),
               "pools": self.pool_stats, "network": self.network}
        if self.plan.mode == "seesaw":
            out |= {"reshard_s": self.reshard_s, "switches": self.switches}
        return out


def _requests(cfg: ServingConfig, rng: np.random.Generator) -> list[tuple[float, int, int]]:
    """``(arrival_s, input_len, output_len)``; arrival is ignored for closed-loop clients."""
    if cfg.arrival == "trace":
        return read_trace(cfg.trace)[: cfg.num_requests]
    n = cfg.num_requests
    isl, osl = cfg.input_len.draw(rng, n), cfg.output_len.draw(rng, n)
    arrivals = np.cumsum(rng.exponential(1.0 / cfg.rate, n)) if cfg.arrival == "poisson" else np.zeros(n)
    return [(float(a), int(i), int(o)) for a, i, o in zip(arrivals, isl, osl, strict=True)]


def _unloaded_s(cluster: PoolCluster, req: Request) -> float:
    """End-to-end time of ``req`` alone on the first pool: its prefill, then one decode step per token."""
    cost = cluster.costs[0]
    prefill = sum(cost.stage_times([GroupBatch.of([(req.input_len, 0)], [], 1)])[0])
    decode = sum(cost.stage_times([GroupBatch.of([], [req.input_len + req.output_len // 2], 1)])[0])
    return prefill + (req.output_len - 1) * decode


class _Clients:
    """Who sends each request, and when (module doc): ``concurrency`` closed-loop clients, or requests at
    their own arrival times. :meth:`finished` counts each request that ends and hands a closed-loop
    client its next one; :attr:`all_done` fires with the last."""

    def __init__(self, env: simpy.Environment, cfg: ServingConfig, reqs: list[Request]):
        self.env, self.cfg, self.reqs = env, cfg, reqs
        self.pending = iter(reqs)
        self.done: list[Request] = []
        self.all_done = env.event()
        self.cluster: RequestIntake | None = None

    def finished(self, req: Request) -> None:
        self.done.append(req)
        if len(self.done) == len(self.reqs):
            self.all_done.succeed()
        elif self.cfg.arrival == "closed":  # its client sends the next once the last token reached it
            nxt = next(self.pending, None)
            if req.finish_s > self.env.now:  # still in the server's frontend (simcore.serving.frontend)
                self.env.process(self._send_at(nxt, req.client, req.finish_s))
            else:
                self._send(nxt, req.client)

    def start(self, cluster: RequestIntake) -> None:
        """Send the opening requests (each closed-loop client's first, spread over one unloaded request's
        time with ``stagger``) or start the timed arrivals."""
        self.cluster, cfg = cluster, self.cfg
        clients = min(cfg.concurrency, len(self.reqs))
        if cfg.arrival == "closed" and cfg.stagger:
            self.env.process(self._staggered(clients, _unloaded_s(cluster, self.reqs[0]) / cfg.concurrency))
        elif cfg.arrival == "closed":
            for client in range(clients):
                self._send(next(self.pending), client)
        else:
            self.env.process(self._timed())

    def _send(self, req: Request | None, client: int) -> None:
        if req is None:
            return
        req.arrival_s, req.client = self.env.now, client
        self.cluster.route(req)

    def _send_at(self, req: Request | None, client: int, at_s: float):
        yield self.env.timeout(at_s - self.env.now)
        self._send(req, client)

    def _staggered(self, clients: int, spacing_s: float):
        for client in range(clients):
            if client:
                yield self.env.timeout(spacing_s)
            self._send(next(self.pending), client)

    def _timed(self):
        for req in self.reqs:
            if req.arrival_s > self.env.now:
                yield self.env.timeout(req.arrival_s - self.env.now)
            self.cluster.route(req)


def _cluster(env, ctx: CostContext, plan: ServingPlan, runtime: RuntimeProfile, graph, on_finish, fast: bool,
             trace: ServingTrace | None = None, contention: bool = True):
    """The plan's workers: a re-sharding :class:`~.seesaw.SeesawCluster` or a :class:`PoolCluster`."""
    if trace is not None:
        untraced = on_finish

        def on_finish(req: Request) -> None:
            trace.finished(req)
            untraced(req)

    if plan.mode == "seesaw":
        return SeesawCluster(env, ctx, plan, runtime, on_finish, fast, trace=trace)
    return PoolCluster(env, ctx, plan, runtime, graph, on_finish, fast, trace=trace, contention=contention)


def pool_stats(workers: list[Worker], end_s: float) -> dict:
    """What a pool's workers did over a run of ``end_s`` simulated seconds: ``gpu_busy_share``, the share
    of that time their GPUs ran steps (the rest waited on the host or for work); ``decode_steps``, the
    pure-decode steps taken; ``mean_decode_seqs`` and ``mean_decode_context``, the busiest attention
    group's decoding sequences and the decodes' mean context over those steps (where
    :func:`~simcore.serving.breakdown.step_breakdown` prices the run's mean decode step);
    ``network_wait_s_per_step``, the seconds a step waited on the network beyond its closed form, over
    all the pool's steps (0 where its steps ran in closed form: :mod:`.fabric`)."""
    steps = sum(w.decode_steps for w in workers)
    busy = sum(w.gpu_busy_s for w in workers) / (len(workers) * end_s) if end_s > 0 else 0.0
    all_steps = sum(w.steps for w in workers)
    wait = sum(w.net.wait_s for w in workers if w.net is not None)
    return {"workers": len(workers), "gpu_busy_share": busy, "decode_steps": steps,
            "network_wait_s_per_step": wait / all_steps if all_steps else 0.0,
            "mean_decode_seqs": sum(w.decode_seqs_sum for w in workers) / steps if steps else 0.0,
            "mean_decode_context": sum(w.decode_context_sum for w in workers) / steps if steps else 0.0}


def _result(plan: ServingPlan, cfg: ServingConfig, cluster, done: list[Request], wall_s: float,
            end_s: float) -> ServingResult:
    """The metrics over the requests after the warm-up, with the run's step and lowering counts."""
    workers = [w for ws in cluster.pools.values() for w in ws]
    preempt = sum(g.preemptions for w in workers for g in w.groups)
    measured = [r for r in done if r.rid >= cfg.warmup]
    metrics = summarize(measured, plan.gpus, cfg.ttft_slo_s, cfg.tpot_slo_s, preempt)
    result = ServingResult(plan, metrics, True, steps=sum(w.steps for w in workers),
                           lowerings=sum(c.lowerings for c in cluster.costs), kv_tokens_per_group=cluster.kv_tokens,
                           wall_s=wall_s, pool_stats={role: pool_stats(ws, end_s) for role, ws in cluster.pools.items()})
    if hasattr(cluster, "network_report"):
        result.network = cluster.network_report(end_s)
    if plan.mode == "seesaw":
        result.reshard_s, result.switches = cluster.reshard_s, cluster.switches
        metrics.extra["swap_in_s"] = cluster.swap_in_s  # host-to-GPU copies charged at switches
    return result


def simulate_serving(ctx: CostContext, plan: ServingPlan, cfg: ServingConfig, graph=None,
                     runtime: RuntimeProfile | None = None, fast: bool = True,
                     trace: ServingTrace | None = None, contention: bool = True) -> ServingResult:
    """Serve ``cfg.num_requests`` requests with ``plan``; ``graph`` (a topology) makes KV hand-offs flows,
    and with ``contention`` the steps' own communication wherever it shares links (:mod:`.fabric`;
    ``False``, ``sim=proxy-equivalent``: every step in closed form).

    ``fast=False`` takes every step as its own process through the pipeline stages (the reference the
    single-stage fast path is tested against). ``trace``: a :class:`~.trace.ServingTrace` that records
    the run (its requests' spans, the workers' steps, counters; :mod:`.trace`); the results are the same."""

    start = time.perf_counter()
    runtime = plan.runtime_for(runtime or cfg.runtime_profile())
    try:
        ctx, runtime = cfg.deployment.deployed(ctx, plan, runtime)  # the plan's MoE kernels, defaults, padding
    except ServingInputError as exc:
        return ServingResult(plan, None, False, str(exc), wall_s=time.perf_counter() - start)
    rng = np.random.default_rng(cfg.seed)
    env = simpy.Environment()
    clients = _Clients(env, cfg, [Request(i, a, isl, osl) for i, (a, isl, osl) in enumerate(_requests(cfg, rng))])
    try:
        cluster = _cluster(env, ctx, plan, runtime, graph, clients.finished, fast, trace, contention)
        if trace is not None:
            trace.bind(len(clients.reqs), cluster.pools)
        clients.start(cluster)
        env.run(until=clients.all_done)
    except PlanInfeasible as exc:
        return ServingResult(plan, None, False, str(exc), wall_s=time.perf_counter() - start)
    except RuntimeError as exc:  # SimPy: no events left before every request finished
        if "until" not in str(exc):
            raise
        return ServingResult(plan, None, False, "stalled: requests wait that no step can admit",
                             wall_s=time.perf_counter() - start)
    if trace is not None and getattr(cluster, "network", None) is not None:
        trace.links(cluster.network.utilization())
    return _result(plan, cfg, cluster, clients.done, time.perf_counter() - start, env.now)
