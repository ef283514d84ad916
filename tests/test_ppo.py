"""PPO pieces: masked log-probabilities, the update's direction, early exit, the logged diagnostics."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from planner.config import PPOPlannerConfig
from planner.policy import Policy, masked_log_probs
from planner.ppo import PPO, PPOConfig, Rollout
from planner.runner import run_planner
from planner.space import SearchSpace
from tests.conftest import make_ctx

torch.set_num_threads(1)  # see planner.ppo.PPO
SIZES = [3, 2, 4]


def test_masked_log_probs_match_a_per_head_reference():
    torch.manual_seed(0)
    logits = torch.randn(5, sum(SIZES))
    masks = torch.rand(5, sum(SIZES)) > 0.3
    masks[:, [0, 3, 5]] = True  # every head keeps at least one value
    actions = torch.tensor([[0, 0, 0]] * 5)
    logp, entropy, probs = masked_log_probs(logits, masks, SIZES, actions)
    ref_logp, ref_ent, start = torch.zeros(5), torch.zeros(5), 0
    for h, size in enumerate(SIZES):
        part = logits[:, start: start + size].masked_fill(~masks[:, start: start + size], -math.inf)
        dist = torch.distributions.Categorical(logits=part)
        ref_logp += dist.log_prob(actions[:, h])
        p = dist.probs
        ref_ent -= torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(1)
        assert (probs[:, h, :size][~masks[:, start: start + size]] == 0).all()
        start += size
    assert torch.allclose(logp, ref_logp, atol=1e-5) and torch.allclose(entropy, ref_ent, atol=1e-5)


def test_uniform_masked_head_has_entropy_log_k():
    logits = torch.zeros(1, 4)
    masks = torch.tensor([[True, False, True, True]])
    _, entropy, _ = masked_log_probs(logits, masks, [4], torch.tensor([[0]]))
    assert entropy.item() == pytest.approx(math.log(3), rel=1e-6)


def test_update_moves_probability_towards_the_better_action():
    torch.manual_seed(0)
    policy = Policy(record_dim=6, head_sizes=SIZES, d_model=16, n_heads=2, hidden=16)
    agent = PPO(policy, PPOConfig(learning_rate=1e-2, update_epochs=4, ent_coef=0.0))
    obs = np.zeros((2, 6), dtype=np.float32)
    good, bad = np.array([2, 1, 3]), np.array([0, 0, 0])
    masks = np.ones(sum(SIZES), dtype=bool)

    def logp(action):
        logits, _ = policy(torch.as_tensor(obs)[None])
        return masked_log_probs(logits, torch.as_tensor(masks)[None], SIZES, torch.as_tensor(action)[None])[0].item()

    before_good, before_bad = logp(good), logp(bad)
    rollout = Rollout()
    for action, r in ((good, 1.0), (bad, -1.0)):
        rollout.obs.append(obs)
        rollout.actions.append(action)
        rollout.masks.append(masks)
        rollout.logprobs.append(logp(action))
        rollout.values.append(0.0)
        rollout.rewards.append(r)
    stats = agent.update(rollout)
    assert logp(good) > before_good and logp(bad) < before_bad
    assert stats["explained_variance"] == pytest.approx(0.0) and stats["approx_kl"] >= 0
    assert set(stats) >= {"approx_kl", "clipfrac", "entropy", "explained_variance", "pg_loss", "v_loss"}


def test_cosine_learning_rate():
    agent = PPO(Policy(4, [2], d_model=8, n_heads=2, hidden=8), PPOConfig(learning_rate=1e-3))
    assert agent.set_progress(0.0) == pytest.approx(1e-3)
    assert agent.set_progress(0.5) == pytest.approx(5e-4)
    assert agent.set_progress(1.0) == pytest.approx(0.0)


def test_tiny_budget_ppo_smoke_and_early_exit():
    ctx = make_ctx("llama-3.1-8b", 8, tpot_slo_s=0.05)
    space = SearchSpace.for_context(ctx, batch=(8, 64, 256))
    cfg = PPOPlannerConfig(budget=40, chunks=2, d_model=16, n_heads=2, hidden=16)
    result = run_planner(ctx, space, cfg, seed=0)
    assert result.calls == 40 and result.best_key is not None and result.metrics
    assert {"approx_kl", "clipfrac", "entropy", "explained_variance", "restart"} <= set(result.metrics[0])
    eager = run_planner(ctx, space, dataclasses.replace(cfg, tau=1e-6), seed=0)
    assert eager.metrics[-1]["restart"] > result.metrics[-1]["restart"]  # exits after every update
