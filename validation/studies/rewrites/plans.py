"""The rewrites study's plans: the grid it sweeps, the base plans of a scenario, and a plan fitted to a
topology's GPU count."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from planner.exact import exact_optimum
from planner.megatron import megatron_search, strategy_from_key
from planner.space import SearchSpace
from simcore.cost.lowering import CostContext
from simcore.strategy.sharding import Strategy
from topologies import build_topology

__all__ = ["TOPOLOGIES", "Grid", "base_plans", "fit_plan", "topology_for"]

#: name -> keyword arguments of ``topologies.build_topology``
TOPOLOGIES = {"hgx-h100": {}, "h100-ib-rail": {}, "h100-ib-fattree": {"oversubscription": 4.0}, "gb200-nvl72": {}}
_FIXED_GPUS = {"hgx-h100": 8, "gb200-nvl72": 72}
_NODE_GPUS = 8


@dataclass(frozen=True)
class Grid:
    """The settings swept per plan: context lengths (tokens), sequences (decode) or prompts (prefill)
    per attention group and microbatch, and topologies."""

    contexts: tuple[int, ...] = (1024, 4096, 16384)
    decode_seqs: tuple[int, ...] = (1, 4, 16, 64, 256)
    prefill_seqs: tuple[int, ...] = (1, 2, 4, 8)
    topologies: tuple[str, ...] = tuple(TOPOLOGIES)

    def __post_init__(self) -> None:
        for name in ("contexts", "decode_seqs", "prefill_seqs"):
            if not getattr(self, name) or any(int(v) < 1 for v in getattr(self, name)):
                raise ValueError(f"grid.{name} must hold positive integers, got {getattr(self, name)!r}")
        bad = [t for t in self.topologies if t not in TOPOLOGIES]
        if bad or not self.topologies:
            raise ValueError(f"grid.topologies: {bad or '()'} not among {', '.join(TOPOLOGIES)}")

    @classmethod
    def quick(cls) -> Grid:
        return cls(contexts=(4096,), decode_seqs=(1, 16, 256), prefill_seqs=(1, 4))


def base_plans(ctx: CostContext) -> dict[str, tuple[Strategy, str]]:
    """Label -> (plan, where it comes from); identical plans are listed once, under the first label."""
    space = SearchSpace.for_context(ctx)
    ranked = megatron_search(ctx, space)
    plans = {"megatron": (ranked.strategy(0), "Megatron heuristic's best (planner.megatron)")}
    exact = exact_optimum(ctx, space)
    if exact.key is not None:
        plans["planner"] = (strategy_from_key(exact.key), "exact optimum under the proxy (planner.exact)")
    keys, valid = ranked.keys[ranked.order], ranked.result.valid[ranked.order]
    tp8 = np.flatnonzero((keys[:, 0] == 8) & valid)
    if len(tp8):
        plans["megatron-tp8"] = (strategy_from_key(keys[tp8[0]]), "best Megatron plan at tp=8")
    tp8_ep = np.flatnonzero((keys[:, 0] == 8) & (keys[:, 1] > 1) & valid)
    if len(tp8_ep):
        plans["megatron-tp8-ep"] = (strategy_from_key(keys[tp8_ep[0]]), "best Megatron plan at tp=8 with ep>1")
    with_tp8 = [s for s, _ in plans.values() if s.tp == 8]
    if with_tp8:
        plans["megatron-tp16"] = (with_tp8[0].replace(tp=16, dp=1), "the tp=8 plan at tp=16 (TP spans two nodes)")
    unique: dict[str, tuple[Strategy, str]] = {}
    for label, (s, note) in plans.items():
        if all(s.key() != t.key() for t, _ in unique.values()):
            unique[label] = (s, note)
    return unique


def _halvings(v: int) -> list[int]:
    return [v >> i for i in range(v.bit_length()) if (v >> i) << i == v]


def fit_plan(s: Strategy, num_gpus: int, num_experts: int = 0,
             fits: Callable[[Strategy], bool] | None = None) -> tuple[Strategy, str]:
    """``s`` on a cluster of ``num_gpus``: ``dp`` fills it; if the replica does not divide it, the
    nearest degrees that do (``tp`` and ``pp`` halved, ``ep`` any count up to the experts; changing tp
    costs most, then pp, then ep), the nearest that ``fits`` (e.g. in HBM) when any does. The note
    says what changed ("" when nothing did)."""
    replica = s.tp * s.ep * s.pp
    if num_gpus % replica == 0:
        return s.replace(dp=num_gpus // replica), ""
    cands = []
    for tp in _halvings(s.tp):
        for pp in _halvings(s.pp):
            for ep in range(1, max(1, min(num_experts, num_gpus)) + 1):
                if num_gpus % (tp * ep * pp) == 0:
                    cost = 3 * math.log2(s.tp / tp) + 2 * math.log2(s.pp / pp) + abs(math.log2(s.ep / ep))
                    cands.append((cost, -tp * ep * pp, tp, ep, pp))
    fitted = []
    for *_, tp, ep, pp in sorted(cands):
        mb = s.microbatches if pp > 1 else 1
        batch = max(1, round(s.batch / (ep * mb))) * ep * mb  # divisible by ep * microbatches
        fitted.append(s.replace(tp=tp, ep=ep, pp=pp, dp=num_gpus // (tp * ep * pp), microbatches=mb, batch=batch))
    best = next((f for f in fitted if fits is None or fits(f)), fitted[0])
    return best, (f"tp{s.tp} ep{s.ep} pp{s.pp} does not divide {num_gpus} GPUs: "
                  f"nearest valid tp{best.tp} ep{best.ep} pp{best.pp}")


@cache
def _graph(topology: str, nodes: int):
    kwargs = dict(TOPOLOGIES[topology])
    if topology not in _FIXED_GPUS:
        kwargs["num_nodes"] = nodes
    return build_topology(topology, **kwargs)


def topology_for(topology: str, s: Strategy):
    """The graph a plan runs on: the fixed presets as they are, IB fabrics sized to one replica."""
    nodes = max(1, math.ceil(s.tp * s.ep * s.pp / _NODE_GPUS))
    return _graph(topology, 1 if topology in _FIXED_GPUS else nodes)
