"""The proxy's ``K`` best distinct plans, exactly: the exact optimum's machinery extended to a top-K.

:func:`planner.exact.exact_optimum` prices, for every valid degree row and every choice ``c`` of the
condition operators (a *class*), the strategy taking each group's fastest choice; by the monotonicity
claim of :mod:`planner.exact` its throughput bounds every strategy of the class from above. A top-K
then needs only the classes whose bound reaches the K-th best value known so far, ``L``:

1. ``L`` is the K-th best distinct valid value among the classes' fastest strategies (a lower bound
   on the true K-th best: K plans at least that good exist);
2. in a class whose bound is at least ``L``, a group choice ``x`` of group ``g`` can appear in a plan
   worth at least ``L`` only if the strategy taking ``x`` in ``g`` and the fastest choice elsewhere
   (a *single deviation*, again an upper bound by monotonicity) is worth at least ``L``;
3. the product of the surviving choices of every group is priced at the class's true row; the K best
   distinct valid plans of everything priced are the answer.

Every plan worth at least the true K-th value is priced (steps 1-3 drop only plans below ``L``), so
the answer is the proxy's exact top-K; ``tests/test_rerank_regret.py`` checks it against brute force.
Plans are distinct by :func:`planner.megatron.canonical_key`. Static workloads use brute force.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from planner.exact import _assemble, _base_codes, _price, _Probe, _probe_keys, _rows, brute_force
from planner.megatron import KEY_WIDTH, canonical_key
from planner.space import SearchSpace
from simcore.cost.lowering import CostContext
from simcore.cost.memory import bit
from simcore.strategy.opgraph import SEARCHABLE_OPS, op_applies

__all__ = ["TopK", "top_k"]

_SLO_BITS = bit("ttft_slo") | bit("tpot_slo")


@dataclass
class TopK:
    """The ``K`` best distinct valid plans, best first (``keys`` [n, KEY_WIDTH], ``values`` tokens/s/GPU),
    and how many strategies were priced to prove it."""

    keys: np.ndarray
    values: np.ndarray
    calls: int


def _distinct_top(keys: np.ndarray, values: np.ndarray, reasons: np.ndarray, k: int, model) -> TopK:
    order = np.argsort(-np.where(reasons == 0, values, -np.inf), kind="stable")
    best: dict[tuple, int] = {}
    for i in order:
        if reasons[i] != 0 or len(best) >= k:
            break
        best.setdefault(canonical_key(keys[i], model), int(i))
    idx = np.array(list(best.values()), dtype=np.int64)
    return TopK(keys[idx] if len(idx) else keys[:0], values[idx] if len(idx) else values[:0], 0)


def _classes(ctx: CostContext, space: SearchSpace, ops: tuple[str, ...]):
    """Valid rows, the probe, and every class ``(row index, c index)`` with its fastest strategy priced."""
    rows = _rows(ctx, space)
    probe_keys, inverse = _probe_keys(rows)
    probe = _Probe(ctx, probe_keys, ops)
    pareto = {g: probe.pareto(g) for g in probe.groups}
    n_c = len(probe.conds)
    ri, ci = np.repeat(np.arange(len(rows)), n_c), np.tile(np.arange(n_c), len(rows))
    ok = np.all([keep[inverse[ri], ci, 0] for _, keep in pareto.values()], axis=0)
    ri, ci = ri[ok], ci[ok]
    fast = {g: order[inverse[ri], ci, 0] for g, (order, _) in pareto.items()}
    return rows, inverse, probe, ri, ci, fast


def _deviations(rows, probe, base, ri, ci, fast, g: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys of every single deviation in group ``g`` of the given classes: (class index, choice, key)."""
    n_x = len(probe.choices[g])
    cls = np.repeat(np.arange(len(ri)), n_x)
    x = np.tile(np.arange(n_x), len(ri))
    picks = {h: (np.tile(np.arange(n_x), len(ri)) if h == g else np.repeat(v, n_x)) for h, v in fast.items()}
    return cls, x, _assemble(rows[ri[cls]], probe.conds[ci[cls]], picks, probe, base)


class _Running:
    """The ``k`` best distinct valid plans seen so far and the floor a new plan must reach."""

    def __init__(self, k: int, model):
        self.k, self.model = k, model
        self.keys, self.values = np.zeros((0, KEY_WIDTH), np.int64), np.zeros(0)
        self.floor = -np.inf

    def add(self, keys: np.ndarray, values: np.ndarray, reasons: np.ndarray) -> None:
        ok = (reasons == 0) & (values >= self.floor)
        keys = np.concatenate([self.keys, keys[ok]])
        values = np.concatenate([self.values, values[ok]])
        top = _distinct_top(keys, values, np.zeros(len(values), np.int64), self.k, self.model)
        self.keys, self.values = top.keys, top.values
        if len(self.values) >= self.k:
            self.floor = float(self.values[-1])


def top_k(ctx: CostContext, space: SearchSpace, k: int = 200) -> TopK:
    """The proxy's ``k`` best distinct valid plans over ``space``, best first (see the module doc).
    Classes are visited best bound first, and the floor rises as better plans are found."""
    if k < 1:
        raise ValueError(f"top_k: k must be >= 1, got {k}")
    ops = tuple(op for op in SEARCHABLE_OPS if op_applies(ctx.model, op))
    if ctx.workload.phase == "static":
        bf = brute_force(ctx, space)
        out = _distinct_top(bf.keys, bf.values, bf.reasons, k, ctx.model)
        return TopK(out.keys, out.values, bf.calls)
    rows, _, probe, ri, ci, fast = _classes(ctx, space, ops)
    base = _base_codes(ops)
    keys = _assemble(rows[ri], probe.conds[ci], fast, probe, base)
    r = _price(ctx, keys)
    calls = probe.calls + len(keys)
    running = _Running(k, ctx.model)
    running.add(keys, r.tokens_per_s_per_gpu, r.reasons)
    live = (r.tokens_per_s_per_gpu >= running.floor) & ((r.reasons & _SLO_BITS) == 0)
    bound = r.tokens_per_s_per_gpu[live]
    ri, ci = ri[live], ci[live]
    fast = {g: v[live] for g, v in fast.items()}
    dev = {}
    for g in probe.groups:
        _, _, dk = _deviations(rows, probe, base, ri, ci, fast, g)
        dev[g] = _price(ctx, dk).tokens_per_s_per_gpu.reshape(len(ri), len(probe.choices[g]))
        calls += len(dk)
    for j in np.argsort(-bound, kind="stable"):
        if bound[j] < running.floor:
            break  # every later class is bounded below the floor too
        lists = [np.flatnonzero(dev[g][j] >= running.floor) for g in probe.groups]
        combos = np.array(list(itertools.product(*lists)), dtype=np.int64).reshape(-1, len(lists))
        if not len(combos):
            continue
        picks = {g: combos[:, n] for n, g in enumerate(probe.groups)}
        more = _assemble(np.repeat(rows[ri[j]][None], len(combos), 0), np.repeat(probe.conds[ci[j]][None],
                         len(combos), 0), picks, probe, base)
        pr = _price(ctx, more)
        calls += len(more)
        running.add(more, pr.tokens_per_s_per_gpu, pr.reasons)
    return TopK(running.keys, running.values, calls)
