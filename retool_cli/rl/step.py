"""One RL step's data: rollouts with the interpreter -> rewards, in the Batch the update (rl/update.py) trains on,
and what the step logs of it.

take_batch(cursor) --run_rollouts--> trajectories (token ids as sampled, tool tokens masked) --score_batch-->
  rewards, in a Batch (rollout_batch: trajectory, score | reward; rounds concatenated with dynamic sampling)
  --rl/update.py: prepare, optimize, report--> optimizer steps and the step's train/* metrics
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from retool_cli.config import RetoolConfig, RewardConfig, RewardControl, RolloutConfig, TrainerConfig
from retool_cli.data.dataset import MathExample, take_batch
from retool_cli.env.reward import reward_metrics, score_batch
from retool_cli.interfaces import Runtime, Tool
from retool_cli.model.precision import Precision
from retool_cli.rl.algorithms import (
    degenerate_groups,
    shuffled_rewards,
)
from retool_cli.rl.batch import Batch
from retool_cli.rl.distributed import (
    all_reduce_sum,
    world,
)
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
    bf16_autocast: bool = False  # the training forward's matmuls in bfloat16 (Precision.bf16_autocast)

    @classmethod
    def of(cls, cfg: RetoolConfig, precision: Precision) -> StepPlan:
        t, context = cfg.trainer, cfg.context_tokens()
        return cls(t, cfg.rollout, cfg.reward, cfg.seed, context, cfg.model.accelerate, precision.bf16_autocast)

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
    rt: Runtime,
    weights_for_phase: Callable[[int], int] | None = None,
    group: Any = None,
) -> tuple[Batch, int]:
    """Rollouts and rewards for one step, and the data cursor after them. With dynamic sampling, more rounds
    of questions are sampled while too few groups have rewards that differ (up to trainer.max_sampling_rounds),
    counted over all processes (in `group`: see all_reduce_sum); the update then drops the all-equal groups.
    `weights_for_phase`: overlapped training's (rl/overlap.py; see run_rollouts)."""
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
            rt.engine,
            rt.protocol,
            rt.tools,
            plan.rollout,
            seed=seed,
            max_context_tokens=plan.max_context_tokens,
            group_size=plan.rollout.group_size * t.roc_oversample,
            weights_for_phase=weights_for_phase,
        )
        started = time.perf_counter()
        scores = score_batch([x.response() for x in got], plan.reward, rt.judge)
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
        if all_reduce_sum(int(varied.sum()), group) // plan.rollout.group_size >= t.questions_per_step:
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


def step_metrics(batch: Batch, timings: dict[str, Any], device: torch.device | None = None) -> dict[str, Any]:
    """What a step logs: reward components, rollout metrics, accuracy, code use, phase times and the shares of
    them the trainer and the sampler idle, and on CUDA the peak GPU memory so far."""
    trajectories, scores = batch.objects["trajectory"], batch.objects["score"]
    n = max(1, len(trajectories))
    out = {**reward_metrics(scores), **batch.meta["metrics"]}
    out["train/accuracy"] = out["reward/correct"]
    out["train/solved_with_code"] = (
        sum(s.correct and len(x.tool_calls) > 0 for x, s in zip(trajectories, scores, strict=True)) / n
    )
    out["train/used_code"] = sum(len(x.tool_calls) > 0 for x in trajectories) / n
    out.update({f"time/{k}": v for k, v in timings.items()})
    if timings.get("rollout_s") and timings.get("update_s"):  # in turns, each side idles while the other works
        busy = timings["rollout_s"] + timings["update_s"]  # (overlapped: rl/overlap.py measures them instead)
        out["time/trainer_idle_share"] = timings["rollout_s"] / busy
        out["time/sampler_idle_share"] = timings["update_s"] / busy
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
