"""MoE routing: how many token copies each expert-parallel rank receives.

A distribution over experts (``uniform``, ``zipf`` with a skew exponent, or a given histogram) is
mapped onto ``ep`` ranks that own ``E / ep`` experts each (experts are shuffled onto ranks by the
seed, so the popular experts do not all land on rank 0). ``expected`` loads use the distribution's
means; ``sampled`` loads draw a multinomial of the actual token copies, seeded.

The load of a rank is its token copies over the mean per rank: 1.0 everywhere for uniform
expected routing (what the proxy assumes), above 1 on hot ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RoutingConfig", "expert_probabilities", "rank_loads"]

DISTRIBUTIONS = ("uniform", "zipf", "histogram")


@dataclass
class RoutingConfig:
    """``distribution``: uniform | zipf | histogram; ``zipf_skew``: exponent s of p(e) ~ 1 / rank^s;
    ``histogram``: relative weight per expert (length = experts); ``sampled``: draw token counts."""

    distribution: str = "uniform"
    zipf_skew: float = 1.0
    histogram: list[float] = field(default_factory=list)
    sampled: bool = False

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"routing.distribution: {self.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
        if self.zipf_skew < 0:
            raise ValueError(f"routing.zipf_skew must be >= 0, got {self.zipf_skew}")


def expert_probabilities(cfg: RoutingConfig, num_experts: int, rng: np.random.Generator) -> np.ndarray:
    """Probability that a token copy goes to each expert (sums to 1), experts in random order."""
    if cfg.distribution == "uniform":
        p = np.full(num_experts, 1.0 / num_experts)
    elif cfg.distribution == "zipf":
        p = 1.0 / np.arange(1, num_experts + 1) ** cfg.zipf_skew
        p = p[rng.permutation(num_experts)]
    else:
        hist = np.asarray(cfg.histogram, dtype=float)
        if hist.shape != (num_experts,) or np.any(hist < 0) or hist.sum() <= 0:
            raise ValueError(f"routing.histogram: needs {num_experts} non-negative weights, got {len(hist)}")
        p = hist
    return p / p.sum()


def rank_loads(cfg: RoutingConfig, num_experts: int, ep: int, token_copies: float, seed: int) -> np.ndarray:
    """Load of each of the ``ep`` ranks (token copies over the mean per rank)."""
    if ep <= 1 or num_experts == 0:
        return np.ones(max(ep, 1))
    rng = np.random.default_rng(seed)
    p = expert_probabilities(cfg, num_experts, rng)
    # contiguous blocks of the (shuffled) experts; uneven when ep does not divide the experts
    parts = np.array_split(np.arange(num_experts), ep)
    share = np.array([p[idx].sum() for idx in parts])
    if cfg.sampled and token_copies >= 1:
        counts = rng.multinomial(int(round(token_copies)), p)
        share = np.array([counts[idx].sum() for idx in parts]) / max(counts.sum(), 1)
    return share * ep
