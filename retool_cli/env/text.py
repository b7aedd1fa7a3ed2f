"""Text a tool returns, made safe for the model's context: protocol tags and special tokens broken so printed
text can never close a turn or open a fake one, and a length cap that keeps head and tail. Below both the
protocols (env/protocol.py) and the tools (env/tools.py), which use it."""

from __future__ import annotations

from typing import Any

PROTOCOL_TAGS = [
    "<code>",
    "</code>",
    "<interpreter>",
    "</interpreter>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]


def neutralize(text: str, tokenizer: Any) -> str:
    """Printed text must never close a turn or open a fake one: break every special token and protocol tag
    the tokenizer would otherwise read as one ("<|im_end|>" -> "< |im_end|>")."""
    dangerous = set(PROTOCOL_TAGS) | set(getattr(tokenizer, "all_special_tokens", []))
    dangerous |= {t for t in getattr(tokenizer, "get_added_vocab", dict)() if t.startswith("<")}
    for token in sorted(dangerous, key=len, reverse=True):
        if token and token in text:
            text = text.replace(token, token[0] + " " + token[1:])
    return text


def cap_tokens(text: str, tokenizer: Any, max_tokens: int) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    keep = max(1, max_tokens - 16) // 2
    head, tail = tokenizer.decode(ids[:keep]), tokenizer.decode(ids[-keep:])
    return f"{head}\n...[{len(ids) - 2 * keep} tokens cut]...\n{tail}"
