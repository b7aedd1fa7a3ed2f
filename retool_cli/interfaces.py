"""The interfaces core code works against, and the values that cross them. The interfaces are typing.Protocols
(any object with these methods fits, no base class): an Engine samples tokens, a ToolProtocol turns questions
and tool calls into tokens, a Tool is one tool the model calls (the code interpreter first), a CodeRunner runs
the model's code for it, a Judge decides whether answers are equal. Implementations: rollout/hf_engine.py and
rollout/vllm_engine.py; env/protocol.py; env/tools.py; env/sandbox.py; env/reward.py (Verifier). The values
(Sampling, Generation, ToolCall, ToolOutput, ExecResult, Verdict) and the Runtime that holds one of each live
here, so that an implementation and its callers import this module, not each other."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# ------------------------------------------------------------------ values


@dataclass
class Sampling:
    """How an Engine samples one batch."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0


@dataclass
class Generation:
    """What an Engine returns for one prompt."""

    token_ids: list[int]  # new tokens, exactly as sampled (the stop string's tokens included)
    logprobs: list[float]  # log p of each sampled token under the temperature-scaled policy
    finish_reason: str  # "eos" | "stop" (a stop string) | "length" | "error" (the engine dropped the request)
    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache (vLLM; 0 for hf)


@dataclass
class ToolCall:
    """What a ToolProtocol reads from a finished segment: the tool called and its arguments, or (name None) why
    the call is malformed, phrased for the model."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class ToolOutput:
    """What a Tool returns for one call."""

    text: str  # what the model reads (the protocol wraps it as a tool result; never a special token)
    status: str  # ok, or the tool's word for what went wrong (the interpreter's: error | timeout | killed)
    record: dict[str, Any] = field(default_factory=dict)  # what a trajectory keeps of the call (reason, duration_s)
    infra_error: bool = False  # the tool itself failed (a sandbox worker died), not the call: the sample is void


@dataclass
class ExecResult:
    """What a CodeRunner returns for one snippet."""

    stdout: str
    stderr: str
    status: str  # ok | error (exception, non-zero exit) | timeout (wall or CPU) | killed (memory, output, signal)
    duration_s: float
    reason: str = ""  # why it was not ok, in words ("memory limit exceeded", "killed by signal SIGSEGV", ...)
    exit_code: int | None = None
    truncated: bool = False  # output was cut at sandbox.max_output_bytes
    infra_error: bool = False  # the worker died or hung: counted separately from the snippet's own errors
    cached: bool = False  # answered from the interpreter cache (sandbox.cache): the same code ran before


@dataclass
class Verdict:
    """What a Judge decides for one (reference, answer) pair."""

    equivalent: bool
    timed_out: bool = False
    path: str = "fast"  # cache | fast | slow


# ------------------------------------------------------------------ interfaces


class Engine(Protocol):
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_strings: list[str],
        sampling: Sampling,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        """Continue each prompt (token ids) by at most its budget of new tokens, stopping at EOS or a stop string.
        `seeds`: each request's own sampling seed (None: sampling.seed + its index); a request's tokens depend on
        its prompt and seed, not on the other requests of the batch."""

    def update_weights(self, policy: Any) -> None:
        """Sample from the policy's current weights from now on (after an optimizer step)."""

    def sleep(self) -> None:
        """Free what sampling holds (vLLM's KV cache) while the trainer runs; wake_up() restores it."""

    def wake_up(self) -> None: ...


class EngineStream(Protocol):
    """Requests in flight, each submitted when its trajectory is ready (rollout.loop=async): the engine batches
    whatever is in flight at each step. One stream per batch of rollouts; none is left open across a weight sync."""

    def submit(self, key: int, prompt: list[int], max_new_tokens: int, seed: int) -> None:
        """Start a request (the stream's sampling and stop strings). Raises EngineRequestError if the engine
        refuses this one request."""

    def poll(self) -> list[tuple[int, Generation]]:
        """Advance the engine (one step for vLLM); the requests that finished, by key."""

    def abort(self, keys: list[int]) -> None:
        """Drop requests still in flight (a trajectory past its deadline)."""


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An Engine that also takes requests one at a time (vLLM); the agent loop dispatches on this type and
    streams through an Engine without it by whole batches."""

    def stream(self, stop_strings: list[str], sampling: Sampling) -> AbstractContextManager[EngineStream]:
        """A stream for one batch of rollouts; what is still in flight when the block ends is aborted."""


class ToolProtocol(Protocol):
    tokenizer: Any
    stop_strings: list[str]  # where a generation segment ends to let a tool run

    def prompt_ids(self, question: str) -> list[int]:
        """The templated prompt of a question, ending where the model's answer starts."""

    def call_text(self, code: str) -> str:
        """How the model writes a call of the interpreter after its own text (SFT traces are written so)."""

    def parse_call(self, turn_text: str) -> ToolCall:
        """The tool call a finished segment makes, by name with its arguments (or why it is malformed)."""

    def result_ids(self, result_text: str) -> list[int]:
        """A tool's output as the tokens appended after the segment (masked out of the loss)."""


class Tool(Protocol):
    """One tool the model may call: the code interpreter (env/tools.py) is the first. A protocol renders its
    schema and parses calls of it by name; the agent loop runs a round's calls of it together."""

    name: str  # what the model calls it (the schema's function name)
    schema: dict[str, Any]  # an OpenAI function schema: what a chat template's tools section renders

    def run_many(self, calls: list[dict[str, Any]]) -> list[ToolOutput]:
        """Run each call's arguments; outputs in input order. May raise to stop the batch (a broken tool)."""

    def reset(self) -> None:
        """Start a batch: forget what `metrics` and health checks counted."""

    def row(self, outputs: list[ToolOutput]) -> dict[str, float]:
        """What one trajectory's row says of its calls of this tool (the interpreter: code_calls, code_errors...)."""

    def metrics(self, outputs: list[ToolOutput], trajectories: int) -> dict[str, float]:
        """The batch's metrics of this tool over all its calls (the interpreter: rollout/code_calls ...)."""


class CodeRunner(Protocol):
    def run_many(self, codes: list[str]) -> list[ExecResult]:
        """Run each snippet in isolation; results in input order."""

    def reset_stats(self) -> None: ...

    def stats(self) -> dict[str, float]: ...


class Judge(Protocol):
    def verify_many(self, pairs: list[tuple[str, str]]) -> list[Verdict]:
        """(reference, answer) pairs -> verdicts, in input order."""

    def is_equivalent(self, gold: str, pred: str) -> bool: ...

    def readable_many(self, golds: list[str]) -> list[bool]:
        """Whether each reference answer reads as math (an unreadable one scores 0 whatever the answer)."""


# ------------------------------------------------------------------ what a command opens


@dataclass
class Runtime:
    """What the commands open before their loop (runtime.open_runtime) and core code samples and judges with."""

    tokenizer: Any
    protocol: ToolProtocol
    engine: Engine
    tools: list[Tool]  # the tools the protocol's calls name: the code interpreter; none with protocol=none
    judge: Judge
