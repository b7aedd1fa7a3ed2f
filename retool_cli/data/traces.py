"""Cold-start SFT traces as token ids + loss masks, rendered with the same protocol as RL rollouts,
so that an SFT checkpoint is directly an RL starting point.

Two sources:
- synthesised for the synthetic task: a mix of traces that call the interpreter (code, its real
  output, the boxed answer) and traces that answer directly ("mental"), as the headroom RL needs;
- a JSONL of chat messages (system/user/assistant/tool), as in the ReTool-SFT data.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from retool_cli.data.dataset import MathExample, _parse_json_line
from retool_cli.errors import DataError
from retool_cli.interfaces import ToolProtocol


@dataclass
class Trace:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1 = the model writes it (trained), 0 = tool output (masked)

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def render(protocol: ToolProtocol, question: str, segments: list[tuple[str, str]]) -> Trace:
    """segments: ("model", text) | ("tool", result text), in order. The last model segment should end the turn."""
    tokenizer = protocol.tokenizer
    ids: list[int] = []
    mask: list[int] = []
    for kind, text in segments:
        if kind == "model":
            piece = tokenizer.encode(text, add_special_tokens=False)
            mask += [1] * len(piece)
        elif kind == "tool":
            piece = protocol.result_ids(text)
            mask += [0] * len(piece)
        else:
            raise ValueError(f"unknown segment kind {kind!r}")
        ids += piece
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
            code = example.solution_code
            segments = [
                ("model", f"Let me compute it.\n<code>\n```python\n{code}\n```\n</code>"),
                ("tool", example.answer),  # what running that code prints (checked in the tests)
                (
                    "model",
                    f"The result is {example.answer}, so the answer is \\boxed{{{example.answer}}}.{eos}",
                ),
            ]
        else:
            segments = [("model", f"The answer is \\boxed{{{example.answer}}}.{eos}")]
        traces.append(render(protocol, example.question, segments))
    return traces


def message_traces(path: str | Path, protocol: ToolProtocol) -> list[Trace]:
    """A JSONL file, one {"messages": [...]} per line (system/user/assistant/tool roles). Assistant text is
    trained, tool messages are rendered as interpreter results and masked."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    eos = protocol.tokenizer.eos_token
    traces = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            messages = _parse_json_line(line, path, line_no).get("messages")
            if not isinstance(messages, list) or not messages:
                raise DataError(f"{path}:{line_no}: expected a non-empty 'messages' list")
            question, segments = None, []
            for message in messages:
                role, content = message.get("role"), message.get("content")
                if not isinstance(content, str):
                    raise DataError(f"{path}:{line_no}: a {role!r} message without text content")
                if role == "user" and question is None:
                    question = content
                elif role == "assistant":
                    segments.append(("model", content))
                elif role in ("tool", "interpreter"):
                    segments.append(("tool", content))
                elif role != "system":
                    raise DataError(f"{path}:{line_no}: unexpected role {role!r}")
            if question is None or not segments or segments[-1][0] != "model":
                raise DataError(f"{path}:{line_no}: needs a user message and must end with an assistant message")
            segments[-1] = ("model", segments[-1][1] + eos)
            traces.append(render(protocol, question, segments))
    return traces


def dump_messages(path: str | Path, question: str, segments: list[tuple[str, str]]) -> None:
    """Append one trace in the messages format (used to write examples and test files)."""
    messages = [{"role": "user", "content": question}]
    messages += [{"role": "assistant" if kind == "model" else "tool", "content": text} for kind, text in segments]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"messages": messages}) + "\n")
