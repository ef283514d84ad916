"""What a rewrite changes in one step, per GPU of the critical pipeline stage: bytes, launches, and the
latency and bandwidth terms of the collectives it touches.

Every figure comes from the lowered tasks (:func:`simcore.cost.lowering.lower`) and the collective cost
model (:func:`simcore.collectives.cost.entry_costs`), so it adds up to the proxy's own step time:
each changed collective's idle-fabric time is ``alpha + beta`` with ``alpha`` the latency term of
the entry NCCL would pick (NCCL's latency plus the calibrated launch overhead) and ``beta`` the rest
(bytes over the algorithm bandwidth plus calibrated ring fill). Bytes are bus bytes per rank in the
nccl-tests convention: ``2 (n-1)/n S`` for an all-reduce of ``S``, ``(n-1)/n S`` for an all-gather or
reduce-scatter of total ``S`` and for an all-to-all of a per-rank ``S``, ``S`` for a send.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.collectives.cost import entry_costs
from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, StrategyArrays, lower
from simcore.cost.memory import stage_layers
from simcore.engine.pricing import packed_shape
from simcore.strategy.sharding import Strategy
from topologies import build_topology
from validation.studies.rewrites.candidates import Slot, collective_diff, comm_slots

__all__ = ["Terms", "bus_bytes", "alpha_beta", "stage_multipliers", "changed_terms", "collective_table"]


@dataclass(frozen=True)
class Terms:
    """Base and rewrite figures for the changed collectives, per GPU per step (seconds, bytes)."""

    base_bytes: float
    rewrite_bytes: float
    base_launches: float
    rewrite_launches: float
    base_alpha_s: float
    rewrite_alpha_s: float
    base_beta_s: float
    rewrite_beta_s: float
    all_reduce_bytes: float  # nccl-tests size of the largest all-reduce the rewrite removes (or adds)

    @property
    def d_alpha_s(self) -> float:
        return self.rewrite_alpha_s - self.base_alpha_s

    @property
    def d_beta_s(self) -> float:
        return self.rewrite_beta_s - self.base_beta_s


def bus_bytes(collective: str, size_bytes: float, n: int) -> float:
    """Bytes one rank sends for a collective of nccl-tests size ``size_bytes`` over ``n`` ranks."""
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n, "send_recv": 1.0}[collective]
    return factor * size_bytes


def _group(ctx: CostContext, s: Strategy, group: str) -> tuple[int, int]:
    """(ranks, ranks per NVLink domain) of a communicator, as the lowering sizes it."""
    return packed_shape(ctx, s, group)


def alpha_beta(ctx: CostContext, s: Strategy, slot: Slot) -> tuple[float, float]:
    """Latency and bandwidth terms (s) of one collective, for the entry NCCL's model picks."""
    n, rpd = _group(ctx, s, slot.group)
    kwargs = {} if ctx.collective_constants is None else {"constants": ctx.collective_constants}
    costs = entry_costs(slot.collective, slot.size_bytes, n, rpd, ctx.cluster.fabric, **kwargs)
    best = min(costs, key=lambda c: float(c[2].nccl_time_s))[2]
    return float(best.latency_s + best.extra_latency_s), float(best.bandwidth_s + best.fill_s)


def stage_multipliers(ctx: CostContext, s: Strategy, phase: str, context_len=None) -> dict[str, float]:
    """How often each block runs per step on the critical (slowest) stage of ``s``, microbatches included."""
    blocks = lower(ctx, StrategyArrays.from_strategies([s]), phase, context_len)
    dense, moe, _ = stage_layers(ctx.model, np.array([s.pp]))
    stages = np.arange(s.pp)
    counts = {"dense_layer": dense[0, : s.pp], "moe_layer": moe[0, : s.pp], "first": (stages == 0) * 1.0,
              "last": (stages == s.pp - 1) * 1.0, "p2p": (stages < s.pp - 1) * 1.0}
    times = sum(counts[b] * sum(float(t.time_s[0]) * t.count for t in tasks) for b, tasks in blocks.items())
    crit = int(np.argmax(times))
    return {b: float(counts[b][crit]) * s.microbatches for b in blocks}


def changed_terms(ctx: CostContext, base: Strategy, rewrite: Strategy, phase: str, context_len=None) -> Terms:
    """Bytes, launches and alpha/beta of the collectives that differ between ``base`` and ``rewrite``."""
    slots = comm_slots(ctx, [base, rewrite], phase, context_len)
    mult = stage_multipliers(ctx, base, phase, context_len)
    acc = np.zeros((2, 4))  # [base, rewrite] x [bytes, launches, alpha, beta]
    largest_ar = 0.0
    for (block, _), *pair in collective_diff(*slots):
        for side, (slot, strat) in enumerate(zip(pair, (base, rewrite), strict=True)):
            if slot is None:
                continue
            reps = mult[block] * slot.count
            a, b = alpha_beta(ctx, strat, slot)
            n = _group(ctx, strat, slot.group)[0]
            acc[side] += reps * np.array([bus_bytes(slot.collective, slot.size_bytes, n), 1.0, a, b])
            if slot.collective == "all_reduce":
                largest_ar = max(largest_ar, slot.size_bytes)
    return Terms(*(float(acc[side, k]) for k in range(4) for side in (0, 1)), largest_ar)


def collective_table(sizes: tuple[float, ...] = (2.0**14, 2.0**20, 2.0**24, 2.0**28)) -> list[dict]:
    """All-reduce against all-gather of the same nccl-tests size on the study's TP groups: 8 GPUs on
    one NVLink domain (HGX, NVL72) and 16 GPUs over two nodes (IB); times and alpha in microseconds."""
    groups = (("hgx-h100", {}, 8, 8), ("gb200-nvl72", {}, 8, 8), ("h100-ib-rail", {"num_nodes": 2}, 16, 8))
    out = []
    for name, kwargs, n, rpd in groups:
        fabric = Cluster.from_graph(build_topology(name, **kwargs)).fabric
        for size in sizes:
            row = {"topology": name, "ranks": n, "size_bytes": size}
            for coll in ("all_reduce", "all_gather"):
                best = min(entry_costs(coll, size, n, rpd, fabric), key=lambda c: float(c[2].nccl_time_s))
                row[f"{coll}_us"] = float(best[2].time_s) * 1e6
                row[f"{coll}_alpha_us"] = float(best[2].latency_s + best[2].extra_latency_s) * 1e6
                row[f"{coll}_algorithm"] = f"{best[0]}/{best[1]}"
            out.append(row)
    return out
