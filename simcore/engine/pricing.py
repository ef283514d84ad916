"""Idle-fabric prices of collectives for the GPUs a communicator actually occupies.

The lowering prices a collective for packed placement (its communicator laid out on consecutive
GPUs, :func:`simcore.cost.cluster.group_ranks_per_domain`). A communicator of another placement (``spread``
deals ranks over nodes) spans other NVLink domains and its idle-fabric cost differs; an op that skips
the flow solver must take the cost of its real communicator, never the packed one. These are the same
formulas (:func:`simcore.collectives.collective_time_s`), fed the communicator's own shape.
"""

from __future__ import annotations

import dataclasses
import functools

from simcore.collectives import collective_time_s
from simcore.cost.cluster import group_ranks_per_domain
from simcore.engine.program import StageProgram
from simcore.moe.deepep_exchange import deepep_mode

__all__ = ["group_shape", "idle_cost_s", "packed_shape", "reprice_programs"]


def group_shape(graph, ranks: list[str]) -> tuple[int, int]:
    """``(n, ranks per NVLink domain)`` of a communicator; ``ValueError`` when its domains hold
    different counts (no NCCL algorithm of this model runs such a group)."""
    counts: dict[int, int] = {}
    for r in ranks:
        data = graph.nodes[r]
        key = data.get("domain", data.get("node"))
        counts[key] = counts.get(key, 0) + 1
    per = set(counts.values())
    if len(per) != 1:
        raise ValueError(f"communicator {ranks} holds {sorted(counts.values())} ranks per NVLink domain")
    return len(ranks), per.pop()


@functools.lru_cache(maxsize=65536)
def _cost(collective: str, size_bytes: float, n: int, per_domain: int, fabric, constants) -> float:
    kwargs = {} if constants is None else {"constants": constants}
    return float(collective_time_s(collective, size_bytes, n, per_domain, fabric, **kwargs))


def idle_cost_s(ctx, collective: str, size_bytes: float, shape: tuple[int, int]) -> float:
    """Idle-fabric time (s) of ``collective`` of ``size_bytes`` on a communicator of ``shape``."""
    if collective in ("", "none") or size_bytes <= 0 or shape[0] <= 1:
        return 0.0
    return _cost(collective, float(size_bytes), int(shape[0]), int(shape[1]), ctx.cluster.fabric,
                 ctx.collective_constants)


def reprice_programs(ctx, programs: list[StageProgram], placement, graph, exchanges=None) -> list[StageProgram]:
    """Stage programs whose communication ops cost what their real communicators cost on an idle
    fabric. A stage whose communicators of one kind differ in shape takes the slowest (a folded
    stage waits for all of them). Ops whose communicators have the lowering's packed shape keep
    their cost untouched (bit for bit). An MoE exchange the lowering priced as DeepEP's kernels
    takes DeepEP's price on its communicators (``exchanges``: :class:`~simcore.moe.deepep_exchange.FoldedExchanges`)."""
    shapes: dict[tuple[str, int], set[tuple[int, int]]] = {}
    out = []
    for prog in programs:
        ops = []
        for op in prog.ops:
            if op.is_comm and op.size_bytes > 0:
                key = (op.group, prog.stage)
                if key not in shapes:
                    shapes[key] = {group_shape(graph, g) for g in placement.groups(op.group, prog.stage)}
                packed = packed_shape(ctx, placement.s, op.group)
                if shapes[key] != {packed} and exchanges is not None and op.group == "ep" and deepep_mode(op):
                    cost = max(exchanges.get(op, g).time_s for g in placement.groups(op.group, prog.stage))
                    op = dataclasses.replace(op, duration_s=cost)
                elif shapes[key] != {packed}:
                    cost = max(idle_cost_s(ctx, op.collective, op.size_bytes, sh) for sh in shapes[key])
                    op = dataclasses.replace(op, duration_s=cost)
            ops.append(op)
        out.append(StageProgram(prog.stage, ops))
    return out


def packed_shape(ctx, s, group: str) -> tuple[int, int]:
    """The communicator shape the lowering priced (see ``_Lowerer.rpd``)."""

    domain = ctx.cluster.nvlink_domain_size
    if group == "tp":
        return s.tp, int(group_ranks_per_domain(s.tp, 1, domain))
    if group == "ep":
        return s.ep, int(group_ranks_per_domain(s.ep, s.tp, domain))
    return 2, 2 if s.pp * s.tp * s.ep <= domain else 1
