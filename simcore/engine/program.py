"""Stage programs: what the GPUs of one pipeline stage run for one microbatch, in order.

A program is the lowered tasks (:mod:`simcore.cost.lowering`, the same ones the proxy sums) laid out
layer by layer: the embedding on the first stage, the stage's dense then MoE layers, the LM head
on the last stage, and the send to the next stage. All GPUs of a stage run the same program (its
``tp * ep`` GPUs in every replica), which is what lets the simulator run one representative
process per stage and microbatch instead of one per GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcore.cost.lowering import CostContext, StrategyArrays, Task, lower
from simcore.cost.memory import stage_layers
from simcore.strategy import layout as L
from simcore.strategy.sharding import Strategy

__all__ = ["Op", "StageProgram", "build_programs"]


@dataclass(frozen=True)
class Op:
    """One task instance: ``layer`` is -1 outside decoder layers; ``duration_s`` is the idle-fabric
    cost (the proxy's); communication ops carry their collective, size and communicator."""

    name: str
    op: str
    layer: int
    is_comm: bool
    duration_s: float
    collective: str = ""
    group: str = ""
    size_bytes: float = 0.0
    branch: str = ""
    algorithm: str = ""  # what the lowering priced a collective as, where not NCCL's (e.g. deepep_normal)

    @classmethod
    def from_task(cls, task: Task, layer: int) -> Op:
        code = int(task.extra.get("collective", [0])[0]) if task.is_comm else 0
        return cls(task.name, task.op, layer, task.is_comm, float(task.time_s[0]) * task.count,
                   L.COLLECTIVE_NAMES[code] if task.is_comm else "", task.group,
                   float(task.size_bytes[0]) if task.is_comm else 0.0, task.branch,
                   str(task.extra.get("algorithm", "")) if task.is_comm else "")


@dataclass
class StageProgram:
    stage: int
    ops: list[Op]

    @property
    def duration_s(self) -> float:
        """Time of one microbatch with every op back to back (no overlap, idle fabric)."""
        return sum(op.duration_s for op in self.ops)


def build_programs(ctx: CostContext, strategy: Strategy, phase: str, context_len=None,
                   expert_load: float = 1.0, moe_block=None) -> list[StageProgram]:
    """One program per pipeline stage; communication ops that cost nothing are dropped.
    ``moe_block(layer)``, when given, returns the tasks of MoE layer ``layer`` (one EP rank's own
    expert work, :mod:`simcore.engine.moework`) in place of the shared block."""
    s = StrategyArrays.from_strategies([strategy])
    blocks = lower(ctx, s, phase, context_len, expert_load)
    dense, moe, _ = stage_layers(ctx.model, s.pp)
    programs = []
    layer = 0
    for p in range(strategy.pp):
        tasks: list[tuple[Task, int]] = []
        if p == 0:
            tasks += [(t, -1) for t in blocks["first"]]
        for kind, count in (("dense_layer", dense[0, p]), ("moe_layer", moe[0, p])):
            for _ in range(int(count)):
                block = moe_block(layer) if moe_block is not None and kind == "moe_layer" else blocks[kind]
                tasks += [(t, layer) for t in block]
                layer += 1
        if p == strategy.pp - 1:
            tasks += [(t, -1) for t in blocks["last"]]
        else:
            tasks += [(t, -1) for t in blocks["p2p"]]
        ops = _launch_bound([Op.from_task(t, i) for t, i in tasks],
                            sum(t.count for t, _ in tasks if float(t.time_s[0]) > 0), ctx.workload.launch_s)
        programs.append(StageProgram(p, [op for op in ops if not (op.is_comm and op.collective == "none")]))
    return programs


def _launch_bound(ops: list[Op], kernels: int, launch_s: float) -> list[Op]:
    """Eager launches (:func:`simcore.cost.host.launch_floor`): when the stage's ``kernels`` launches take
    longer than its ops, its compute ops stretch so the stage takes exactly the launches' time."""
    total = sum(op.duration_s for op in ops)
    compute = sum(op.duration_s for op in ops if not op.is_comm)
    floor = kernels * launch_s
    if launch_s <= 0 or floor <= total or compute <= 0:
        return ops
    scale = (floor - (total - compute)) / compute
    return [op if op.is_comm else dataclasses.replace(op, duration_s=op.duration_s * scale) for op in ops]
