"""PPO for the sharding search, in the paper's vocabulary and CleanRL's shape.

The search is a contextual bandit: the observation is the elite history, an action is one complete
strategy, the reward arrives at once and the episode ends (``gamma = 1``, one step), so the return is
the reward and the advantage is ``reward - value``. One update per rollout of ``num_steps``
strategies (the paper: 2), ``update_epochs`` passes over it (the paper: 2), the whole rollout as one
minibatch:

- clipped surrogate ``max(-A * ratio, -A * clip(ratio, 1 - clip_coef, 1 + clip_coef))``;
- value loss ``0.5 * (V - R)^2`` (optionally clipped, off by default after Andrychowicz et al.);
- entropy bonus ``ent_coef * H`` summed over heads;
- advantages normalized over the rollout; global gradient-norm clipping; Adam (``eps = 1e-5``);
- learning rate ``learning_rate`` cosine-annealed to 0 over the network's life.

Diagnostics per update, as CleanRL logs them: ``approx_kl`` (the k3 estimator), ``clipfrac``,
``entropy``, ``explained_variance``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from planner.actions import ActionSpace
from planner.policy import Policy, masked_log_probs

__all__ = ["PPOConfig", "Rollout", "PPO"]


@dataclass
class PPOConfig:
    """PPO hyper-parameters (defaults: the paper's where it gives them, CleanRL's otherwise)."""

    learning_rate: float = 1e-3   # initial Adam step size, cosine-annealed to 0
    num_steps: int = 2            # strategies per rollout (the paper's rollout buffer)
    update_epochs: int = 2        # gradient passes per rollout
    clip_coef: float = 0.2        # surrogate clipping range
    ent_coef: float = 0.01        # entropy bonus
    vf_coef: float = 0.5          # value-loss weight
    max_grad_norm: float = 0.5    # global gradient-norm clip
    norm_adv: bool = True         # normalize advantages over the rollout
    clip_vloss: bool = False      # PPO-style value clipping
    adam_eps: float = 1e-5


@dataclass
class Rollout:
    """One rollout: per step the observation, action (head indices), masks, old log-prob, value, reward."""

    obs: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    masks: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    values: list = field(default_factory=list)
    rewards: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rewards)


class PPO:
    """The agent: a :class:`Policy` and its optimizer."""

    def __init__(self, policy: Policy, cfg: PPOConfig) -> None:
        # One thread: this network is far too small to gain from more, extra threads spin against
        # each other on a busy machine (100x slower), and one thread makes results reproducible.
        torch.set_num_threads(1)
        self.policy, self.cfg = policy, cfg
        # fused: one kernel for every parameter, 2x faster than the per-tensor loop on this small net
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps, fused=True)

    def set_progress(self, frac: float) -> float:
        """Cosine-anneal the learning rate: ``frac`` in [0, 1] of the network's life spent."""
        lr = self.cfg.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(max(frac, 0.0), 1.0)))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    @torch.no_grad()
    def probs(self, obs: np.ndarray) -> tuple[torch.Tensor, np.ndarray, float]:
        """Logits, unmasked per-head probabilities (side by side, float64) and value of one observation."""
        logits, value = self.policy(torch.as_tensor(obs)[None])
        parts = torch.split(logits.double(), self.policy.head_sizes, dim=1)
        return logits, torch.cat([torch.softmax(p, dim=1) for p in parts], dim=1).numpy(), float(value[0])

    @torch.no_grad()
    def act(self, space: ActionSpace, rng: np.random.Generator, logits: torch.Tensor, probs: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, float]:
        """Sample one strategy from :meth:`probs`' output: ``(action [H], masks [S], log-prob)``."""
        action, masks = space.sample(probs, rng, with_masks=True)
        logp, _, _ = masked_log_probs(logits, torch.as_tensor(masks), self.policy.head_sizes,
                                      torch.as_tensor(action))
        return action[0], masks[0], float(logp[0])

    def update(self, rollout: Rollout) -> dict[str, float]:
        """``update_epochs`` clipped-surrogate steps on the rollout; returns the diagnostics."""
        cfg = self.cfg
        b_obs = torch.as_tensor(np.stack(rollout.obs))
        b_actions = torch.as_tensor(np.stack(rollout.actions))
        b_masks = torch.as_tensor(np.stack(rollout.masks))
        b_logprobs = torch.as_tensor(rollout.logprobs, dtype=torch.float32)
        b_values = torch.as_tensor(rollout.values, dtype=torch.float32)
        b_returns = torch.as_tensor(rollout.rewards, dtype=torch.float32)  # one-step episodes
        b_advantages = b_returns - b_values
        clipfracs, approx_kl, entropy_loss, pg_loss, v_loss = [], 0.0, 0.0, 0.0, 0.0
        for _epoch in range(cfg.update_epochs):
            logits, newvalue = self.policy(b_obs)
            newlogprob, entropy, _ = masked_log_probs(logits, b_masks, self.policy.head_sizes, b_actions)
            logratio = newlogprob - b_logprobs
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = float(((ratio - 1) - logratio).mean())
                clipfracs.append(float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean()))
            mb_advantages = b_advantages
            if cfg.norm_adv and len(mb_advantages) > 1:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            if cfg.clip_vloss:
                v_clipped = b_values + torch.clamp(newvalue - b_values, -cfg.clip_coef, cfg.clip_coef)
                v_loss = 0.5 * torch.max((newvalue - b_returns) ** 2, (v_clipped - b_returns) ** 2).mean()
            else:
                v_loss = 0.5 * ((newvalue - b_returns) ** 2).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - cfg.ent_coef * entropy_loss + v_loss * cfg.vf_coef
            self.optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
        y_pred, y_true = b_values.numpy(), b_returns.numpy()
        var_y = float(np.var(y_true))
        explained_var = None if var_y == 0 else 1.0 - float(np.var(y_true - y_pred)) / var_y
        return {"pg_loss": float(pg_loss.detach()), "v_loss": float(v_loss.detach()),
                "entropy": float(entropy_loss.detach()),
                "approx_kl": approx_kl, "clipfrac": float(np.mean(clipfracs)),
                "explained_variance": explained_var, "lr": self.optimizer.param_groups[0]["lr"]}
