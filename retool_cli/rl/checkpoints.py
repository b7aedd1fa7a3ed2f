"""What a run keeps on disk: checkpoints (HF safetensors + optimizer, scheduler, RNG and data cursor) for an
exact resume, and the metrics log (metrics.jsonl, TensorBoard, W&B) with its plots."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from retool_cli import stops
from retool_cli.checkpoint_paths import checkpoints, write_record
from retool_cli.errors import ConfigError
from retool_cli.files import append_jsonl, read_jsonl_log, umask, write_jsonl
from retool_cli.model.loading import is_lora, merged_state_dict
from retool_cli.rl.distributed import load_optimizer_state


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


# ------------------------------------------------------------------ logs


class MetricsLog:
    """metrics.jsonl (always); TensorBoard and W&B when configured (trainer.tensorboard, trainer.wandb_project)."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.rollouts_path = run_dir / "rollouts.jsonl"
        self.tensorboard = self.wandb = None
        try:
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
            if wandb_project:
                import wandb

                self.wandb = wandb.init(
                    project=wandb_project,
                    dir=str(run_dir),
                    config=config,
                    resume="allow",
                    id=run_dir.name.replace("/", "-"),
                )
        except ImportError as exc:
            raise ConfigError(
                f"{exc.name} is not installed: pip install -e '.[{'wandb' if wandb_project else 'tensorboard'}]'"
            ) from exc

    def rows(self) -> list[dict[str, Any]]:
        return read_jsonl_log(self.path)

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be redone identically), in
        metrics.jsonl and rollouts.jsonl."""
        for path in (self.path, self.rollouts_path):
            if path.exists():
                write_jsonl(path, [row for row in read_jsonl_log(path) if row["step"] <= step])

    def write(self, row: dict[str, Any], rollouts: list[dict[str, Any]] | None = None) -> None:
        """A step's metrics, and the trajectories kept of it (each tagged with the step) in rollouts.jsonl."""
        with stops.critical():  # both logs or neither, as far as a stop signal goes
            if rollouts:
                append_jsonl(self.rollouts_path, [{"step": row["step"], **r} for r in rollouts])
            append_jsonl(self.path, [row])
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tensorboard is not None:
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, value, row["step"])
        if self.wandb is not None:
            self.wandb.log(scalars, step=row["step"])


def plot_metrics(rows: list[dict[str, Any]], keys: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(k in r for r in rows)]
    if not present:
        return
    fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 3.2), squeeze=False)
    for ax, key in zip(axes[0], present, strict=True):
        points = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
