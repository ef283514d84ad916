"""The policy: attention over the elite history, one categorical head per strategy component.

As in the paper (Fig. 2, Appendix A): each of the ``T`` elite records is embedded linearly to
``d = 256``, one Transformer encoder block mixes them, the result is mean-pooled over the history, and
a small MLP maps it to the logits of every head and to a value estimate. Heads are independent given
the pooled vector (not autoregressive); invalid values are masked by setting their logits to a large
negative number (see :mod:`planner.actions`).

``elite_prior`` (0 in the paper) adds ``elite_prior`` to the logit of each value the best elite uses,
a skip connection from the observation to the logits: a freshly initialized network then proposes
around the incumbent instead of uniformly. It is a function of the observation, so PPO's ratios are
unchanged.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["Policy", "masked_log_probs", "MASKED_LOGIT"]

MASKED_LOGIT = -1e9


def _orthogonal(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Policy(nn.Module):
    """``obs [B, T, A] -> (logits [B, sum(head_sizes)], value [B])``."""

    def __init__(self, record_dim: int, head_sizes: list[int], d_model: int = 256, n_heads: int = 4,
                 hidden: int = 256, elite_prior: float = 0.0) -> None:
        super().__init__()
        self.head_sizes = [int(s) for s in head_sizes]
        self.num_logits = sum(self.head_sizes)
        self.elite_prior = float(elite_prior)
        self.embed = _orthogonal(nn.Linear(record_dim, d_model), np.sqrt(2))
        self.encoder = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=hidden, dropout=0.0,
                                                  batch_first=True)
        self.trunk = nn.Sequential(_orthogonal(nn.Linear(d_model, hidden), np.sqrt(2)), nn.Tanh())
        self.actor = _orthogonal(nn.Linear(hidden, self.num_logits), 0.01)
        self.critic = _orthogonal(nn.Linear(hidden, 1), 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder(self.embed(obs))          # [B, T, d]
        h = self.trunk(z.mean(dim=1))              # mean-pool over the history
        logits = self.actor(h)
        if self.elite_prior:
            logits = logits + self.elite_prior * obs[:, 0, : self.num_logits]  # best elite, one-hot
        return logits, self.critic(h).squeeze(-1)


def _layout(head_sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather index ``[H, max_size]`` from side-by-side logits to one row per head, and which slots
    are real values (``False`` pads heads shorter than the longest)."""
    width = max(head_sizes)
    offsets = np.concatenate([[0], np.cumsum(head_sizes)[:-1]])
    slot = np.arange(width)[None, :]
    real = slot < np.asarray(head_sizes)[:, None]
    index = np.where(real, offsets[:, None] + slot, 0)
    return torch.as_tensor(index), torch.as_tensor(real)


_LAYOUTS: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def masked_log_probs(logits: torch.Tensor, masks: torch.Tensor, head_sizes: list[int],
                     actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probability of ``actions [B, H]`` (sum over heads), entropy (sum over heads) and the
    per-head probabilities ``[B, H, max_size]``, with masked values removed. All heads at once: the
    side-by-side logits are gathered into one padded row per head."""
    key = tuple(int(s) for s in head_sizes)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = _layout(key)
    index, real = _LAYOUTS[key]
    allowed = masks[:, index] & real                          # [B, H, W]
    padded = torch.where(allowed, logits[:, index], torch.full((), MASKED_LOGIT, dtype=logits.dtype))
    log_p = torch.log_softmax(padded, dim=2)
    p = log_p.exp()
    logp = log_p.gather(2, actions.unsqueeze(2)).squeeze(2).sum(1)
    entropy = -(p * torch.where(allowed, log_p, torch.zeros((), dtype=log_p.dtype))).sum((1, 2))
    return logp, entropy, p
