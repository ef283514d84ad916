"""Per-rank MoE work for the per-GPU engine: each EP rank's expert load, the tokens every pair of
ranks exchanges, and each rank's own program.

:func:`rank_work` is the one place the engine asks how tokens are routed: :mod:`simcore.moe`'s
``draw_routing`` (per MoE layer and decode step, with the plan's redundant experts) when it exists;
otherwise :func:`simcore.engine.rank_loads.rank_loads` gives every rank its load and every sender
spreads its token copies over the receivers in proportion to their loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.cost.lowering import StrategyArrays, lower
from simcore.cost.memory import stage_layers
from simcore.engine.program import StageProgram, build_programs
from simcore.moe import draw_routing
from simcore.strategy.sharding import Strategy

__all__ = ["RankWork", "rank_work", "tokens_per_rank", "RankPrograms"]


@dataclass(frozen=True)
class RankWork:
    """One MoE layer's routing over ``ep`` ranks: ``loads[e]`` is rank ``e``'s received token copies
    over the mean (1 everywhere for uniform routing); ``pair_tokens[a, b]`` the copies ``a`` sends to ``b``."""

    loads: np.ndarray
    pair_tokens: np.ndarray

    @property
    def uniform(self) -> bool:
        return bool(np.all(self.pair_tokens == self.pair_tokens.flat[0]))


def tokens_per_rank(ctx, s: Strategy, phase: str) -> float:
    """Tokens one attention group (EP rank) holds per microbatch."""
    return s.batch / (s.ep * s.microbatches) * (ctx.workload.input_len if phase == "prefill" else 1)


def rank_work(ctx, s: Strategy, cfg, tokens: float, layer: int, step: int) -> RankWork | None:
    """Routing of MoE layer ``layer`` (0 = the first MoE layer) at decode step ``step``; None
    without expert parallelism."""
    m = ctx.model
    if not m.is_moe or s.ep <= 1:
        return None
    d = draw_routing(cfg.routing, m, s.ep, tokens, cfg.seed, layer, step, getattr(s, "redundant_experts", 0))
    pair = np.asarray(d.pair_tokens, dtype=float)
    received = pair.sum(axis=0)
    return RankWork(received / max(received.mean(), 1e-30), pair)


class RankPrograms:
    """Stage programs per EP rank: rank ``e`` runs its own expert GEMMs (lowered at its load), every
    other task is shared. One lowering per distinct load value (cached)."""

    def __init__(self, ctx, s: Strategy, phase: str, context_len, cfg):
        self.ctx, self.s, self.phase, self.context, self.cfg = ctx, s, phase, context_len, cfg
        self.tokens = tokens_per_rank(ctx, s, phase)
        self._arrays = StrategyArrays.from_strategies([s])
        self._blocks: dict[float, list] = {}
        self._work: dict[tuple[int, int], RankWork | None] = {}
        self._programs: dict[tuple, list[StageProgram]] = {}
        self.step_dependent = True  # seeded draws per (layer, step): simcore.moe.draw_routing
        # program layer (as build_programs numbers them: per stage, dense then MoE) -> MoE layer index

        dense, moe, _ = stage_layers(ctx.model, self._arrays.pp)
        self._moe_index: dict[int, int] = {}
        layer = 0
        for p in range(s.pp):
            layer += int(dense[0, p])
            for _ in range(int(moe[0, p])):
                self._moe_index[layer] = len(self._moe_index)
                layer += 1

    def work(self, layer: int, step: int) -> RankWork | None:
        """Routing of program layer ``layer`` (None for a dense layer)."""
        moe = self._moe_index.get(layer)
        if moe is None:
            return None
        key = (moe, step if self.step_dependent else 0)
        if key not in self._work:
            self._work[key] = rank_work(self.ctx, self.s, self.cfg, self.tokens, moe, key[1])
        return self._work[key]

    def equal_loads(self, steps: int) -> bool:
        """Whether every rank has the same work in every MoE layer of ``steps`` steps."""
        for step in range(steps if self.step_dependent else 1):
            for layer in self._moe_index:
                w = self.work(layer, step)
                if w is not None and not w.uniform:
                    return False
        return True

    def bytes_per_copy(self, name: str) -> float:
        """Bytes one routed token copy puts in the EP collective ``name`` (dispatch | combine) on
        one GPU: the uniform block's size over the copies it carries."""
        task = next(t for t in self._block(1.0) if t.name == name)
        copies = self.tokens * self.ctx.model.top_k
        return float(task.size_bytes[0]) / copies if copies > 0 else 0.0

    def _block(self, load: float) -> list:
        if load not in self._blocks:
            self._blocks[load] = lower(self.ctx, self._arrays, self.phase, self.context, load)["moe_layer"]
        return self._blocks[load]

    def programs(self, e: int, step: int) -> list[StageProgram]:
        """Every stage's program as EP rank ``e`` runs it at ``step``."""
        def load(layer: int) -> float:
            w = self.work(layer, step)
            return 1.0 if w is None else float(w.loads[e])

        loads = tuple(load(layer) for layer in range(max(self._moe_index, default=-1) + 1))
        if loads not in self._programs:  # ranks with equal loads share one program
            self._programs[loads] = build_programs(self.ctx, self.s, self.phase, self.context,
                                                   moe_block=lambda layer: self._block(loads[layer]))
        return self._programs[loads]
