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

- prefill worker of layout ``(tp, ep, pp)``: a step of ``k`` prompts of ``isl`` tokens in each of its
  ``ep`` attention groups (``k`` = 1, or as many as the token budget holds); a prompt waits for its step
  and for the steps queued before it, which an M/D/1 queue prices: at utilization ``rho`` the mean wait
  is ``rho T / (2 (1 - rho))`` for a step of ``T``, so the TTFT SLO caps ``rho`` and the worker's
  capacity is ``rho x`` its prompts per second;
- decode worker: a step of the sequences it runs (``max_num_seqs`` and its KV cache bound them; closed-loop
  clients put about ``clients / n_d`` on each of ``n_d`` workers, as nearly every client is decoding) at
  the mean context ``isl + osl / 2``; kept where the step meets the TPOT SLO;
- a pair of layouts with worker counts ``(n_p, n_d)`` from the worker-count head: requests per second
  ``min(n_p x prefill capacity, n_d x decode capacity, offered)``, where closed-loop clients offer at
  most ``clients / (prefill step + osl x TPOT)`` and Poisson arrivals their rate, over its GPUs, times
  ``osl``: output tokens/s per GPU. The KV hand-off and the queueing in the decode pool are left to the
  simulation that follows.

The screening only orders candidates; every seed is then simulated like any other plan, and a seed
that screens well but simulates badly is just a poor plan in the history.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.serving import Pool, ServingConfig, ServingPlan, runtime_strategy
from simcore.serving.kvcache import kv_capacity_tokens
from simcore.serving.step_cost import GroupBatch, StepCost

from .space import MODE_VALUES, ServingSpace

__all__ = ["pool_seeds", "PrefillOption", "DecodeOption", "DecodeScreen", "screen_prefill", "md1_max_utilization"]

#: prefill layouts kept for pairing (the best by prompts/s per GPU)
KEEP = 6


@dataclass(frozen=True)
class PrefillOption:
    layout: tuple[int, int, int]
    step_s: float  # one step of the option's prompts
    capacity_rps: float  # prompts/s one worker takes with the TTFT SLO met on the mean

    @property
    def gpus(self) -> int:
        return int(np.prod(self.layout))


@dataclass(frozen=True)
class DecodeOption:
    layout: tuple[int, int, int]
    max_num_seqs: int
    tpot_s: float
    capacity_rps: float  # requests/s one worker finishes (its sequences / (TPOT x osl))

    @property
    def gpus(self) -> int:
        return int(np.prod(self.layout))


def md1_max_utilization(step_s: float, slo_s: float | None) -> float:
    """Highest utilization of an M/D/1 server of service time ``step_s`` whose mean sojourn
    ``step_s (1 + rho / (2 (1 - rho)))`` stays within ``slo_s`` (1 without an SLO; 0 when one step alone
    misses it)."""
    if slo_s is None:
        return 1.0
    if step_s > slo_s:
        return 0.0
    a = slo_s / step_s - 1.0  # the mean wait the SLO leaves, in steps
    return 2.0 * a / (1.0 + 2.0 * a)


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


def screen_prefill(space: ServingSpace, costs: dict, cfg: ServingConfig) -> list[PrefillOption]:
    """Each layout's best prefill option (module doc), best prompts/s per GPU first."""
    rt, isl = space.runtime, max(int(round(cfg.input_len.mean)), 1)
    out = []
    for lay in space.layouts:
        cost, best = costs[lay], None
        for k in sorted({1, max(rt.max_num_batched_tokens // isl, 1)}):
            step = _prompt_steps(cost, rt, isl, k, lay[1])
            cap = md1_max_utilization(step, cfg.ttft_slo_s) * k * lay[1] / step
            if cap > 0 and (best is None or cap > best.capacity_rps):
                best = PrefillOption(lay, step, cap)
        if best is not None:
            out.append(best)
    return sorted(out, key=lambda o: -o.capacity_rps / o.gpus)


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
        """The worker at ``sequences`` running sequences (capped as above), or None where it misses the
        TPOT SLO or holds none."""
        groups = layout[1]
        per_group = min(max(max_num_seqs // groups, 1), self.fits[layout], max(int(np.ceil(sequences / groups)), 1))
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
        return DecodeOption(layout, int(max_num_seqs), tpot, per_group * groups / (tpot * self.osl))


def _offered_rps(cfg: ServingConfig, latency_s: float) -> float:
    """Requests/s the arrivals can offer: closed-loop clients one request per latency each, Poisson
    arrivals their rate, a trace whatever the pools take."""
    if cfg.arrival == "closed":
        return cfg.concurrency / latency_s
    if cfg.arrival == "poisson":
        return cfg.rate
    return float("inf")


def pool_seeds(space: ServingSpace, cfg: ServingConfig, k: int) -> list[np.ndarray]:
    """The ``k`` disaggregated plans the pool-by-pool screening ranks first, as actions of ``space``
    (none when the space holds no disaggregated plans or nothing screens feasible)."""
    if k < 1 or MODE_VALUES.index("disagg") not in space.modes:
        return []
    costs = {lay: StepCost(space.ctx, runtime_strategy(*lay), space.runtime) for lay in space.layouts}
    prefill = screen_prefill(space, costs, cfg)[:KEEP]
    screen = DecodeScreen(space, costs, cfg)
    osl = max(float(cfg.output_len.mean), 1.0)
    counts = space.heads[4].values
    # in a closed loop nearly every client is decoding (osl x TPOT dwarfs the prefill), so each of n_d
    # decode workers runs about clients / n_d sequences; open arrivals fill what the worker allows
    clients = float(cfg.concurrency) if cfg.arrival == "closed" else float("inf")
    scored = []
    for lay in space.layouts:
        for seqs in space.heads[9].values:
            for n_d in counts:
                d = screen.option(lay, int(seqs), clients / n_d)
                if d is None:
                    continue
                for p in prefill:
                    offered = _offered_rps(cfg, p.step_s + osl * d.tpot_s)
                    for n_p in counts:
                        gpus = n_p * p.gpus + n_d * d.gpus
                        if gpus > space.num_gpus:
                            continue
                        rps = min(n_p * p.capacity_rps, n_d * d.capacity_rps, offered)
                        scored.append((rps * osl / gpus, gpus, p, d, n_p, n_d))
    scored.sort(key=lambda s: (-s[0], s[1]))
    seeds: list[np.ndarray] = []
    seen = set()
    for _, _, p, d, n_p, n_d in scored:
        plan = ServingPlan("disagg", prefill=Pool(runtime_strategy(*p.layout), n_p, d.max_num_seqs),
                           decode=Pool(runtime_strategy(*d.layout), n_d, d.max_num_seqs))
        action = space.action_of(plan)
        # plans that differ only in a max_num_seqs the load never reaches screen alike: keep the first
        same = (p.layout, d.layout, n_p, n_d, round(d.capacity_rps * d.tpot_s * osl))
        if same in seen or not space.inside(action)[0]:
            continue
        seen.add(same)
        seeds.append(action)
        if len(seeds) == k:
            break
    return seeds
