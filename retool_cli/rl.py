"""One RL step: rollouts with the interpreter -> rewards -> group advantages -> clipped policy updates.

take_batch(cursor) --run_rollouts--> trajectories (token ids as sampled, tool tokens masked)
  --score_batch--> rewards --group_advantages--> (N,) --old logprobs (no grad)-->
  epochs x mini-batches x token-budget micro-batches of policy_loss --> optimizer steps
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from retool_cli.algorithms import degenerate_groups, group_advantages, kl_penalty, policy_loss
from retool_cli.config import RetoolConfig
from retool_cli.data import MathExample, take_batch
from retool_cli.distributed import (
    all_reduce_gradients,
    all_reduce_sum,
    equal_count,
    grad_norm,
    is_sharded,
    world,
)
from retool_cli.reward import Verifier, reward_metrics, score_batch
from retool_cli.rollout.agent import Trajectory, run_rollouts
from retool_cli.trainer import micro_batches, response_mask_matrix, sequence_logprobs


def collect(cfg: RetoolConfig, examples: list[MathExample], cursor: int, step: int, engine: Any, protocol: Any,
            sandbox: Any, verifier: Verifier) -> tuple[list[Trajectory], torch.Tensor, list, dict, int]:  # fmt: skip
    """Rollouts and rewards for one step. With dynamic sampling, groups whose rewards are all equal are
    dropped and more questions are sampled (up to trainer.max_sampling_rounds batches)."""
    t = cfg.trainer
    trajectories, scores, rollout_metrics = [], [], {}
    rounds = t.max_sampling_rounds if t.dynamic_sampling else 1
    rank, size = world()
    for round_index in range(rounds):
        batch = take_batch(examples, cursor, t.questions_per_step)[
            rank::size
        ]  # each process its share of questions
        cursor += t.questions_per_step
        seed = cfg.seed * 1_000_003 + step * 16 + round_index + rank * 7919
        got, rollout_metrics = run_rollouts(batch, engine, protocol, sandbox, cfg.rollout, seed=seed,
                                            max_context_tokens=cfg.model.max_context_tokens)  # fmt: skip
        got_scores = score_batch([(x.final_text, x.example.answer, x.truncated, len(x.response_ids)) for x in got],
                                 cfg.reward, verifier)  # fmt: skip
        trajectories += got
        scores += got_scores
        if not t.dynamic_sampling:
            break
        rewards = torch.tensor([s.reward for s in scores])
        keep = ~degenerate_groups(rewards, group_ids(trajectories))
        if all_reduce_sum(int(keep.sum())) // cfg.rollout.group_size >= t.questions_per_step:
            break
    rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    return trajectories, rewards, scores, rollout_metrics, cursor


def group_ids(trajectories: list[Trajectory]) -> torch.Tensor:
    """(N,) the index of each trajectory's question, in first-seen order."""
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(x.example.id, len(index)) for x in trajectories])


def update(cfg: RetoolConfig, model: Any, trajectories: list[Trajectory], rewards: torch.Tensor, optimizer: Any,
           scheduler: Any, pad_id: int, ref_model: Any = None) -> dict[str, float]:  # fmt: skip
    """Policy-gradient updates on one rollout batch; returns loss statistics."""
    t = cfg.trainer
    device = next(model.parameters()).device
    groups = group_ids(trajectories)
    advantages = group_advantages(rewards, groups, t.advantage.value)  # (N,)
    degenerate = degenerate_groups(rewards, groups)
    keep = [i for i in range(len(trajectories)) if not (t.dynamic_sampling and degenerate[i])]
    masks = [
        [0] * len(x.response_mask) if (t.mask_truncated and x.truncated) else x.response_mask
        for x in trajectories
    ]
    sequences = [x.token_ids for x in trajectories]
    prompt_lens = [len(x.prompt_ids) for x in trajectories]
    # The sampling logprobs are the engine's; the trainer recomputes them so that ratios compare like with like.
    # One pass over the batch is on-policy: the ratio is exactly 1, so the current logprobs (detached) serve
    # as the old ones and the extra forward pass is skipped (as TRL does with num_iterations=1).
    on_policy = t.epochs_per_batch == 1 and t.mini_batches == 1

    def all_logprobs(m: Any) -> list[torch.Tensor]:
        return _all_logprobs(m, sequences, pad_id, device, t.micro_batch_tokens, t.bf16_autocast)

    old = None if on_policy else all_logprobs(model)
    ref = all_logprobs(ref_model) if ref_model else None
    stats: dict[str, list[float]] = {
        "loss": [],
        "clip_fraction": [],
        "approx_kl": [],
        "grad_norm": [],
        "kl_ref": [],
    }
    max_tokens = cfg.rollout.max_response_tokens
    for _epoch in range(t.epochs_per_batch):
        for mini in _split(keep, t.mini_batches):
            # With several processes each holds its share of the batch: the loss is normalised by the tokens
            # and sequences of all of them, and gradients are summed, so N processes match one.
            tokens = all_reduce_sum(sum(sum(masks[i]) for i in mini))
            mini_size = all_reduce_sum(len(mini))
            if tokens == 0:
                continue
            total = 0.0
            groups = _equalized(micro_batches([len(sequences[i]) for i in mini], t.micro_batch_tokens), model)
            for group in groups:
                if not group:  # FSDP2: an empty pass keeps this process in step with the others' collectives
                    logp, _ = sequence_logprobs(
                        model, [[pad_id] * 2], pad_id, device, bf16_autocast=t.bf16_autocast
                    )
                    (logp.sum() * 0.0).backward()
                    continue
                chosen = [mini[j] for j in group]
                logp, _ = sequence_logprobs(model, [sequences[i] for i in chosen], pad_id, device,
                                            bf16_autocast=t.bf16_autocast)  # (B, L-1)  # fmt: skip
                width = logp.shape[1]
                mask = response_mask_matrix(
                    [prompt_lens[i] for i in chosen], [masks[i] for i in chosen], width, device
                )
                old_logp = logp.detach() if old is None else _stack([old[i] for i in chosen], width, device)
                loss, ls = policy_loss(
                    logp, old_logp, advantages[chosen].to(device), mask, clip_low=t.clip_low, clip_high=t.clip_high,
                    aggregation=t.loss_agg.value, dual_clip=t.dual_clip, max_tokens=max_tokens,
                    loss_scale_tokens=float(tokens),
                )  # fmt: skip
                if (
                    t.loss_agg.value != "token_mean"
                ):  # per-sequence means: weight micro-batches by their share
                    loss = loss * len(chosen) / mini_size
                if ref is not None and t.kl_coef > 0:
                    kl = kl_penalty(logp, _stack([ref[i] for i in chosen], width, device), t.kl_estimator)
                    kl_term = (kl * mask).sum() / tokens
                    loss = loss + t.kl_coef * kl_term
                    stats["kl_ref"].append(float(kl_term))
                loss.backward()
                total += float(loss.detach())
                stats["clip_fraction"].append(ls.clip_fraction)
                stats["approx_kl"].append(ls.approx_kl)
            all_reduce_gradients(model)
            stats["grad_norm"].append(
                grad_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip))
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats["loss"].append(total)
    scheduler.step()
    out = {f"train/{k}": sum(v) / len(v) if v else 0.0 for k, v in stats.items() if v or k != "kl_ref"}
    out["train/optimizer_steps"] = float(len(stats["loss"]))  # 0 when every token was masked (all truncated)
    out["train/degenerate_group_rate"] = float(degenerate.float().mean())
    out["train/advantage_abs"] = float(advantages.abs().mean())
    out["train/lr"] = scheduler.get_last_lr()[0]
    return out


@torch.no_grad()
def _all_logprobs(model: Any, sequences: list[list[int]], pad_id: int, device: torch.device, budget: int,
                  bf16_autocast: bool) -> list[torch.Tensor]:  # fmt: skip
    """Next-token logprobs of each sequence (len - 1,), computed in token-budget micro-batches."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    for group in _equalized(micro_batches([len(s) for s in sequences], budget), model):
        chosen = [sequences[i] for i in group] or [[pad_id, pad_id]]  # empty: an FSDP2 pass to keep in step
        logp, _ = sequence_logprobs(model, chosen, pad_id, device, bf16_autocast=bf16_autocast)
        for row, i in enumerate(group):
            out[i] = logp[row, : len(sequences[i]) - 1]
    return out


def _stack(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), device=device)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[:width]
    return out


def _split(indices: list[int], parts: int) -> list[list[int]]:
    """Exactly `parts` contiguous, nearly equal slices (some may be empty): every process runs as many
    mini-batches as the others, whatever its share of the batch."""
    bounds = [len(indices) * k // parts for k in range(parts + 1)]
    return [indices[bounds[k] : bounds[k + 1]] for k in range(parts)]


def _equalized(groups: list[list[int]], model: Any) -> list[list[int]]:
    """Under FSDP2 every process runs as many forward/backward passes as the busiest one: pad with empty ones."""
    if not is_sharded(model):
        return groups
    return groups + [[] for _ in range(equal_count(len(groups)) - len(groups))]


def step_metrics(trajectories: list[Trajectory], scores: list, rollout_metrics: dict, timings: dict) -> dict:
    n = max(1, len(trajectories))
    out = {**reward_metrics(scores), **rollout_metrics}
    out["train/accuracy"] = out["reward/correct"]
    out["train/solved_with_code"] = (
        sum(s.correct and len(x.code_calls) > 0 for x, s in zip(trajectories, scores, strict=True)) / n
    )
    out["train/used_code"] = sum(len(x.code_calls) > 0 for x in trajectories) / n
    out.update({f"time/{k}": v for k, v in timings.items()})
    return out


class Timer:
    """Seconds spent per named phase: `with timer("rollout_s"): ...`."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start
