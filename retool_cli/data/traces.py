"""Cold-start SFT traces as token ids + loss masks, rendered with the run's protocol and the model's own
chat template, so that SFT teaches exactly the text RL samples and an SFT checkpoint is directly an RL
starting point.

A trace is a question and segments in order: ("model", text) the model writes, ("call", code) the model's
call of the interpreter (written as the protocol writes it: <code> tags, or the template's <tool_call>
JSON / XML), ("tool", output) what the interpreter printed (rendered as the agent loop renders a result:
neutralised, capped, in the protocol's result segment; masked from the loss).

Sources:
- synthesised for the synthetic task: traces that call the interpreter (code, its real output, the boxed
  answer) and traces that answer directly ("mental"), as the headroom RL needs;
- `sft.traces_file`: a local .jsonl / .json / .parquet file or a `datasets` folder, or a hub dataset id (at
  `sft.traces_revision`), with a `messages` column. Two shapes are read: chat messages with tool calls
  (user, assistant with `tool_calls`, tool, ..., assistant), and the ReTool-SFT shape (JoeYing/ReTool-SFT:
  [user, assistant], the question after `*user question:*`, the response interleaving <code>```python ...```
  </code> and <interpreter>...</interpreter>).

Token boundaries: each model turn (its text and the call that ends it) is encoded on its own and the result
segment after it, as the loop appends them. With Qwen's BPE, `</code>` is not a token: encoded alone, the
turn ends in `>`, the token at which the engines stop; the interpreter's text starts right after it.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retool_cli.data.dataset import MathExample, read_hub_rows, read_local_rows
from retool_cli.env.protocol import parse_tagged_call, tool_call
from retool_cli.env.text import cap_tokens, neutralize
from retool_cli.errors import DataError
from retool_cli.interfaces import ToolProtocol

# ReTool-SFT's user message: its instructions, the question after this line, then a reminder of the answer format
RETOOL_QUESTION_MARK, RETOOL_REMINDER = "*user question:*", "Remember to place the final answer"
_TAGGED_STEP = re.compile(r"<code>(.*?)</code>(?:\s*<interpreter>\n?(.*?)\n?</interpreter>\n?)?", re.DOTALL)


@dataclass
class Trace:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1 = the model writes it (trained), 0 = tool output (masked)

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def render(
    protocol: ToolProtocol, question: str, segments: list[tuple[str, str]], max_tool_tokens: int | None = None
) -> Trace:
    """segments: ("model", text) | ("call", code) | ("tool", output), in order; the last model text should end
    the answer (with the eos token). `max_tool_tokens`: cap tool output as the loop does (rollout's setting)."""
    tokenizer = protocol.tokenizer
    ids: list[int] = []
    mask: list[int] = []
    turn = ""  # the model's text since the last tool result: one piece, as sampled in one turn

    def close_turn() -> None:
        nonlocal turn
        piece = tokenizer.encode(turn, add_special_tokens=False) if turn else []
        ids.extend(piece)
        mask.extend([1] * len(piece))
        turn = ""

    for kind, value in segments:
        if kind == "model":
            turn += value
        elif kind == "call":
            turn = turn.rstrip("\n") + protocol.call_text(value)
        elif kind == "tool":
            close_turn()
            text = neutralize(value.rstrip("\n"), tokenizer)
            if max_tool_tokens:
                text = cap_tokens(text, tokenizer, max_tool_tokens)
            piece = protocol.result_ids(text)
            ids.extend(piece)
            mask.extend([0] * len(piece))
        else:
            raise ValueError(f"unknown segment kind {kind!r}")
    close_turn()
    return Trace(protocol.prompt_ids(question), ids, mask)


def synthetic_traces(
    examples: list[MathExample], protocol: ToolProtocol, code_fraction: float, seed: int
) -> list[Trace]:
    """One trace per example: with probability `code_fraction` it computes with the interpreter, otherwise it
    states the answer directly."""
    eos = protocol.tokenizer.eos_token
    rng = random.Random(seed)
    traces = []
    without = [e.id for e in examples if not e.solution_code]
    if without:
        raise DataError(
            f"{len(without)} training problems (first: {without[0]!r}) have no 'solution_code' to write a trace "
            "from: synthesised traces need the synthetic task's problems as `retool prepare` writes them "
            "(data.source=synthetic); for other data give sft.traces_file"
        )
    for example in examples:
        if rng.random() < code_fraction:
            segments = [
                ("model", "Let me compute it."),
                ("call", example.solution_code),
                ("tool", example.answer),  # what running that code prints (checked in the tests)
                ("model", f"The result is {example.answer}, so the answer is \\boxed{{{example.answer}}}.{eos}"),
            ]
        else:
            segments = [("model", f"The answer is \\boxed{{{example.answer}}}.{eos}")]
        traces.append(render(protocol, example.question, segments))
    return traces


# ------------------------------------------------------------------ traces from files and the hub


def read_trace_rows(source: str, revision: str = "main", split: str = "train") -> Iterable[tuple[str, dict[str, Any]]]:
    """(where, row) of a local file or folder, or of a hub dataset when no such path exists."""
    path = Path(source).expanduser()
    hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", source) and path.suffix not in (".jsonl", ".json", ".parquet")
    if path.exists():
        rows = read_local_rows(path)
    elif hub_id and not source.startswith("."):
        rows = read_hub_rows(source, revision, split, path_key="sft.traces_file")
    else:
        raise DataError(f"sft.traces_file={source}: no such file or folder (nor a hub dataset id owner/name)")
    for row in rows:
        yield row.where, row.fields


def conversation_segments(messages: Any, where: str) -> tuple[str, list[tuple[str, str]]]:
    """The question and the segments of one `messages` list (chat messages with tool calls, or ReTool-SFT's
    tagged response). Raises DataError naming `where`."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError(f"{where}: expected a non-empty 'messages' list")
    question, segments = None, []
    for message in messages:
        if not isinstance(message, dict):
            raise DataError(f"{where}: a message is not an object")
        role, content = message.get("role"), message.get("content")
        calls = message.get("tool_calls") or []
        if not isinstance(content, str) and not (role == "assistant" and content is None and calls):
            raise DataError(f"{where}: a {role!r} message without text content")
        if role == "user" and question is None:
            question = _question(content or "")
        elif role == "assistant":
            segments += _tagged_segments(content or "", where)
            segments += [("call", _call_code(call, where)) for call in calls]
        elif role in ("tool", "interpreter"):
            segments.append(("tool", content or ""))
        elif role != "system":
            raise DataError(f"{where}: unexpected role {role!r}")
    if question is None or not segments or segments[-1][0] != "model":
        raise DataError(f"{where}: needs a user message and must end with an assistant message")
    for (kind, _), (next_kind, _) in itertools.pairwise(segments):
        if (kind == "call" and next_kind != "tool") or (kind == "tool" and next_kind == "tool"):
            raise DataError(f"{where}: each tool call must be followed by exactly one tool result (one call a turn)")
    return question, segments


def _question(content: str) -> str:
    """ReTool-SFT's user message is its own instructions, the question after `*user question:*` and a reminder
    of its answer format; the question alone is kept: the run's protocol brings its own instructions (the
    system prompt RL samples with)."""
    if RETOOL_QUESTION_MARK in content:
        content = content.split(RETOOL_QUESTION_MARK, 1)[1].split(RETOOL_REMINDER, 1)[0]
    return content.strip()


def _tagged_segments(content: str, where: str) -> list[tuple[str, str]]:
    """An assistant text, its <code> blocks as calls and the <interpreter> output after each as tool results."""
    segments: list[tuple[str, str]] = []
    at = 0
    for step in _TAGGED_STEP.finditer(content):
        call = parse_tagged_call(step.group(0)[: step.group(0).rfind("</code>") + len("</code>")])
        if call.name is None:
            raise DataError(f"{where}: {call.error}")
        if step.group(2) is None and step.end() < len(content.rstrip()):
            raise DataError(f"{where}: a <code> block without an <interpreter> result after it")
        segments += [("model", content[at : step.start()]), ("call", call.arguments["code"])]
        if step.group(2) is not None:
            segments.append(("tool", step.group(2)))
        at = step.end()
    return [*segments, ("model", content[at:])] if content[at:] or not segments else segments


def _call_code(call: Any, where: str) -> str:
    function = call.get("function", call) if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise DataError(f"{where}: a tool call's arguments are not JSON") from None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str) or not code.strip():
        raise DataError(f"{where}: a tool call without a 'code' argument")
    return code


def file_traces(
    source: str, protocol: ToolProtocol, revision: str = "main", split: str = "train", max_tool_tokens: int = 0
) -> list[Trace]:
    """Every row of `source` (sft.traces_file) rendered with the protocol; the eos token ends each answer."""
    eos = protocol.tokenizer.eos_token
    traces = []
    for where, row in read_trace_rows(source, revision, split):
        question, segments = conversation_segments(row.get("messages"), where)
        segments[-1] = ("model", segments[-1][1] + eos)
        traces.append(render(protocol, question, segments, max_tool_tokens or None))
    return traces


def dump_messages(path: str | Path, question: str, segments: list[tuple[str, str]]) -> None:
    """Append one trace as chat messages with tool calls (used to write examples and test files)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    for kind, value in segments:
        if kind == "model":
            messages.append({"role": "assistant", "content": value})
        elif kind == "call":
            if messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            messages[-1]["tool_calls"] = [tool_call(value)]
        else:
            messages.append({"role": "tool", "content": value})
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"messages": messages}) + "\n")
