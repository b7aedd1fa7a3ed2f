"""`model=tiny`: a random-init Qwen2 model and a tokenizer trained here, built offline and deterministically.

The tokenizer is byte-level BPE trained on the synthetic task's text, with one token per digit (so
arithmetic is learnable), ChatML special tokens, and the protocol tags as single tokens. Built once
into a cache folder keyed by its settings; later calls load it from there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from retool_cli.errors import RetoolError

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# Protocol tags as single (non-special) tokens: they decode as text and the model can learn them cheaply.
TAG_TOKENS = [
    "<code>",
    "</code>",
    "<interpreter>",
    "</interpreter>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "\\boxed{",
    "```python",
]

# ChatML with Hermes-style tools (the layout of Qwen2.5's template, much reduced).
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}"
    "\n\n# Tools\n<tools>\n{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>"
    "<|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|im_start|>user\n{{ message['content'] }}<|im_end|>\n"
    "{% elif message['role'] == 'assistant' %}<|im_start|>assistant\n{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls', []) %}"
    '<tool_call>\n{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{{ call['function']['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TINY_SPEC = {
    "vocab_size": 400,
    "hidden": 64,
    "layers": 2,
    "heads": 2,  # head_dim 32: the smallest head vLLM's CPU attention runs (16 is refused)
    "max_positions": 1024,
    "seed": 0,
    "version": 3,
}


def cache_root() -> Path:
    return Path(os.environ.get("RETOOL_CACHE", Path.home() / ".cache" / "retool"))


def tiny_model_path(spec: dict[str, Any] | None = None) -> Path:
    """The folder of the tiny model and tokenizer, built on first use (a few seconds)."""
    spec = {**TINY_SPEC, **(spec or {})}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_root() / f"tiny-{key}"
    if not (path / "config.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tiny-{key}-", dir=path.parent))
        try:
            tokenizer = build_tokenizer(spec["vocab_size"], spec["seed"])
            tokenizer.save_pretrained(staging)
            build_model(tokenizer, spec).save_pretrained(staging)
            if not (staging / "config.json").exists():  # transformers writes a model on rank 0 of a process group only
                raise RetoolError(
                    f"model=tiny: a process of rank > 0 cannot write {path} (transformers saves on rank 0 only); "
                    "`retool train` builds it before it starts its processes"
                )
            (staging / "retool_tiny.json").write_text(json.dumps(spec, indent=2))
            with contextlib.suppress(OSError):  # atomic; another process may have finished first
                staging.rename(path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path


def training_corpus(seed: int, n: int = 1800) -> list[str]:
    """Text in the shapes the model will see: questions, code, interpreter output, boxed answers."""
    from retool_cli.config import SyntheticConfig
    from retool_cli.data.synthetic import KINDS, generate

    rng = random.Random(seed)
    lines = []
    for _, question, answer, _ in generate(SyntheticConfig(num_examples=n, kinds=list(KINDS), difficulty=1), seed):
        lines.append(question)
        lines.append(f"Let me compute it.\n```python\nprint({rng.randint(2, 999)} * {rng.randint(2, 999)})\n```\n")
        lines.append(f"The result is {answer}. So the answer is \\boxed{{{answer}}}.")
    lines += [
        "Traceback (most recent call last): NameError: name 'x' is not defined",
        "import sympy\nfrom math import comb, gcd\nsum(int(d) for d in str(2**100))",
        "You are a helpful assistant. Solve the problem; write Python code when a computation is hard.",
    ]
    return lines


def build_tokenizer(vocab_size: int, seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(seed), trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        padding_side="left",
        model_max_length=TINY_SPEC["max_positions"],
    )
    hf.add_tokens(TAG_TOKENS)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_model(tokenizer: Any, spec: dict[str, Any]) -> Any:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    # its own random stream: building on first use must leave the run's as it would be with the model cached
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        config = Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=spec["hidden"],
            intermediate_size=spec["hidden"] * 4,
            num_hidden_layers=spec["layers"],
            num_attention_heads=spec["heads"],
            num_key_value_heads=spec["heads"],
            max_position_embeddings=spec["max_positions"],
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model
