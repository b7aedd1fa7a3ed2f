"""retool train: multi-turn RL with the code interpreter; `trainer.resume=true` continues the latest
checkpoint of an unfinished run of the same config (same data position, RNG and optimizer state)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from rich.console import Console
from rich.progress import Progress

from retool_cli import run_lock, stops
from retool_cli.checkpoint_paths import latest_checkpoint
from retool_cli.config import FsdpSharding, RetoolConfig, RolloutEngine
from retool_cli.data.dataset import training_examples
from retool_cli.env.protocol import build_protocol, drop_overlong_prompts
from retool_cli.eval.sampling import dev_eval
from retool_cli.faults import die_if_due, jitter
from retool_cli.interfaces import Runtime
from retool_cli.metrics_log import MetricsLog, plot_metrics
from retool_cli.model.loading import load_tokenizer, model_path, policy_for, reference_policy
from retool_cli.model.precision import resolve_precision
from retool_cli.rl import packing
from retool_cli.rl.checkpoints import Checkpointing, resume
from retool_cli.rl.distributed import (
    agreed_stop,
    barrier,
    init_distributed,
    leave_process_group,
    peers_alive,
    same_folder_everywhere,
    shard,
    world,
)
from retool_cli.rl.launch import (
    check_devices,
    check_engine_span,
    check_placement,
    launch_processes,
    resolve_rendezvous,
    typed_trainer_keys,
)
from retool_cli.rl.optim import build_optimizer, build_scheduler
from retool_cli.rl.sampler import (
    batch_sampled_ahead,
    engine_call,
    overlapped_sampling,
    rollouts_in_turn,
    sampled_ahead,
    shared_engine,
    sync_weights,
    weights_for,
)
from retool_cli.rl.step import StepPlan, Timer, kept_rollouts, step_metrics
from retool_cli.rl.update import update
from retool_cli.run_keys import config_key
from retool_cli.runtime import for_this_process, from_checkpoint, open_runtime, run_folder

log = logging.getLogger(__name__)
# what trainer.resume=false replaces in its folder
OUTPUTS = ("metrics.jsonl", "rollouts.jsonl", "checkpoints", "evals", "tensorboard", "final.txt", "train.png")
PLOTTED = ["reward/mean", "train/accuracy", "rollout/code_calls", "rollout/response_tokens", "eval/accuracy"]


def run(config: RetoolConfig, run_dir: Path) -> None:
    t = config.trainer
    check_placement(config)  # before any process, folder or model
    for note in config.idle_overlap_settings():
        log.warning("%s", note)
    config = from_checkpoint(config)  # trainer.init_from: the model, tokenizer and protocol it was trained with
    key = config_key(config)  # before the per-process changes below: every process must agree on it
    rank, size = init_distributed(t.collective_timeout_s)
    if size == 1:
        overrides = list(HydraConfig.get().overrides.task)
        layout = resolve_rendezvous(t, os.environ, typed_trainer_keys(overrides))
        if t.nproc > 1 or layout.nnodes > 1:  # relaunched through torchrun, joined with the other nodes
            check_devices(config)  # once, here: not once per process, after they started
            model_path(config.model)  # model=tiny built here, once (model/tiny.py), not by ranks racing
            return launch_processes(t, layout, overrides, run_dir, config.rollout.engine is RolloutEngine.vllm)
        run_lock.claim(run_dir, "train")
    with peers_alive():
        train(for_this_process(config, rank, size), run_dir, key, rank, size)


def train(config: RetoolConfig, run_dir: Path, key: str, rank: int, size: int) -> None:
    """The run as one of `size` processes (rank 0 writes the outputs)."""
    t = config.trainer
    check_engine_span(config, size)
    examples, dev_split = training_examples(config)  # first: bad data fails before a model loads
    run_dir = same_folder_everywhere(run_dir)  # rank 0's; every node must see it
    out_dir = run_folder(config, run_dir, key, "final.txt", "metrics.jsonl", resume=t.resume, outputs=OUTPUTS)
    checkpoint = latest_checkpoint(out_dir, log.warning) if t.resume else None
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(config.model)
    precision = resolve_precision(config, training=True)
    log.info("precision: %s", precision)
    model, source = policy_for(config, precision, checkpoint, sharded=t.fsdp and size > 1)
    ref_model = reference_policy(config, precision, model, checkpoint)  # (trainer.kl_coef) the initial weights
    if t.pack_sequences:  # a model that cannot pack is refused here, not after the first rollouts
        packing.enable(model)
        if ref_model is not None:
            packing.enable(ref_model)
    if t.fsdp and size > 1:  # after the reference copy: that one stays whole on each process
        shard(model, replicas=t.nnodes if t.fsdp_sharding is FsdpSharding.hybrid else 1)
    optimizer = build_optimizer(model, t.lr, t.weight_decay)
    scheduler = build_scheduler(optimizer, t.warmup_steps, t.total_steps, t.schedule)
    metrics = MetricsLog(out_dir, t.tensorboard, t.wandb_project, {"seed": config.seed, "recipe": source}, rank)
    start, cursor, pending = resume(checkpoint, model, optimizer, scheduler, metrics)
    log.info("train: %d questions, %d steps, from %s -> %s", len(examples), t.total_steps, source, out_dir)
    protocol = build_protocol(config.protocol, tokenizer)
    examples = drop_overlong_prompts(examples, protocol, config.rollout.max_prompt_tokens)
    checkpoint_at = Checkpointing(config, out_dir, model, tokenizer, optimizer, scheduler, rank)
    checkpoint_at.last = start
    with (
        open_runtime(config, precision, tokenizer, protocol, policy=model, weights=source) as rt,
        Progress(console=Console(stderr=True)) as progress,
        stops.deferred(),  # a stop ends the run at a step's end (all ranks agreed), or alone in the rollouts
    ):
        rt = shared_engine(config, rt)
        # vLLM loaded files; the first rollout must sample from the policy (init_from, a resumed checkpoint, LoRA)
        sync_weights(config, rt.engine, model)
        task = progress.add_task("train", total=t.total_steps, completed=start)
        plan = StepPlan.of(config, precision)
        with overlapped_sampling(config, plan, precision, examples, rt, model, start, cursor, pending) as pipeline:
            for step in range(start + 1, t.total_steps + 1):
                timer = Timer()
                if pipeline is None:
                    batch, cursor = rollouts_in_turn(plan, examples, cursor, step, rt, model, timer, checkpoint_at)
                else:
                    batch, cursor, timer.times["rollout_s"] = batch_sampled_ahead(pipeline, step, checkpoint_at)
                with engine_call(config, "the engine's sleep"):
                    rt.engine.sleep()  # vLLM (with sleep mode): its KV cache freed, its weights offloaded
                with timer("update_s"):
                    jitter("update")  # the determinism tests' random delay (faults.py; nothing outside tests)
                    die_if_due("update", step)  # killed mid-step: the resume tests (RETOOL_DIE_AFTER=update:N)
                    stats = update(plan, model, batch, optimizer, scheduler, tokenizer.pad_token_id, ref_model)
                if pipeline is not None:
                    pipeline.publish(step, model)  # the sampler may start the batch that waited for it
                with engine_call(config, "the engine's wake-up"):
                    rt.engine.wake_up()
                # refresh what the engine keeps of the weights: vLLM's copy, a cast copy, prepacked CPU matrices
                sync_weights(config, rt.engine, model)
                row = {"step": step, **step_metrics(batch, timer.times, next(model.parameters()).device), **stats}
                if pipeline is not None:
                    row.update(pipeline.metrics(step, batch))
                if t.eval_every and step % t.eval_every == 0 and dev_split:
                    row.update(periodic_eval(config, dev_split, out_dir / "evals" / f"step_{step}", rt, model))
                metrics.write(row, kept_rollouts(batch, t.keep_rollouts, config.seed * 1_000_003 + step, rt.tools))
                shown = f"train acc {row['train/accuracy']:.2f} code {row['train/used_code']:.2f}"
                progress.update(task, completed=step, description=shown)
                stop = agreed_stop()
                if step % t.save_every == 0 or step == t.total_steps or (stop and t.save_on_signal):
                    checkpoint_at(step, sampled_ahead(pipeline, step, cursor) if pipeline else {"cursor": cursor})
                barrier()  # no process runs ahead of a checkpoint being written
                die_if_due("step", step)  # the resume tests' fault injection (RETOOL_DIE_AFTER=step:N)
                if stop:
                    log.warning("stopped after step %d (last checkpoint: step %d)", step, checkpoint_at.last)
                    raise stops.Stopped(stop)
    leave_process_group()
    if rank > 0:
        return
    plot_metrics(metrics.rows(), PLOTTED, out_dir / "train.png")
    (out_dir / "final.txt").write_text(f"finished at step {t.total_steps}\n")
    log.info("wrote %s", out_dir)


def periodic_eval(config: RetoolConfig, dev_split: list, folder: Path, rt: Runtime, model: Any) -> dict[str, float]:
    """trainer.eval_every's evaluation of the policy's current weights, by rank 0 (hf + FSDP2: the weights'
    gather is every process's collective). With trainer.max_staleness, the sampler's batches go on meanwhile
    (the sandbox and the judge serve several threads; the eval samples with the policy itself)."""
    with weights_for(config, model):
        if world()[0] > 0:
            return {}
        return dev_eval(config, dev_split[: config.trainer.eval_problems], folder, rt)
