"""The tool seam: a second tool, written here alone, goes through the protocol, the agent loop, the rows and the
metrics beside the code interpreter, with no change anywhere else."""

from __future__ import annotations

import ast
import operator
from typing import Any, ClassVar

from retool_cli.config import Isolation, RolloutConfig, SandboxConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.protocol import ChatToolProtocol
from retool_cli.env.reward import RewardScore
from retool_cli.env.sandbox import Sandbox
from retool_cli.env.tools import CODE_INTERPRETER_SCHEMA, CodeInterpreter
from retool_cli.interfaces import ToolOutput
from retool_cli.rollout.agent import run_rollouts, sample_row
from tests.scripted import ScriptedEngine

EOS = "<|im_end|>"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class Calculator:
    """Integer arithmetic (+, -, *) on one expression: the whole of a new tool."""

    name = "calculator"
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an integer expression with + - *.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }

    def __init__(self) -> None:
        self.batches: list[int] = []  # how many calls each run_many got

    def reset(self) -> None:
        self.batches = []

    def run_many(self, calls: list[dict[str, Any]]) -> list[ToolOutput]:
        self.batches.append(len(calls))
        return [self._run(call["expression"]) for call in calls]

    def _run(self, expression: str) -> ToolOutput:
        def value(node: ast.AST) -> int:
            if isinstance(node, ast.Constant) and isinstance(node.value, int):
                return node.value
            if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
                return _OPS[type(node.op)](value(node.left), value(node.right))
            raise ValueError(ast.dump(node))

        try:
            return ToolOutput(str(value(ast.parse(expression, mode="eval").body)), "ok")
        except (SyntaxError, ValueError):
            return ToolOutput(f"cannot evaluate {expression!r}", "error")

    def row(self, outputs: list[ToolOutput]) -> dict[str, float]:
        return {"calculator_calls": len(outputs)}

    def metrics(self, outputs: list[ToolOutput], trajectories: int) -> dict[str, float]:
        return {"rollout/calculator_calls": len(outputs) / max(1, trajectories)}


def _call(name: str, argument: str, value: str) -> str:
    return (
        f'Let me use a tool.\n<tool_call>\n{{"name": "{name}", "arguments": {{"{argument}": "{value}"}}}}\n</tool_call>'
    )


def test_a_second_tool_runs_beside_the_interpreter(tokenizer) -> None:
    calculator = Calculator()
    protocol = ChatToolProtocol(tokenizer, "SYS", schemas=[CODE_INTERPRETER_SCHEMA, calculator.schema])
    turns = [
        _call("calculator", "expression", "12 * 34"),
        _call("code_interpreter", "code", "print(408 + 1)"),
        _call("search", "query", "408"),
        "So \\boxed{408}." + EOS,
    ]
    engine = ScriptedEngine(tokenizer, lambda context, turn: turns[turn])
    cfg = RolloutConfig(group_size=3, max_response_tokens=600, max_turns=5, max_code_calls=4, overlap_sandbox=False)
    example = MathExample("q0", "What is 12 * 34?", "408", "test")
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=1, timeout_s=5)) as sandbox:
        tools = [CodeInterpreter(sandbox, tokenizer, cfg), calculator]
        trajectories, metrics = run_rollouts([example], engine, protocol, tools, cfg, seed=0, max_context_tokens=1024)

    prompt = tokenizer.decode(trajectories[0].prompt_ids)
    assert '"name": "calculator"' in prompt and '"name": "code_interpreter"' in prompt  # both schemas rendered
    assert calculator.batches == [3]  # the round's three calls of it, run together
    for t in trajectories:
        assert t.stop_reason == "answered" and t.turns == 4
        assert [(c.name, o.status, o.text) for c, o in zip(t.tool_calls, t.tool_outputs, strict=True)] == [
            ("calculator", "ok", "408"),
            ("code_interpreter", "ok", "409"),
        ]
        assert t.invalid_calls == 1  # the unknown tool, answered with the names of the two there are
        tool_texts = [text for kind, text in t.segments if kind == "tool"]
        assert "408" in tool_texts[0] and "409" in tool_texts[1]
        assert "unknown tool 'search'" in tool_texts[2] and "code_interpreter, calculator" in tool_texts[2]
        masked = [i for i, m in enumerate(t.response_mask) if m == 0]
        assert tokenizer.decode([t.response_ids[i] for i in masked]) == "".join(tool_texts)  # tool output: mask 0
        row = sample_row(t, RewardScore(1.0, "408", True, True, False, False), 0, tools)
        assert row["calculator_calls"] == 1 and row["code_calls"] == 1 and row["code_errors"] == 0
    assert metrics["rollout/calculator_calls"] == 1.0 and metrics["rollout/code_calls"] == 1.0
    assert metrics["rollout/invalid_calls"] == 1.0


def test_a_tool_the_run_does_not_have_is_refused_to_the_model(tokenizer) -> None:
    """A protocol that renders a schema the loop has no tool for: the call is answered with an error, not run."""
    protocol = ChatToolProtocol(tokenizer, "SYS", schemas=[CODE_INTERPRETER_SCHEMA, Calculator.schema])
    turns = [_call("calculator", "expression", "1 + 1"), "\\boxed{2}" + EOS]
    engine = ScriptedEngine(tokenizer, lambda context, turn: turns[turn])
    cfg = RolloutConfig(group_size=1, max_response_tokens=300, max_turns=3, max_code_calls=2, overlap_sandbox=False)
    [t], _ = run_rollouts(
        [MathExample("q", "1 + 1?", "2", "test")], engine, protocol, [], cfg, seed=0, max_context_tokens=1024
    )
    assert t.tool_calls == [] and t.invalid_calls == 1 and "not available" in t.segments[1][1]


def test_calls_are_checked_against_their_tools_schema() -> None:
    """A required integer argument is taken as given (only required strings must be non-empty text)."""
    from retool_cli.env.protocol import parse_chat_call

    repeat = {
        "type": "function",
        "function": {
            "name": "repeat",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
                "required": ["text", "times"],
            },
        },
    }
    schemas = [CODE_INTERPRETER_SCHEMA, repeat]
    ok = parse_chat_call('<tool_call>{"name": "repeat", "arguments": {"text": "ab", "times": 3}}</tool_call>', schemas)
    assert ok.name == "repeat" and ok.arguments == {"text": "ab", "times": 3}
    missing = parse_chat_call('<tool_call>{"name": "repeat", "arguments": {"text": "ab"}}</tool_call>', schemas)
    assert missing.name is None and "needs an argument 'times'" in missing.error
    empty = parse_chat_call(
        '<tool_call>{"name": "repeat", "arguments": {"text": " ", "times": 1}}</tool_call>', schemas
    )
    assert empty.name is None and "non-empty string argument 'text'" in empty.error
