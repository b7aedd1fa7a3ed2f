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
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """PPO clipped surrogate with separate low/high clip bounds (DAPO's clip-higher) and optional dual
    clip for negative advantages. logp, old_logp, mask: (N, T); advantages: (N,) or (N, T).

    aggregation: token_mean (sum over the batch's model tokens / their count; DAPO), seq_mean_token_mean
    (per-sequence mean, then mean; GRPO), seq_mean_token_sum_norm (token sum / (N * max_tokens); Dr.GRPO).
    `loss_scale_tokens` replaces the token count of token_mean when a mini-batch is split into micro-batches
    (so gradients equal those of the whole mini-batch). `weights` (N, T): the rollout correction's
    (`rollout_correction`), multiplying each token's clipped loss, as TRL and verl apply theirs.
    """
    mask = mask.to(logp.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (N, 1) or (N, T)
    ratio = torch.exp(logp - old_logp)  # (N, T)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:  # bound the loss of very large ratios on negative advantages
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    if weights is not None:
        per_token = per_token * weights
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


# ------------------------------------------------------------------ the sampler is not the trainer
#
# Three policies: the sampler (the engine's logprobs, recorded with each trajectory), the trainer's policy
# before the update ("old": recomputed by the trainer) and the current one (whose gradient is taken). The PPO
# ratio compares current with old; the rollout correction weighs each token's loss by how the old policy
# differs from the sampler, which drew the token: rho = pi_old / pi_sampler (vLLM's bf16 kernels, batch
# composition and fused ops make it differ from 1 even with the same weights).

ROLLOUT_CORRECTIONS = ("none", "token_tis", "seq_tis", "token_mask", "seq_mask")


def rollout_correction(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float = 2.0,
    bounds: tuple[float, float] = (0.5, 2.0),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss weights (N, T) correcting for the sampler, and (N, T) bool: the model tokens the
    correction changes (truncated or masked; with `none`, those a token_mask would mask). No gradient.

    none: 1. token_tis: min(rho_t, cap), truncated importance sampling per token (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"; verl rollout_is=token, threshold 2;
    TRL token_truncate). seq_tis: min(prod_t rho_t, cap) on every token of the sequence (verl
    rollout_is=sequence; TRL sequence_truncate). token_mask: rho_t where lo <= rho_t <= hi, else 0 (masked
    importance sampling: TRL token_mask; Liu et al. 2025, "When speed kills stability"). seq_mask: a
    sequence whose geometric-mean ratio exp(mean_t log rho_t) lies outside [lo, hi] gets 0, the others 1
    (verl rollout_rs=geometric; length-independent, unlike the product). Masked tokens keep their place in the
    loss's normaliser, as in TRL. With sampler == old policy every weight is exactly 1."""
    with torch.no_grad():
        mask = mask.to(old_logp.dtype)
        log_rho = (old_logp - sampler_logp) * mask  # (N, T), 0 off the model's tokens
        rho = torch.exp(log_rho)
        low, high = bounds
        model_tokens = mask > 0
        if mode == "none":
            return torch.ones_like(rho), ((rho < low) | (rho > high)) & model_tokens
        if mode == "token_tis":
            return rho.clamp(max=cap), (rho > cap) & model_tokens
        if mode == "token_mask":
            inside = (rho >= low) & (rho <= high)
            return torch.where(inside, rho, torch.zeros_like(rho)), ~inside & model_tokens
        if mode == "seq_tis":
            seq_rho = torch.exp(log_rho.sum(-1, keepdim=True))  # (N, 1)
            return seq_rho.clamp(max=cap).expand_as(rho).clone(), (seq_rho > cap) & model_tokens
        if mode == "seq_mask":
            geometric = torch.exp(log_rho.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1))  # (N, 1)
            inside = (geometric >= low) & (geometric <= high)
            return inside.to(rho.dtype).expand_as(rho).clone(), ~inside & model_tokens
        raise ValueError(f"unknown rollout correction {mode!r} ({', '.join(ROLLOUT_CORRECTIONS)})")


def mismatch_sums(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, corrected: torch.Tensor
) -> dict[str, float]:
    """Sums over the model tokens of (N, T) tensors, so that micro-batches and processes add up (the step divides
    by `tokens`): |old - sampler|, the k3 estimate of KL(sampler || trainer) (tokens were drawn from the sampler:
    rho - 1 - log rho, with rho = pi_trainer / pi_sampler), the tokens the correction changed; and the largest
    and smallest token ratio."""
    with torch.no_grad():
        keep = mask > 0
        log_rho = (old_logp - sampler_logp)[keep].double()  # float64: rho - 1 - log rho of a 1e-7 gap is not < 0
        rho = torch.exp(log_rho)
        return {
            "tokens": float(keep.sum()),
            "abs_logprob_diff": float(log_rho.abs().sum()),
            "kl_k3": float((rho - 1 - log_rho).sum()),
            "corrected": float((corrected & keep).sum()),
            "max_ratio": float(rho.max()) if rho.numel() else 1.0,
            "min_ratio": float(rho.min()) if rho.numel() else 1.0,
        }
