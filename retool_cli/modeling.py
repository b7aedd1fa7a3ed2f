"""Loading the policy: device and dtype from config, `tiny` built offline, anything else via transformers."""

from __future__ import annotations

from typing import Any

import torch

from retool_cli.config import ModelConfig
from retool_cli.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={name} but CUDA is not available here; use model.device=cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, key: str = "model.dtype") -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ConfigError(f"{key}={name!r}: use one of auto, {', '.join(dtypes)}")
    return dtypes[name]


def model_path(cfg: ModelConfig) -> str:
    if cfg.name_or_path == "tiny":
        from retool_cli.tiny import tiny_model_path

        return str(tiny_model_path())
    return cfg.name_or_path


def load_tokenizer(cfg: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path(cfg))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(cfg: ModelConfig) -> Any:
    from transformers import AutoModelForCausalLM

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    model = AutoModelForCausalLM.from_pretrained(model_path(cfg), dtype=dtype)
    return model.to(device)
