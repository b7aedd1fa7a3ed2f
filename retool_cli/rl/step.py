"""One RL step: rollouts with the interpreter -> rewards -> group advantages -> clipped policy updates.

take_batch(cursor) --run_rollouts--> trajectories (token ids as sampled, tool tokens masked) --score_batch-->
  rewards, in a Batch (rollout_batch: trajectory, score | reward; rounds concatenated with dynamic sampling)
  --update: + advantage (N,), loss mask, old / reference logprobs--> epochs x mini-batches (Batch.index)
  x token-budget micro-batches of policy_loss --> optimizer steps
"""

from __future__ import annotations

import contextlib
import random
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from retool_cli.config import LossAgg, RetoolConfig, RewardConfig, RewardControl, RolloutConfig, TrainerConfig
from retool_cli.data.dataset import MathExample, take_batch
from retool_cli.env.reward import reward_metrics, score_batch
from retool_cli.interfaces import Engine, Judge, Tool, ToolProtocol
from retool_cli.rl.algorithms import (
    degenerate_groups,
    group_advantages,
    kl_penalty,
    mismatch_sums,
    policy_loss,
    rollout_correction,
    shuffled_rewards,
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
from retool_cli.rl.logprobs import micro_batches, response_mask_matrix, sequence_logprobs
from retool_cli.rl.tir_filters import roc_select
from retool_cli.rollout.agent import Trajectory, run_rollouts, sample_row


@dataclass(frozen=True)
class StepPlan:
    """What one RL step depends on, and nothing else of the config."""

    trainer: TrainerConfig  # batch sizes, sampling rounds, epochs, mini-batches, the loss and its clipping
    rollout: RolloutConfig  # the agent loop's settings (group_size: samples per question)
    reward: RewardConfig  # the reward function and the judge's settings
    seed: int  # the run's seed; each step's and round's seed follows from it
    max_context_tokens: int  # prompt + response bound of one trajectory
    shared_prefix: bool = False  # model.accelerate: each GRPO prompt computed once in the training forward

    @classmethod
    def of(cls, cfg: RetoolConfig) -> StepPlan:
        return cls(cfg.trainer, cfg.rollout, cfg.reward, cfg.seed, cfg.context_tokens(), cfg.model.accelerate)

    @property
    def temperature(self) -> float:
        """The temperature the trainer's logprobs are taken at: the sampler's (as TRL and verl do), so that the
        trainer's policy is the one that drew the tokens (greedy sampling: 1)."""
        return self.rollout.temperature or 1.0


def rollout_batch(
    trajectories: list[Trajectory],
    rewards: torch.Tensor,
    scores: list[Any] | None = None,
    metrics: dict[str, Any] | None = None,
) -> Batch:
    """The envelope of a rollout round for the update: per sample its trajectory (and reward score) and its
    reward (N,); the round's rollout metrics in meta."""
    objects: dict[str, list[Any]] = {"trajectory": trajectories}
    if scores is not None:
        objects["score"] = scores
    return Batch({"reward": rewards.to(torch.float32)}, objects, {"metrics": metrics or {}})


def collect(
    plan: StepPlan,
    examples: list[MathExample],
    cursor: int,
    step: int,
    engine: Engine,
    protocol: ToolProtocol,
    tools: list[Tool],
    verifier: Judge,
) -> tuple[Batch, int]:
    """Rollouts and rewards for one step, and the data cursor after them. With dynamic sampling, more rounds
    of questions are sampled while too few groups have rewards that differ (up to trainer.max_sampling_rounds);
    the update then drops the all-equal groups."""
    t = plan.trainer
    rounds: list[Batch] = []
    rank, size = world()
    # A vLLM engine over `tp` processes (rollout.vllm_tensor_parallel_size) is one sampler: its processes roll out
    # one share together (the same requests, the same seeds), then each trains on its own questions of it.
    tp = plan.rollout.vllm_tensor_parallel_size
    share, shares = rank // tp, size // tp
    for round_index in range(t.max_sampling_rounds if t.dynamic_sampling else 1):
        questions = take_batch(examples, cursor, t.questions_per_step)[share::shares]  # this engine's share
        cursor += t.questions_per_step
        seed = plan.seed * 1_000_003 + step * 16 + round_index + share * 7919
        got, metrics = run_rollouts(
            questions,
            engine,
            protocol,
            tools,
            plan.rollout,
            seed=seed,
            max_context_tokens=plan.max_context_tokens,
            group_size=plan.rollout.group_size * t.roc_oversample,
        )
        started = time.perf_counter()
        scores = score_batch([x.response() for x in got], plan.reward, verifier)
        metrics = {**metrics, "rollout/reward_s": time.perf_counter() - started}  # the judge's time
        for x, s in zip(got, scores, strict=True):
            if s.timed_out and not x.infra:  # no verdict: no evidence about this sample (left out of the update)
                x.infra = "judge"
        if t.roc_oversample > 1:  # GRPO-RoC: keep group_size of each question's samples (rl/tir_filters.py)
            kept, roc_metrics = roc_select(got, scores, plan.rollout.group_size, t.roc_oversample, seed)
            got, scores, metrics = [got[i] for i in kept], [scores[i] for i in kept], {**metrics, **roc_metrics}
        if tp > 1:  # this process's questions of the engine's share: whole groups, disjoint from the others'
            mine = [i for i in range(len(got)) if (i // plan.rollout.group_size) % tp == rank % tp]
            got, scores = [got[i] for i in mine], [scores[i] for i in mine]
        rewards = torch.tensor([s.reward for s in scores])  # (N,)
        if plan.reward.control is RewardControl.shuffled:  # a control run: the rewards' link to correctness cut
            rewards = shuffled_rewards(rewards, seed)
        rounds.append(rollout_batch(got, rewards, scores, metrics))
        if not t.dynamic_sampling:
            break
        so_far = Batch.concat(rounds)
        so_far_trajectories = so_far.objects["trajectory"]
        varied = ~degenerate_groups(
            so_far.tensors["reward"], group_ids(so_far_trajectories), valid_samples(so_far_trajectories)
        )
        if all_reduce_sum(int(varied.sum())) // plan.rollout.group_size >= t.questions_per_step:
            break
    batch = Batch.concat(rounds)
    batch.meta["metrics"] = _merge_round_metrics(rounds)
    return batch, cursor


def _merge_round_metrics(rounds: list[Batch]) -> dict[str, float]:
    """Rollout metrics of all sampling rounds: times (`*_s`) summed, throughput recomputed, the rest
    (per-trajectory means and rates) weighted by each round's trajectories."""
    if len(rounds) == 1:
        return dict(rounds[0].meta["metrics"])
    total = max(1, sum(len(r) for r in rounds))
    keys = dict.fromkeys(k for r in rounds for k in r.meta["metrics"])
    merged: dict[str, float] = {}
    for key in keys:
        if key.endswith("_per_s"):  # a rate: recomputed below
            continue
        values = [(len(r), r.meta["metrics"].get(key, 0.0)) for r in rounds]
        merged[key] = sum(v for _, v in values) if key.endswith("_s") else sum(n * v for n, v in values) / total
    if "rollout/gen_tokens_per_s" in keys:  # tokens / seconds over all rounds
        tokens = sum(
            r.meta["metrics"]["rollout/gen_tokens_per_s"] * r.meta["metrics"]["rollout/generate_s"] for r in rounds
        )
        seconds = merged["rollout/generate_s"]
        merged["rollout/gen_tokens_per_s"] = tokens / seconds if seconds else 0.0
    return merged


def valid_samples(trajectories: list[Trajectory]) -> torch.Tensor:
    """(N,) False for a void trajectory (the infrastructure failed it: Trajectory.infra)."""
    return torch.tensor([not x.infra for x in trajectories], dtype=torch.bool)


def group_ids(trajectories: list[Trajectory]) -> torch.Tensor:
    """(N,) the index of each trajectory's question, in first-seen order."""
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(x.example.id, len(index)) for x in trajectories])


def update(
    plan: StepPlan, model: Any, batch: Batch, optimizer: Any, scheduler: Any, pad_id: int, ref_model: Any = None
) -> dict[str, float]:
    """Policy-gradient updates on one rollout batch (`rollout_batch`); returns loss statistics."""
    t = plan.trainer
    device = next(model.parameters()).device
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
    sequences = [x.token_ids for x in trajectories]
    prompt_lens = [len(x.prompt_ids) for x in trajectories]

    def all_logprobs(m: Any) -> list[torch.Tensor]:
        return _all_logprobs(
            m,
            sequences,
            prompt_lens,
            pad_id,
            device,
            t.micro_batch_tokens,
            t.bf16_autocast,
            plan.shared_prefix,
            plan.temperature,
        )

    extra = {"sampler_logprobs": [_sampler_logprobs(x) for x in trajectories]}
    if not on_policy:
        extra["old_logprobs"] = all_logprobs(model)
    if ref_model is not None:
        extra["ref_logprobs"] = all_logprobs(ref_model)
    batch = batch.union(Batch({"advantage": advantages}, {"mask": masks, **extra}))
    batch = batch.index([i for i in range(len(batch)) if not (t.dynamic_sampling and degenerate[i])])
    stats: dict[str, list[float]] = {
        "loss": [],
        "clip_fraction": [],
        "approx_kl": [],
        "grad_norm": [],
        "kl_ref": [],
    }
    entropy_sum = entropy_tokens = 0.0  # over this process's model tokens
    mismatch: dict[str, float] = {}  # sums over this process's model tokens (the first epoch's: old = before)
    for epoch in range(t.epochs_per_batch):
        for mini in _split(batch, t.mini_batches):
            # With several processes each holds its share of the batch: the loss is normalised by the tokens
            # and sequences of all of them, and gradients are summed, so N processes match one.
            tokens = all_reduce_sum(sum(sum(mask) for mask in mini.objects["mask"]))
            mini_size = all_reduce_sum(len(mini))
            if tokens == 0:
                continue
            total = 0.0
            lengths = [len(x.token_ids) for x in mini.objects["trajectory"]]
            for group in _equalized(micro_batches(lengths, t.micro_batch_tokens), model):
                if not group:  # FSDP2: an empty pass keeps this process in step with the others' collectives
                    logp, _, _ = sequence_logprobs(model, [[pad_id] * 2], pad_id, device, bf16_autocast=t.bf16_autocast)
                    (logp.sum() * 0.0).backward()
                    continue
                loss, loss_stats, sums = _micro_loss(plan, model, mini.index(group), pad_id, tokens, mini_size)
                if epoch == 0:
                    _add_mismatch(mismatch, sums.pop("mismatch"))
                loss.backward()
                total += float(loss.detach())
                stats["clip_fraction"].append(loss_stats.clip_fraction)
                stats["approx_kl"].append(loss_stats.approx_kl)
                entropy_sum += sums["entropy_sum"]
                entropy_tokens += sums["entropy_tokens"]
                if "kl_ref" in sums:
                    stats["kl_ref"].append(sums["kl_ref"])
            all_reduce_gradients(model)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            stats["grad_norm"].append(grad_norm(norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats["loss"].append(total)
    lr = scheduler.get_last_lr()[0]  # the rate this step trained with (the scheduler then moves to the next)
    with warnings.catch_warnings():
        if not stats["loss"]:  # nothing trained (every token masked): the schedule still advances, on purpose
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()
    out = {f"train/{k}": sum(v) / len(v) if v else 0.0 for k, v in stats.items() if v or k != "kl_ref"}
    out["train/entropy"] = entropy_sum / entropy_tokens if entropy_tokens else 0.0
    out["train/optimizer_steps"] = float(len(stats["loss"]))  # 0 when every token was masked (all truncated)
    out["train/degenerate_group_rate"] = float(degenerate.float().mean())
    out["train/void_rate"] = float((~valid).float().mean())  # left out of the loss: infrastructure failures
    out["train/void_turn_filtered"] = sum(void_turns) / max(1, len(void_turns))  # masked if filter_void_turns
    out.update(_mismatch_metrics(mismatch))
    out["train/advantage_abs"] = float(advantages.abs().mean())
    out["train/lr"] = lr
    return out


def _micro_loss(
    plan: StepPlan, model: Any, micro: Batch, pad_id: int, tokens: float, mini_size: float
) -> tuple[torch.Tensor, Any, dict[str, Any]]:
    """The loss of one micro-batch, scaled so that the micro-batches (and processes) of a mini-batch add up to
    its loss; its policy-loss statistics; sums for the step's metrics (entropy over the model's tokens, and
    the KL-to-reference term when there is one)."""
    t = plan.trainer
    device = next(model.parameters()).device
    trajectories = micro.objects["trajectory"]
    prompt_lens = [len(x.prompt_ids) for x in trajectories]
    logp, _, entropy = sequence_logprobs(
        model,
        [x.token_ids for x in trajectories],
        pad_id,
        device,
        temperature=plan.temperature,
        bf16_autocast=t.bf16_autocast,
        entropy="loss" if t.entropy_coef > 0 else "metric",
        prompt_lens=prompt_lens,
        shared_prefix=plan.shared_prefix,
    )  # (B, L-1)
    width = logp.shape[1]
    mask = response_mask_matrix(prompt_lens, micro.objects["mask"], width, device)
    old = micro.objects.get("old_logprobs")
    old_logp = logp.detach() if old is None else _stack(old, width, device)
    sampler_logp = _stack(micro.objects["sampler_logprobs"], width, device)
    bounds = (t.rollout_correction_bounds[0], t.rollout_correction_bounds[1])
    weights, corrected = rollout_correction(
        old_logp, sampler_logp, mask, t.rollout_correction.value, t.rollout_correction_cap, bounds
    )
    loss, loss_stats = policy_loss(
        logp,
        old_logp,
        micro.tensors["advantage"].to(device),
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
    if "ref_logprobs" in micro.objects and t.kl_coef > 0:
        kl = kl_penalty(logp, _stack(micro.objects["ref_logprobs"], width, device), t.kl_estimator)
        kl_term = (kl * mask).sum() / tokens
        loss = loss + t.kl_coef * kl_term
        sums["kl_ref"] = float(kl_term.detach())
    return loss, loss_stats, sums


@torch.no_grad()
def _all_logprobs(
    model: Any,
    sequences: list[list[int]],
    prompt_lens: list[int],
    pad_id: int,
    device: torch.device,
    budget: int,
    bf16_autocast: bool,
    shared_prefix: bool,
    temperature: float,
) -> list[torch.Tensor]:
    """Next-token logprobs of each sequence (len - 1,), computed in token-budget micro-batches; only the
    positions predicting response tokens are meaningful (the prompt's are 0 when prompts are shared)."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    for group in _equalized(micro_batches([len(s) for s in sequences], budget), model):
        chosen = [sequences[i] for i in group] or [[pad_id, pad_id]]  # empty: an FSDP2 pass to keep in step
        lens = [prompt_lens[i] for i in group] or [1]
        logp, _, _ = sequence_logprobs(
            model,
            chosen,
            pad_id,
            device,
            temperature=temperature,
            bf16_autocast=bf16_autocast,
            prompt_lens=lens,
            shared_prefix=shared_prefix,
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


def _split(batch: Batch, parts: int) -> list[Batch]:
    """Exactly `parts` contiguous, nearly equal mini-batches (some may be empty): every process runs as many
    mini-batches as the others, whatever its share of the samples."""
    bounds = [len(batch) * k // parts for k in range(parts + 1)]
    return [batch.index(list(range(bounds[k], bounds[k + 1]))) for k in range(parts)]


def _equalized(groups: list[list[int]], model: Any) -> list[list[int]]:
    """Under FSDP2 every process runs as many forward/backward passes as the busiest one: pad with empty ones."""
    if not is_sharded(model):
        return groups
    return groups + [[] for _ in range(equal_count(len(groups)) - len(groups))]


def step_metrics(batch: Batch, timings: dict[str, Any], device: torch.device | None = None) -> dict[str, Any]:
    """What a step logs: reward components, rollout metrics, accuracy, code use, phase times, and on CUDA the
    peak GPU memory so far."""
    trajectories, scores = batch.objects["trajectory"], batch.objects["score"]
    n = max(1, len(trajectories))
    out = {**reward_metrics(scores), **batch.meta["metrics"]}
    out["train/accuracy"] = out["reward/correct"]
    out["train/solved_with_code"] = (
        sum(s.correct and len(x.tool_calls) > 0 for x, s in zip(trajectories, scores, strict=True)) / n
    )
    out["train/used_code"] = sum(len(x.tool_calls) > 0 for x in trajectories) / n
    out.update({f"time/{k}": v for k, v in timings.items()})
    if device is not None and device.type == "cuda":
        out["memory/gpu_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def kept_rollouts(batch: Batch, count: int, seed: int, tools: list[Tool]) -> list[dict[str, Any]]:
    """Up to `count` of a step's trajectories as rows for rollouts.jsonl (`retool report` browses them): half
    right and half wrong where the step has both, picked with their own seeded generator (the run's random
    streams are untouched)."""
    trajectories, scores = batch.objects["trajectory"], batch.objects["score"]
    rng = random.Random(seed)
    right = [i for i, s in enumerate(scores) if s.correct]
    wrong = [i for i, s in enumerate(scores) if not s.correct]
    rng.shuffle(right)
    rng.shuffle(wrong)
    half = min(len(right), max(count // 2, count - len(wrong)))
    chosen = sorted(right[:half] + wrong[: count - half])
    return [sample_row(trajectories[i], scores[i], None, tools) for i in chosen]


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
