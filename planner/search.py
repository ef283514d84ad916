"""The paper's search loop: PPO proposals, the reward, the elite history, early exit and restarts.

Reward (Eq. 1), on throughput normalized by the warm start's best (``raw = tokens/s/GPU / reference``,
so one set of hyper-parameters fits every scenario)::

    r = alpha * raw + beta * (raw - best_so_far)        valid strategies
    r = invalid_reward                                   anything the proxy or the space rejects

The budget is split into ``chunks`` equal chunks; each chunk starts a fresh network (re-initialized
from the seed and the restart count) that keeps the elite history and the best so far. Inside a chunk
the agent exits early once every head's top probability reaches ``tau`` (the policy has become
deterministic); a new network then continues on the chunk's remaining calls. With ``polish`` on
(our addition) every network's life ends with a local search from the new elite records.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import torch

from planner.actions import ActionSpace
from planner.elite import Elite
from planner.evaluator import Evaluator
from planner.policy import Policy
from planner.ppo import PPO, PPOConfig, Rollout

__all__ = ["PPOSearch", "reward", "BLOCKS"]

# Operators whose layouts must agree with one another, so the polish step tries every layout of a
# block at once: the attention block with the router that reads its output, and each FFN pair.
BLOCKS = (("qkv", "attention", "out_proj", "router"), ("expert_ffn1", "expert_ffn2"),
          ("dense_ffn1", "dense_ffn2"), ("shared_ffn1", "shared_ffn2"))


def reward(raw: float | None, best_so_far: float | None, alpha: float, beta: float, invalid: float) -> float:
    """Eq. 1 on normalized throughput; ``raw`` is ``None`` for an invalid strategy."""
    if raw is None:
        return invalid
    best = raw if best_so_far is None else best_so_far
    return alpha * raw + beta * (raw - best)


class PPOSearch:
    """The PPO planner: :meth:`start` warm-starts the elite, :meth:`run` spends one chunk."""

    name = "ppo"

    def __init__(self, actions: ActionSpace, cfg, seed: int) -> None:
        self.actions, self.cfg, self.seed = actions, cfg, int(seed)
        torch.set_num_threads(1)  # see PPO.__init__
        self.rng = np.random.default_rng([self.seed, 1])
        self.elite = Elite(int(cfg.T), distinct_prefix=3 if cfg.elite_diverse else 0)
        self.restarts = 0
        self.polished: set[tuple[int, ...]] = set()
        self.metrics: list[dict] = []
        self.ppo_cfg = PPOConfig(learning_rate=cfg.learning_rate, num_steps=cfg.num_steps,
                                 update_epochs=cfg.update_epochs, clip_coef=cfg.clip_coef,
                                 ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm,
                                 norm_adv=cfg.norm_adv)

    def start(self, ev: Evaluator) -> None:
        out = ev.warm_start()
        acts = self.actions.from_keys(out.keys)
        for a, value, ok in zip(acts, out.tokens_per_s_per_gpu, out.valid, strict=True):
            if ok:
                self.elite.offer(ev.normalized(value), a)

    def _agent(self) -> PPO:
        torch.manual_seed(int(np.random.SeedSequence([self.seed, 2, self.restarts]).generate_state(1)[0]))
        c = self.cfg
        exploit = (self.restarts + 1) % int(c.elite_prior_every) == 0
        policy = Policy(Elite.record_dim(self.actions), self.actions.sizes.tolist(), d_model=c.d_model,
                        n_heads=c.n_heads, hidden=c.hidden, elite_prior=c.elite_prior if exploit else 0.0)
        return PPO(policy, self.ppo_cfg)

    def run(self, ev: Evaluator, until: int, stop: Callable[[], bool]) -> None:
        """Spend calls up to ``until`` (one chunk): fresh networks, each until it exits early."""
        while ev.calls < min(until, ev.budget) and not stop():
            self._life(ev, until, stop)
            self.restarts += 1
            if self.cfg.polish:
                self._polish(ev, until, stop)

    def _polish(self, ev: Evaluator, until: int, stop: Callable[[], bool]) -> None:
        """Hill-climb from every elite record not polished yet: price all its unpriced neighbours
        (:meth:`_neighbours`; one batch, counted against the budget; a changed head that invalidates
        later heads re-draws them), move to the best one while it improves. Records found on the way
        enter the elite. Not in the paper; see ``conf/planner/ppo.yaml`` for what it buys."""
        for _, start in list(self.elite.records):
            current = start
            while current not in self.polished and ev.calls < min(until, ev.budget) and not stop():
                self.polished.add(current)
                moves = self._neighbours(ev, current)
                if len(moves) == 0:
                    break
                out = ev.evaluate_actions(moves[: min(until, ev.budget) - ev.calls])
                base = ev.lookup(self.actions.to_keys(np.array([current]))[0][0])
                best, best_value = None, base if base is not None else -np.inf
                for a, value, ok in zip(moves, out.tokens_per_s_per_gpu, out.valid, strict=False):
                    if ok:
                        self.elite.offer(ev.normalized(value), a)
                        if value > best_value:
                            best, best_value = tuple(int(x) for x in a), value
                if best is None:
                    break
                current = best

    def _neighbours(self, ev: Evaluator, action: tuple[int, ...]) -> np.ndarray:
        """Distinct changes of ``action`` whose keys were never priced (masks repaired): every
        one-head change; every change of two coarse heads together, since degrees, batch,
        microbatches and redundant experts are coupled (more pipeline stages pay off only with a
        larger batch, replicas only at a wide enough expert-parallel degree); every
        change of two neighbouring operators; and every layout of each block of operators
        (:data:`BLOCKS`), whose layouts must agree (a column-parallel producer wants a row-parallel
        consumer), so no single change from one good layout reaches the other."""
        base = np.array(action, dtype=np.int64)
        sizes = self.actions.sizes.tolist()
        n_coarse = self.actions.num_coarse
        groups = [(i,) for i in range(len(sizes))]
        groups += [(i, j) for i in range(n_coarse) for j in range(i + 1, n_coarse)]
        names = [h.name for h in self.actions.heads]
        groups += [tuple(names.index(op) for op in block if op in names) for block in BLOCKS]
        groups += [(i, i + 1) for i in range(n_coarse, len(sizes) - 1)]  # a producer and its consumer
        rows = [_moved(base, dict(zip(g, values, strict=True)))
                for g in groups if g for values in itertools.product(*(range(sizes[i]) for i in g))]
        rows += self._pipeline_moves(base)
        if not rows:
            return np.zeros((0, len(base)), dtype=np.int64)
        rows = self.actions.repair(np.array(rows), self.rng) if self.actions.masking else np.array(rows)
        keys, inside = self.actions.to_keys(rows)
        keep, seen = [], set()
        for r, (k, ok) in enumerate(zip(keys.tolist(), inside.tolist(), strict=True)):
            if ok and tuple(k) not in seen and ev.lookup(k) is None:
                seen.add(tuple(k))
                keep.append(r)
        return rows[keep]

    def _pipeline_moves(self, base: np.ndarray) -> list[np.ndarray]:
        """Every pipeline depth with as many microbatches (a pipeline of p stages needs p of them
        in flight to stay busy), at every batch and expert-parallel degree (the GPUs a depth frees
        or takes come from EP or from the replicas): four coarse heads that move together."""
        names = [h.name for h in self.actions.heads]
        if not {"pp", "microbatches", "batch"} <= set(names):
            return []
        i_pp, i_mb, i_batch = names.index("pp"), names.index("microbatches"), names.index("batch")
        pp, mb = self.actions.heads[i_pp].values, self.actions.heads[i_mb].values
        i_ep = names.index("ep")
        return [_moved(base, {i_pp: a, i_mb: mb.index(depth), i_batch: b, i_ep: e})
                for a, depth in enumerate(pp) if depth in mb for b in range(len(self.actions.heads[i_batch].values))
                for e in range(len(self.actions.heads[i_ep].values))]

    def _life(self, ev: Evaluator, until: int, stop: Callable[[], bool]) -> None:
        """One network's life: rollouts and updates until the chunk ends or the policy is confident
        (checked before each rollout, on the probabilities its first step samples from)."""
        agent, start = self._agent(), ev.calls
        end = min(until, ev.budget)
        span = max(end - start, 1)
        stats = None
        while ev.calls < end:
            rollout = Rollout()
            while len(rollout) < self.ppo_cfg.num_steps and ev.calls < end:
                if stop():
                    return
                obs = self.elite.observation(self.actions)
                logits, probs, value = agent.probs(obs)
                if len(rollout) == 0 and stats is not None:  # after each update: log, maybe exit
                    confidence = self.actions.greedy(probs)[1][0]
                    self._log(ev, stats, confidence)
                    if confidence.min() >= self.cfg.tau:
                        return
                self._step(ev, agent, rollout, obs, logits, probs, value)
            lr = agent.set_progress((ev.calls - start) / span)
            stats = agent.update(rollout) | {"lr": lr}
        if stats is not None:  # the life's last update
            self._log(ev, stats, self.actions.greedy(agent.probs(self.elite.observation(self.actions))[1])[1][0])

    def _log(self, ev: Evaluator, stats: dict, confidence: np.ndarray) -> None:
        best = ev.best_value if ev.best_key is not None else None
        self.metrics.append({"call": ev.calls, "restart": self.restarts, **stats,
                             "min_confidence": float(confidence.min()), "best": best})

    def _step(self, ev: Evaluator, agent: PPO, rollout: Rollout, obs, logits, probs, value) -> None:
        action, masks, logp = agent.act(self.actions, self.rng, logits, probs)
        best = ev.normalized(ev.best_value) if ev.best_key is not None else None
        out = ev.evaluate_actions(action[None])
        raw = ev.normalized(float(out.tokens_per_s_per_gpu[0])) if out.valid[0] else None
        c = self.cfg
        r = reward(raw, best, c.alpha, c.beta, c.invalid_reward)
        if raw is not None:
            self.elite.offer(raw, action)
        rollout.obs.append(obs)
        rollout.actions.append(action)
        rollout.masks.append(masks)
        rollout.logprobs.append(logp)
        rollout.values.append(value)
        rollout.rewards.append(r)


def _moved(base: np.ndarray, changes: dict[int, int]) -> np.ndarray:
    """``base`` with the heads in ``changes`` set to their new values."""
    row = base.copy()
    for i, v in changes.items():
        row[i] = v
    return row
