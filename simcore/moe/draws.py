"""Routing draws: the token copies every EP rank sends to every other, per layer and decode step.

Each of the ``ep`` ranks (attention groups) routes ``tokens_per_rank`` tokens, ``top_k`` copies
each, over the expert slots of :func:`~simcore.moe.placement.place_experts` with probability
``p(e) / replicas(e)`` per slot. With ``sampled`` routing the copies of (layer, step) are a seeded
multinomial per source rank; otherwise every rank sends its expected (fractional) copies. Copies are
drawn independently (a token may pick one expert twice: the approximation lifts the top-k
without-replacement constraint, whose effect on the rank loads is of order ``top_k / E``).

The load of a rank is its received copies over the mean per rank; :func:`expected_max_load` is the
expectation of the busiest rank's load under the configured routing, the number the proxy prices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr
from scipy.stats import binom

from simcore.moe.placement import place_experts
from simcore.moe.routing import RoutingConfig, _layer_rng, layer_popularity, load_expert_loads

__all__ = ["RoutingDraw", "draw_routing", "draw_copies", "expected_max_load", "expected_max_loads",
           "EXPECTATION_LAYERS"]

#: Layer popularities averaged by :func:`expected_max_load` (a zipf law reshuffles its experts per
#: layer; a file is averaged over its layers, at most this many).
EXPECTATION_LAYERS = 64
_EXPECTATION_SEED = 0x5EED


@dataclass(frozen=True)
class RoutingDraw:
    """One layer's routing at one step. ``pair_tokens[i, j]``: token copies rank ``i`` sends to
    rank ``j`` (``i == j`` stays local); ``rank_tokens[j]``: copies rank ``j``'s experts receive;
    ``expert_tokens[r * slots + k]``: copies of slot ``k`` of rank ``r`` (its grouped GEMM rows);
    ``slot_expert``: the expert in each slot (-1 empty)."""

    pair_tokens: np.ndarray
    rank_tokens: np.ndarray
    expert_tokens: np.ndarray
    slot_expert: np.ndarray
    tokens_per_rank: float
    top_k: int

    @property
    def ep(self) -> int:
        return len(self.rank_tokens)

    @property
    def slots_per_rank(self) -> int:
        return len(self.expert_tokens) // self.ep

    @property
    def loads(self) -> np.ndarray:
        """Received copies of every rank over the mean (1 everywhere when balanced)."""
        mean = self.rank_tokens.mean()
        return self.rank_tokens / mean if mean > 0 else np.ones(self.ep)

    @property
    def max_load(self) -> float:
        return float(self.loads.max())


def draw_copies(cfg: RoutingConfig, num_experts: int, ep: int, copies_per_rank: float, seed: int,
                layer: int, step: int = 0, redundant: int = 0, top_k: int = 1) -> RoutingDraw:
    """:func:`draw_routing` for a bare expert count (``copies_per_rank`` = tokens x top_k)."""
    if copies_per_rank < 0:
        raise ValueError(f"token copies per rank must be >= 0, got {copies_per_rank}")
    p = layer_popularity(cfg, num_experts, seed, layer)
    placement = place_experts(p, ep, redundant)
    q = placement.slot_share.ravel()
    spr = placement.slot_expert.shape[1]
    if cfg.sampled:
        counts = _layer_rng(seed, layer, step).multinomial(int(round(copies_per_rank)), q, size=ep).astype(float)
    else:
        counts = np.broadcast_to(copies_per_rank * q, (ep, len(q)))
    pair = counts.reshape(ep, ep, spr).sum(axis=2)
    return RoutingDraw(pair, pair.sum(axis=0), counts.sum(axis=0), placement.slot_expert.ravel(),
                       copies_per_rank / top_k, top_k)


def draw_routing(cfg: RoutingConfig, model, ep: int, tokens_per_rank: float, seed: int, layer: int,
                 step: int = 0, redundant: int = 0) -> RoutingDraw:
    """Routing of MoE layer ``layer`` (0 = the model's first MoE layer) at decode step ``step``:
    ``tokens_per_rank`` tokens on each of ``ep`` ranks, ``model.top_k`` copies each, over the
    model's routed experts placed with ``redundant`` replicas. Seeded: the same arguments give the
    same draw, whatever was drawn before."""
    if not model.is_moe:
        raise ValueError(f"routing: model {model.name} has no routed experts")
    return draw_copies(cfg, model.num_experts, ep, tokens_per_rank * model.top_k, seed, layer, step,
                       redundant, model.top_k)


def expected_max_load(cfg: RoutingConfig, num_experts: int, ep: int, token_copies: float,
                      redundant: int = 0) -> float:
    """Expected load of the busiest of ``ep`` ranks (over the mean) when ``token_copies`` copies in
    all are routed under ``cfg``: averaged over layer popularities (:data:`EXPECTATION_LAYERS`), and
    under ``sampled`` routing over the multinomial too (each rank's count binomial, summed exactly,
    or normal for large counts: ``E[max] = integral of 1 - prod_j F_j(x)``; the counts of different
    ranks taken as independent)."""
    if ep <= 1 or num_experts == 0 or ep > num_experts:  # ep > E: no placement (an invalid strategy)
        return 1.0
    if cfg.is_uniform and redundant == 0 and num_experts % ep == 0:
        return 1.0  # exact: every rank holds E / ep experts of equal popularity
    shares = _rank_shares(cfg, num_experts, ep, redundant)
    if not cfg.sampled:
        return float((shares.max(axis=1) * ep).mean())
    return _sampled_max(shares, float(token_copies))


def expected_max_loads(cfg: RoutingConfig | None, num_experts: int, ep, token_copies, redundant=0):
    """:func:`expected_max_load` for arrays of strategies (one evaluation per distinct row); 1.0
    (a float) when ``cfg`` is None: the proxy's uniform routing."""
    if cfg is None or num_experts == 0:
        return 1.0
    ep, copies, redundant = np.broadcast_arrays(np.asarray(ep, dtype=np.int64), np.asarray(token_copies, dtype=float),
                                                np.asarray(redundant, dtype=np.int64))
    if cfg.is_uniform and not redundant.any() and not np.any(num_experts % np.maximum(ep, 1)):
        return 1.0  # exactly balanced: the proxy's prices stay what they were without a routing config
    if not cfg.sampled:  # the copies do not matter
        copies = np.zeros_like(copies)
    rows = np.stack([ep.ravel().astype(float), copies.ravel(), redundant.ravel().astype(float)], axis=1)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    values = np.array([expected_max_load(cfg, num_experts, int(e), c, int(n)) for e, c, n in unique.tolist()])
    return values[inverse.ravel()].reshape(ep.shape)


def _rank_shares(cfg: RoutingConfig, num_experts: int, ep: int, redundant: int) -> np.ndarray:
    """``[layers, ep]``: each layer's expected share of the copies per rank."""
    if cfg.distribution == "file":
        layers = min(len(load_expert_loads(str(cfg.path), num_experts)), EXPECTATION_LAYERS)
    elif cfg.distribution == "zipf":
        layers = EXPECTATION_LAYERS
    else:
        layers = 1
    key = (cfg.key(), num_experts, ep, redundant, layers)
    if key not in _SHARES:  # a search asks for the same few (ep, redundant) again and again
        if len(_SHARES) > 4096:
            _SHARES.clear()
        _SHARES[key] = np.stack([place_experts(layer_popularity(cfg, num_experts, _EXPECTATION_SEED, la), ep,
                                               redundant).rank_share for la in range(layers)])
    return _SHARES[key]


_SHARES: dict[tuple, np.ndarray] = {}


def _sampled_max(shares: np.ndarray, copies: float, points: int = 512, exact_below: int = 4096) -> float:
    """Mean over layers of E[max_j X_j] / (copies / ep) with X_j ~ Binomial(n, s_j): summed exactly
    over the integers (``E[max] = sum_x P(max > x)``) while the counts stay below ``exact_below``,
    else with each X_j as Normal(n s_j, n s_j (1 - s_j)) on a grid of ``points``."""
    if copies <= 0:
        return 1.0
    ep = shares.shape[1]
    mu = copies * shares
    sd = np.sqrt(np.maximum(copies * shares * (1.0 - shares), 1e-12))
    hi = float((mu + 8.0 * sd).max())
    if hi < exact_below and hi * shares.size < 2e6:  # exact sums while they stay cheap
        n = int(round(copies))
        x = np.arange(int(np.ceil(hi)) + 1)
        cdf = binom.cdf(x[None, None, :], n, np.clip(shares, 0.0, 1.0)[:, :, None]).prod(axis=1)
        return float((1.0 - cdf).sum(axis=1).mean() / (n / ep))
    x = np.linspace(0.0, hi, points)
    cdf = ndtr((x[None, None, :] - mu[:, :, None]) / sd[:, :, None]).prod(axis=1)  # [layers, points]
    tail = 1.0 - cdf
    emax = ((tail[:, 1:] + tail[:, :-1]) * 0.5 * (x[1] - x[0])).sum(axis=1)  # trapezoid rule
    return float(emax.mean() / (copies / ep))
