"""retool sft: cold-start fine-tuning on code-interleaved traces (loss on the model's own tokens only)."""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import torch

from retool_cli.config import RetoolConfig
from retool_cli.data.dataset import load_examples, prepare_dataset
from retool_cli.data.traces import message_traces, synthetic_traces
from retool_cli.env.protocol import build_protocol
from retool_cli.errors import DataError
from retool_cli.model.loading import load_policy, load_tokenizer
from retool_cli.rl.checkpoints import MetricsLog, plot_metrics, save_checkpoint
from retool_cli.rl.optim import build_optimizer, build_scheduler, micro_batches, response_mask_matrix, sequence_logprobs
from retool_cli.runtime import training_precision

log = logging.getLogger(__name__)


def run(config: RetoolConfig, run_dir: Path) -> None:
    config = training_precision(config)
    cfg = config.sft
    torch.manual_seed(config.seed)
    if not cfg.traces_file:  # the problems first: a bad or empty file fails before the model loads
        t = config.trainer
        train = (
            load_examples(t.train_file, "trainer.train_file")
            if t.train_file
            else prepare_dataset(config.data, config.seed)[0]
        )
    tokenizer = load_tokenizer(config.model)
    protocol = build_protocol(config.protocol, tokenizer)
    if cfg.traces_file:
        traces = message_traces(cfg.traces_file, protocol)
    else:
        traces = synthetic_traces(train, protocol, cfg.code_fraction, config.seed)
    if not traces:
        raise DataError(f"sft.traces_file={cfg.traces_file}: no traces to train on")
    model = load_policy(config.model, gradient_checkpointing=config.trainer.gradient_checkpointing)
    device = next(model.parameters()).device
    log.info(
        "sft: %d traces, %d steps of %d, model %s -> %s",
        len(traces),
        cfg.steps,
        cfg.batch_size,
        config.model.name_or_path,
        run_dir,
    )
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = build_scheduler(optimizer, cfg.warmup_steps, cfg.steps, cfg.schedule)
    metrics = MetricsLog(run_dir)
    rng = random.Random(config.seed)
    started = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        batch = rng.sample(traces, min(cfg.batch_size, len(traces)))
        tokens = sum(sum(t.response_mask) for t in batch)
        loss_sum = 0.0
        for group in micro_batches([len(t.input_ids) for t in batch], config.trainer.micro_batch_tokens):
            chosen = [batch[i] for i in group]
            logp, _, _ = sequence_logprobs(
                model,
                [t.input_ids for t in chosen],
                tokenizer.pad_token_id,
                device,
                bf16_autocast=config.trainer.bf16_autocast,
            )
            mask = response_mask_matrix(
                [len(t.prompt_ids) for t in chosen], [t.response_mask for t in chosen], logp.shape[1], device
            )
            loss = -(logp * mask).sum() / tokens  # the mean over the whole batch's model tokens
            loss.backward()
            loss_sum += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.trainer.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0 or step == cfg.steps:
            elapsed = time.perf_counter() - started
            metrics.write(
                {
                    "step": step,
                    "loss": loss_sum,
                    "grad_norm": float(grad_norm),
                    "lr": scheduler.get_last_lr()[0],
                    "seconds": elapsed,
                }
            )
            log.info(
                "step %d/%d loss %.4f lr %.2e (%.0f s)",
                step,
                cfg.steps,
                loss_sum,
                scheduler.get_last_lr()[0],
                elapsed,
            )
    path = save_checkpoint(run_dir, cfg.steps, model, tokenizer, optimizer, scheduler, {"cursor": 0}, keep_last=1)
    plot_metrics(metrics.rows(), ["loss", "grad_norm", "lr"], run_dir / "sft.png")
    log.info("wrote %s", path)
