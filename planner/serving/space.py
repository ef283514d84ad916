"""The serving plan space as categorical heads: the mode, each pool's degrees and workers, max_num_seqs,
speculative decoding's draft tokens.

One proposal is one vector of head indices::

    mode, a.tp, a.ep, a.pp, a.workers, b.tp, b.ep, b.pp, b.workers, max_num_seqs[, spec_tokens][, a.moe_ep, b.moe_ep]

Pool ``a`` is the aggregated pool (``mode`` agg) or the prefill pool (disagg); pool ``b`` the decode
pool. The prefill:decode worker ratio is ``a.workers : b.workers``. ``max_num_seqs`` caps the running
sequences of every worker (a prefill worker's are bounded by the step's token budget first).
``spec_tokens`` is the draft tokens per decode step (0: no speculation; :mod:`simcore.serving.speculative`),
a head only when its values are given (``serving.search.spec_tokens``): then each plan carries its own
(:attr:`simcore.serving.ServingPlan.spec_tokens`); otherwise plans leave it to the runtime, and the space
(so every method's proposals, seed for seed) is what it was before the head existed. ``a.moe_ep`` /
``b.moe_ep``, likewise only when their values are given (``serving.search.moe_ep``, an MoE model), split
each pool's experts that many ways whole inside its tensor-parallel groups (:class:`simcore.serving.Pool`;
a value must divide the pool's ``tp`` and leave the ``ep x moe_ep`` expert ranks an equal share of the
experts); otherwise every pool shards its experts by TP (moe_ep 1).

Masks are conditional, head by head (as in :mod:`planner.actions`): a worker layout ``(tp, ep, pp)`` must
pass the structural checks of :func:`simcore.cost.memory.structural_reasons` (heads and features divide,
EP within the experts, no group straddling NVLink domains) and its weights must leave a KV cache that
holds one request (:func:`simcore.serving.kvcache.kv_capacity_tokens`, a memory-model call per
layout, cheap beside a simulation); the GPUs of both pools must fit the cluster; an aggregated plan's
``b`` heads are forced to their first value (so each plan has one action). Per-operator sharding is
the serving runtimes' throughout (:func:`simcore.serving.runtime_sharding`: Megatron-style TP with a
replicated MoE gate, two all-reduces per layer; the static planner searches the per-operator choices).

:class:`ServingSpace` reuses :class:`planner.actions.ActionSpace`'s head-by-head sampling, greedy
decoding, repair and one-hot encoding, so PPO (:class:`planner.search.PPOSearch`) and the
metaheuristics of :mod:`planner.baselines` run on it unchanged; keys are the actions themselves.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from planner.actions import ActionSpace, Head
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import bit, structural_reasons
from simcore.serving import Pool, ServingPlan, runtime_sharding, runtime_strategy
from simcore.serving.kvcache import kv_capacity_tokens
from simcore.serving.runtime import RuntimeProfile
from simcore.space.bounds import powers_of_two
from simcore.strategy.opgraph import SEARCHABLE_OPS, choice_code

__all__ = ["ServingSpace", "HEADS", "WORKER_COUNTS"]

#: the heads in order; ``spec_tokens`` only when the draft count is searched
HEADS = ("mode", "a.tp", "a.ep", "a.pp", "a.workers", "b.tp", "b.ep", "b.pp", "b.workers", "max_num_seqs",
         "spec_tokens", "a.moe_ep", "b.moe_ep")
MODE_VALUES = ("agg", "disagg")
#: worker counts a pool may take (up to what the cluster holds): ratios like 1:3 and 2:3 need 3 and 6
WORKER_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class ServingSpace(ActionSpace):
    """Heads and masks of serving plans on ``ctx.cluster``; ``max_len`` tokens (prompt + output) must
    fit one attention group's KV cache."""

    def __init__(self, ctx: CostContext, runtime: RuntimeProfile, *, max_len: int, tp=None, ep=None,
                 pp=(1,), max_num_seqs=(32, 64, 128, 256, 512, 1024), modes=MODE_VALUES, spec_tokens=None,
                 moe_ep=None) -> None:
        self.ctx, self.runtime, self.masking = ctx, runtime, True
        self.spec_searched = spec_tokens is not None
        spec = _spec_values(spec_tokens, runtime)
        self.moe_ep_values = _moe_ep_values(moe_ep, ctx.model)
        n, m = ctx.cluster.num_gpus, ctx.model
        unknown = set(modes) - set(MODE_VALUES)
        if unknown or not modes:
            raise ValueError(f"serving.search.modes: {sorted(unknown) or modes!r} not among {', '.join(MODE_VALUES)}")
        tp = tuple(tp) if tp else powers_of_two(min(n, max(ctx.cluster.nvlink_domain_size, 8)))
        ep = tuple(ep) if ep else (powers_of_two(min(n, m.num_experts)) if m.is_moe else (1,))
        self.layouts = self._layouts(tuple(int(v) for v in tp), tuple(int(v) for v in ep),
                                     tuple(int(v) for v in pp), max_len)
        if not self.layouts:
            raise ValueError(f"serving search: no worker layout (tp {tp}, ep {ep}, pp {tuple(pp)}) splits {m.name} "
                             f"evenly, fits the cluster's {n} GPUs and holds, on {ctx.cluster.gpu.name} GPUs, a KV "
                             f"cache for one {max_len}-token request")
        self.min_gpus = min(t * e * p for t, e, p in self.layouts)
        disagg_ok = 2 * self.min_gpus <= n
        self.modes = tuple(i for i, name in enumerate(MODE_VALUES) if name in modes and (name == "agg" or disagg_ok))
        if not self.modes:
            raise ValueError(f"serving.search.modes: disaggregation needs two pools of {self.min_gpus} GPUs, the "
                             f"cluster has {n}")
        counts = tuple(w for w in WORKER_COUNTS if w * self.min_gpus <= n)
        degree = [sorted({lay[k] for lay in self.layouts}) for k in range(3)]
        self.heads = (Head("mode", tuple(range(len(MODE_VALUES)))),
                      Head("a.tp", tuple(degree[0])), Head("a.ep", tuple(degree[1])), Head("a.pp", tuple(degree[2])),
                      Head("a.workers", counts),
                      Head("b.tp", tuple(degree[0])), Head("b.ep", tuple(degree[1])), Head("b.pp", tuple(degree[2])),
                      Head("b.workers", counts), Head("max_num_seqs", tuple(int(s) for s in max_num_seqs)))
        if self.spec_searched:
            self.heads += (Head("spec_tokens", spec),)
        self.moe_head = len(self.heads) if self.moe_ep_values else None  # a.moe_ep, then b.moe_ep
        if self.moe_ep_values:
            self.heads += (Head("a.moe_ep", self.moe_ep_values), Head("b.moe_ep", self.moe_ep_values))
        self.degree_heads = self.heads
        self.sizes = np.array([h.size for h in self.heads], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.num_gpus = n
        self._allowed = lru_cache(maxsize=None)(self._allowed_uncached)
        self._size: int | None = None

    # ----- which worker layouts exist ---------------------------------------------------------------
    def _layouts(self, tp, ep, pp, max_len: int) -> tuple[tuple[int, int, int], ...]:
        n = self.ctx.cluster.num_gpus
        rows = [(t, e, p) for t, e, p in itertools.product(tp, ep, pp) if t * e * p <= n]
        if not rows:
            return ()
        codes = [choice_code(runtime_sharding()[op]) for op in SEARCHABLE_OPS]
        keys = np.array([[t, e, p, 1, e, 1, *codes] for t, e, p in rows], dtype=np.int64)
        reasons = structural_reasons(self.ctx, StrategyArrays.from_keys(keys)) & ~bit("device_count")
        out = []
        for (t, e, p), r in zip(rows, reasons.tolist(), strict=True):
            if r == 0 and kv_capacity_tokens(self.ctx, runtime_strategy(tp=t, ep=e, pp=p), self.runtime) >= max_len:
                out.append((t, e, p))
        return tuple(out)

    # ----- masks ---------------------------------------------------------------------------------
    def _allowed_uncached(self, i: int, prefix: tuple[int, ...]) -> np.ndarray:
        """Allowed values of head ``i`` after the head indices ``prefix`` (see the module docstring)."""
        h, n = self.heads, self.num_gpus
        size = h[i].size
        if i == 0:
            return np.isin(np.arange(size), self.modes)
        disagg = prefix[0] == 1
        if i >= 5 and i <= 8 and not disagg:  # an aggregated plan has no pool b
            return np.arange(size) == 0
        if self.moe_head is not None and i >= self.moe_head:
            return self._moe_ep_allowed(i - self.moe_head, prefix, disagg)
        if i >= 9:
            return np.ones(size, dtype=bool)
        pool = 0 if i < 5 else 1
        start = 1 + 4 * pool
        chosen = [h[start + k].values[prefix[start + k]] for k in range(min(i - start, 3))]
        room = n
        if pool == 0 and disagg:
            room = n - self.min_gpus  # leave room for the smallest decode pool
        if pool == 1:
            a = [h[1 + k].values[prefix[1 + k]] for k in range(3)]
            room = n - int(np.prod(a)) * h[4].values[prefix[4]]
        if i - start == 3:  # workers
            gpus = int(np.prod(chosen))
            return np.array([w * gpus <= room for w in h[i].values])
        k = i - start
        ok = np.zeros(size, dtype=bool)
        for lay in self.layouts:
            if list(lay[:k]) == chosen and lay[0] * lay[1] * lay[2] <= room:
                ok[h[i].values.index(lay[k])] = True
        return ok

    def _moe_ep_allowed(self, pool: int, prefix: tuple[int, ...], disagg: bool) -> np.ndarray:
        """Values of pool ``pool``'s (0: a, 1: b) ``moe_ep`` head: divisors of its tp that split the experts
        evenly over ``ep x moe_ep`` ranks; an aggregated plan's pool b, and a DeepEP runtime's pools (its
        dispatch inside a TP group is not modelled, :class:`~simcore.serving.StepCost`), take the first (1)."""
        values = self.heads[self.moe_head + pool].values
        if (pool == 1 and not disagg) or self.runtime.moe_a2a_backend == "deepep":  # DeepEP: experts over ep only
            return np.arange(len(values)) == 0
        tp, ep = (self.heads[1 + 4 * pool + k].values[prefix[1 + 4 * pool + k]] for k in range(2))
        return np.array([tp % g == 0 and self.ctx.model.num_experts % (ep * g) == 0 for g in values])

    def _allowed_any(self, i: int, prefix: tuple[int, ...]) -> np.ndarray:
        """As :meth:`_allowed_uncached`, but never empty: after a prefix that is itself outside the
        space (a crossover child) every value is allowed, as :class:`ActionSpace`'s tries do, and
        :meth:`repair` mends the prefix first."""
        ok = self._allowed(i, prefix)
        return ok if ok.any() else np.ones_like(ok)

    def head_mask(self, i: int, actions: np.ndarray) -> np.ndarray:
        rows = np.asarray(actions, dtype=np.int64)[:, :i].tolist()
        return np.stack([self._allowed_any(i, tuple(r)) for r in rows]) if rows else np.zeros((0, self.heads[i].size), bool)

    # ----- actions, keys and plans ---------------------------------------------------------------------
    def inside(self, keys: np.ndarray) -> np.ndarray:
        """Whether each action respects every mask (is a plan of this space)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1, self.num_heads)
        return np.array([all(self._allowed(i, tuple(row[:i]))[row[i]] for i in range(self.num_heads))
                         for row in keys.tolist()], dtype=bool)

    def to_keys(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        actions = np.asarray(actions, dtype=np.int64).reshape(-1, self.num_heads)
        return actions, self.inside(actions)

    def from_keys(self, keys: np.ndarray) -> np.ndarray:
        return np.asarray(keys, dtype=np.int64).reshape(-1, self.num_heads)

    def project(self, action) -> np.ndarray:
        """The nearest plan of the space, head by head: a masked index moves to the closest allowed
        one (deterministic, for samplers that propose every head independently, e.g. Optuna)."""
        out = np.array(action, dtype=np.int64).reshape(self.num_heads)
        for i in range(self.num_heads):
            allowed = np.flatnonzero(self._allowed(i, tuple(out[:i].tolist())))
            out[i] = allowed[np.argmin(np.abs(allowed - out[i]))]
        return out

    def plan(self, action) -> ServingPlan:
        """The :class:`~simcore.serving.ServingPlan` of one action (the runtimes' sharding in every pool)."""
        a = [int(x) for x in np.asarray(action).reshape(-1)]
        v = [self.heads[i].values[a[i]] for i in range(self.num_heads)]
        seqs, spec = v[9], (v[10] if self.spec_searched else None)
        moe = (v[self.moe_head], v[self.moe_head + 1]) if self.moe_head is not None else (1, 1)
        pool_a = Pool(runtime_strategy(tp=v[1], ep=v[2], pp=v[3]), v[4], seqs, moe[0])
        if MODE_VALUES[v[0]] == "agg":
            return ServingPlan("agg", pool=pool_a, spec_tokens=spec)
        return ServingPlan("disagg", prefill=pool_a,
                           decode=Pool(runtime_strategy(tp=v[5], ep=v[6], pp=v[7]), v[8], seqs, moe[1]), spec_tokens=spec)

    def action_of(self, plan: ServingPlan) -> np.ndarray:
        """The action of a plan (its degrees and counts must be head values)."""
        def idx(i, value):
            return self.heads[i].values.index(value)

        pools = [p for _, p in plan.pools]
        row = [idx(0, MODE_VALUES.index(plan.mode))]
        for k, p in enumerate(pools):
            s = p.strategy
            row += [idx(1 + 4 * k, s.tp), idx(2 + 4 * k, s.ep), idx(3 + 4 * k, s.pp), idx(4 + 4 * k, p.workers)]
        if plan.mode == "agg":
            row += [0, 0, 0, 0]
        row.append(idx(9, pools[-1].max_num_seqs))
        if self.spec_searched:
            row.append(idx(10, self.runtime.spec_tokens if plan.spec_tokens is None else plan.spec_tokens))
        if self.moe_head is not None:
            row += [idx(self.moe_head, pools[0].moe_ep),
                    idx(self.moe_head + 1, pools[1].moe_ep) if plan.mode != "agg" else 0]
        elif any(p.moe_ep != 1 for p in pools):
            raise ValueError(f"plan {plan.describe()}: moe_ep is not searched here (serving.search.moe_ep)")
        return np.array(row, dtype=np.int64)

    def enumerate(self) -> np.ndarray:
        """Every action of the space (depth-first over the masks)."""
        rows: list[list[int]] = []

        def walk(prefix: list[int]) -> None:
            i = len(prefix)
            if i == self.num_heads:
                rows.append(list(prefix))
                return
            for j in np.flatnonzero(self._allowed(i, tuple(prefix))).tolist():
                walk(prefix + [j])

        walk([])
        return np.array(rows, dtype=np.int64).reshape(-1, self.num_heads)

    @property
    def size(self) -> int:
        """How many plans the space holds."""
        if self._size is None:
            self._size = len(self.enumerate())
        return self._size

    def megatron(self) -> list[np.ndarray]:
        """The Megatron-style heuristic at every ``max_num_seqs``: an aggregated plan with the widest
        tensor parallelism in a node, the fewest GPUs at that width (EP before PP when both fit), and
        as many workers as the cluster holds; speculative decoding as the runtime has it (else the
        first searched value)."""
        tp = max(t for t, _, _ in self.layouts)
        lay = min((x for x in self.layouts if x[0] == tp), key=lambda x: (x[0] * x[1] * x[2], x[2], x[1]))
        gpus = lay[0] * lay[1] * lay[2]
        workers = max(w for w in self.heads[4].values if w * gpus <= self.num_gpus)
        rows = []
        values = self.heads[10].values if self.spec_searched else (self.runtime.spec_tokens,)
        spec = self.runtime.spec_tokens if self.runtime.spec_tokens in values else values[0]
        moe_ep = self.moe_ep_values[0] if self.moe_ep_values else 1  # the first allowed value: 1 if given
        for s in self.heads[9].values:
            plan = ServingPlan("agg", pool=Pool(runtime_strategy(tp=lay[0], ep=lay[1], pp=lay[2]), workers, s, moe_ep),
                               spec_tokens=spec if self.spec_searched else None)
            rows.append(self.action_of(plan))
        return rows


def _moe_ep_values(values, model) -> tuple[int, ...]:
    """The ``moe_ep`` heads' values (``serving.search.moe_ep``): distinct positive integers, on an MoE model
    only; ``()`` when not searched (``None``)."""
    if values is None:
        return ()
    if not model.is_moe:
        raise ValueError(f"serving.search.moe_ep: {model.name} has no routed experts to split")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"serving.search.moe_ep: {v!r} is not a positive integer")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError("serving.search.moe_ep: an empty list (leave it null to shard experts by TP)")
    if 1 not in out:  # the Megatron heuristic and the pool seeds shard experts by TP
        raise ValueError("serving.search.moe_ep: include 1 (expert TP), the layout the warm start proposes")
    return tuple(sorted(out))


def _spec_values(values, runtime: RuntimeProfile) -> tuple[int, ...]:
    """The ``spec_tokens`` head's values: those given (distinct, each a draft count the runtime's
    acceptance rates cover), else the runtime's own."""
    if values is None:
        return (int(runtime.spec_tokens),)
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"serving.search.spec_tokens: {v!r} is not an integer >= 0")
        if v > len(runtime.spec_accept):
            raise ValueError(f"serving.search.spec_tokens: {v} draft tokens, but serving.spec_accept gives "
                             f"acceptance rates for {len(runtime.spec_accept)}")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError("serving.search.spec_tokens: an empty list (leave it null to keep serving.spec_tokens)")
    return tuple(out)
