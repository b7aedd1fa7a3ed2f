"""What SFT and RL share: optimizer and schedule, token-budget micro-batches, per-token logprobs,
checkpoints (HF safetensors + optimizer, scheduler, RNG and data cursor) with exact resume, metric logs."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from retool_cli import prefix_sharing
from retool_cli.algorithms import token_logprobs
from retool_cli.distributed import load_optimizer_state
from retool_cli.errors import ConfigError
from retool_cli.modeling import is_lora, merged_state_dict


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer, warmup: int, total: int, kind: str
) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "cosine":
            progress = (step - warmup) / max(1, total - warmup)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group sample indices so that (longest in group) x (group size) stays within the budget; sorting by
    length first keeps the padding small."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def pad_right(seqs: list[list[int]], value: int, device: torch.device) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out.to(device)


def sequence_logprobs(
    model: Any,
    sequences: list[list[int]],
    pad_id: int,
    device: torch.device,
    temperature: float = 1.0,
    bf16_autocast: bool = False,
    entropy: str = "off",
    prompt_lens: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Logprobs of every next token of right-padded sequences (B, L-1), its validity mask (B, L-1), and the
    policy's entropy at each position (B, L-1) or None (`entropy`: see algorithms.token_logprobs).
    With `bf16_autocast`, matmuls run in bfloat16 over the fp32 weights (mixed precision); the log-softmax
    is always taken in fp32. Given `prompt_lens` and sequences that repeat a prompt (GRPO groups), each
    prompt runs once (prefix_sharing) and only positions predicting response tokens are filled (0 elsewhere)."""
    ids = pad_right(sequences, pad_id, device)  # (B, L)
    attention = pad_right([[1] * len(s) for s in sequences], 0, device)
    if prompt_lens is not None and prefix_sharing.usable(model) and _repeats_a_prompt(sequences, prompt_lens):
        logp, entropy_per_token = _grouped_logprobs(
            model, sequences, prompt_lens, pad_id, device, temperature, bf16_autocast, entropy, ids.shape[1] - 1
        )
        return logp, attention[:, 1:], entropy_per_token
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # (B, L-1, V)
    logp, entropy_per_token = token_logprobs(logits, ids[:, 1:], temperature, entropy)
    return logp, attention[:, 1:], entropy_per_token


def _repeats_a_prompt(sequences: list[list[int]], prompt_lens: list[int]) -> bool:
    return len({tuple(s[:n]) for s, n in zip(sequences, prompt_lens, strict=True)}) < len(sequences)


def _grouped_logprobs(
    model: Any,
    sequences: list[list[int]],
    prompt_lens: list[int],
    pad_id: int,
    device: torch.device,
    temperature: float,
    bf16_autocast: bool,
    entropy: str,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` through prefix_sharing: response positions filled, in the same (B, width) layout."""
    prompts = [s[:n] for s, n in zip(sequences, prompt_lens, strict=True)]
    responses = [s[n:] for s, n in zip(sequences, prompt_lens, strict=True)]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
        logits = prefix_sharing.response_logits(model, prompts, responses, pad_id, device)  # (B, R, V)
    targets = pad_right(responses, pad_id, device)  # (B, R)
    logp, entropy_per_token = token_logprobs(logits, targets, temperature, entropy)  # (B, R)
    # Response token j of row b sits at sequence index n_b + j, so it is predicted at position n_b - 1 + j.
    starts = torch.tensor(prompt_lens, device=device)[:, None] - 1
    offset = torch.arange(width, device=device)[None] - starts  # (B, width): j at each position
    inside = (offset >= 0) & (offset < torch.tensor([len(r) for r in responses], device=device)[:, None])
    index = offset.clamp(0, targets.shape[1] - 1)
    logp = logp.gather(1, index) * inside
    if entropy_per_token is not None:
        entropy_per_token = entropy_per_token.gather(1, index) * inside
    return logp, entropy_per_token


def response_mask_matrix(
    prompt_lens: list[int], response_masks: list[list[int]], width: int, device: torch.device
) -> torch.Tensor:
    """(B, width) mask aligned with `sequence_logprobs`: position t predicts token t+1."""
    out = torch.zeros((len(prompt_lens), width), dtype=torch.float32)
    for i, (start, mask) in enumerate(zip(prompt_lens, response_masks, strict=True)):
        out[i, start - 1 : start - 1 + len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return out.to(device)


# ------------------------------------------------------------------ checkpoints


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
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
    state: dict,
    keep_last: int,
    full: tuple[dict | None, dict | None] = (None, None),
) -> Path:
    """checkpoints/step_N/: the model in HF safetensors (loadable by from_pretrained and vLLM; LoRA adapters merged
    in, and also saved alone under adapter/), the tokenizer, and trainer_state.pt (optimizer, scheduler, RNG,
    data cursor). `full`: the gathered model and optimizer state of a sharded (FSDP2) policy. Written to a
    temporary folder, then renamed."""
    root = run_dir / "checkpoints"
    final, staging = root / f"step_{step}", root / f".step_{step}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model_state, optimizer_state = full
    if is_lora(model):  # merged weights for from_pretrained / vLLM / eval, the adapter itself for resume
        model.get_base_model().save_pretrained(staging, state_dict=merged_state_dict(model))
        model.save_pretrained(staging / "adapter")
    else:
        model.save_pretrained(staging, state_dict=model_state)
    tokenizer.save_pretrained(staging)
    optimizer_state = optimizer.state_dict() if optimizer_state is None else optimizer_state
    torch.save(
        {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "rng": rng_state(), "step": step, **state},
        staging / "trainer_state.pt",
    )
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for old in sorted(root.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    steps = sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    complete = [p for p in steps if (p / "trainer_state.pt").exists()]
    return complete[-1] if complete else None


def load_trainer_state(checkpoint: Path, model: Any, optimizer: Any, scheduler: Any) -> dict:
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    load_optimizer_state(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state


# ------------------------------------------------------------------ logs


class MetricsLog:
    """metrics.jsonl (always); TensorBoard and W&B when configured (trainer.tensorboard, trainer.wandb_project)."""

    def __init__(
        self, run_dir: Path, tensorboard: bool = False, wandb_project: str | None = None, config: dict | None = None
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
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

    def rows(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be redone identically)."""
        kept = [row for row in self.rows() if row["step"] <= step]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))

    def write(self, row: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tensorboard is not None:
            for key, value in scalars.items():
                self.tensorboard.add_scalar(key, value, row["step"])
        if self.wandb is not None:
            self.wandb.log(scalars, step=row["step"])


def plot_metrics(rows: list[dict], keys: list[str], path: Path) -> None:
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
