"""The sampler of overlapped training (trainer.max_staleness > 0) as `retool train` sets it up: its engines
(threads of the trainer's process with copies of the weights, slots of the process's one vLLM engine, or engine
processes: rollout.placement), the Pipeline over them (rl/overlap.py), and what a checkpoint keeps of it: each
trainer process's share of the batches sampled ahead."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from retool_cli.config import RetoolConfig, RolloutEngine, RolloutPlacement
from retool_cli.faults import die_if_due, pause_if_due
from retool_cli.interfaces import Engine, Runtime
from retool_cli.model.precision import Precision
from retool_cli.rl.checkpoints import PENDING_BY_RANK
from retool_cli.rl.distributed import engine_span_group, side_group, world
from retool_cli.rl.overlap import Pipeline, plain_policy
from retool_cli.rl.step import StepPlan, collect
from retool_cli.rollout import build_engine
from retool_cli.rollout.engine_process import engine_processes
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
