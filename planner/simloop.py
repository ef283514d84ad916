"""Simulator in the loop: re-rank a proxy-ranked pool with a learned correction of the proxy.

Re-ranking the proxy's top ``K`` trusts the proxy to put the simulator's best among its first few.
Where the simulator departs from the proxy by layout (contention on a shared fabric, overlap of MoE
all-to-all, pipeline waits), its best can sit far down the proxy's list. :func:`sim_in_the_loop` takes
a larger pool (the proxy's best ``N`` distinct plans, best first) and a simulation ``budget``:

1. **Seed.** Simulate the proxy's top ``seed`` plans plus the proxy's best plan of each of the
   ``diverse`` best distinct ``(tp, ep, pp)`` layouts, so the correction sees every kind of plan.
2. **Learn.** Fit :class:`ProxyCorrection`, a ridge regression of ``log(sim / proxy)`` on features
   the proxy already computes (:func:`plan_features`: the shares of compute, communication and
   bubble in the proxy's step, the log degrees), on every simulated plan.
3. **Acquire.** Predict ``sim = proxy * exp(correction)`` for every unsimulated plan and simulate the
   ``batch`` best by the optimistic value ``prediction * exp(z * rmse)`` (``rmse``: the fit's
   leave-one-out error in log space).
4. **Stop** when no unsimulated plan's optimistic value beats the best simulated plan, or the
   budget is spent. The answer is the best *simulated* plan: the correction only chooses what to
   simulate, it never decides the answer.

Simulations go through :class:`SimMemo`, a memo keyed by the plan (optionally persisted as JSON
lines on disk, with a fingerprint of the scenario so a stale file is not reused), so plans simulated
by an earlier round, seed or run are not simulated again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import simcore
import topologies
from planner.megatron import canonical_key, strategy_from_key
from planner.rerank import Reranked, _verdict, rank_valid
from simcore.cost.proxy import evaluate

__all__ = ["SimMemo", "ProxyCorrection", "LoopResult", "plan_features", "sim_in_the_loop", "rerank_search_loop",
           "scenario_fingerprint", "code_fingerprint"]

FEATURES = ("bias", "compute_share", "comm_share", "bubble_share", "log_tp", "log_ep", "log_pp", "log_mb",
            "log_dp")


class SimMemo:
    """``key -> (tokens/s/GPU, valid)`` memo around ``simulate(key)``; ``path`` (a ``.jsonl``) keeps it
    on disk across runs, lines tagged with ``fingerprint`` (lines of another fingerprint are ignored).
    ``simulate`` may also return an invalid plan's reasons, kept in ``reasons[key]``."""

    def __init__(self, simulate: Callable[[tuple], tuple], path: str | Path | None = None,
                 fingerprint: str = ""):
        self._simulate, self.fingerprint = simulate, fingerprint
        self.path = None if path is None else Path(path)
        self.cache: dict[tuple, tuple[float, bool]] = {}
        self.reasons: dict[tuple, list[str]] = {}
        self.hits = self.misses = 0
        if self.path is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("fingerprint") == fingerprint:
                    self.cache[tuple(rec["key"])] = (float(rec["tokens_per_s_per_gpu"]), bool(rec["valid"]))
                    self.reasons[tuple(rec["key"])] = list(rec.get("reasons", []))

    def __call__(self, key) -> tuple[float, bool]:
        key = tuple(int(v) for v in key)
        if key in self.cache:
            self.hits += 1
            return self.cache[key]
        self.misses += 1
        value, valid, *reasons = self._simulate(key)
        self.cache[key] = (float(value), bool(valid))
        self.reasons[key] = list(reasons[0]) if reasons else []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"fingerprint": self.fingerprint, "key": list(key),
                                    "tokens_per_s_per_gpu": float(value), "valid": bool(valid),
                                    "reasons": self.reasons[key]}) + "\n")
        return self.cache[key]


def plan_features(key, by_category: dict[str, float], step_time_s: float) -> np.ndarray:
    """The regression features of one plan (names in ``FEATURES``): the proxy's step shares and log2
    of ``tp, ep, pp, microbatches, dp`` (key layout of :meth:`simcore.strategy.sharding.Strategy.key`)."""
    step = max(step_time_s, 1e-30)
    comm = sum(v for k, v in by_category.items() if k.startswith("comm"))
    tp, ep, pp, dp, _, mb = (int(v) for v in key[:6])
    return np.array([1.0, by_category.get("compute", 0.0) / step, comm / step, by_category.get("bubble", 0.0) / step,
                     np.log2(tp), np.log2(ep), np.log2(pp), np.log2(mb), np.log2(dp)])


@dataclass
class ProxyCorrection:
    """Ridge regression of ``log(sim / proxy)`` on :func:`plan_features` (the bias is not penalized).
    ``rmse`` is the leave-one-out root-mean-square error of the fit, in log space."""

    ridge: float = 1e-2
    coef: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))
    rmse: float = float("inf")

    def fit(self, x: np.ndarray, y: np.ndarray) -> ProxyCorrection:
        if self.ridge < 0:
            raise ValueError(f"ProxyCorrection.ridge must be >= 0, got {self.ridge}")
        x, y = np.asarray(x, float), np.asarray(y, float)
        penalty = self.ridge * np.eye(x.shape[1])
        penalty[0, 0] = 0.0
        a = x.T @ x + penalty
        inv = np.linalg.pinv(a)
        self.coef = inv @ x.T @ y
        hat = np.einsum("ij,jk,ik->i", x, inv, x)  # leverage of each point: LOO residual = r / (1 - h)
        resid = (y - x @ self.coef) / np.maximum(1.0 - hat, 1e-6)
        self.rmse = float(np.sqrt(np.mean(resid ** 2))) if len(y) > x.shape[1] else float("inf")
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, float) @ self.coef


@dataclass
class LoopResult:
    """The best simulated plan (index into the pool), every simulated index in order, and the rounds."""

    best: int | None
    simulated: list[int]
    sim_values: dict[int, float]
    rounds: int
    rmse: float


def _seed(keys: np.ndarray, seed: int, diverse: int) -> list[int]:
    first = list(range(min(seed, len(keys))))
    layouts: dict[tuple, int] = {}
    for i, k in enumerate(keys):
        layouts.setdefault((int(k[0]), int(k[1]), int(k[2])), i)
    return list(dict.fromkeys(first + list(layouts.values())[:diverse]))


def sim_in_the_loop(keys: np.ndarray, proxy_values: np.ndarray, features: np.ndarray,
                    simulate: Callable[[tuple], tuple[float, bool]], budget: int = 48, seed: int = 16,
                    diverse: int = 16, batch: int = 8, z: float = 2.0, ridge: float = 1e-2) -> LoopResult:
    """Choose, simulate and return the best plan of a proxy-ranked pool (see the module doc)."""
    for name, v in (("budget", budget), ("batch", batch)):
        if v < 1:
            raise ValueError(f"sim_in_the_loop: {name} must be >= 1, got {v}")
    n = len(keys)
    sim: dict[int, float] = {}
    todo = _seed(keys, seed, diverse)[:budget]
    model, rounds = ProxyCorrection(ridge), 0
    while todo:
        rounds += 1
        for i in todo:
            value, valid = simulate(tuple(int(v) for v in keys[i]))
            sim[i] = value if valid and value > 0 else 0.0
        done = [i for i in sim if sim[i] > 0]
        rest = np.array([i for i in range(n) if i not in sim], dtype=np.int64)
        left = budget - len(sim)
        if len(rest) == 0 or left <= 0 or not done:
            break
        x = features[done]
        y = np.log(np.array([sim[i] for i in done]) / proxy_values[done])
        model.fit(x, y)
        margin = model.rmse if np.isfinite(model.rmse) else float(np.max(np.abs(y)) + 0.05)
        optimistic = proxy_values[rest] * np.exp(model.predict(features[rest]) + z * margin)
        better = optimistic > max(sim.values())
        todo = rest[better][np.argsort(-optimistic[better], kind="stable")][:min(batch, left)].tolist()
    best = max(sim, key=lambda i: (sim[i], -i)) if sim and max(sim.values()) > 0 else None
    return LoopResult(best, list(sim), sim, rounds, model.rmse)


def rerank_search_loop(ctx, result, pool: int, k: int, budget: int, evaluator: Callable, cache: str | Path | None = None,
                       fingerprint: str = "") -> list:
    """:func:`planner.rerank.rerank_search` with the simulator in the loop: the search's ``pool`` best
    distinct plans, the top ``k`` and the acquisitions of :func:`sim_in_the_loop` simulated (at most
    ``budget``), memoized in ``cache``; returns the simulated plans as ``Reranked``, best first."""

    def canon(key):
        return canonical_key(key, ctx.model)

    first = result.top_valid(k, canon)  # what plain re-ranking simulates (elite included): the seed
    seen = {key for key, _ in first}
    top = first + [(key, v) for key, v in result.top_valid(pool, canon) if key not in seen]
    if not top:
        return []
    keys = np.array([key for key, _ in top], dtype=np.int64)
    proxy = np.array([value for _, value in top], dtype=float)
    feats = []
    for key in keys:
        p = evaluate(ctx, strategy_from_key(key))
        feats.append(plan_features(key, p.by_category, p.step_time_s))
    memo = SimMemo(lambda key: _verdict(evaluator(strategy_from_key(key))), cache, fingerprint)
    loop = sim_in_the_loop(keys, proxy, np.array(feats), memo, budget=max(budget, len(first)), seed=len(first))
    out = [Reranked(strategy_from_key(keys[i]), float(proxy[i]), i + 1, *memo(keys[i]),
                    reasons=memo.reasons.get(tuple(int(v) for v in keys[i]), [])) for i in loop.simulated]
    return rank_valid(out)


def code_fingerprint() -> str:
    """Hash of the simulator's and topologies' source files as they are on disk (edits included, so a
    memo never answers for a simulator that has changed since)."""

    h = hashlib.sha256()
    for package in (simcore, topologies):
        root = Path(package.__file__).resolve().parent
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def scenario_fingerprint(config: dict, reranker: str = "sim") -> str:
    """A stable tag of what a simulation depends on: the config's model, hardware, topology, workload
    and sim groups (plain dicts), the simulator's code (:func:`code_fingerprint`) and the re-ranker;
    a memo line of another tag is not reused."""
    parts = {g: config.get(g) for g in ("model", "hardware", "topology", "workload", "sim")}
    tag = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    tag = f"{tag}-{code_fingerprint()}"
    return tag if reranker == "sim" else f"{tag}:{reranker}"
