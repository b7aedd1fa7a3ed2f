"""The multi-turn agent loop: the model reasons, calls a tool (the code interpreter: it writes code, the
sandbox runs it), the result goes back into the context, the model continues.

    examples x group_size --prompt_ids--> Trajectory
      loop: engine.generate (only rows still running) --> parse the turn -->
            answered | out of budget | a tool call --tool.run_many (each tool's calls of the round
            together)--> result ids (mask 0) appended --> again

Token-in, token-out: a trajectory is the exact sampled ids plus the rendered tool segments; its
history is never re-encoded. With `overlap_sandbox`, the batch runs as two cohorts so that one
cohort's tool calls run while the other generates.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from retool_cli.config import RolloutConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.reward import Response, RewardScore
from retool_cli.interfaces import Engine, Generation, Sampling, Tool, ToolCall, ToolOutput, ToolProtocol

STOP_REASONS = ("answered", "length", "turn_budget", "code_budget", "invalid_tool_call", "context_overflow")


@dataclass
class Trajectory:
    example: MathExample
    sample_index: int  # index within the question's group
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)  # everything after the prompt, tool output included
    response_mask: list[int] = field(default_factory=list)  # 1 = sampled by the model, 0 = tool output
    response_logprobs: list[float] = field(default_factory=list)  # sampling logprobs (0.0 where mask is 0)
    turns: int = 0  # generation segments
    tool_calls: list[ToolCall] = field(default_factory=list)  # the well-formed calls, in order
    tool_outputs: list[ToolOutput] = field(default_factory=list)  # what each returned (tool_calls[i]'s)
    invalid_calls: int = 0
    segments: list[tuple[str, str]] = field(default_factory=list)  # ("model" | "tool", decoded text), in order
    stop_reason: str = ""  # one of STOP_REASONS once finished
    truncated: bool = False  # stopped by a length limit in the middle of a turn or a tool result

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def final_text(self) -> str:
        """The model's own text (tool output excluded): where the reward looks for the answer."""
        return "".join(text for kind, text in self.segments if kind == "model")

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.segments)

    def response(self) -> Response:
        """What the reward scores."""
        return Response(self.final_text, self.example.answer, self.truncated, len(self.response_ids))

    def outputs_of(self, tool: str) -> list[ToolOutput]:
        return [o for c, o in zip(self.tool_calls, self.tool_outputs, strict=True) if c.name == tool]


def sample_row(t: Trajectory, s: RewardScore, seed: int | None, tools: list[Tool]) -> dict[str, Any]:
    """One judged trajectory as samples.jsonl (eval) and rollouts.jsonl (train) keep it: what `summarize` and
    `retool report` read. `seed`: the sampling seed (eval). `segments`: ["model" | "tool", text] in order
    (tool: the tool's output as the model saw it). Each tool adds what its row says of its calls (the code
    interpreter: code_calls, code_errors, code_timeouts; zeros where the run has no interpreter)."""
    tool_fields: dict[str, float] = {"code_calls": 0, "code_errors": 0, "code_timeouts": 0}
    for tool in tools:
        tool_fields.update(tool.row(t.outputs_of(tool.name)))
    return {
        "problem_id": t.example.id,
        "sample_index": t.sample_index,
        "seed": seed,
        "question": t.example.question,
        "reference": t.example.answer,
        "answer": s.extracted,
        "correct": s.correct,
        "reward": s.reward,
        "formatted": s.formatted,
        "overlong_penalty": s.overlong_penalty,
        "truncated": t.truncated,
        "judge_timed_out": s.timed_out,
        "turns": t.turns,
        **tool_fields,
        "prompt_tokens": len(t.prompt_ids),
        "response_tokens": len(t.response_ids),
        "model_tokens": sum(t.response_mask),
        "stop_reason": t.stop_reason,
        "segments": [list(segment) for segment in t.segments],
    }


@dataclass
class _ToolJob:
    trajectory: Trajectory
    call: ToolCall  # name None: a malformed call, answered with its error


def run_rollouts(
    examples: list[MathExample],
    engine: Engine,
    protocol: ToolProtocol,
    tools: list[Tool],
    cfg: RolloutConfig,
    *,
    seed: int,
    max_context_tokens: int,
    group_size: int | None = None,
    sampling: Sampling | None = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Sample `group_size` trajectories per example (grouped: example 0's samples first), calling `tools` (the
    protocol's calls name them; none with protocol=none). Returns the trajectories and the batch's rollout
    metrics."""
    group = group_size or cfg.group_size
    base = sampling or Sampling(cfg.temperature, cfg.top_p, cfg.top_k, seed)
    trajectories = [Trajectory(ex, j, protocol.prompt_ids(ex.question)) for ex in examples for j in range(group)]
    for t in trajectories:
        if len(t.prompt_ids) >= max_context_tokens:
            t.stop_reason, t.truncated = "context_overflow", True
    loop = _Loop(engine, protocol, tools, cfg, base, max_context_tokens)
    for tool in tools:
        tool.reset()
    cohorts = [trajectories[0::2], trajectories[1::2]] if cfg.overlap_sandbox and tools else [trajectories]
    with ThreadPoolExecutor(1, thread_name_prefix="tools") as worker:
        pending: list[Future[Any] | None] = [None] * len(cohorts)
        step = 0
        while True:
            progressed = False
            for c, cohort in enumerate(cohorts):
                future = pending[c]
                if future is not None:  # this cohort's code ran while the other cohort generated
                    started = time.perf_counter()
                    done = future.result()
                    loop.wait_tools_s += time.perf_counter() - started
                    loop.apply_tool_results(done)
                    pending[c] = None
                running = [t for t in cohort if not t.stop_reason]
                if not running:
                    continue
                progressed = True
                jobs = loop.generate_round(running, seed_offset=step * len(cohorts) + c)
                if jobs:
                    pending[c] = worker.submit(loop.run_tools, jobs)
            step += 1
            if not progressed and all(p is None for p in pending):
                break
    return trajectories, loop.metrics(trajectories)


class _Loop:
    """The per-batch state of the loop: budgets, the engine and tool calls, timing."""

    def __init__(
        self,
        engine: Engine,
        protocol: ToolProtocol,
        tools: list[Tool],
        cfg: RolloutConfig,
        sampling: Sampling,
        max_context: int,
    ) -> None:
        self.engine, self.protocol, self.cfg = engine, protocol, cfg
        self.tools = {tool.name: tool for tool in tools}
        self.sampling, self.max_context = sampling, max_context
        self.tokenizer = protocol.tokenizer
        self.generate_s = self.wait_tools_s = 0.0
        self.sampled_tokens = 0

    def generate_round(self, running: list[Trajectory], seed_offset: int) -> list[_ToolJob]:
        cfg = self.cfg
        per_turn = cfg.max_tokens_per_turn or cfg.max_response_tokens  # None: the rest of the response budget
        budgets = [
            min(per_turn, cfg.max_response_tokens - len(t.response_ids), self.max_context - len(t.token_ids))
            for t in running
        ]
        sampling = Sampling(
            self.sampling.temperature,
            self.sampling.top_p,
            self.sampling.top_k,
            self.sampling.seed * 1_000_003 + seed_offset,
        )
        started = time.perf_counter()
        generations = self.engine.generate(
            [t.token_ids for t in running], budgets, self.protocol.stop_strings, sampling
        )
        self.generate_s += time.perf_counter() - started
        jobs = []
        for t, gen, budget in zip(running, generations, budgets, strict=True):
            self.sampled_tokens += len(gen.token_ids)
            t.response_ids += gen.token_ids
            t.response_mask += [1] * len(gen.token_ids)
            t.response_logprobs += gen.logprobs
            t.turns += 1
            turn_text = self.tokenizer.decode(gen.token_ids)
            t.segments.append(("model", turn_text))
            job = self._after_turn(t, gen, turn_text, budget)
            if job is not None:
                jobs.append(job)
        return jobs

    def _after_turn(self, t: Trajectory, gen: Generation, turn_text: str, budget: int) -> _ToolJob | None:
        cfg = self.cfg
        if gen.finish_reason == "eos":
            t.stop_reason = "answered"
        elif gen.finish_reason == "length":
            t.truncated = True
            t.stop_reason = "context_overflow" if len(t.token_ids) >= self.max_context else "length"
        elif len(t.tool_calls) + t.invalid_calls >= cfg.max_code_calls:
            t.stop_reason = "code_budget"
        elif t.turns >= cfg.max_turns:
            t.stop_reason = "turn_budget"
        else:
            call = self.protocol.parse_call(turn_text)
            if call.name is not None and call.name not in self.tools:  # a protocol that knows more tools
                call = ToolCall(None, error=f"Error: the tool {call.name!r} is not available in this run.")
            if call.name is None:
                t.invalid_calls += 1  # answered with the error, so the model can learn the format
            return _ToolJob(t, call)
        return None

    def run_tools(self, jobs: list[_ToolJob]) -> list[tuple[_ToolJob, ToolOutput | None]]:
        """Run the round's calls, each tool's together; returns (job, its output, or None for a malformed call)."""
        outputs: dict[int, ToolOutput] = {}
        for name, tool in self.tools.items():
            mine = [i for i, job in enumerate(jobs) if job.call.name == name]
            if mine:
                outputs.update(zip(mine, tool.run_many([jobs[i].call.arguments for i in mine]), strict=True))
        return [(job, outputs.get(i)) for i, job in enumerate(jobs)]

    def apply_tool_results(self, done: list[tuple[_ToolJob, ToolOutput | None]]) -> None:
        for job, output in done:
            t = job.trajectory
            ids = self.protocol.result_ids(output.text if output is not None else job.call.error)
            if output is not None:
                t.tool_calls.append(job.call)
                t.tool_outputs.append(output)
            if len(t.response_ids) + len(ids) >= self.cfg.max_response_tokens:
                t.stop_reason, t.truncated = "length", True
            elif len(t.token_ids) + len(ids) >= self.max_context:
                t.stop_reason, t.truncated = "context_overflow", True
            else:
                t.response_ids += ids
                t.response_mask += [0] * len(ids)
                t.response_logprobs += [0.0] * len(ids)
                t.segments.append(("tool", self.tokenizer.decode(ids)))

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        n = max(1, len(trajectories))
        tool_tokens = sum(len(t.response_mask) - sum(t.response_mask) for t in trajectories)
        metrics = {
            "rollout/turns": sum(t.turns for t in trajectories) / n,
            # the code interpreter's, zero in a run without it (protocol=none): the curves every report draws
            "rollout/code_calls": 0.0,
            "rollout/invalid_calls": sum(t.invalid_calls for t in trajectories) / n,
            "rollout/code_error_rate": 0.0,
            "rollout/code_timeout_rate": 0.0,
            "rollout/code_killed_rate": 0.0,
            "rollout/tool_result_tokens": tool_tokens / n,
            "rollout/response_tokens": sum(len(t.response_ids) for t in trajectories) / n,
            "rollout/truncated": sum(t.truncated for t in trajectories) / n,
            "rollout/generate_s": self.generate_s,
            "rollout/wait_tools_s": self.wait_tools_s,  # time the loop waited on tools (not overlapped)
            "rollout/gen_tokens_per_s": self.sampled_tokens / self.generate_s if self.generate_s else 0.0,
        }
        for reason in STOP_REASONS:
            metrics[f"rollout/stop_{reason}"] = sum(t.stop_reason == reason for t in trajectories) / n
        for name, tool in self.tools.items():
            metrics.update(tool.metrics([o for t in trajectories for o in t.outputs_of(name)], len(trajectories)))
        return metrics
