"""The policy update of one RL step, in three stages with typed values between them:

    rollout batch (rl/step.py: trajectories, rewards) --prepare--> PreparedBatch (per kept sample: advantage,
      loss mask, and every log-prob the loss reads: the sampler's, the old policy's, the reference's)
    --optimize--> UpdateStats (epochs x mini-batches x token-budget micro-batches of policy_loss; optimizer steps)
    --report--> the step's train/* metrics

A loss that needs another policy's log-probs (a behaviour policy of another weight version) is one more field
of `Samples`, filled in `prepare`; nothing else changes.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from retool_cli.config import LossAgg
from retool_cli.rl import packing
from retool_cli.rl.algorithms import (
    degenerate_groups,
    group_advantages,
    kl_penalty,
    mismatch_sums,
    policy_loss,
    rollout_correction,
)
from retool_cli.rl.batch import Batch
from retool_cli.rl.distributed import (
    all_reduce_gradients,
    all_reduce_max,
    all_reduce_sum,
    equal_count,
    grad_norm,
    is_sharded,
    world,
)
from retool_cli.rl.logprobs import micro_batch_indices, response_mask_matrix, rl_positions, sequence_logprobs
from retool_cli.rl.step import StepPlan, group_ids, valid_samples
from retool_cli.rollout.agent import Trajectory


@dataclass(frozen=True)
class Forward:
    """How the trainer's forward passes run, for every model they run on (the policy, the reference)."""

    pad_id: int  # the tokenizer's: right padding of a micro-batch
    device: torch.device  # the policy's
    token_budget: int  # trainer.micro_batch_tokens: (longest sequence) x (sequences) of one micro-batch
    bf16_autocast: bool  # matmuls in bfloat16 over fp32 weights
    shared_prefix: bool  # model.accelerate: each GRPO prompt computed once
    temperature: float  # the sampler's (StepPlan.temperature)
    pack: bool = False  # trainer.pack_sequences: each micro-batch one packed row, no padding (rl/packing.py)

    @classmethod
    def of(cls, plan: StepPlan, model: torch.nn.Module, pad_id: int) -> Forward:
        device = next(model.parameters()).device
        t = plan.trainer
        return cls(
            pad_id,
            device,
            t.micro_batch_tokens,
            plan.bf16_autocast,
            plan.shared_prefix,
            plan.temperature,
            t.pack_sequences,
        )

    def micro_batches(self, trajectories: list[Trajectory], model: torch.nn.Module) -> list[list[int]]:
        """Indices of the trajectories in each micro-batch (under FSDP2, as many on every process)."""
        sequences = [x.token_ids for x in trajectories]
        prompt_lens = [len(x.prompt_ids) for x in trajectories]
        groups = micro_batch_indices(sequences, prompt_lens, self.token_budget, self.pack, self.shared_prefix)
        return _equalized(groups, model)


@dataclass(frozen=True)
class Samples:
    """The samples the loss trains on, one entry per sample in every field. Log-probs are (len - 1,) per
    sample, position t predicting token t + 1 (only response positions are read)."""

    trajectories: list[Trajectory]
    advantages: torch.Tensor  # (N,)
    masks: list[list[int]]  # per response token: 1 = the loss counts it
    sampler_logprobs: list[torch.Tensor]  # the engine's, as it sampled (the mismatch correction's)
    old_logprobs: list[torch.Tensor] | None  # the policy's before this update; None: on-policy (the current, detached)
    ref_logprobs: list[torch.Tensor] | None  # the reference model's (trainer.kl_coef > 0)

    def __len__(self) -> int:
        return len(self.trajectories)

    def index(self, indices: list[int]) -> Samples:
        """Samples at `indices`, in that order."""
        return Samples(
            [self.trajectories[i] for i in indices],
            self.advantages[torch.as_tensor(indices, dtype=torch.long)],
            [self.masks[i] for i in indices],
            [self.sampler_logprobs[i] for i in indices],
            None if self.old_logprobs is None else [self.old_logprobs[i] for i in indices],
            None if self.ref_logprobs is None else [self.ref_logprobs[i] for i in indices],
        )


@dataclass(frozen=True)
class PreparedBatch:
    """What the optimizer loop reads (`samples`: the batch less the dropped degenerate groups) and what the
    step reports of the whole batch."""

    samples: Samples
    advantages: torch.Tensor  # (N,) every sample's
    degenerate: torch.Tensor  # (N,) bool: in a group whose rewards are all equal
    valid: torch.Tensor  # (N,) bool: not void (its infrastructure did not fail it)
    void_turns: list[bool]  # (N,) a turn without a tool call or an answer (SimpleTIR)


@dataclass
class UpdateStats:
    """What the optimizer loop measured on this process."""

    losses: list[float] = field(default_factory=list)  # per optimizer step: its mini-batch's loss
    grad_norms: list[float] = field(default_factory=list)  # per optimizer step
    clip_fractions: list[float] = field(default_factory=list)  # per micro-batch
    approx_kls: list[float] = field(default_factory=list)  # per micro-batch
    kl_refs: list[float] = field(default_factory=list)  # per micro-batch, with a reference model
    entropy_sum: float = 0.0  # over this process's model tokens
    entropy_tokens: float = 0.0
    mismatch: dict[str, float] = field(default_factory=dict)  # sums over the model tokens (the first epoch's)
    positions: int = 0  # positions the loss passes computed (padding included), forward and backward
    real_tokens: int = 0  # of those, real tokens
    seconds: float = 0.0  # the optimizer loop's wall time


def update(
    plan: StepPlan,
    model: torch.nn.Module,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    pad_id: int,
    ref_model: torch.nn.Module | None = None,
) -> dict[str, float]:
    """Policy-gradient updates on one rollout batch (rl/step.py: rollout_batch); the step's train/* metrics."""
    forward = Forward.of(plan, model, pad_id)
    prepared = prepare(plan, forward, model, batch, ref_model)
    stats = optimize(plan, forward, model, prepared.samples, optimizer)
    lr = float(scheduler.get_last_lr()[0])  # the rate this step trained with (the scheduler then moves to the next)
    with warnings.catch_warnings():
        if not stats.losses:  # nothing trained (every token masked): the schedule still advances, on purpose
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()
    return report(prepared, stats, lr)


def prepare(
    plan: StepPlan, forward: Forward, model: torch.nn.Module, batch: Batch, ref_model: torch.nn.Module | None
) -> PreparedBatch:
    """Advantages, loss masks and the log-probs the loss reads; the degenerate groups dropped with dynamic
    sampling."""
    t = plan.trainer
    trajectories, rewards = batch.objects["trajectory"], batch.tensors["reward"]
    groups, valid = group_ids(trajectories), valid_samples(trajectories)
    advantages = group_advantages(rewards, groups, t.advantage, valid=valid)  # (N,)
    degenerate = degenerate_groups(rewards, groups, valid)  # (N,)
    # no gradient from a void sample (its infrastructure failed), with mask_truncated from a truncated one, with
    # filter_void_turns from one with a void turn (SimpleTIR)
    void_turns = [x.void_turns > 0 for x in trajectories]
    masks = [
        [0] * len(x.response_mask)
        if x.infra or (t.mask_truncated and x.truncated) or (t.filter_void_turns and void)
        else x.response_mask
        for x, void in zip(trajectories, void_turns, strict=True)
    ]
    # The sampling logprobs are the engine's; the trainer recomputes them so that ratios compare like with like.
    # One pass over the batch is on-policy: the ratio is exactly 1, so the current logprobs (detached) serve
    # as the old ones and the extra forward pass is skipped (as TRL does with num_iterations=1).
    on_policy = t.epochs_per_batch == 1 and t.mini_batches == 1
    samples = Samples(
        trajectories,
        advantages,
        masks,
        [_sampler_logprobs(x) for x in trajectories],
        None if on_policy else all_logprobs(model, trajectories, forward),
        None if ref_model is None else all_logprobs(ref_model, trajectories, forward),
    )
    kept = [i for i in range(len(samples)) if not (t.dynamic_sampling and degenerate[i])]
    return PreparedBatch(samples.index(kept), advantages, degenerate, valid, void_turns)


def optimize(
    plan: StepPlan, forward: Forward, model: torch.nn.Module, samples: Samples, optimizer: torch.optim.Optimizer
) -> UpdateStats:
    """trainer.epochs_per_batch passes over trainer.mini_batches mini-batches, one optimizer step each, each
    accumulated over token-budget micro-batches."""
    t = plan.trainer
    stats = UpdateStats()
    started = time.perf_counter()
    minis = _split(samples, t.mini_batches)
    if forward.pack and world()[1] > 1:  # each process about the same real tokens of every mini-batch
        minis = [_balanced(mini, forward.shared_prefix) for mini in minis]
    for epoch in range(t.epochs_per_batch):
        for mini in minis:
            # With several processes each holds its share of the batch: the loss is normalised by the tokens
            # and sequences of all of them, and gradients are summed, so N processes match one.
            tokens = all_reduce_sum(sum(sum(mask) for mask in mini.masks))
            mini_size = all_reduce_sum(len(mini))
            if tokens == 0:
                continue
            total = 0.0
            for group in forward.micro_batches(mini.trajectories, model):
                if not group:  # FSDP2: an empty pass keeps this process in step with the others' collectives
                    empty = [[forward.pad_id] * 2]
                    logp, _, _ = sequence_logprobs(
                        model, empty, forward.pad_id, forward.device, bf16_autocast=forward.bf16_autocast
                    )
                    (logp.sum() * 0.0).backward()
                    continue
                micro = mini.index(group)
                computed, real = rl_positions(
                    model,
                    [x.token_ids for x in micro.trajectories],
                    [len(x.prompt_ids) for x in micro.trajectories],
                    forward.shared_prefix,
                    forward.pack,
                )
                stats.positions += computed
                stats.real_tokens += real
                loss, loss_stats, sums = _micro_loss(plan, forward, model, micro, tokens, mini_size)
                if epoch == 0:
                    _add_mismatch(stats.mismatch, sums.pop("mismatch"))
                loss.backward()
                total += float(loss.detach())
                stats.clip_fractions.append(loss_stats.clip_fraction)
                stats.approx_kls.append(loss_stats.approx_kl)
                stats.entropy_sum += sums["entropy_sum"]
                stats.entropy_tokens += sums["entropy_tokens"]
                if "kl_ref" in sums:
                    stats.kl_refs.append(sums["kl_ref"])
            all_reduce_gradients(model)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            stats.grad_norms.append(grad_norm(norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats.losses.append(all_reduce_sum(total))  # every process's share of the mini-batch's loss
    stats.seconds = time.perf_counter() - started
    return stats


def report(prepared: PreparedBatch, stats: UpdateStats, lr: float) -> dict[str, float]:
    """The step's train/* metrics: the loop's means (over optimizer steps or micro-batches), the entropy and the
    sampler-trainer gap over every process's model tokens, and what the batch was made of."""
    out = {
        "train/loss": _mean(stats.losses),
        "train/clip_fraction": _mean(stats.clip_fractions),
        "train/approx_kl": _mean(stats.approx_kls),
        "train/grad_norm": _mean(stats.grad_norms),
    }
    if stats.kl_refs:
        out["train/kl_ref"] = _mean(stats.kl_refs)
    entropy_tokens = all_reduce_sum(stats.entropy_tokens)
    out["train/entropy"] = all_reduce_sum(stats.entropy_sum) / entropy_tokens if entropy_tokens else 0.0
    out["train/optimizer_steps"] = float(len(stats.losses))  # 0 when every token was masked (all truncated)
    out["train/degenerate_group_rate"] = float(prepared.degenerate.float().mean())
    out["train/void_rate"] = float((~prepared.valid).float().mean())  # left out of the loss: infrastructure failures
    void_turns = prepared.void_turns
    out["train/void_turn_filtered"] = sum(void_turns) / max(1, len(void_turns))  # masked if filter_void_turns
    out.update(_mismatch_metrics(stats.mismatch))
    out["train/advantage_abs"] = float(prepared.advantages.abs().mean())
    out["train/lr"] = lr
    # what padding costs: the share of computed positions that were padding; real tokens per second of the loop
    out["train/padding_share"] = 1 - stats.real_tokens / stats.positions if stats.positions else 0.0
    out["time/train_tokens_per_s"] = stats.real_tokens / stats.seconds if stats.seconds > 0 else 0.0
    processes = world()[1]
    if processes > 1:  # the busiest process's real tokens over the mean (1 = balanced; see pack_sequences)
        total, most = all_reduce_sum(stats.real_tokens), all_reduce_max(stats.real_tokens)
        out["train/token_imbalance"] = most * processes / total if total else 1.0
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _micro_loss(
    plan: StepPlan, forward: Forward, model: torch.nn.Module, micro: Samples, tokens: float, mini_size: float
) -> tuple[torch.Tensor, Any, dict[str, Any]]:
    """The loss of one micro-batch, scaled so that the micro-batches (and processes) of a mini-batch add up to
    its loss; its policy-loss statistics; sums for the step's metrics (entropy over the model's tokens, and
    the KL-to-reference term when there is one)."""
    t = plan.trainer
    device = forward.device
    prompt_lens = [len(x.prompt_ids) for x in micro.trajectories]
    logp, _, entropy = sequence_logprobs(
        model,
        [x.token_ids for x in micro.trajectories],
        forward.pad_id,
        device,
        temperature=forward.temperature,
        bf16_autocast=forward.bf16_autocast,
        entropy="loss" if t.entropy_coef > 0 else "metric",
        prompt_lens=prompt_lens,
        shared_prefix=forward.shared_prefix,
        pack=forward.pack,
    )  # (B, L-1)
    width = logp.shape[1]
    mask = response_mask_matrix(prompt_lens, micro.masks, width, device)
    old_logp = logp.detach() if micro.old_logprobs is None else _stack(micro.old_logprobs, width, device)
    sampler_logp = _stack(micro.sampler_logprobs, width, device)
    bounds = (t.rollout_correction_bounds[0], t.rollout_correction_bounds[1])
    weights, corrected = rollout_correction(
        old_logp, sampler_logp, mask, t.rollout_correction.value, t.rollout_correction_cap, bounds
    )
    loss, loss_stats = policy_loss(
        logp,
        old_logp,
        micro.advantages.to(device),
        mask,
        clip_low=t.clip_low,
        clip_high=t.clip_high,
        aggregation=t.loss_agg,
        dual_clip=t.dual_clip,
        max_tokens=plan.rollout.max_response_tokens,
        loss_scale_tokens=float(tokens),
        weights=None if t.rollout_correction.value == "none" else weights,
    )
    if t.loss_agg is not LossAgg.token_mean:  # per-sequence means: weight micro-batches by their share
        loss = loss * len(micro) / mini_size
    assert entropy is not None  # asked for above ("loss" or "metric")
    entropy_sum = (entropy * mask).sum()
    sums: dict[str, Any] = {"entropy_sum": float(entropy_sum.detach()), "entropy_tokens": float(mask.sum())}
    sums["mismatch"] = mismatch_sums(old_logp, sampler_logp, mask, corrected)
    if t.entropy_coef > 0:  # a bonus on the token-mean entropy of the model's tokens
        loss = loss - t.entropy_coef * entropy_sum / tokens
    if micro.ref_logprobs is not None and t.kl_coef > 0:
        kl = kl_penalty(logp, _stack(micro.ref_logprobs, width, device), t.kl_estimator)
        kl_term = (kl * mask).sum() / tokens
        loss = loss + t.kl_coef * kl_term
        sums["kl_ref"] = float(kl_term.detach())
    return loss, loss_stats, sums


@torch.no_grad()
def all_logprobs(model: torch.nn.Module, trajectories: list[Trajectory], forward: Forward) -> list[torch.Tensor]:
    """Next-token logprobs of each trajectory (len - 1,), computed in token-budget micro-batches; only the
    positions predicting response tokens are meaningful (the prompt's are 0 when prompts are shared)."""
    sequences = [x.token_ids for x in trajectories]
    out: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    for group in forward.micro_batches(trajectories, model):
        pad = forward.pad_id
        chosen = [sequences[i] for i in group] or [[pad, pad]]  # empty: an FSDP2 pass to keep in step
        lens = [len(trajectories[i].prompt_ids) for i in group] or [1]
        logp, _, _ = sequence_logprobs(
            model,
            chosen,
            pad,
            forward.device,
            temperature=forward.temperature,
            bf16_autocast=forward.bf16_autocast,
            prompt_lens=lens,
            shared_prefix=forward.shared_prefix,
            pack=forward.pack,
        )
        for row, i in enumerate(group):
            out[i] = logp[row, : len(sequences[i]) - 1]
    return out


def _sampler_logprobs(x: Trajectory) -> torch.Tensor:
    """The engine's logprobs of a trajectory's response tokens (len - 1,), aligned with the trainer's (position
    t predicts token t + 1); 0 on the prompt and tool tokens, which the mask leaves out."""
    out = torch.zeros(len(x.token_ids) - 1)
    start = len(x.prompt_ids) - 1
    sampled = torch.tensor(x.response_logprobs[: len(x.response_ids)], dtype=torch.float32)
    out[start : start + len(sampled)] = sampled
    return out


def _add_mismatch(total: dict[str, float], part: dict[str, float]) -> None:
    for key, value in part.items():
        if key == "max_ratio":
            total[key] = max(total.get(key, value), value)
        elif key == "min_ratio":
            total[key] = min(total.get(key, value), value)
        else:
            total[key] = total.get(key, 0.0) + value


def _mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The sampler-trainer gap over every process's model tokens: the mean |log-prob difference|, the k3 KL
    estimate, the extreme token ratios and the share of tokens the correction truncated or masked."""
    tokens = all_reduce_sum(sums.get("tokens", 0.0))
    per_token = {k: all_reduce_sum(sums.get(k, 0.0)) / max(tokens, 1.0) for k in ("abs_logprob_diff", "kl_k3")}
    return {
        "train/mismatch_abs_logprob_diff": per_token["abs_logprob_diff"],
        "train/mismatch_kl_k3": per_token["kl_k3"],
        "train/mismatch_max_ratio": all_reduce_max(sums.get("max_ratio", 1.0)),
        "train/mismatch_min_ratio": -all_reduce_max(-sums.get("min_ratio", 1.0)),
        "train/mismatch_outside_share": all_reduce_sum(sums.get("corrected", 0.0)) / max(tokens, 1.0),
    }


def _stack(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), device=device)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[:width]
    return out


def _split(samples: Samples, parts: int) -> list[Samples]:
    """Exactly `parts` contiguous, nearly equal mini-batches (some may be empty): every process runs as many
    mini-batches as the others, whatever its share of the samples."""
    bounds = [len(samples) * k // parts for k in range(parts + 1)]
    return [samples.index(list(range(bounds[k], bounds[k + 1]))) for k in range(parts)]


def _balanced(mini: Samples, shared_prefix: bool) -> Samples:
    """This process's share of the mini-batch that all processes hold together, re-dealt so that each gets about
    the same tokens (packing.balanced_ranks; whole GRPO groups when prompts are shared). The loss is normalised
    by global counts and gradients are summed, so who trains on which sample changes nothing but the wait."""
    rank, size = world()

    def on_cpu(rows: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
        return None if rows is None else [row.cpu() for row in rows]

    mine = Samples(
        mini.trajectories,
        mini.advantages.cpu(),
        mini.masks,
        mini.sampler_logprobs,
        on_cpu(mini.old_logprobs),
        on_cpu(mini.ref_logprobs),
    )
    shares: list[Any] = [None] * size
    torch.distributed.all_gather_object(shares, mine)  # in rank order: the same list on every process

    def joined(name: str) -> Any:
        return None if getattr(mine, name) is None else [row for share in shares for row in getattr(share, name)]

    together = Samples(
        joined("trajectories"),
        torch.cat([share.advantages for share in shares]),
        joined("masks"),
        joined("sampler_logprobs"),
        joined("old_logprobs"),
        joined("ref_logprobs"),
    )
    first: dict[Any, int] = {}
    groups = [
        first.setdefault((x.example.id, tuple(x.prompt_ids)) if shared_prefix else i, len(first))
        for i, x in enumerate(together.trajectories)
    ]
    ranks = packing.balanced_ranks([len(x.token_ids) for x in together.trajectories], groups, size)
    return together.index([i for i, r in enumerate(ranks) if r == rank])


def _equalized(groups: list[list[int]], model: torch.nn.Module) -> list[list[int]]:
    """Under FSDP2 every process runs as many forward/backward passes as the busiest one: pad with empty ones."""
    if not is_sharded(model):
        return groups
    return groups + [[] for _ in range(equal_count(len(groups)) - len(groups))]
