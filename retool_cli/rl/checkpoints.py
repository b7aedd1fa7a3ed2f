"""Checkpoints: HF safetensors + optimizer, scheduler, RNG and data cursor, for an exact resume. Saving and
loading only: where a run's checkpoints are, which is complete and which is the latest, is checkpoint_paths.py's."""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from retool_cli import stops
from retool_cli.checkpoint_paths import checkpoints, record_of, write_record
from retool_cli.config import RetoolConfig
from retool_cli.errors import ConfigError
from retool_cli.files import umask
from retool_cli.metrics_log import MetricsLog
from retool_cli.model.loading import is_lora, merged_state_dict
from retool_cli.rl.distributed import full_state, load_optimizer_state, world

log = logging.getLogger(__name__)
PENDING_BY_RANK = "pending_by_rank"  # several trainer processes' batches sampled ahead, each its own share


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    keep_last: int,
    record: dict[str, Any],
    full: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None),
) -> Path:
    """checkpoints/step_N/: the model in HF safetensors (loadable by from_pretrained and vLLM; LoRA adapters merged
    in, and also saved alone under adapter/), the tokenizer, and trainer_state.pt (optimizer, scheduler, RNG,
    data cursor), and last the record of what it was trained with (`record`: checkpoint_paths.record_of) with
    every file's size. `full`: the gathered model and optimizer state of a sharded (FSDP2) policy. Written to a
    temporary folder of this writer's own (pid and a random part), then renamed; a stop signal waits for it."""
    with stops.critical():
        root = run_dir / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step_*.tmp"):  # a killed writer's (the run folder has one writer: run_lock)
            shutil.rmtree(stale, ignore_errors=True)
        final = root / f"step_{step}"
        staging = Path(tempfile.mkdtemp(prefix=f".step_{step}.{os.getpid()}.", suffix=".tmp", dir=root))
        os.chmod(staging, 0o777 & ~umask())  # mkdtemp makes 0700: the checkpoint gets the usual permissions
        model_state, optimizer_state = full
        if is_lora(model):  # merged weights for from_pretrained / vLLM / eval, the adapter itself for resume
            model.get_base_model().save_pretrained(staging, state_dict=merged_state_dict(model))
            model.save_pretrained(staging / "adapter")
        else:
            model.save_pretrained(staging, state_dict=model_state)
        tokenizer.save_pretrained(staging)
        optimizer_state = optimizer.state_dict() if optimizer_state is None else optimizer_state
        trainer_state = {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rng_state()}
        torch.save({**trainer_state, "step": step, **state}, staging / "trainer_state.pt")
        write_record(staging, {"step": step, **record})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        for old in checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final


def load_trainer_state(checkpoint: Path, model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    load_optimizer_state(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


def resume(
    checkpoint: Path | None, model: Any, optimizer: Any, scheduler: Any, metrics: MetricsLog
) -> tuple[int, int, list[Any]]:
    """(step, data cursor, this process's batches sampled ahead) to continue from: the checkpoint's, with its
    optimizer, schedule and RNG restored, or (0, 0, []). The data cursor is the one after the last batch sampled
    (with trainer.max_staleness, the checkpoint keeps the batches sampled for the steps after it: rl/overlap.py;
    each process's share of them: rl/sampler.py). The metrics log (rank 0's) loses what a stopped run logged
    after it (all of it, without one)."""
    start, cursor = 0, 0
    pending: list[Any] = []
    if checkpoint is not None:
        state = load_trainer_state(checkpoint, model, optimizer, scheduler)
        start, cursor = state["step"], state["cursor"]
        pending = pending_share(state, checkpoint)
        log.info("resumed from %s (step %d)", checkpoint, start)
    metrics.truncate_after(start)
    return start, cursor, pending


def pending_share(state: dict[str, Any], checkpoint: Path) -> list[Any]:
    """This process's share of the batches a checkpoint's trainer_state keeps sampled ahead (written by
    rl/sampler.py: sampled_ahead), or []; a checkpoint written by another number of trainer processes, with
    batches ahead, is refused."""
    shares = state.get(PENDING_BY_RANK, [state.get("pending", [])])  # one process's: "pending" alone
    rank, size = world()
    if any(shares) and len(shares) != size:
        raise ConfigError(
            f"{checkpoint} keeps batches sampled ahead (trainer.max_staleness) by {len(shares)} trainer "
            f"process(es), each its own share, and this run has {size}: resume it with trainer.nproc x "
            f"trainer.nnodes = {len(shares)} processes"
        )
    return shares[rank] if any(shares) else []


class Checkpointing:
    """Writes the run's checkpoints (rank 0; FSDP2's gather is every process's) and remembers the last one."""

    def __init__(
        self, config: RetoolConfig, out_dir: Path, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any, rank: int
    ) -> None:
        self.config, self.out_dir, self.rank = config, out_dir, rank
        self.model, self.tokenizer, self.optimizer, self.scheduler = model, tokenizer, optimizer, scheduler
        self.last = 0

    def __call__(self, step: int, state: dict[str, Any]) -> None:
        """checkpoints/step_N with `state` (the data cursor; the RNG state when it is not the current one)."""
        full = full_state(self.model, self.optimizer)  # FSDP2: gathered on rank 0, by every process
        if self.rank == 0:
            t = self.config.trainer
            save_checkpoint(
                self.out_dir,
                step,
                self.model,
                self.tokenizer,
                self.optimizer,
                self.scheduler,
                state,
                t.keep_last,
                record_of(self.config),
                full,
            )
        self.last = step
