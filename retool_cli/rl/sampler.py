"""Where `retool train`'s batches come from. With trainer.max_staleness = 0, each step's rollouts in turn with the
update, by the policy's current weights (`rollouts_in_turn`). Above 0, the overlapped sampler: its engines
(threads of the trainer's process with copies of the weights, slots of the process's one vLLM engine, or engine
processes: rollout.placement), the Pipeline over them (rl/overlap.py), and what a checkpoint keeps of it: each
trainer process's share of the batches sampled ahead. And the trainer's calls into its engine outside the
rollouts (`sync_weights`, `engine_call`), each under rollout.engine_timeout_s."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from retool_cli import stops
from retool_cli.config import RetoolConfig, RolloutEngine, RolloutPlacement
from retool_cli.data.dataset import MathExample
from retool_cli.faults import die_if_due, pause_if_due
from retool_cli.interfaces import Engine, Runtime
from retool_cli.model.precision import Precision
from retool_cli.rl.batch import Batch
from retool_cli.rl.checkpoints import PENDING_BY_RANK, Checkpointing, rng_state
from retool_cli.rl.distributed import engine_span_group, full_weights, side_group, world
from retool_cli.rl.overlap import Pipeline, plain_policy
from retool_cli.rl.step import StepPlan, Timer, collect
from retool_cli.rollout import build_engine
from retool_cli.rollout.engine_process import engine_processes
from retool_cli.rollout.watchdog import time_limit
from retool_cli.rollout.weight_slots import CallOrder, SlotEngine, WeightSlots


@contextlib.contextmanager
def overlapped_sampling(
    config: RetoolConfig,
    plan: StepPlan,
    precision: Precision,
    examples: list[Any],
    rt: Runtime,
    model: Any,
    start: int,
    cursor: int,
    pending: list[Any],
) -> Iterator[Pipeline | None]:
    """With trainer.max_staleness > 0, the sampler thread (rl/overlap.py) with an engine of its own, its
    weights at step `start`; else None (rollouts and update take turns)."""
    if config.trainer.max_staleness == 0:
        yield None
        return
    t = config.trainer
    # batches in flight at once, each sampled by its engine's copy of the weights: up to k + 1 (step s may start
    # once update s - 1 - k is done, while steps s - k .. s - 1 still sample); dynamic sampling: one, since a
    # batch's data cursor is known only when the batch before it ends
    slots = 1 if t.dynamic_sampling else t.max_staleness + 1
    with contextlib.ExitStack() as stack:
        if config.rollout.placement is RolloutPlacement.separate:
            engines: list[Engine] = stack.enter_context(engine_processes(config, precision, model, rt.tokenizer, slots))
        elif isinstance(rt.engine, SlotEngine):  # vLLM colocated: the trainer's engine, shared (see shared_engine)
            engines = [SlotEngine(rt.engine.slots, slot) for slot in range(slots)]
            if isinstance(rt.engine.slots, WeightSlots) and rt.engine.slots.order is not None:
                stack.enter_context(rt.engine.slots.order)  # exits after the pipeline: its last call made
        else:
            sampler = plain_policy(model)  # LoRA merged, FSDP2 gathered: what every engine of the sampler loads
            engines = [build_engine(config, precision, sampler, rt.tokenizer, own_copy=True) for _ in range(slots)]
        yield stack.enter_context(sample_ahead(config, plan, examples, rt, model, engines, start, cursor, pending))


def shared_engine(config: RetoolConfig, rt: Runtime) -> Runtime:
    """Colocated vLLM with trainer.max_staleness > 0: the process's one vLLM engine samples for the batches in
    flight and for the trainer (periodic evaluation), each slot with its own weights, in turn
    (rollout/weight_slots.py); else `rt` as it is."""
    colocated = config.rollout.placement is RolloutPlacement.colocated
    if config.trainer.max_staleness == 0 or not colocated or config.rollout.engine is not RolloutEngine.vllm:
        return rt
    span = config.rollout.vllm_tensor_parallel_size  # an engine spanning processes: its calls in one order
    group = engine_span_group(span, config.trainer.collective_timeout_s)
    order = CallOrder(group, leader=world()[0] // span * span) if group is not None else None
    return replace(rt, engine=SlotEngine(WeightSlots(rt.engine, order), "trainer"))


@contextlib.contextmanager
def sample_ahead(
    config: RetoolConfig,
    plan: StepPlan,
    examples: list[Any],
    rt: Runtime,
    model: Any,
    engines: list[Engine],
    start: int,
    cursor: int,
    pending: list[Any],
) -> Iterator[Pipeline]:
    """The sampler's pipeline over `engines`, its first weights published."""
    t = config.trainer
    # several processes: each samples its share of every batch; dynamic sampling counts the groups over all of
    # them in the sampler's threads, which must not meet the trainer's collectives in the run's group
    group = side_group(t.collective_timeout_s) if t.dynamic_sampling else None

    def sample(step: int, cursor: int, engine: Engine, weights_for_phase: Callable[[int], int]) -> tuple[Any, int]:
        pause_if_due("rollouts", step)  # the stop tests' fixed point (RETOOL_PAUSE_AT=rollouts:N)
        die_if_due("sampling", step)  # killed while sampling ahead (RETOOL_DIE_AFTER=sampling:N: before step N's)
        # the tools and judge are shared
        return collect(plan, examples, cursor, step, replace(rt, engine=engine), weights_for_phase, group)

    per_step = None if t.dynamic_sampling else t.questions_per_step
    last, timeout = t.total_steps, config.rollout.engine_timeout_s
    args = (sample, engines, t.max_staleness, start, last, cursor, pending, timeout, per_step, config.rollout.partial)
    with Pipeline(*args) as pipeline:
        pipeline.publish(start, model)
        yield pipeline


def sampled_ahead(pipeline: Pipeline, step: int, cursor: int) -> dict[str, Any]:
    """What a checkpoint of step `step` keeps of the sampler (Pipeline.checkpoint_state). Several processes:
    each sampled its own share of the batches ahead, gathered to rank 0, which saves them all (a collective;
    each resumes with its own: rl/checkpoints.py, pending_share)."""
    state = pipeline.checkpoint_state(step, cursor)
    rank, size = world()
    if size == 1:
        return state
    shares: list[Any] | None = [None] * size if rank == 0 else None
    torch.distributed.gather_object(state.pop("pending"), shares, dst=0)
    return {**state, PENDING_BY_RANK: shares}


def rollouts_in_turn(
    plan: StepPlan,
    examples: list[MathExample],
    cursor: int,
    step: int,
    rt: Runtime,
    model: Any,
    timer: Timer,
    checkpoint_at: Checkpointing,
) -> tuple[Batch, int]:
    """Step `step`'s rollouts with the policy's current weights (trainer.max_staleness=0): the batch and the
    data cursor after it. One process: a stop abandons them at once (nothing trained yet) and, with
    trainer.save_on_signal, checkpoints the step before; several: see agreed_stop."""
    config, size = checkpoint_at.config, world()[1]
    before = {"cursor": cursor, "rng": rng_state()}  # what a checkpoint of step - 1 holds
    try:
        with timer("rollout_s"), weights_for(config, model), stops.interruptible(size == 1):
            pause_if_due("rollouts", step)  # the stop tests' fixed point (RETOOL_PAUSE_AT=rollouts:N)
            return collect(plan, examples, cursor, step, rt)
    except stops.Stopped:
        if config.trainer.save_on_signal and step - 1 > checkpoint_at.last:
            checkpoint_at(step - 1, before)
        raise


def batch_sampled_ahead(pipeline: Pipeline, step: int, checkpoint_at: Checkpointing) -> tuple[Batch, int, float]:
    """Step `step`'s batch from the sampler (trainer.max_staleness > 0): the batch, the data cursor after it, the
    sampler's seconds on it. One process, no update since the last checkpoint (a fresh run's first batch; a
    checkpoint already holds the batches after it): a stop abandons the wait at once, as synchronous rollouts do,
    since what is lost is sampling the rerun repeats. Else a stop waits for the batch: the step's checkpoint needs
    the batches sampled ahead."""
    nothing_trained = world()[1] == 1 and step - 1 == checkpoint_at.last
    with stops.interruptible(nothing_trained):
        return pipeline.take(step)


def weights_for(config: RetoolConfig, model: Any) -> contextlib.AbstractContextManager[Any]:
    """The hf engine decodes with the policy's own modules: under FSDP2 their weights are all-gathered for it.
    vLLM keeps its own copy (synced after each step), so the trainer's shards stay sharded."""
    return contextlib.nullcontext() if config.rollout.engine is RolloutEngine.vllm else full_weights(model)


def engine_call(config: RetoolConfig, what: str) -> contextlib.AbstractContextManager[None]:
    """A call into the engine outside the rollouts, under rollout.engine_timeout_s."""
    return time_limit(config.rollout.engine_timeout_s, what, "rollout.engine_timeout_s")


def sync_weights(config: RetoolConfig, engine: Engine, model: Any) -> None:
    with engine_call(config, "the weight sync into the engine"):
        engine.update_weights(model)
