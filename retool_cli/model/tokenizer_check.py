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

import contextlib
import json
import re
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

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


def check_tokenizer(tokenizer: Any, source: str, tokenizer_class: str | None = None) -> None:
    """Raise ConfigError naming what reads wrong and how to fix it; `source` is the folder or hub id,
    `tokenizer_class` the class model.tokenizer_class forced (None: the one its files name)."""
    problems, fixes = [], []
    round_trip = _round_trip_problems(tokenizer)
    if round_trip:
        problems += round_trip
        fixes.append(_round_trip_fix(source, tokenizer_class))
    try:
        markers = _special_token_problems(tokenizer)
    except TemplateError as exc:  # e.g. Gemma's template refuses a system message; every protocol sends one
        markers = []
        problems.append(f"its chat template cannot render a system prompt and a question ({exc})")
        fixes.append("give a template that renders a system message with model.chat_template=FILE.jinja")
    if markers and round_trip:
        problems += markers  # the same misreading as the text's: its fix above is the one fix
    elif markers:
        problems += markers
        fixes.append(
            "the tokenizer files lack special tokens its chat template writes: load the model's own tokenizer "
            "files, or give the template that goes with these files in model.chat_template=FILE.jinja"
        )
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        problems.append("it has no chat template (the prompts are rendered with it)")
        fixes.append("give one with model.chat_template=FILE.jinja")
    if tokenizer.eos_token_id is None:
        problems.append("it has no eos token (an answer could not end)")
        fixes.append("use the model's own tokenizer files, which name its eos_token")
    if problems:
        raise ConfigError(
            f"model.name_or_path={source}: the tokenizer does not read text right, so training on it would be "
            "training on garbage:\n  - " + "\n  - ".join(problems) + "\nFix: " + "; ".join(fixes) + "."
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
        if len(ids) != 1:
            pieces = [tokenizer.decode([i]) for i in ids]
            problems.append(
                f"{marker!r} (a chat-template marker or eos/bos/pad) is split into {len(ids)} tokens: {pieces}"
            )
        elif (back := tokenizer.decode(ids)) != marker:
            problems.append(
                f"{marker!r} (a chat-template marker or eos/bos/pad) is one token ({ids[0]}) but decodes as {back!r}"
            )
    return problems


def _round_trip_fix(source: str, tokenizer_class: str | None) -> str:
    import transformers

    if tokenizer_class:
        return (
            f"model.tokenizer_class={tokenizer_class} reads these files wrong: leave it unset, or use the model's "
            f"own tokenizer files (transformers {transformers.__version__})"
        )
    folder = Path(source)
    tokenizer_config = folder / "tokenizer_config.json"
    named = None
    if tokenizer_config.is_file():
        with contextlib.suppress(OSError, json.JSONDecodeError):
            named = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("tokenizer_class")
    fix = (
        "set model.tokenizer_class=PreTrainedTokenizerFast to read tokenizer.json as it is, or try another "
        f"transformers release (installed: {transformers.__version__})"
    )
    if named and not (folder / "config.json").is_file():
        fix = (
            f"{tokenizer_config} names tokenizer_class={named!r} and no config.json is beside it, so transformers "
            "< 5.24 builds that class (DeepSeek-R1-Distill-Qwen's files name LlamaTokenizerFast for a Qwen "
            "vocabulary: it drops spaces). Put the model's config.json in the folder, or " + fix
        )
    return fix


def check_same_tokenizer(ours: Any, engine_tokenizer: Any, engine: str) -> None:
    """An engine that loads its own tokenizer (vLLM) must read text as ours does: its stop strings are found in
    its own decoding of the ids we give it."""
    for text in PROBES:
        mine = ours.encode(text, add_special_tokens=False)
        theirs = engine_tokenizer.encode(text, add_special_tokens=False)
        if mine != theirs:
            raise ConfigError(
                f"{engine} loaded a tokenizer that reads text differently from the run's ({text!r}: {theirs[:8]} vs "
                f"{mine[:8]}); point model.name_or_path at a folder with the model's config.json and tokenizer "
                "files, so that both load the same one"
            )
