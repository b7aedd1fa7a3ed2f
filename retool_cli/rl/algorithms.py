"""Advantages and policy losses of the GRPO / DAPO family: pure tensor functions.

Shapes: N trajectories, T response tokens (padded); `mask` (N, T) is 1 on tokens the model sampled
and 0 on prompt padding and tool output, so interpreter text never receives gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    estimator: str,
    eps: float = 1e-4,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-trajectory advantages (N,) from rewards (N,) compared within their group (same question).

    grpo: (r - group mean) / (group std + eps), std unbiased as in TRL; dr_grpo: r - group mean
    (no std scaling, Liu et al. 2025); rloo: r - mean of the *other* samples of the group.
    `valid` (N,) bool: False marks a void sample (the infrastructure failed it: a dead sandbox worker, a dropped
    request, a judge time-out); it gets 0 and its group's statistics are those of the others, as if it had not
    been drawn, instead of a fake zero reward biasing them (open-instruct measured the bias in GRPO groups).
    """
    advantages = torch.zeros_like(rewards)
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
    for group in torch.unique(group_ids):
        members = (group_ids == group) & valid
        if not members.any():
            continue
        r = rewards[members]
        centred = r - r.mean()
        if estimator == "grpo":
            std = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
            advantages[members] = centred / (std + eps)
        elif estimator == "dr_grpo":
            advantages[members] = centred
        elif estimator == "rloo":
            n = r.numel()
            advantages[members] = centred * n / (n - 1) if n > 1 else torch.zeros_like(r)
        else:
            raise ValueError(f"unknown advantage estimator {estimator!r} (grpo, dr_grpo, rloo)")
    return advantages


def shuffled_rewards(rewards: torch.Tensor, seed: int) -> torch.Tensor:
    """The shuffled-reward control (`reward.control=shuffled`): the batch's rewards (N,) permuted with a seeded
    generator. The reward distribution, hence the advantages' scale and the share of all-equal groups in
    expectation, is kept; which trajectory earns which reward no longer depends on correctness. A policy that
    improves under it learns from something other than the reward (a placebo for "RL teaches the task")."""
    generator = torch.Generator().manual_seed(seed)
    return rewards[torch.randperm(len(rewards), generator=generator)]


def degenerate_groups(
    rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """(N,) True where the trajectory's group has identical rewards among its valid samples (all of them when
    `valid` is None; a group with none is degenerate): zero advantage, no gradient (DAPO's dynamic sampling
    drops these groups and samples more)."""
    out = torch.zeros_like(rewards, dtype=torch.bool)
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
    for group in torch.unique(group_ids):
        members = group_ids == group
        r = rewards[members & valid]
        out[members] = bool((r == r[0]).all()) if r.numel() else True
    return out


@dataclass
class LossStats:
    clip_fraction: float  # share of model tokens whose ratio was clipped
    approx_kl: float  # mean of (ratio - 1) - log ratio over model tokens (k3 estimate of KL(old || new))
    ratio_mean: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    dual_clip: float | None = None,
    max_tokens: int | None = None,
    loss_scale_tokens: float | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """PPO clipped surrogate with separate low/high clip bounds (DAPO's clip-higher) and optional dual
    clip for negative advantages. logp, old_logp, mask: (N, T); advantages: (N,) or (N, T).

    aggregation: token_mean (sum over the batch's model tokens / their count; DAPO), seq_mean_token_mean
    (per-sequence mean, then mean; GRPO), seq_mean_token_sum_norm (token sum / (N * max_tokens); Dr.GRPO).
    `loss_scale_tokens` replaces the token count of token_mean when a mini-batch is split into micro-batches
    (so gradients equal those of the whole mini-batch).
    """
    mask = mask.to(logp.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (N, 1) or (N, T)
    ratio = torch.exp(logp - old_logp)  # (N, T)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:  # bound the loss of very large ratios on negative advantages
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    loss = aggregate(per_token, mask, aggregation, max_tokens, loss_scale_tokens)
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1)
        was_clipped = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).to(mask.dtype)
        log_ratio = logp - old_logp
        stats = LossStats(
            clip_fraction=float((was_clipped * mask).sum() / tokens),
            approx_kl=float((((ratio - 1) - log_ratio) * mask).sum() / tokens),
            ratio_mean=float((ratio * mask).sum() / tokens),
        )
    return loss, stats


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str,
    max_tokens: int | None = None,
    loss_scale_tokens: float | None = None,
) -> torch.Tensor:
    if aggregation == "token_mean":
        return (per_token * mask).sum() / (loss_scale_tokens or mask.sum().clamp(min=1))
    if aggregation == "seq_mean_token_mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if aggregation == "seq_mean_token_sum_norm":
        return (per_token * mask).sum() / (per_token.shape[0] * (max_tokens or per_token.shape[1]))
    raise ValueError(f"unknown loss aggregation {aggregation!r}")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(new || ref) estimates: k1 = log r, k3 = exp(-log r) - 1 + log r (always >= 0)."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(f"unknown KL estimator {kind!r} (k1, k3)")


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, entropy: str = "off"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) per position, from logits (N, T, V) predicting targets (N, T); and, from the same
    log-softmax, the policy's entropy per position (N, T): `entropy` = off (None) | loss (with gradient, for a
    bonus) | metric (no gradient, in slices of positions, so no second (N, T, V) tensor is made)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, T, V)
    picked = logp.gather(-1, targets[..., None])[..., 0]
    if entropy == "loss":
        return picked, -(logp.exp() * logp).sum(-1)
    if entropy == "metric":
        with torch.no_grad():
            return picked, torch.cat([-(part.exp() * part).sum(-1) for part in logp.split(256, dim=1)], dim=1)
    return picked, None
