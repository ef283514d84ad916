"""Aggregated seeds of the serving warm start: decode layouts picked for the load, as aggregated plans.

An aggregated worker spends most of its steps decoding, so the layouts that decode this load best
within the TPOT SLO are good aggregated layouts too. Two sources pick them:

- in a space with disaggregated plans, the decode pools of the pool-by-pool screening's seeds
  (:func:`planner.serving.poolwise.screen_plans`; :func:`screened_decodes`);
- in a space without them (``serving.search.modes=[agg]``), or where no disaggregated plan screens
  feasible, the decode screening alone (:func:`screen_decodes`): every layout whose one-prompt prefill
  step fits the TTFT SLO, at every ``max_num_seqs`` and worker count the cluster holds, kept where the
  workers hold every closed-loop client within the TPOT SLO, ranked by the output tokens/s per GPU of
  its decode steps (fewest GPUs first among equals), best ``max_num_seqs`` per layout. Before it, the
  aggregated-only warm start had only the Megatron-style plans, which fill the cluster: on
  ``small-dense`` (8 clients of Llama-3.1-8B on one node) PPO's 40 simulations of
  ``python -m validation.studies.serving.disagg --modes agg`` stopped at 2x(tp1), half the optimum 1x(tp1).

:func:`aggregated_seeds` turns each picked decode pool into an aggregated plan with that pool's
``max_num_seqs``. It takes as many workers as the cluster holds, as the Megatron-style warm start fills
it with its one layout, except at a low load, where that wastes GPUs: closed-loop clients need only
ceil(clients / max_num_seqs) workers for all of them to run, and more only idle GPUs. So the seed takes
that smaller count where the screening says it also meets the TTFT SLO. The check prices the workers'
prompts as a prefill pool of the layout, decoding at the screened TPOT between them
(:func:`planner.serving.poolwise.closed_screened_ttft`). That leaves out the decode steps the prompts
share the GPUs with, so it is a necessary condition only. Where it fails the seed fills the cluster, as
it does under open arrivals, which have no client count. The two ends:

- 8 clients of Llama-3.1-8B on one node (``small-dense``): filling the cluster seeded 8x(tp1), while
  1x(tp1) is the optimum; at 40 simulations PPO, random search and the random walk then ended at 0.56
  of it on some seeds (``python -m validation.studies.serving.disagg --methods-on small-dense --budget 40``);
- DeepSeek-V3 at 256 clients on 64 GPUs (``deepseek-8node``): one worker per 256-sequence batch cannot
  prefill the load in time, so the seeds fill the cluster, and 4x(tp1 ep16) is the optimum.

Without aggregated seeds a search whose seeds are all disaggregated can keep to that mode: on
``deepseek-8node`` with ``sglang-deepep`` (256 clients, ISL 4096, OSL 512) PPO's 64 simulations returned
a disaggregated plan at 116.5 tokens/s/GPU and never tried the aggregated 4x(tp1 ep16) at 128.7, the
decode layout of its own second seed. The seeds only order candidates: each is simulated like any
other plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.serving.poolwise import DecodeScreen, Screened, closed_screened_ttft, prefill_option
from planner.serving.space import MODE_VALUES, ServingSpace
from simcore.serving import Pool, ServingConfig, ServingPlan, runtime_strategy
from simcore.serving.step_cost import StepCost

__all__ = ["DecodePick", "screened_decodes", "screen_decodes", "aggregated_seeds"]


@dataclass(frozen=True)
class DecodePick:
    """A decode pool picked for the load (its layout, ``max_num_seqs`` and expert split) and its
    screened TPOT."""

    pool: Pool
    tpot_s: float

    @property
    def layout(self) -> tuple[int, int, int]:
        st = self.pool.strategy
        return st.tp, st.ep, st.pp


def screened_decodes(screened: list[Screened]) -> list[DecodePick]:
    """The decode pools of the pool-by-pool screening's plans, in their order."""
    return [DecodePick(s.plan.decode, s.tpot_s) for s in screened]


def screen_decodes(space: ServingSpace, cfg: ServingConfig, k: int) -> list[DecodePick]:
    """Up to ``k`` decode pools of distinct layouts, best first, by the decode screening alone (module
    doc); none when the space holds no aggregated plans."""
    if k < 1 or MODE_VALUES.index("agg") not in space.modes:
        return []
    costs = {lay: StepCost(space.ctx, runtime_strategy(*lay), space.runtime) for lay in space.layouts}
    screen = DecodeScreen(space, costs, cfg)
    closed = cfg.arrival == "closed"
    clients = float(cfg.concurrency) if closed else math.inf
    scored = []
    for lay in space.layouts:
        if prefill_option(space, costs[lay], lay, cfg) is None:
            continue  # one prompt alone misses the TTFT SLO on this layout
        gpus = int(np.prod(lay))
        for workers in (w for w in space.heads[4].values if w * gpus <= space.num_gpus):
            for seqs in space.heads[9].values:
                d = screen.option(lay, int(seqs), clients / workers)
                if d is None or (closed and workers * d.sequences < cfg.concurrency):
                    continue  # misses the TPOT SLO, or clients would wait for a slot
                scored.append((d.sequences / (d.tpot_s * gpus), gpus, len(scored), d))
    scored.sort(key=lambda s: (-s[0], s[1], s[2]))
    out, seen = [], set()
    for *_, d in scored:
        if d.layout in seen:
            continue
        seen.add(d.layout)
        out.append(DecodePick(Pool(runtime_strategy(*d.layout), 1, d.max_num_seqs), d.tpot_s))
        if len(out) == k:
            break
    return out


def aggregated_seeds(space: ServingSpace, decodes: list[DecodePick], k: int, cfg: ServingConfig) -> list[np.ndarray]:
    """Up to ``k`` aggregated plans, one per distinct decode layout of ``decodes`` (in its order): that
    layout, its ``max_num_seqs`` and expert split, as many workers as the cluster holds, or the fewest
    that hold every closed-loop client where those also meet the TTFT SLO as the screening prices their
    prefill (module doc); none when the space holds no aggregated plans."""
    if k < 1 or MODE_VALUES.index("agg") not in space.modes:
        return []
    out, seen = [], set()
    for pick in decodes:
        pool, lay = pick.pool, pick.layout
        fits = [w for w in space.heads[4].values if w * int(np.prod(lay)) <= space.num_gpus]
        key = (*lay, pool.moe_ep)
        if key in seen or not fits:
            continue
        workers = _agg_workers(space, lay, fits, pool.max_num_seqs, pick.tpot_s, cfg)
        plan = ServingPlan("agg", pool=Pool(pool.strategy, workers, pool.max_num_seqs, pool.moe_ep))
        action = space.action_of(plan)
        if not space.inside(action)[0]:
            continue
        seen.add(key)
        out.append(action)
        if len(out) == k:
            break
    return out


def _agg_workers(space: ServingSpace, lay: tuple[int, int, int], fits: list[int], max_num_seqs: int, tpot_s: float,
                 cfg: ServingConfig) -> int:
    """Workers of an aggregated seed (module doc), among the counts ``fits`` the cluster holds: the fewest
    whose batches hold every closed-loop client, ceil(clients / max_num_seqs), where those workers'
    prompts, priced as a prefill pool of the layout decoding at ``tpot_s`` between them, meet the TTFT
    SLO; else (or under open arrivals) the cluster's most."""
    most = max(fits)
    if cfg.arrival != "closed":
        return most
    need = -(-int(cfg.concurrency) // max(int(max_num_seqs), 1))
    few = min((w for w in fits if w >= need), default=most)
    if few == most:
        return most
    prefill = prefill_option(space, StepCost(space.ctx, runtime_strategy(*lay), space.runtime), lay, cfg)
    if prefill is None:
        return most
    ttft, _ = closed_screened_ttft(prefill, few, cfg, tpot_s, space.runtime)
    return few if cfg.ttft_slo_s is None or ttft <= cfg.ttft_slo_s else most
