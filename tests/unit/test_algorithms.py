"""algorithms.py against hand-computed tensors, and parity with TRL's GRPOTrainer formulas."""

from __future__ import annotations

import math

import pytest
import torch

from retool_cli.rl.algorithms import (
    ROLLOUT_CORRECTIONS,
    aggregate,
    degenerate_groups,
    group_advantages,
    kl_penalty,
    mismatch_sums,
    policy_loss,
    rollout_correction,
    shuffled_rewards,
    token_logprobs,
)

REWARDS = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])


def test_grpo_advantages_by_hand() -> None:
    adv = group_advantages(REWARDS, GROUPS, "grpo", eps=0.0)
    # group 0: mean -1/3, unbiased std sqrt(((4/3)^2 + 2*(2/3)^2)/2) = sqrt(4/3)
    std = math.sqrt(4 / 3)
    expected = torch.tensor([4 / 3 / std, -2 / 3 / std, -2 / 3 / std, -4 / 3 / std, 2 / 3 / std, 2 / 3 / std])
    assert torch.allclose(adv, expected)


def test_dr_grpo_and_rloo_by_hand() -> None:
    assert torch.allclose(
        group_advantages(REWARDS, GROUPS, "dr_grpo"), torch.tensor([4 / 3, -2 / 3, -2 / 3, -4 / 3, 2 / 3, 2 / 3])
    )
    # rloo: r_i - mean(others): 1 - (-1) = 2, -1 - 0 = -1, ...
    assert torch.allclose(group_advantages(REWARDS, GROUPS, "rloo"), torch.tensor([2.0, -1.0, -1.0, -2.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        group_advantages(REWARDS, GROUPS, "ppo")


def test_degenerate_groups_have_zero_advantage() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0])
    assert degenerate_groups(rewards, GROUPS).tolist() == [True, True, True, False, False, False]
    assert group_advantages(rewards, GROUPS, "grpo")[:3].abs().max() == 0


def test_void_samples_are_left_out_of_their_groups_statistics() -> None:
    """A void sample (its infrastructure failed: reward 0 as a stand-in) gets advantage 0 and its group's mean and
    std are those of the others, not pulled toward the fake zero; a group whose other samples all agree is
    degenerate; a group with no valid sample gets nothing."""
    rewards = torch.tensor([1.0, -1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    valid = torch.tensor([True, True, False, True, True, False, False, False])
    adv = group_advantages(rewards, groups, "grpo", valid=valid)
    # group 0 as if it were [1, -1]: mean 0, unbiased std sqrt(2); group 1 as [1, 1]: zero
    expected = torch.tensor([1 / (math.sqrt(2) + 1e-4), -1 / (math.sqrt(2) + 1e-4), 0, 0, 0, 0, 0, 0])
    assert torch.allclose(adv, expected)
    assert torch.equal(adv[:2], group_advantages(rewards[:2], groups[:2], "grpo"))
    assert degenerate_groups(rewards, groups, valid).tolist() == [False] * 3 + [True] * 5
    assert degenerate_groups(rewards, groups).tolist() == [False] * 6 + [True] * 2  # the fake zero varies group 1
    every = torch.ones(8, dtype=torch.bool)
    plain = group_advantages(rewards, groups, "rloo")
    assert torch.equal(group_advantages(rewards, groups, "rloo", valid=every), plain)


def test_policy_loss_clipping_by_hand() -> None:
    old = torch.zeros(2, 3)
    # ratios: e^0.5 ~ 1.65 (clipped above 1.28 for positive advantage), e^-0.5 ~ 0.61 (clipped below 0.8 for negative)
    logp = torch.tensor([[0.5, 0.0, 0.1], [-0.5, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="token_mean")
    # row 0 (A=+1): -min(1.65, 1.28) = -1.28 ; -1 ; (masked) ; row 1 (A=-1): max(0.61, 0.8) = 0.8 ; 1 ; 1
    expected = (-1.28 - 1.0 + 0.8 + 1.0 + 1.0) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats.clip_fraction == pytest.approx(2 / 5)


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    logp, old = torch.tensor([[3.0]]), torch.zeros(1, 1)  # ratio e^3 ~ 20
    adv, mask = torch.tensor([-1.0]), torch.ones(1, 1)
    plain, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="token_mean")
    dual, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="token_mean", dual_clip=3.0)
    assert plain.item() == pytest.approx(math.exp(3.0), rel=1e-5) and dual.item() == pytest.approx(3.0)


def test_aggregations_by_hand() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "seq_mean_token_sum_norm", max_tokens=5).item() == pytest.approx(10 / (2 * 5))
    assert aggregate(per_token, mask, "token_mean", loss_scale_tokens=8).item() == pytest.approx(10 / 8)


def test_tool_tokens_get_no_gradient() -> None:
    logp = torch.zeros(1, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # positions 1-2 are interpreter output
    loss, _ = policy_loss(
        logp, torch.zeros(1, 4), torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28, aggregation="token_mean"
    )
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 2] == 0 and logp.grad[0, 0] != 0


def test_kl_entropy_logprobs() -> None:
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([0.0, -0.5])
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([0.0, -0.5]))
    assert torch.allclose(kl_penalty(logp, ref, "k3"), torch.tensor([0.0, math.exp(0.5) - 1 - 0.5]))
    uniform = torch.zeros(1, 1, 4)
    picked, entropy = token_logprobs(uniform, torch.tensor([[2]]), entropy="metric")
    assert picked.item() == pytest.approx(-math.log(4)) and entropy.item() == pytest.approx(math.log(4))
    logits = torch.randn(2, 600, 7, requires_grad=True)  # more positions than one metric slice (256)
    targets = torch.randint(0, 7, (2, 600))
    _, with_grad = token_logprobs(logits, targets, 0.7, entropy="loss")
    _, sliced = token_logprobs(logits, targets, 0.7, entropy="metric")
    assert with_grad.requires_grad and not sliced.requires_grad and torch.allclose(with_grad, sliced)
    assert token_logprobs(logits, targets)[1] is None


# ------------------------------------------------------------------ TRL parity


def trl_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL GRPOTrainer (scale_rewards="group"): (r - group mean) / (group std + 1e-4)."""
    mean = rewards.view(-1, num_generations).mean(dim=1).repeat_interleave(num_generations)
    std = rewards.view(-1, num_generations).std(dim=1).repeat_interleave(num_generations)
    return (rewards - mean) / (std + 1e-4)


def trl_loss(logp, old, adv, mask, eps_low, eps_high, loss_type, max_completion_length):
    """TRL GRPOTrainer._compute_loss with beta = 0."""
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv.unsqueeze(1), coef_2 * adv.unsqueeze(1))
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)  # "dapo"


@pytest.mark.parametrize(
    ("trl_type", "ours"),
    [("dapo", "token_mean"), ("grpo", "seq_mean_token_mean"), ("dr_grpo", "seq_mean_token_sum_norm")],
)
def test_parity_with_trl(trl_type: str, ours: str) -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (16,), generator=gen).float()
    logp = torch.randn(16, 12, generator=gen) * 0.3
    old = logp + torch.randn(16, 12, generator=gen) * 0.2
    mask = (torch.rand(16, 12, generator=gen) > 0.3).float()
    groups = torch.arange(16) // 8
    adv = group_advantages(rewards, groups, "grpo")
    assert torch.allclose(adv, trl_advantages(rewards, 8), atol=1e-6)
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation=ours, max_tokens=12)
    assert loss.item() == pytest.approx(trl_loss(logp, old, adv, mask, 0.2, 0.28, trl_type, 12).item(), rel=1e-6)


def test_shuffled_rewards_is_a_seeded_permutation() -> None:
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.5, -1.0, 1.0, -1.0])
    shuffled = shuffled_rewards(rewards, seed=3)
    assert sorted(shuffled.tolist()) == sorted(rewards.tolist()) and not torch.equal(shuffled, rewards)
    assert torch.equal(shuffled_rewards(rewards, seed=3), shuffled)  # the same seed, the same permutation
    assert not torch.equal(shuffled_rewards(rewards, seed=4), shuffled)


# ------------------------------------------------------------------ rollout correction (sampler vs trainer)


def test_rollout_corrections_by_hand() -> None:
    """Token ratios 1, 3, 1/4 (and a tool token, mask 0, whose ratio would be 10): each mode's weights and the
    tokens it changes, computed by hand."""
    old = torch.log(torch.tensor([[1.0, 3.0, 0.25, 10.0]]))
    sampler = torch.zeros(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])

    def run(mode: str, **kw):
        weights, changed = rollout_correction(old, sampler, mask, mode, **kw)
        return [round(w, 5) for w in weights[0, :3].tolist()], changed[0].tolist()

    assert run("none") == ([1.0, 1.0, 1.0], [False, True, True, False])  # what token_mask would mask
    assert run("token_tis", cap=2.0) == ([1.0, 2.0, 0.25], [False, True, False, False])
    assert run("token_mask", bounds=(0.5, 2.0)) == ([1.0, 0.0, 0.0], [False, True, True, False])
    assert run("seq_tis", cap=2.0) == ([0.75] * 3, [False] * 4)  # 1 * 3 * 1/4
    assert run("seq_tis", cap=2.0)[0] == run("seq_tis", cap=1.0)[0]  # below the cap either way
    geometric = 0.75 ** (1 / 3)  # 0.909
    assert run("seq_mask", bounds=(0.9, 1.1)) == ([1.0] * 3, [False] * 4) and geometric > 0.9
    assert run("seq_mask", bounds=(0.95, 1.05)) == ([0.0] * 3, [True, True, True, False])
    with pytest.raises(ValueError, match="unknown rollout correction"):
        rollout_correction(old, sampler, mask, "tis")


def test_without_a_mismatch_every_correction_is_the_plain_loss_to_the_last_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = (torch.randn(6, 9, generator=gen) * 0.5).requires_grad_()
    old = logp.detach() + torch.randn(6, 9, generator=gen) * 0.1
    mask = (torch.rand(6, 9, generator=gen) > 0.2).float()
    adv = torch.randn(6, generator=gen)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean"}
    plain, _ = policy_loss(logp, old, adv, mask, **kw)
    (grad_plain,) = torch.autograd.grad(plain, logp)
    for mode in ROLLOUT_CORRECTIONS:
        weights, changed = rollout_correction(old, old.clone(), mask, mode, cap=1.5, bounds=(0.999, 1.001))
        assert torch.equal(weights, torch.ones_like(weights)) and not changed.any(), mode
        loss, _ = policy_loss(logp, old, adv, mask, weights=weights, **kw)
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.equal(loss, plain) and torch.equal(grad, grad_plain), mode


def test_stale_tokens_get_the_decoupled_ppo_loss() -> None:
    """Tokens sampled by older weight versions (the behaviour policy: each token's sampler log-prob, mixed
    versions in one sequence) against the trainer's weights before the update (the proximal policy, `old`):
    policy_loss with token_tis weights is decoupled PPO as AReaL writes it (Fu et al. 2025, arXiv 2505.24298;
    Hilton et al. 2022): per token -min(r A, clip(r) A) * min(pi_prox / pi_behav, cap), r = pi_theta / pi_prox;
    loss and gradient by hand."""
    gen = torch.Generator().manual_seed(3)
    logp = (torch.randn(4, 7, generator=gen) * 0.4 - 1).requires_grad_()
    prox = logp.detach() + torch.randn(4, 7, generator=gen) * 0.3
    behaviour = prox + torch.randn(4, 7, generator=gen) * 0.5  # versions older than the proximal one
    mask = (torch.rand(4, 7, generator=gen) > 0.25).float()
    adv = torch.randn(4, generator=gen)
    weights, _ = rollout_correction(prox, behaviour, mask, "token_tis", cap=2.0)
    loss, _ = policy_loss(
        logp, prox, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="token_mean", weights=weights
    )
    r = torch.exp(logp - prox)
    a = adv[:, None]
    surrogate = torch.minimum(r * a, r.clamp(0.8, 1.28) * a)
    importance = torch.exp(prox - behaviour).clamp(max=2.0)
    by_hand = -(surrogate * importance * mask).sum() / mask.sum()
    assert torch.allclose(loss, by_hand, atol=1e-6)
    (grad,) = torch.autograd.grad(loss, logp)
    (grad_by_hand,) = torch.autograd.grad(by_hand, logp)
    assert torch.allclose(grad, grad_by_hand, atol=1e-7) and grad.abs().sum() > 0


def trl_is_ratio(old, sampling, mask, mode, clip_min, clip_max):
    """TRL GRPOTrainer._generate_and_score_completions: the vLLM importance-sampling ratio (trl 1.16)."""
    per_token_logps_diff = (old - sampling) * mask
    if mode in ("sequence_mask", "sequence_truncate"):
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), value=0.0)


def verl_geometric_rejection(old, rollout, mask, low, high):
    """verl's rollout rejection sampling at the geometric level (rollout_rs=geometric): a sequence is kept
    when exp(mean over its tokens of log(pi_old / pi_rollout)) lies in [low, high]."""
    log_ratio = (old - rollout) * mask
    geometric = torch.exp(log_ratio.sum(-1) / mask.sum(-1).clamp(min=1))
    return ((geometric >= low) & (geometric <= high)).float()[:, None] * torch.ones_like(old)


@pytest.mark.parametrize(
    ("ours", "trl_mode"),
    [("token_tis", "token_truncate"), ("seq_tis", "sequence_truncate"), ("token_mask", "token_mask")],
)
def test_rollout_correction_parity_with_trl(ours: str, trl_mode: str) -> None:
    """The same weights as TRL's vLLM importance sampling (upper bound 2; masks: [0.5, 2]) and, multiplied into
    the clipped token losses as TRL does, the same DAPO loss."""
    gen = torch.Generator().manual_seed(2)
    logp = torch.randn(16, 12, generator=gen) * 0.3
    old = logp + torch.randn(16, 12, generator=gen) * 0.1
    sampler = old + torch.randn(16, 12, generator=gen) * (0.4 if "token" in ours else 0.3)
    mask = (torch.rand(16, 12, generator=gen) > 0.3).float()
    adv = group_advantages(torch.randint(0, 2, (16,), generator=gen).float(), torch.arange(16) // 8, "grpo")
    clip_min = 0.5 if ours == "token_mask" else None
    expected = trl_is_ratio(old, sampler, mask, trl_mode, clip_min, 2.0).expand(16, 12)
    weights, changed = rollout_correction(old, sampler, mask, ours, cap=2.0, bounds=(0.5, 2.0))
    assert torch.allclose(weights * mask, expected * mask, atol=1e-6) and changed.any()
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="token_mean", weights=weights)
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
    per_token = -torch.min(coef_1 * adv[:, None], coef_2 * adv[:, None]) * expected  # TRL, beta = 0
    assert loss.item() == pytest.approx(((per_token * mask).sum() / mask.sum()).item(), rel=1e-6)


def test_seq_mask_parity_with_verl_geometric_rejection() -> None:
    gen = torch.Generator().manual_seed(3)
    old = torch.randn(32, 20, generator=gen) * 0.3
    sampler = old + torch.randn(32, 20, generator=gen) * 0.02 + torch.randn(32, 1, generator=gen) * 0.01
    mask = (torch.rand(32, 20, generator=gen) > 0.3).float()
    weights, _ = rollout_correction(old, sampler, mask, "seq_mask", bounds=(0.995, 1.005))
    expected = verl_geometric_rejection(old, sampler, mask, 0.995, 1.005)
    assert torch.equal(weights, expected) and 0 < expected[:, 0].sum() < 32  # some kept, some masked


def test_mismatch_sums_by_hand() -> None:
    """Ratios trainer / sampler of 1, e and 1/2 on the model tokens (a tool token left out)."""
    sampler = torch.zeros(1, 4)
    old = torch.tensor([[0.0, 1.0, math.log(0.5), 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    corrected = torch.tensor([[False, True, False, True]])
    sums = mismatch_sums(old, sampler, mask, corrected)
    assert sums["tokens"] == 3 and sums["corrected"] == 1
    assert sums["abs_logprob_diff"] == pytest.approx(1 + math.log(2))
    assert sums["kl_k3"] == pytest.approx((math.e - 1 - 1) + (0.5 - 1 - math.log(0.5)))
    assert sums["max_ratio"] == pytest.approx(math.e) and sums["min_ratio"] == pytest.approx(0.5)
