"""Figures of the fidelity study: rank agreement, top-k overlap, re-ranking, ratio distributions.

Throughputs are tokens/s/GPU (higher is better); ``ratio`` is simulator over proxy step time (above 1:
the simulator is slower). The proxy only ever sees valid strategies here; the simulator can still
judge one invalid (an SLO it misses on its own, longer step), and such strategies are never its pick.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

__all__ = ["rank_agreement", "top_overlap", "rerank", "ratio_stats", "finite_or_none"]


def finite_or_none(value: float) -> float | None:
    """``value`` as a float, ``None`` where it is NaN or infinite (JSON has no NaN)."""
    value = float(value)
    return value if math.isfinite(value) else None


def rank_agreement(proxy: np.ndarray, sim: np.ndarray) -> dict:
    """Kendall tau-b and Spearman rho of two score vectors (``None`` with fewer than 3 points or a
    constant vector)."""
    proxy, sim = np.asarray(proxy, float), np.asarray(sim, float)
    if len(proxy) < 3 or np.ptp(proxy) == 0 or np.ptp(sim) == 0:
        return {"n": len(proxy), "kendall_tau": None, "spearman": None}
    return {"n": len(proxy), "kendall_tau": finite_or_none(stats.kendalltau(proxy, sim).statistic),
            "spearman": finite_or_none(stats.spearmanr(proxy, sim).statistic)}


def _top(score: np.ndarray, k: int, allowed: np.ndarray | None = None) -> np.ndarray:
    """Indices of the ``k`` best scores, best first (ties by index); only ``allowed`` ones."""
    score = np.asarray(score, float)
    idx = np.arange(len(score)) if allowed is None else np.flatnonzero(allowed)
    return idx[np.lexsort((idx, -score[idx]))][:k]


def top_overlap(proxy: np.ndarray, sim: np.ndarray, sim_valid: np.ndarray, k: int = 10) -> dict:
    """How many of the proxy's ``k`` best are among the simulator's ``k`` best (simulator-valid ones)."""
    a, b = set(_top(proxy, k).tolist()), set(_top(sim, k, sim_valid).tolist())
    k_eff = min(k, len(proxy))
    return {"k": k_eff, "overlap": len(a & b), "fraction": len(a & b) / k_eff if k_eff else None}


def rerank(proxy: np.ndarray, sim: np.ndarray, sim_valid: np.ndarray, pool: np.ndarray, k: int = 16) -> dict | None:
    """Take the proxy's ``k`` best of ``pool`` (a mask), pick the simulator's best valid among them.

    Returns indices and figures: ``gain`` (simulated throughput of the re-ranked pick over that of the
    proxy's pick, minus 1), ``proxy_loss`` (the proxy's view of the same swap), the pool's simulated
    optimum and each pick's regret to it. ``None`` when the pool has fewer than 2 strategies.
    """
    if pool.sum() < 2:
        return None
    top = _top(proxy, k, pool)
    proxy_pick = int(top[0])
    candidates = top[np.asarray(sim_valid)[top]]
    picked = int(_top(sim, 1, np.isin(np.arange(len(sim)), candidates))[0]) if len(candidates) else proxy_pick
    valid_pool = pool & np.asarray(sim_valid)
    oracle = float(np.max(np.asarray(sim)[valid_pool])) if valid_pool.any() else float("nan")
    return {"k": len(top), "pool_size": int(pool.sum()), "proxy_pick": proxy_pick, "reranked_pick": picked,
            "changed": picked != proxy_pick, "proxy_pick_sim_valid": bool(sim_valid[proxy_pick]),
            "gain": finite_or_none(sim[picked] / sim[proxy_pick] - 1),
            "proxy_loss": finite_or_none(proxy[picked] / proxy[proxy_pick] - 1),
            "oracle_sim_tokens_per_s_per_gpu": finite_or_none(oracle),
            "regret_proxy_pick": finite_or_none(1 - sim[proxy_pick] / oracle),
            "regret_reranked_pick": finite_or_none(1 - sim[picked] / oracle)}


def ratio_stats(ratios: np.ndarray, large: float = 0.05) -> dict:
    """Distribution of sim/proxy step ratios: quantiles and the share with ``|ratio - 1| > large``."""
    r = np.asarray(ratios, float)
    r = r[np.isfinite(r)]
    if len(r) == 0:
        return {"n": 0}
    q10, q50, q90 = np.quantile(r, [0.1, 0.5, 0.9])
    return {"n": len(r), "median": float(q50), "p10": float(q10), "p90": float(q90), "min": float(r.min()),
            "max": float(r.max()), "median_abs_dev": float(np.median(np.abs(r - 1))),
            "share_large": float(np.mean(np.abs(r - 1) > large))}
