"""Disaggregated plans pool by pool: DistServe's placement as seeds for every serving search.

A disaggregated plan's two pools do different work, so each can be judged alone before any simulation
(DistServe, Zhong et al., OSDI 2024, section 4: choose the prefill instance's parallelism for prefill
goodput under the TTFT SLO and the decode instance's for decode goodput under the TPOT SLO, then
replicate each to match the request rate; NVIDIA aiconfigurator's disaggregated search does the same
with its analytic step times). A search over the joint heads instead has to hit both pools' layouts, both
worker counts and the batch at once; at a few dozen simulations it can miss the plan the literature
would pick. So the warm start of every serving method also simulates the few disaggregated plans this
screening ranks first (:meth:`planner.serving.evaluator.ServingEvaluator.warm_start`).

The screening prices steps with the simulator's own step cost (:class:`simcore.serving.step_cost.StepCost`
and the runtime's host time, overlapped where the runtime overlaps it), nothing fitted of its own:

- prefill worker of layout ``(tp, ep, pp)``: a step of one prompt of ``isl`` tokens in each of its ``ep``
  attention groups, and one of as many as the token budget holds (:class:`PrefillOption`);
- decode worker: a step of the sequences it runs (``max_num_seqs`` and its KV cache bound them; closed-loop
  clients put about ``clients / n_d`` on each of ``n_d`` workers, as nearly every client is decoding, and
  the workers must hold them all) at the mean context ``isl + osl / 2``; kept where the step meets the
  TPOT SLO;
- a pair of layouts with worker counts ``(n_p, n_d)`` from the worker-count head, and its mean TTFT
  (:func:`prefill_ttft`): a prefill worker's step takes every prompt waiting, up to the token budget, so
  its batch is what arrives during a step (``b = lambda T(b)``, ``T`` linear between the one-prompt and
  the full-budget step), and a prompt waits as in an M/D/1 queue of those steps, then runs its own;
  closed-loop clients arrive at ``clients / (TTFT + osl x TPOT)`` (solved with it),
  and every client's first request arrives at once (waves of full steps), weighted by its share of the
  requests; the runtime's request path and the decode worker's first step add to the TTFT. Kept where
  the TTFT meets the SLO and the prefill pool keeps up; scored by its requests per second (capped by the
  decode pool's ``n_d x`` sequences / (TPOT x osl)) times ``osl`` over its GPUs: output tokens/s per GPU.
  The KV hand-off and the queueing in the decode pool are left to the simulation that follows.

The screening only orders candidates; every seed is then simulated like any other plan, and a seed
that screens well but simulates badly is just a poor plan in the history.

Aggregated counterparts of these seeds, and aggregated seeds where the space has no disaggregated
plans, are :mod:`planner.serving.agg_seeds`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.serving.space import MODE_VALUES, ServingSpace
from simcore.serving import Pool, ServingConfig, ServingPlan, runtime_strategy
from simcore.serving.kvcache import kv_capacity_tokens
from simcore.serving.step_cost import GroupBatch, StepCost

__all__ = ["pool_seeds", "screen_plans", "Screened", "prefill_option", "closed_screened_ttft", "PrefillOption", "DecodeOption", "DecodeScreen", "screen_prefill", "prefill_ttft",
           "first_wave_ttft", "closed_loop_ttft"]

#: prefill layouts kept for pairing (the most prompts/s per GPU)
KEEP = 6


@dataclass(frozen=True)
class PrefillOption:
    """A prefill worker of ``layout``: a step of one prompt in each attention group takes ``one_s``, of
    ``per_group`` prompts (as many as the token budget holds) ``full_s``."""

    layout: tuple[int, int, int]
    one_s: float
    full_s: float
    per_group: int

    @property
    def gpus(self) -> int:
        return int(np.prod(self.layout))

    @property
    def groups(self) -> int:
        return self.layout[1]

    @property
    def capacity_rps(self) -> float:
        """Prompts/s the worker prefills at full steps."""
        return self.per_group * self.groups / self.full_s

    def step_s(self, per_group: float) -> float:
        """A step of ``per_group`` prompts in each group (linear between the two priced steps)."""
        if self.per_group == 1:
            return self.one_s
        return self.one_s + (per_group - 1) / (self.per_group - 1) * (self.full_s - self.one_s)


@dataclass(frozen=True)
class DecodeOption:
    layout: tuple[int, int, int]
    max_num_seqs: int
    sequences: int  # sequences the worker runs in its steps
    tpot_s: float
    capacity_rps: float  # requests/s one worker finishes (its sequences / (TPOT x osl))

    @property
    def gpus(self) -> int:
        return int(np.prod(self.layout))


def _step_s(cost: StepCost, runtime, batches: list[GroupBatch], seqs_per_group: int) -> float:
    """One step's time: GPU and host, the host hidden behind the previous step where the runtime overlaps."""
    gpu = float(sum(cost.gpu_times(batches, runtime)))
    host = runtime.host_s(seqs_per_group)
    return max(gpu, host) if runtime.overlap_host else gpu + host


def _prompt_steps(cost: StepCost, runtime, isl: int, prompts: int, groups: int) -> float:
    """Time to prefill ``prompts`` prompts of ``isl`` tokens in each of ``groups`` attention groups,
    in chunks of the runtime's token budget."""
    budget = runtime.max_num_batched_tokens
    if prompts * isl <= budget:
        batch = GroupBatch.of([(isl, 0)] * prompts, [], prompts)
        return _step_s(cost, runtime, [batch] * groups, prompts)
    done, total = 0, 0.0  # one prompt longer than the budget: its chunks, one step each
    while done < isl:
        chunk = min(budget, isl - done)
        batch = GroupBatch.of([(chunk, done)], [], int(done + chunk >= isl))
        total += _step_s(cost, runtime, [batch] * groups, 1)
        done += chunk
    return total


def prefill_option(space: ServingSpace, cost: StepCost, lay: tuple[int, int, int], cfg: ServingConfig) -> PrefillOption | None:
    """The layout's prefill worker, or None when its one-prompt step alone misses the TTFT SLO."""
    rt, isl = space.runtime, max(int(round(cfg.input_len.mean)), 1)
    k = max(rt.max_num_batched_tokens // isl, 1)
    one = _prompt_steps(cost, rt, isl, 1, lay[1])
    if cfg.ttft_slo_s is not None and one > cfg.ttft_slo_s:
        return None
    return PrefillOption(lay, one, _prompt_steps(cost, rt, isl, k, lay[1]) if k > 1 else one, k)


def screen_prefill(space: ServingSpace, costs: dict, cfg: ServingConfig) -> list[PrefillOption]:
    """Each layout's prefill worker whose one-prompt step fits the TTFT SLO, most prompts/s per GPU first."""
    out = [o for lay in space.layouts if (o := prefill_option(space, costs[lay], lay, cfg)) is not None]
    return sorted(out, key=lambda o: -o.capacity_rps / o.gpus)


def prefill_ttft(p: PrefillOption, workers: int, rps: float) -> float:
    """Mean time from a prompt reaching ``workers`` prefill workers of ``p`` at ``rps`` (spread evenly)
    to the end of its step; infinite when they cannot keep up. Each step takes the prompts that arrived
    during the one before (up to the budget): the batch per group ``b`` solves ``b = rate T(b)`` (at least
    one prompt). Arrivals from many independent clients are close to Poisson (a superposition of sparse
    streams), so a prompt waits as in an M/D/1 queue of steps, ``rho T / (2 (1 - rho))`` at utilization
    ``rho = rate T(b) / b``, then runs its own step."""
    rate = rps / (workers * p.groups)  # prompts/s into one attention group
    b = 1.0
    for _ in range(100):
        nxt = min(max(rate * p.step_s(b), 1.0), float(p.per_group))
        if abs(nxt - b) < 1e-9:
            break
        b = nxt
    step = p.step_s(b)
    rho = rate * step / b
    if rho >= 1.0:
        return math.inf
    return step + rho * step / (2.0 * (1.0 - rho))


def first_wave_ttft(p: PrefillOption, workers: int, clients: int) -> float:
    """Mean prefill time of ``clients`` prompts arriving at once on ``workers`` workers of ``p``: in waves
    of full steps, each prompt done with its wave."""
    per_group = clients / (workers * p.groups)
    if per_group <= p.per_group:
        return p.step_s(max(per_group, 1.0))
    waves = math.ceil(per_group / p.per_group)
    return p.full_s * (waves + 1) / 2.0


def closed_loop_ttft(p: PrefillOption, workers: int, clients: int, away_s: float) -> tuple[float, float]:
    """Steady mean prefill TTFT and requests/s of ``clients`` closed-loop clients, each away ``away_s``
    (decoding) between its first token and its next request: the rate where ``rps (TTFT(rps) + away_s) =
    clients`` (Little's law over the loop) with :func:`prefill_ttft`, by bisection; as the rate nears the
    pool's capacity the TTFT grows without bound, so the loop settles below it."""
    lo, hi = 0.0, min(workers * p.capacity_rps, clients / (p.one_s + away_s))
    for _ in range(60):
        mid = (lo + hi) / 2
        if clients / (prefill_ttft(p, workers, mid) + away_s) > mid:
            lo = mid
        else:
            hi = mid
    return prefill_ttft(p, workers, lo), lo


def closed_screened_ttft(p: PrefillOption, workers: int, cfg: ServingConfig, tpot_s: float, runtime) -> tuple[float, float]:
    """Screened mean TTFT and requests/s of the closed-loop clients of ``cfg`` on ``workers`` prefill workers
    of ``p``, decoding at ``tpot_s`` between requests: the opening wave (every client's first prompt at
    once) weighted by its share of the requests, the steady loop the rest, plus the request path and the
    first decode step (module doc)."""
    osl = max(float(cfg.output_len.mean), 1.0)
    per_client = cfg.num_requests / cfg.concurrency if cfg.num_requests else 1.0
    fixed = runtime.request_s + tpot_s
    steady, rps = closed_loop_ttft(p, workers, int(cfg.concurrency), osl * tpot_s + fixed)
    share = min(1.0 / per_client, 1.0)
    return share * first_wave_ttft(p, workers, int(cfg.concurrency)) + (1 - share) * steady + fixed, rps


class DecodeScreen:
    """Decode options of every layout: a worker of ``layout`` running ``batch`` sequences (at most
    ``max_num_seqs`` and what its KV cache holds), their TPOT and the requests/s it finishes (its
    sequences / (TPOT x osl)); memoized, as the batch a load gives depends on the worker count."""

    def __init__(self, space: ServingSpace, costs: dict, cfg: ServingConfig) -> None:
        self.space, self.costs, self.cfg = space, costs, cfg
        self.isl = max(int(round(cfg.input_len.mean)), 1)
        self.osl = max(int(round(cfg.output_len.mean)), 1)
        rt = space.runtime
        self.fits = {lay: kv_capacity_tokens(space.ctx, runtime_strategy(*lay), rt) // (self.isl + self.osl)
                     for lay in space.layouts}
        self._memo: dict = {}

    def option(self, layout: tuple[int, int, int], max_num_seqs: int, sequences: float) -> DecodeOption | None:
        """The worker at ``sequences`` running sequences (capped as above; ``inf``: open arrivals, as many
        as it allows), or None where it misses the TPOT SLO or holds none."""
        groups = layout[1]
        demand = math.ceil(sequences / groups) if math.isfinite(sequences) else math.inf
        per_group = min(max(max_num_seqs // groups, 1), self.fits[layout], max(demand, 1))
        if per_group < 1:
            return None
        key = (layout, per_group)
        if key not in self._memo:
            rt = self.space.runtime
            batch = GroupBatch.of([], [self.isl + self.osl // 2] * per_group, per_group)
            self._memo[key] = _step_s(self.costs[layout], rt, [batch] * groups, per_group) / rt.tokens_per_step
        tpot = self._memo[key]
        if self.cfg.tpot_slo_s is not None and tpot > self.cfg.tpot_slo_s:
            return None
        return DecodeOption(layout, int(max_num_seqs), per_group * groups, tpot, per_group * groups / (tpot * self.osl))


def _offered_rps(cfg: ServingConfig) -> float:
    """Requests/s open arrivals offer: Poisson arrivals their rate, a trace whatever the pools take."""
    return cfg.rate if cfg.arrival == "poisson" else float("inf")


@dataclass(frozen=True)
class Screened:
    """A disaggregated plan as the screening sees it: its action in the space and its screened figures."""

    action: np.ndarray
    plan: ServingPlan
    tokens_per_s_per_gpu: float
    ttft_s: float
    tpot_s: float


def pool_seeds(space: ServingSpace, cfg: ServingConfig, k: int) -> list[np.ndarray]:
    """The ``k`` disaggregated plans the pool-by-pool screening ranks first, as actions of ``space``
    (none when the space holds no disaggregated plans or nothing screens feasible)."""
    return [s.action for s in screen_plans(space, cfg, k)]


def screen_plans(space: ServingSpace, cfg: ServingConfig, k: int) -> list[Screened]:
    """The ``k`` best distinct disaggregated plans of ``space`` by the screening (module doc)."""
    if k < 1 or MODE_VALUES.index("disagg") not in space.modes:
        return []
    costs = {lay: StepCost(space.ctx, runtime_strategy(*lay), space.runtime) for lay in space.layouts}
    prefill = screen_prefill(space, costs, cfg)[:KEEP]
    screen = DecodeScreen(space, costs, cfg)
    osl = max(float(cfg.output_len.mean), 1.0)
    counts = space.heads[4].values
    closed = cfg.arrival == "closed"
    # in a closed loop nearly every client is decoding (osl x TPOT dwarfs the prefill), so each of n_d
    # decode workers runs about clients / n_d sequences; open arrivals fill what the worker allows
    clients = float(cfg.concurrency) if closed else float("inf")
    scored = []
    for lay in space.layouts:
        for seqs in space.heads[9].values:
            for n_d in counts:
                d = screen.option(lay, int(seqs), clients / n_d)
                if d is None or (closed and n_d * d.sequences < cfg.concurrency):
                    continue  # closed-loop clients beyond the decode slots would wait for one: TTFT
                for p in prefill:
                    for n_p in counts:
                        gpus = n_p * p.gpus + n_d * d.gpus
                        if gpus > space.num_gpus:
                            continue
                        if closed:
                            ttft, rps = closed_screened_ttft(p, n_p, cfg, d.tpot_s, space.runtime)
                        else:
                            rps = min(_offered_rps(cfg), n_p * p.capacity_rps * (1 - 1e-9))
                            ttft = prefill_ttft(p, n_p, rps) + space.runtime.request_s + d.tpot_s
                        if rps <= 0 or (cfg.ttft_slo_s is not None and ttft > cfg.ttft_slo_s):
                            continue
                        rps = min(rps, n_d * d.capacity_rps)
                        scored.append((rps * osl / gpus, gpus, ttft, p, d, n_p, n_d))
    scored.sort(key=lambda s: (-s[0], s[1]))
    out: list[Screened] = []
    seen = set()
    for value, _, ttft, p, d, n_p, n_d in scored:
        plan = ServingPlan("disagg", prefill=Pool(runtime_strategy(*p.layout), n_p, d.max_num_seqs),
                           decode=Pool(runtime_strategy(*d.layout), n_d, d.max_num_seqs))
        action = space.action_of(plan)
        # plans that differ only in a max_num_seqs the load never reaches screen alike: keep the first
        same = (p.layout, d.layout, n_p, n_d, d.sequences)  # (the plan does not carry the prefill batch)
        if same in seen or not space.inside(action)[0]:
            continue
        seen.add(same)
        out.append(Screened(action, plan, value, ttft, d.tpot_s))
        if len(out) == k:
            break
    return out
