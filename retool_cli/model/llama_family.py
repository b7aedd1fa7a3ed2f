"""What the hand-written fast paths (the decode loop, rollout/kv_decoder.py; the shared-prefix training forward,
rl/prefix_sharing.py) know about the architecture of a Llama-family decoder: which models they run, and the
rotary embedding they apply in place of the model module's own."""

from __future__ import annotations

from typing import Any

import torch

SUPPORTED = {"qwen2", "qwen3", "llama", "mistral"}


def supports(model: Any) -> bool:
    config = model.config
    if config.model_type not in SUPPORTED or getattr(config, "use_sliding_window", False):
        return False
    return not (config.model_type == "mistral" and getattr(config, "sliding_window", None))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of transformers' Llama-family models (rotate_half form) on x (B, N, T, D)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
