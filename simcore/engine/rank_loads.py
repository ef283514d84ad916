"""MoE routing in the engine: the per-rank loads of one draw, from :mod:`simcore.moe`.

The routing itself (laws, per-layer popularity, expert placement with redundant replicas, seeded
per-(layer, step) draws, DeepEP costs) lives in :mod:`simcore.moe`; this module keeps the engine's
old entry point. The load of a rank is its token copies over the mean per rank: 1.0 everywhere for
uniform expected routing, above 1 on hot ranks.
"""

from __future__ import annotations

import numpy as np

from simcore.moe import RoutingConfig, draw_copies

__all__ = ["RoutingConfig", "rank_loads"]


def rank_loads(cfg: RoutingConfig, num_experts: int, ep: int, token_copies: float, seed: int,
               layer: int = 0, step: int = 0, redundant: int = 0) -> np.ndarray:
    """Load of each of the ``ep`` ranks when ``token_copies`` copies in all (tokens x top_k over the
    EP group) are routed in MoE layer ``layer`` at step ``step`` (:func:`simcore.moe.draw_copies`)."""
    if ep <= 1 or num_experts == 0:
        return np.ones(max(ep, 1))
    return draw_copies(cfg, num_experts, ep, token_copies / ep, seed, layer, step, redundant).loads
