"""A run's metrics log: metrics.jsonl (and rollouts.jsonl, the trajectories kept of each step), TensorBoard and
W&B when configured, and the plots drawn from it. One writer per run: rank 0's log is real, every other
process's a no-op (so W&B is initialised once, not once per process). Torch-free (TensorBoard's writer is
imported only when asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retool_cli import stops
from retool_cli.errors import ConfigError
from retool_cli.files import append_jsonl, read_jsonl_log, write_jsonl


class MetricsLog:
    """metrics.jsonl (always); TensorBoard and W&B when configured (trainer.tensorboard, trainer.wandb_project).
    `rank`: the process's; only rank 0 opens, reads or writes anything (the others' calls do nothing)."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        config: dict[str, Any] | None = None,
        rank: int = 0,
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.rollouts_path = run_dir / "rollouts.jsonl"
        self.writer = rank == 0
        self.tensorboard = self.wandb = None
        if not self.writer:
            return
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
        return read_jsonl_log(self.path) if self.writer else []

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be redone identically), in
        metrics.jsonl and rollouts.jsonl."""
        if not self.writer:
            return
        for path in (self.path, self.rollouts_path):
            if path.exists():
                write_jsonl(path, [row for row in read_jsonl_log(path) if row["step"] <= step])

    def write(self, row: dict[str, Any], rollouts: list[dict[str, Any]] | None = None) -> None:
        """A step's metrics, and the trajectories kept of it (each tagged with the step) in rollouts.jsonl."""
        if not self.writer:
            return
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
