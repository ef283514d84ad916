"""Regimes of the fidelity study: what dominates a strategy's step, by the proxy's own account.

Each strategy gets flags from two sources, both computed before any simulation:

- the proxy's breakdown (:func:`simcore.cost.proxy.evaluate`, ``by_category``), as shares of its step:
  ``compute``, ``comm:tp`` / ``comm:ep`` / ``comm:pp`` and ``bubble``;
- its lowered collectives (:func:`simcore.cost.lowering.lower`, one pass through every layer of the
  model in the workload's main phase: ``decode`` unless the workload is ``prefill``): each
  collective's group span (does its communicator cross an NVLink domain?) and the share of its
  time that is latency (NCCL's latency term plus the calibrated launch overhead of the entry NCCL
  would pick), weighted by time.

The rules, applied in this order (a strategy carries every flag that holds; its *primary* regime is
the first that holds):

===================  =============================================================================
``bubble_heavy``     pipeline bubble >= 20% of the step
``all_to_all_heavy`` ``comm:ep`` (the MoE dispatch and combine all-to-alls) >= 20% of the step
``inter_node``       communication on communicators that span NVLink domains >= 10% of the step
``latency_bound``    communication >= 10% of the step, latency terms >= 50% of the communication
``bandwidth_bound``  communication >= 10% of the step, latency terms < 50% of the communication
``compute_bound``    none of the above
===================  =============================================================================
"""

from __future__ import annotations

import numpy as np

from simcore.collectives.cost import entry_costs
from simcore.cost.cluster import group_ranks_per_domain
from simcore.cost.lowering import CostContext, StrategyArrays, lower
from simcore.cost.memory import stage_layers
from simcore.strategy.layout import COLLECTIVE_NAMES, NONE

__all__ = ["REGIMES", "THRESHOLDS", "collective_profile", "classify", "primary"]

REGIMES = ("bubble_heavy", "all_to_all_heavy", "inter_node", "latency_bound", "bandwidth_bound", "compute_bound")
THRESHOLDS = {"bubble": 0.20, "all_to_all": 0.20, "inter_node": 0.10, "comm": 0.10, "latency_share": 0.50}
_GROUPS = ("tp", "ep", "pp")


def _communicators(ctx: CostContext, s: StrategyArrays) -> tuple[dict, dict]:
    """Ranks of each communicator and how many of them share an NVLink domain (as the lowering
    prices them: ``tp`` stride 1, ``ep`` stride ``tp``, a pipeline send between two stages)."""
    domain = ctx.cluster.nvlink_domain_size
    size = {"tp": s.tp, "ep": s.ep, "pp": np.where(s.pp > 1, 2, 1)}
    per_domain = {"tp": group_ranks_per_domain(s.tp, 1, domain), "ep": group_ranks_per_domain(s.ep, s.tp, domain),
                  "pp": np.where(s.pp > 1, np.where(s.pp * s.tp * s.ep <= domain, 2, 1), 1)}
    return size, per_domain


def _latency_fraction(ctx: CostContext, code: int, size, n, per_domain) -> np.ndarray:
    """Latency share of each call's time for the entry NCCL picks (its own argmin)."""
    kwargs = {} if ctx.collective_constants is None else {"constants": ctx.collective_constants}
    costs = [c for _, _, c in entry_costs(COLLECTIVE_NAMES[code], size, n, per_domain, ctx.cluster.fabric,
                                          **kwargs)]
    idx = np.argmin(np.stack([c.nccl_time_s for c in costs]), axis=0)[None]
    latency = np.take_along_axis(np.stack([c.latency_s + c.extra_latency_s for c in costs]), idx, 0)[0]
    total = np.take_along_axis(np.stack([c.time_s for c in costs]), idx, 0)[0]
    return np.where(total > 0, latency / np.where(total > 0, total, 1.0), 0.0)


def _critical_stage(ctx: CostContext, s: StrategyArrays, blocks: dict) -> np.ndarray:
    """The stage the proxy's breakdown describes: the slowest one (block times times the blocks each
    stage runs, as :mod:`simcore.cost.proxy` composes them)."""
    dense, moe, in_stage = stage_layers(ctx.model, s.pp)
    stages = np.arange(dense.shape[1])[None, :]
    last = (s.pp - 1)[:, None]
    counts = {"dense_layer": dense, "moe_layer": moe, "first": (stages == 0) & in_stage, "last": stages == last,
              "p2p": (stages < last) & in_stage}
    total = np.zeros(dense.shape)
    for name, tasks in blocks.items():
        block = sum(np.broadcast_to(np.asarray(t.time_s, float), (len(s),)) * t.count for t in tasks)
        total = total + counts[name] * block[:, None]
    return np.argmax(total, axis=1)


def collective_profile(ctx: CostContext, keys: np.ndarray) -> dict[str, np.ndarray]:
    """Per strategy (rows of ``keys``): ``latency_share`` of its communication time (0 without
    communication), ``spans_tp`` / ``spans_ep`` / ``spans_pp`` (that communicator crosses an NVLink
    domain) and ``critical_stage`` (the pipeline stage the proxy's breakdown is of; for a ``static``
    workload, that of its decode steps)."""
    s = StrategyArrays.from_keys(np.asarray(keys, dtype=np.int64))
    phase = "prefill" if ctx.workload.phase == "prefill" else "decode"
    blocks = lower(ctx, s, phase)
    dense, moe, _ = stage_layers(ctx.model, np.array([1]))
    weight = {"dense_layer": int(dense[0, 0]), "moe_layer": int(moe[0, 0])}
    size, per_domain = _communicators(ctx, s)
    latency, total = np.zeros(len(s)), np.zeros(len(s))
    for name, tasks in blocks.items():
        for task in (t for t in tasks if t.is_comm):
            t = np.broadcast_to(np.asarray(task.time_s, float), (len(s),)) * task.count * weight.get(name, 1)
            code = np.broadcast_to(np.asarray(task.extra["collective"]), (len(s),))
            nbytes = np.broadcast_to(np.asarray(task.size_bytes, float), (len(s),))
            for c in np.unique(code).tolist():
                rows = (code == c) & (t > 0)
                if c == NONE or not rows.any():
                    continue
                g = task.group
                frac = _latency_fraction(ctx, c, nbytes[rows], size[g][rows], per_domain[g][rows])
                latency[rows] += t[rows] * frac
            total += t
    out = {"latency_share": np.where(total > 0, latency / np.where(total > 0, total, 1.0), 0.0)}
    for g in _GROUPS:
        out[f"spans_{g}"] = (size[g] > 1) & (per_domain[g] < size[g])
    out["critical_stage"] = _critical_stage(ctx, s, blocks)
    return out


def classify(by_category: dict[str, float], step_time_s: float, latency_share: float,
             spans: dict[str, bool]) -> list[str]:
    """The regime flags of one strategy (see the module docstring); never empty."""
    step = step_time_s if step_time_s > 0 else 1.0
    comm = {g: by_category.get(f"comm:{g}", 0.0) / step for g in _GROUPS}
    comm_share = sum(comm.values())
    inter = sum(comm[g] for g in _GROUPS if spans.get(g, False))
    th = THRESHOLDS
    flags = []
    if by_category.get("bubble", 0.0) / step >= th["bubble"]:
        flags.append("bubble_heavy")
    if comm["ep"] >= th["all_to_all"]:
        flags.append("all_to_all_heavy")
    if inter >= th["inter_node"]:
        flags.append("inter_node")
    if comm_share >= th["comm"]:
        flags.append("latency_bound" if latency_share >= th["latency_share"] else "bandwidth_bound")
    return flags or ["compute_bound"]


def primary(flags: list[str]) -> str:
    """The first of ``flags`` in :data:`REGIMES` order."""
    return min(flags, key=REGIMES.index)
