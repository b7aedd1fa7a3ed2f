"""The tools a policy may call, each one object (interfaces.Tool): its name and schema, how a round of its calls
runs, what the model reads back, what a trajectory's row and the batch's metrics say of it. The code interpreter
is the first; another tool is one more class like it (tests/unit/test_tools.py writes one in the test alone).

A protocol renders the schemas and parses calls by name (env/protocol.py); the agent loop groups a round's calls
by tool and runs each tool's together (rollout/agent.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from retool_cli.config import RolloutConfig
from retool_cli.env.sandbox import SandboxError
from retool_cli.env.text import cap_tokens, neutralize
from retool_cli.interfaces import CodeRunner, ToolOutput

INTERPRETER = "code_interpreter"  # what the model calls the interpreter: the schema's name, the tagged format's calls
CODE_INTERPRETER_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": INTERPRETER,
        "description": "Run Python code in a fresh interpreter and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source; print what you need."}},
            "required": ["code"],
        },
    },
}


class CodeInterpreter:
    """Python in the sandbox: each call's `code` runs in its own jailed child (env/sandbox.py); the model reads
    its output, or its error's last lines, or why it was stopped, capped to rollout.max_tool_result_tokens. A batch
    whose calls fail in the sandbox itself (not in the code) above rollout.max_sandbox_infra_error_rate stops."""

    name = INTERPRETER
    schema = CODE_INTERPRETER_SCHEMA

    def __init__(self, runner: CodeRunner, tokenizer: Any, cfg: RolloutConfig) -> None:
        """`cfg`: the rollout section (rollout.max_tool_result_tokens, rollout.max_sandbox_infra_error_rate)."""
        self.runner, self.tokenizer = runner, tokenizer
        self.max_result_tokens, self.max_infra_error_rate = cfg.max_tool_result_tokens, cfg.max_sandbox_infra_error_rate
        self.error_lines = cfg.error_tail_lines

    def reset(self) -> None:
        self.runner.reset_stats()

    def run_many(self, calls: list[dict[str, Any]]) -> list[ToolOutput]:
        results = self.runner.run_many([call["code"] for call in calls])
        outputs = [
            ToolOutput(
                format_result(r, self.tokenizer, self.max_result_tokens, self.error_lines),
                r.status,
                {"reason": r.reason, "duration_s": r.duration_s, "cached": r.cached},
                infra_error=r.infra_error,
            )
            for r in results
        ]
        self._check_health()
        return outputs

    def _check_health(self) -> None:
        stats = self.runner.stats()
        if stats["calls"] >= 8 and stats["infra_error_rate"] > self.max_infra_error_rate:
            raise SandboxError(
                f"{stats['infra_errors']:.0f} of {stats['calls']:.0f} sandbox calls in this batch failed in the "
                f"sandbox itself (above rollout.max_sandbox_infra_error_rate={self.max_infra_error_rate}); "
                "stopping instead of training without a working interpreter"
            )

    def row(self, outputs: list[ToolOutput]) -> dict[str, float]:
        statuses = Counter(o.status for o in outputs)
        return {"code_calls": len(outputs), "code_errors": statuses["error"], "code_timeouts": statuses["timeout"]}

    def metrics(self, outputs: list[ToolOutput], trajectories: int) -> dict[str, float]:
        statuses, calls = Counter(o.status for o in outputs), max(1, len(outputs))
        return {
            "rollout/code_calls": len(outputs) / max(1, trajectories),
            "rollout/code_error_rate": statuses["error"] / calls,
            "rollout/code_timeout_rate": statuses["timeout"] / calls,
            "rollout/code_killed_rate": statuses["killed"] / calls,
            # calls answered from the interpreter cache (sandbox.cache): no sandbox run
            "rollout/code_cache_hit_rate": sum(bool(o.record.get("cached")) for o in outputs) / calls,
        }


def format_result(result: Any, tokenizer: Any, max_tokens: int, error_lines: int = 12) -> str:
    """An ExecResult as the text the model reads: output, or the error's last `error_lines` lines (the
    exception itself is the last; ToRL keeps only it), or why it was stopped; capped to `max_tokens` with the
    head and tail kept."""
    if getattr(result, "infra_error", False):
        text = "Error: the interpreter failed to run this code (sandbox failure). Try again."
    elif result.status == "timeout":
        # Which clock stopped it (CPU or wall) and how much it printed before depend on the machine's load, so
        # neither reaches the model: the same seed must give the same trajectories.
        text = "TimeoutError: stopped (time limit exceeded)."
    elif result.status == "killed":
        text = (result.stdout + "\n" if result.stdout else "") + f"Killed: {result.reason}."
    elif result.status == "error":
        tail = "\n".join(result.stderr.strip().splitlines()[-error_lines:]) or result.reason
        text = (result.stdout + "\n" if result.stdout else "") + tail
    else:
        text = result.stdout if result.stdout.strip() else "(no output: print the values you need)"
    return cap_tokens(neutralize(text.rstrip("\n"), tokenizer), tokenizer, max_tokens)
