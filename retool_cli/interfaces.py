"""The interfaces core code works against, as typing.Protocols (any object with these methods fits, no base
class): an Engine samples tokens, a ToolProtocol turns questions and tool calls into tokens, a CodeRunner
runs the model's code, a Judge decides whether answers are equal. Implementations: rollout/hf_engine.py and
rollout/vllm_engine.py; env/protocol.py; env/sandbox.py; env/reward.py (Verifier)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from retool_cli.env.protocol import ToolCall
    from retool_cli.env.reward import Verdict
    from retool_cli.env.sandbox import ExecResult
    from retool_cli.rollout.hf_engine import Generation, Sampling


class Engine(Protocol):
    def generate(
        self, prompts: list[list[int]], max_new_tokens: list[int], stop_strings: list[str], sampling: Sampling
    ) -> list[Generation]:
        """Continue each prompt (token ids) by at most its budget of new tokens, stopping at EOS or a stop string."""

    def update_weights(self, policy: Any) -> None:
        """Sample from the policy's current weights from now on (after an optimizer step)."""

    def sleep(self) -> None:
        """Free what sampling holds (vLLM's KV cache) while the trainer runs; wake_up() restores it."""

    def wake_up(self) -> None: ...


class ToolProtocol(Protocol):
    tokenizer: Any
    stop_strings: list[str]  # where a generation segment ends to let the interpreter run

    def prompt_ids(self, question: str) -> list[int]:
        """The templated prompt of a question, ending where the model's answer starts."""

    def call_text(self, code: str) -> str:
        """How the model writes a call of the interpreter after its own text (SFT traces are written so)."""

    def parse_call(self, turn_text: str) -> ToolCall:
        """The code a finished segment asks to run (or why it is malformed)."""

    def result_ids(self, result_text: str) -> list[int]:
        """The interpreter's output as the tokens appended after the segment (masked out of the loss)."""


class CodeRunner(Protocol):
    def run_many(self, codes: list[str]) -> list[ExecResult]:
        """Run each snippet in isolation; results in input order."""

    def reset_stats(self) -> None: ...

    def stats(self) -> dict[str, float]: ...


class Judge(Protocol):
    def verify_many(self, pairs: list[tuple[str, str]]) -> list[Verdict]:
        """(reference, answer) pairs -> verdicts, in input order."""

    def is_equivalent(self, gold: str, pred: str) -> bool: ...
