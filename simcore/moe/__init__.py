"""MoE routing and expert-parallel communication: which experts the tokens pick, where the experts sit,
and what dispatch and combine cost.

* :mod:`.routing` - :class:`RoutingConfig` (uniform, Zipf(s), a histogram, a file of measured
  per-layer loads) and each layer's expert popularity.
* :mod:`.placement` - experts on EP ranks, with redundant replicas placed greedily by load.
* :mod:`.draws` - :func:`draw_routing`: seeded per-(layer, step) token copies per rank pair, per rank
  and per expert slot; :func:`expected_max_load`: the busiest rank's expected load (for the proxy).
* :mod:`.deepep` - DeepEP's normal and low-latency kernels as all-to-all algorithms, fitted on
  DeepEP's published H800 figures.
"""

from __future__ import annotations

from simcore.moe.deepep import (
    DEFAULT_DEEPEP,
    MODES,
    DeepEPConstants,
    LinkTokens,
    fixed_time_s,
    fp8_token_bytes,
    kernel_sms,
    kernel_time_s,
    link_tokens,
    mode_for_phase,
    pair_times_s,
    uniform_time_s,
)
from simcore.moe.draws import RoutingDraw, draw_copies, draw_routing, expected_max_load, expected_max_loads
from simcore.moe.placement import ExpertPlacement, place_experts, slots_per_rank
from simcore.moe.routing import A2A_KINDS, DISTRIBUTIONS, RoutingConfig, layer_popularity, load_expert_loads

__all__ = [
    "RoutingConfig", "DISTRIBUTIONS", "A2A_KINDS", "layer_popularity", "load_expert_loads",
    "ExpertPlacement", "place_experts", "slots_per_rank",
    "RoutingDraw", "draw_routing", "draw_copies", "expected_max_load", "expected_max_loads",
    "MODES", "DeepEPConstants", "DEFAULT_DEEPEP", "kernel_time_s", "pair_times_s", "uniform_time_s",
    "mode_for_phase", "fp8_token_bytes", "LinkTokens", "link_tokens", "fixed_time_s", "kernel_sms",
]
