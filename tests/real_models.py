"""The real tokenizers and chat templates of the models users train (../shared/tokenizers: Qwen2.5-Instruct,
Qwen3, DeepSeek-R1-Distill-Qwen, Qwen3-Coder's template; no weights), and small random-init Qwen2 models over
their vocabularies, saved as the model folders users pass (config, weights, tokenizer files)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

SHARED_TOKENIZERS = Path(__file__).resolve().parents[2] / "shared" / "tokenizers"
TEMPLATES = SHARED_TOKENIZERS / "templates"
QWEN3_CODER_TEMPLATE = TEMPLATES / "qwen3coder-tool-chat.jinja"


def tokenizer_folder(name: str) -> Path:
    """A folder of ../shared/tokenizers; skipped where the checkout has no shared/ beside it, except in CI."""
    folder = SHARED_TOKENIZERS / name
    if folder.is_dir():
        return folder
    message = f"{folder} is missing (the real tokenizers come with the shared/ folder beside the checkout)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def load_real_tokenizer(name: str, chat_template: Path | None = None):
    """A real tokenizer as `retool` loads it (checked at load). DeepSeek-R1-Distill-Qwen's folder has no
    config.json, so it is read with PreTrainedTokenizerFast (the fix the load check names)."""
    from retool_cli.config import ModelConfig
    from retool_cli.model.loading import load_tokenizer

    tokenizer_class = "PreTrainedTokenizerFast" if name.startswith("deepseek") else None
    cfg = ModelConfig(
        name_or_path=str(tokenizer_folder(name)),
        tokenizer_class=tokenizer_class,
        chat_template=str(chat_template) if chat_template else None,
    )
    return load_tokenizer(cfg)


def build_model_folder(name: str, out: Path, seed: int = 0) -> Path:
    """A random-init Qwen2 model with the tiny model's body (hidden 64, 2 layers, head size 32: vLLM's CPU
    attention runs it) over the real vocabulary of `name`, with its tokenizer files: a folder
    `model.name_or_path` takes as it is."""
    from retool_cli.model.tiny import TINY_SPEC, build_model

    tokenizer = load_real_tokenizer(name)
    out.mkdir(parents=True, exist_ok=True)
    for file in tokenizer_folder(name).iterdir():
        shutil.copy(file, out / file.name)
    build_model(tokenizer, {**TINY_SPEC, "max_positions": 2048, "seed": seed}).save_pretrained(out)
    return out
