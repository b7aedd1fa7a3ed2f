"""Refuse a tokenizer that loads but reads text wrong, before any work.

A tokenizer can load without an error and still encode garbage: DeepSeek-R1-Distill-Qwen's files name
`LlamaTokenizerFast`, and transformers 5.19, in a folder without the model's config.json, follows that name
and builds a tokenizer that drops every space (`What is 2+2?` -> `Whatis2+2?`). A model trained on that
learns nothing useful, silently. So every command that loads a tokenizer checks, in milliseconds:

- probe texts (spaces, tabs, newlines, digits, LaTeX, unicode, the protocols' tags) decode back to themselves;
- the special tokens the chat template writes (`<|im_start|>`, `<｜Assistant｜>`, ...) and eos / bos / pad are
  each one token that decodes to itself: a marker split into pieces is text to the model, not a turn boundary;
- there is a chat template, and an eos token to end an answer with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from retool_cli.errors import ConfigError

PROBES = [
    "What is 2+2? Answer: 4",
    "  two leading spaces, a\ttab,\n\nblank lines and a trailing space ",
    "Digits 0123456789, 3.14159, -42, 1e-9 and 1,000,000.",
    r"Let $f(x) = \frac{x^2}{\sqrt{2}}$; then \boxed{\dfrac{3}{4}} and \(a_{n+1} \le 2^{n}\).",
    "Unicode: café, naïve, 数学, α+β=γ, “quotes” — a dash.",
    "<code>\n```python\nprint(sum(range(10)))\n```\n</code>\n<interpreter>\n45\n</interpreter>\n",
    '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>',
    "<think>\nreasoning\n</think>\n\n<answer>\\boxed{7}</answer>",
]
# markers a chat template writes as literals: ChatML's <|...|> and DeepSeek's full-width <｜...｜>
_TEMPLATE_MARKER = re.compile(r"<\|[^|<>\s]+\|>|<｜[^｜<>\s]+｜>")


def check_tokenizer(tokenizer: Any, source: str) -> None:
    """Raise ConfigError naming what reads wrong and how to fix it; `source` is the folder or hub id."""
    problems = _round_trip_problems(tokenizer) + _special_token_problems(tokenizer)
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        problems.append("it has no chat template (the prompts are rendered with it)")
    if tokenizer.eos_token_id is None:
        problems.append("it has no eos token (an answer could not end)")
    if problems:
        import transformers

        raise ConfigError(
            f"model.name_or_path={source}: the tokenizer does not read text right, so training on it would be "
            "training on garbage:\n  - " + "\n  - ".join(problems) + "\n" + _fixes(source, transformers.__version__)
        )


def _round_trip_problems(tokenizer: Any) -> list[str]:
    for text in PROBES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        back = tokenizer.decode(ids)
        if back != text:
            return [f"{text!r} encodes to {ids[:8]}{'...' if len(ids) > 8 else ''} and decodes as {back!r}"]
    return []


def template_markers(tokenizer: Any) -> set[str]:
    """The special tokens the chat template writes into a conversation (system, user, answer), and the
    tokenizer's own eos / bos / pad. (Markers of features we never render, such as DeepSeek's tool-call
    tokens, which R1-Distill-Qwen's vocabulary lacks, are not checked.)"""
    markers = {t for t in (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) if t}
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return markers
    system, user = {"role": "system", "content": "S"}, {"role": "user", "content": "Q"}
    rendered = tokenizer.apply_chat_template([system, user], tokenize=False, add_generation_prompt=True)
    rendered += tokenizer.apply_chat_template(
        [system, user, {"role": "assistant", "content": "A"}], tokenize=False, add_generation_prompt=False
    )
    added = set(tokenizer.get_added_vocab())
    return markers | set(_TEMPLATE_MARKER.findall(rendered)) | {t for t in added if len(t) > 1 and t in rendered}


def _special_token_problems(tokenizer: Any) -> list[str]:
    problems = []
    for marker in sorted(template_markers(tokenizer)):
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) != 1 or tokenizer.decode(ids) != marker:
            pieces = [tokenizer.decode([i]) for i in ids]
            problems.append(f"{marker!r} (a chat-template marker or eos/bos/pad) is not one token: {pieces}")
    return problems


def _fixes(source: str, version: str) -> str:
    hints = [f"the installed transformers is {version}"]
    folder = Path(source)
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file() and not (folder / "config.json").is_file():
        try:
            named = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("tokenizer_class")
        except (OSError, json.JSONDecodeError):
            named = None
        hints.append(
            f"{tokenizer_config} names tokenizer_class={named!r} and there is no config.json beside it: transformers "
            "< 5.24 then follows that name (DeepSeek-R1-Distill-Qwen's files name LlamaTokenizerFast for a Qwen "
            "vocabulary, which drops spaces). Put the model's config.json in the folder, or set "
            "model.tokenizer_class=PreTrainedTokenizerFast to read tokenizer.json as it is, or upgrade transformers"
        )
    else:
        hints.append(
            "set model.tokenizer_class=PreTrainedTokenizerFast to read tokenizer.json as it is, or try another "
            "transformers release"
        )
    hints.append("a template without the model's markers can be replaced with model.chat_template=FILE.jinja")
    return "Fix: " + "; ".join(hints) + "."
