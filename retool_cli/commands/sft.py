"""retool sft: cold-start fine-tuning on code-interleaved traces (loss on the model's own tokens only);
`sft.resume=true` continues the latest checkpoint of an unfinished run of the same config (same batches, RNG
and optimizer state)."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

import torch

from retool_cli import stops
from retool_cli.checkpoint_paths import latest_checkpoint, record_of
from retool_cli.config import RetoolConfig, SFTConfig
from retool_cli.data.dataset import load_examples, prepare_dataset
from retool_cli.data.traces import Trace, file_traces, synthetic_traces
from retool_cli.env.protocol import build_protocol
from retool_cli.errors import DataError
from retool_cli.faults import die_if_due, pause_if_due
from retool_cli.metrics_log import MetricsLog, plot_metrics
from retool_cli.model.loading import load_policy, load_tokenizer
from retool_cli.model.precision import resolve_precision
from retool_cli.rl import packing
from retool_cli.rl.checkpoints import load_trainer_state, save_checkpoint
from retool_cli.rl.logprobs import counted_token_logprobs, micro_batch_indices, sft_positions
from retool_cli.rl.optim import build_optimizer, build_scheduler
from retool_cli.run_keys import config_key
from retool_cli.runtime import run_folder

log = logging.getLogger(__name__)


def sft_traces(config: RetoolConfig, tokenizer: Any) -> list[Trace]:
    """The traces to fine-tune on: `sft.traces_file`, else written from the training problems' programs."""
    cfg, t = config.sft, config.trainer
    protocol = build_protocol(config.protocol, tokenizer)
    if cfg.traces_file:
        traces = file_traces(
            cfg.traces_file, protocol, cfg.traces_revision, cfg.traces_split, config.rollout.max_tool_result_tokens
        )
    else:
        train = (
            load_examples(t.train_file, "trainer.train_file")
            if t.train_file
            else prepare_dataset(config.data, config.seed)[0]
        )
        traces = synthetic_traces(train, protocol, cfg.code_fraction, config.seed)
    if cfg.max_length is not None:
        kept = [t for t in traces if len(t.input_ids) <= cfg.max_length]
        if len(kept) < len(traces):
            log.warning(
                "left out %d of %d traces longer than sft.max_length=%d",
                len(traces) - len(kept),
                len(traces),
                cfg.max_length,
            )
        traces = kept
    if not traces:
        raise DataError(f"sft.traces_file={cfg.traces_file}: no traces to train on")
    return traces


def warn_of_tiny_defaults(config: RetoolConfig) -> None:
    """The SFT defaults fit the tiny smoke model (lr 2e-3 learns it in a minute, and would wreck a real one)."""
    cfg, default = config.sft, SFTConfig()
    if config.model.name_or_path != "tiny" and cfg.lr == default.lr:
        log.warning(
            "sft.lr=%g is the tiny smoke model's default; a pretrained model like %s wants ~1e-5 (verl's ReTool "
            "cold start: lr 1e-5, batch 32, max length 16384; conf/recipe/retool_qwen2.5_7b.yaml has that sft "
            "section)",
            cfg.lr,
            config.model.name_or_path,
        )


def batch_loss(
    config: RetoolConfig, model: Any, batch: list[Trace], pad_id: int, bf16_autocast: bool
) -> tuple[float, int, int]:
    """Backpropagate the batch's negative log-likelihood of the model's tokens, in micro-batches; its value,
    and the positions the passes computed and the real tokens among them."""
    device = next(model.parameters()).device
    tokens = sum(sum(t.response_mask) for t in batch)
    loss_sum, positions, real = 0.0, 0, 0
    pack = config.sft.pack_sequences
    budget = config.trainer.micro_batch_tokens
    for group in micro_batch_indices([t.input_ids for t in batch], None, budget, pack, shared_prefix=False):
        chosen = [batch[i] for i in group]
        computed, counted = sft_positions(
            model, [t.input_ids for t in chosen], [len(t.prompt_ids) for t in chosen], config.model.accelerate, pack
        )
        positions, real = positions + computed, real + counted
        logp = counted_token_logprobs(
            model,
            [t.input_ids for t in chosen],
            [len(t.prompt_ids) for t in chosen],
            [t.response_mask for t in chosen],
            pad_id,
            device,
            bf16_autocast=bf16_autocast,
            shared_prefix=config.model.accelerate,
            pack=pack,
        )  # (N,): the micro-batch's model tokens
        loss = -logp.sum() / tokens  # the mean over the whole batch's model tokens
        loss.backward()
        loss_sum += loss.item()
    return loss_sum, positions, real


def run(config: RetoolConfig, run_dir: Path) -> None:
    key = config_key(config)
    precision = resolve_precision(config, training=True)
    cfg = config.sft
    torch.manual_seed(config.seed)
    warn_of_tiny_defaults(config)
    tokenizer = load_tokenizer(config.model)
    traces = sft_traces(config, tokenizer)  # a bad or empty file fails before the model loads
    resume, outputs = cfg.resume, ("metrics.jsonl", "checkpoints", "final.txt", "sft.png")
    out_dir = run_folder(config, run_dir, key, "final.txt", "metrics.jsonl", resume=resume, outputs=outputs)
    checkpoint = latest_checkpoint(out_dir, log.warning) if cfg.resume else None
    lora = config.model.lora_rank > 0  # a LoRA run resumes from its base weights plus the checkpoint's adapter
    source = str(checkpoint) if checkpoint and not lora else config.model.name_or_path
    adapter = checkpoint / "adapter" if checkpoint and lora else None
    model = load_policy(config.model, precision, source, config.trainer.gradient_checkpointing, adapter)
    if cfg.pack_sequences:  # a model that cannot pack is refused before the first step
        packing.enable(model)
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = build_scheduler(optimizer, cfg.warmup_steps, cfg.steps, cfg.schedule)
    metrics = MetricsLog(out_dir)
    rng = random.Random(config.seed)  # draws each step's batch
    start = 0
    if checkpoint is not None:
        state = load_trainer_state(checkpoint, model, optimizer, scheduler)
        start = state["step"]
        rng.setstate(state["batch_rng"])
        log.info("resumed from %s (step %d)", checkpoint, start)
    metrics.truncate_after(start)  # what a stopped run logged after its last checkpoint (all of it, without one)
    log.info("sft: %d traces, %d steps of %d, %s -> %s", len(traces), cfg.steps, cfg.batch_size, source, out_dir)
    started = time.perf_counter()
    with stops.deferred():  # a stop signal ends the run at the end of a step (SFT steps are short)
        for step in range(start + 1, cfg.steps + 1):
            batch = rng.sample(traces, min(cfg.batch_size, len(traces)))
            step_started = time.perf_counter()
            loss, positions, real = batch_loss(config, model, batch, tokenizer.pad_token_id, precision.bf16_autocast)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.trainer.grad_clip)
            optimizer.step()
            lr = scheduler.get_last_lr()[0]  # this step's rate (the scheduler then moves to the next step's)
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if step % cfg.log_every == 0 or step == cfg.steps:
                now = time.perf_counter()
                elapsed = now - started
                row = {"step": step, "loss": loss, "grad_norm": float(grad_norm), "lr": lr, "seconds": elapsed}
                # this step's share of computed positions that were padding, and its real tokens per second
                row["train/padding_share"] = 1 - real / positions if positions else 0.0
                row["time/train_tokens_per_s"] = real / (now - step_started)
                metrics.write(row)
                log.info("step %d/%d loss %.4f lr %.2e (%.0f s)", step, cfg.steps, loss, lr, elapsed)
            pause_if_due("step", step)  # the stop tests' fixed point (RETOOL_PAUSE_AT=step:N)
            stop = stops.requested()
            if step % cfg.save_every == 0 or step == cfg.steps or (stop and config.trainer.save_on_signal):
                state = {"cursor": 0, "batch_rng": rng.getstate()}
                save_checkpoint(out_dir, step, model, tokenizer, optimizer, scheduler, state, 1, record_of(config))
            die_if_due("step", step)  # the resume test's fault injection (RETOOL_DIE_AFTER=step:N)
            if stop:
                log.warning("stopped after step %d (last checkpoint: %s)", step, latest_checkpoint(out_dir))
                raise stops.Stopped(stop)
    plot_metrics(metrics.rows(), ["loss", "grad_norm", "lr"], out_dir / "sft.png")
    (out_dir / "final.txt").write_text(f"finished at step {cfg.steps}\n")
    log.info("wrote %s", latest_checkpoint(out_dir))
