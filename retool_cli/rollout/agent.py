"""The multi-turn agent loop: the model reasons, calls a tool (the code interpreter: it writes code, the
sandbox runs it), the result goes back into the context, the model continues.

    examples x group_size --prompt_ids--> Trajectory
      a turn (the exact ids so far, the request's own seed) --> parse it -->
            answered | out of budget | a tool call --Tool.run_many--> result ids (mask 0) appended --> again

Two schedules (rollout.loop), the same trajectories:
  turns: every running trajectory generates a turn in one engine call, then their calls run, then the next
         turn (with `overlap_sandbox` as two cohorts, one's calls running while the other generates);
  async: each trajectory on its own: its turn is submitted the moment it is ready, its call runs the moment
         the turn ends, and the engine (vLLM: one step at a time) batches whatever is in flight, so a slow
         tool call holds back only its own trajectory.
A request's seed is a hash of (the batch's seed: run seed, step, round; the question; the sample; the turn),
and an engine samples a request from its prompt and seed alone, so the order in which turns and tool calls
finish changes nothing: on CPU the two schedules give the same tokens (tests/unit/test_schedules.py).

Token-in, token-out: a trajectory is the exact sampled ids plus the rendered tool segments; its history is
never re-encoded. Nothing hangs: a trajectory past rollout.trajectory_timeout_s stops (`deadline`), every
engine call has rollout.engine_timeout_s (rollout/watchdog.py). A trajectory the infrastructure failed (a
sandbox worker died, the engine dropped its request, its deadline) is marked void (`infra`): the trainer leaves
it out of the loss and of its group's statistics rather than score it as a wrong answer.

Overlapped training (rl/overlap.py) passes `weights_for_phase`, and the loop records the version it returns with
every token sampled (Trajectory.response_versions). With partial rollouts (rollout.partial; turns loop) a batch has
two phases: each trajectory samples its first rollout.partial_turns turns, and at most rollout.partial_tokens
model tokens, in phase 0 (the batch's own weights); a turn that reaches the token budget is cut there and kept.
Once no running trajectory is left in phase 0 the loop asks for phase 1's weights (the engine may load newer
ones) and the rest samples with them; a cut turn continues from its tokens with a seed of its own. The engine
looked for stop strings only in what it generated, so one that straddles the cut ends the turn where it
completes, as the engine would have ended an uncut turn.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from retool_cli.config import RolloutConfig, RolloutEngine, RolloutLoop
from retool_cli.data.dataset import MathExample
from retool_cli.env.reward import Response, RewardScore, answer_text, extract_boxed
from retool_cli.errors import EngineRequestError
from retool_cli.faults import jitter
from retool_cli.interfaces import (
    Engine,
    EngineStream,
    Generation,
    Sampling,
    StreamingEngine,
    Tool,
    ToolCall,
    ToolOutput,
    ToolProtocol,
)
from retool_cli.rollout.watchdog import time_limit

STOP_REASONS = (
    "answered",
    "length",
    "turn_budget",
    "code_budget",
    "invalid_tool_call",
    "context_overflow",
    "deadline",  # still running at rollout.trajectory_timeout_s (void)
    "infra_error",  # a tool's infrastructure failed or the engine dropped the request (void)
)
INFRA_CAUSES = ("sandbox", "engine", "deadline", "judge")  # why a trajectory is void (Trajectory.infra)


@dataclass
class Trajectory:
    example: MathExample
    sample_index: int  # index within the question's group
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)  # everything after the prompt, tool output included
    response_mask: list[int] = field(default_factory=list)  # 1 = sampled by the model, 0 = tool output
    response_logprobs: list[float] = field(default_factory=list)  # sampling logprobs (0.0 where mask is 0)
    # the weight version that sampled each response token (-1 for tool output); empty unless the caller gives
    # versions (overlapped training: run_rollouts' weights_for_phase)
    response_versions: list[int] = field(default_factory=list)
    turns: int = 0  # generation segments
    open_turn: int | None = None  # where a turn cut at rollout.partial_tokens starts in response_ids (it continues)
    tool_calls: list[ToolCall] = field(default_factory=list)  # the well-formed calls, in order
    tool_outputs: list[ToolOutput] = field(default_factory=list)  # what each returned (tool_calls[i]'s)
    invalid_calls: int = 0
    void_turns: int = 0  # turns that neither made a well-formed call nor answered in \boxed{} (SimpleTIR)
    segments: list[tuple[str, str]] = field(default_factory=list)  # ("model" | "tool", decoded text), in order
    stop_reason: str = ""  # one of STOP_REASONS once finished
    truncated: bool = False  # stopped by a length limit in the middle of a turn or a tool result
    infra: str = ""  # one of INFRA_CAUSES when the infrastructure failed it: no evidence about the policy

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
        "infra_failure": t.infra or ("judge" if s.timed_out else ""),
        "turns": t.turns,
        "invalid_calls": t.invalid_calls,
        "void_turns": t.void_turns,
        **tool_fields,
        "prompt_tokens": len(t.prompt_ids),
        "response_tokens": len(t.response_ids),
        "model_tokens": sum(t.response_mask),
        "stop_reason": t.stop_reason,
        "segments": [list(segment) for segment in t.segments],
    }


def request_seed(batch_seed: int, question: str, sample_index: int, turn: int, continued: bool = False) -> int:
    """The sampling seed of one request: a hash of (the batch's seed, the question (its id, and which occurrence
    of it in the batch), the sample, the turn, and whether it continues a turn cut by partial rollouts), so that
    no schedule, batch composition or completion order changes what a trajectory samples. 63 bits (vLLM's and
    torch's generators take them)."""
    key = f"{batch_seed}|{question}|{sample_index}|{turn}{'|continued' if continued else ''}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def loop_of(cfg: RolloutConfig) -> str:
    """`async` or `turns`: rollout.loop, with auto resolved (async with vLLM, turns with hf: README, Rollout loops).
    A vLLM engine spanning processes (rollout.vllm_tensor_parallel_size > 1) takes turns: each of its processes
    schedules the same requests itself, so they must arrive in the same batches everywhere, which the async
    loop (requests as tool calls return) cannot promise. Partial rollouts (rollout.partial) take turns too: a
    batch switches weights between rounds, once its trajectories got that far."""
    if cfg.loop is RolloutLoop.auto:
        takes_turns = cfg.engine is RolloutEngine.hf or cfg.vllm_tensor_parallel_size > 1 or cfg.partial
        return "turns" if takes_turns else "async"
    return str(cfg.loop.value)


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
    weights_for_phase: Callable[[int], int] | None = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Sample `group_size` trajectories per example (grouped: example 0's samples first), calling `tools` (the
    protocol's calls name them; none with protocol=none), scheduled as rollout.loop says. Returns the
    trajectories and the batch's rollout metrics. `weights_for_phase(phase)`: readies the engine's weights for
    phase 0 (the batch's own) or 1 (partial rollouts' tail) and returns their version, which each sampled token
    records; asked before every round (rollout.loop=async: once, for phase 0, and only without rollout.partial)."""
    group = group_size or cfg.group_size
    base = sampling or Sampling(cfg.temperature, cfg.top_p, cfg.top_k, seed)
    trajectories = [Trajectory(ex, j, protocol.prompt_ids(ex.question)) for ex in examples for j in range(group)]
    for t in trajectories:
        if len(t.prompt_ids) >= max_context_tokens:
            t.stop_reason, t.truncated = "context_overflow", True
    occurrence: Counter[str] = Counter()
    questions = []  # each trajectory's question key: its id, and which occurrence of it in the batch
    for ex in examples:
        questions += [f"{ex.id}#{occurrence[ex.id]}"] * group
        occurrence[ex.id] += 1
    by_trajectory = dict(zip(map(id, trajectories), questions, strict=True))
    loop = _Loop(engine, protocol, tools, cfg, base, max_context_tokens, by_trajectory, weights_for_phase)
    for tool in tools:
        tool.reset()
    if loop_of(cfg) == "async":
        if loop.partial:
            raise ValueError("partial rollouts need rollout.loop=turns, whose rounds keep a batch's phases apart")
        # without partial rollouts every token has the batch's own weights: readied once, recorded on every token
        version = -1 if weights_for_phase is None else weights_for_phase(0)
        with _open_stream(engine, protocol.stop_strings, base) as stream:
            _run_async(loop, trajectories, stream, version)
    else:
        _run_turns(loop, trajectories, overlap=cfg.overlap_sandbox and bool(tools))
    return trajectories, loop.metrics(trajectories)


def _run_turns(loop: _Loop, trajectories: list[Trajectory], overlap: bool) -> None:
    """rollout.loop=turns: a round is one engine call for every running trajectory of a cohort in the batch's
    current phase, then the round's tool calls (each tool's together); with `overlap`, two cohorts, one's calls
    running while the other generates."""
    cohorts = [trajectories[0::2], trajectories[1::2]] if overlap else [trajectories]
    with _tool_pool(1) as worker:
        pending: list[Future[Any] | None] = [None] * len(cohorts)
        idle_passes = 0
        while True:
            progressed = False
            for c, cohort in enumerate(cohorts):
                future = pending[c]
                if future is not None:  # this cohort's calls ran while the other cohort generated
                    started = time.perf_counter()
                    with contextlib.suppress(FutureTimeout):  # past the deadline: stopped below
                        loop.apply_tool_results(future.result(timeout=loop.time_left()))
                    loop.wait_tools_s += time.perf_counter() - started
                    pending[c] = None
                running = [t for t in cohort if not t.stop_reason]
                if loop.past_deadline():
                    loop.stop_at_deadline(running)
                    continue
                phase = loop.batch_phase(trajectories)
                running = [t for t in running if loop.phase(t) == phase]
                if not running:  # done, or in phase 1 while the other cohort finishes phase 0
                    continue
                progressed = True
                jobs = loop.generate_round(running, phase)
                if jobs:
                    pending[c] = worker.submit(loop.run_tools, jobs)
            if not progressed and all(p is None for p in pending):
                if not any(not t.stop_reason for t in trajectories):
                    break
                idle_passes += 1  # one pass may find a cohort waiting on a phase that has just ended
                if idle_passes > 1:
                    raise RuntimeError("the turns loop stalled with trajectories running and no call pending")
            else:
                idle_passes = 0


@contextlib.contextmanager
def _tool_pool(threads: int) -> Iterator[ThreadPoolExecutor]:
    """Threads for tool calls. Leaving it never waits: calls still running are those of trajectories stopped at
    their deadline (or of a batch that failed), and their results are not wanted."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="tools")
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _run_async(loop: _Loop, trajectories: list[Trajectory], stream: EngineStream, version: int) -> None:
    """rollout.loop=async: each trajectory's turn is submitted when it is ready, each call runs in the tool pool
    the moment its turn ends, and the engine advances whatever is in flight. `version`: the weights' (-1: not
    tracked)."""
    in_flight: set[int] = set()  # indices of the trajectories with a turn in the engine
    calls: dict[Future[list[tuple[_ToolJob, ToolOutput | None]]], _ToolJob] = {}
    index = {id(t): i for i, t in enumerate(trajectories)}

    def submit(t: Trajectory) -> None:
        i = index[id(t)]
        try:
            stream.submit(i, t.token_ids, loop.budget(t), loop.seed_of(t))
        except EngineRequestError:
            t.stop_reason, t.infra = "infra_error", "engine"
            return
        in_flight.add(i)

    with _tool_pool(max(1, min(64, len(trajectories)))) as pool:
        for t in trajectories:
            if not t.stop_reason:
                submit(t)
        while in_flight or calls:
            if loop.past_deadline():
                stream.abort(list(in_flight))
                loop.stop_at_deadline([t for t in trajectories if not t.stop_reason])
                break
            started = time.perf_counter()
            if in_flight:
                with time_limit(loop.cfg.engine_timeout_s, "an engine step of the async loop", _TIMEOUT_KEY):
                    finished = stream.poll()
                for i, gen in finished:
                    in_flight.remove(i)
                    job = loop.finish_turn(trajectories[i], gen, version)
                    if job is not None:
                        calls[pool.submit(loop.run_tools, [job])] = job
                loop.generate_s += time.perf_counter() - started  # time with requests in flight
                done = {f for f in calls if f.done()}
            else:  # nothing in flight: wait for the first call to come back
                done, _ = wait(list(calls), timeout=loop.time_left(), return_when=FIRST_COMPLETED)
                loop.wait_tools_s += time.perf_counter() - started
            for future in done:
                job = calls.pop(future)
                loop.apply_tool_results(future.result())
                if not job.trajectory.stop_reason:
                    submit(job.trajectory)


_TIMEOUT_KEY = "rollout.engine_timeout_s"


@contextlib.contextmanager
def _open_stream(engine: Engine, stop_strings: list[str], sampling: Sampling) -> Iterator[EngineStream]:
    """The engine's own stream (vLLM), or, for an engine that only samples whole batches (hf), a stream whose
    every poll generates everything submitted since the last."""
    if isinstance(engine, StreamingEngine):
        with engine.stream(stop_strings, sampling) as stream:
            yield stream
    else:
        yield _BatchStream(engine, stop_strings, sampling)


class _BatchStream:
    """EngineStream over Engine.generate: a poll is one engine call over the requests submitted since the last."""

    def __init__(self, engine: Engine, stop_strings: list[str], sampling: Sampling) -> None:
        self.engine, self.stop_strings, self.sampling = engine, stop_strings, sampling
        self.queued: dict[int, tuple[list[int], int, int]] = {}  # key -> (prompt, budget, seed)

    def submit(self, key: int, prompt: list[int], max_new_tokens: int, seed: int) -> None:
        self.queued[key] = (prompt, max_new_tokens, seed)

    def poll(self) -> list[tuple[int, Generation]]:
        jitter("engine")  # the determinism tests' random delay (faults.py; nothing outside tests)
        keys, requests = list(self.queued), list(self.queued.values())
        self.queued = {}
        prompts, budgets, seeds = [r[0] for r in requests], [r[1] for r in requests], [r[2] for r in requests]
        generations = self.engine.generate(prompts, budgets, self.stop_strings, self.sampling, seeds)
        return list(zip(keys, generations, strict=True))

    def abort(self, keys: list[int]) -> None:
        for key in keys:
            self.queued.pop(key, None)


class _Loop:
    """The per-batch state of the loop: budgets, seeds, deadline, what a turn and a tool result do, timing."""

    def __init__(
        self,
        engine: Engine,
        protocol: ToolProtocol,
        tools: list[Tool],
        cfg: RolloutConfig,
        sampling: Sampling,
        max_context: int,
        questions: dict[int, str],
        weights_for_phase: Callable[[int], int] | None = None,
    ) -> None:
        """`questions`: each trajectory's question key (its id, and which occurrence in the batch), by id(t);
        `weights_for_phase`: see run_rollouts."""
        self.engine, self.protocol, self.cfg = engine, protocol, cfg
        self.tools = {tool.name: tool for tool in tools}
        self.sampling, self.max_context, self.questions = sampling, max_context, questions
        self.tokenizer = protocol.tokenizer
        self.deadline = time.monotonic() + cfg.trajectory_timeout_s if cfg.trajectory_timeout_s > 0 else None
        self.generate_s = self.wait_tools_s = 0.0
        self.sampled_tokens = self.prompt_tokens = self.cached_tokens = 0
        self.cut_turns = 0  # turns cut at rollout.partial_tokens (each continued in phase 1)
        self.weights_for_phase = weights_for_phase
        self.partial = cfg.partial and weights_for_phase is not None  # two phases (rollout.partial)

    def seed_of(self, t: Trajectory) -> int:
        """The seed of the trajectory's next request: its turn's, or that of a cut turn's continuation."""
        return request_seed(self.sampling.seed, self.questions[id(t)], t.sample_index, t.turns, t.open_turn is not None)

    def budget(self, t: Trajectory) -> int:
        """The token budget of a trajectory's next request (the rest of a cut turn's)."""
        per_turn = self.cfg.max_tokens_per_turn or self.cfg.max_response_tokens  # None: the rest of the response
        if t.open_turn is not None:
            per_turn -= len(t.response_ids) - t.open_turn
        return min(per_turn, self.cfg.max_response_tokens - len(t.response_ids), self.max_context - len(t.token_ids))

    def phase_tokens_left(self, t: Trajectory) -> int | None:
        """Model tokens a trajectory may still sample in phase 0 (rollout.partial_tokens; None: no such budget)."""
        if not self.partial or self.cfg.partial_tokens is None:
            return None
        return self.cfg.partial_tokens - sum(t.response_mask)

    def phase(self, t: Trajectory) -> int:
        """0 while a trajectory samples with its batch's own weights; 1 once partial rollouts move it on, after
        rollout.partial_turns turns or rollout.partial_tokens model tokens."""
        left = self.phase_tokens_left(t)
        return int(self.partial and (t.turns >= self.cfg.partial_turns or (left is not None and left <= 0)))

    def batch_phase(self, trajectories: list[Trajectory]) -> int:
        """The phase the batch samples in: 1 only once no running trajectory is left in phase 0 (its weights are
        loaded once, and never unloaded for an earlier phase)."""
        return min((self.phase(t) for t in trajectories if not t.stop_reason), default=1)

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def time_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def stop_at_deadline(self, running: list[Trajectory]) -> None:
        for t in running:
            t.stop_reason, t.infra = "deadline", "deadline"

    def generate_round(self, running: list[Trajectory], phase: int) -> list[_ToolJob]:
        """rollout.loop=turns: one engine call for `running` (trajectories in batch order, all in `phase`); their
        tool calls. In phase 0 a request stops at the phase's token budget, its turn cut there."""
        version = self.ready_weights(phase)
        budgets = [self.budget(t) for t in running]
        lefts = [self.phase_tokens_left(t) if phase == 0 else None for t in running]
        caps = [budget if left is None else min(budget, left) for budget, left in zip(budgets, lefts, strict=True)]
        seeds = [self.seed_of(t) for t in running]
        started = time.perf_counter()
        jitter("engine")  # the determinism tests' random delay (faults.py; nothing outside tests)
        with time_limit(self.cfg.engine_timeout_s, "a turn's engine call", _TIMEOUT_KEY):
            generations = self.engine.generate(
                [t.token_ids for t in running], caps, self.protocol.stop_strings, self.sampling, seeds
            )
        self.generate_s += time.perf_counter() - started
        jobs = []
        for t, gen, cap, budget in zip(running, generations, caps, budgets, strict=True):
            cut = cap < budget and gen.finish_reason == "length" and len(gen.token_ids) >= cap
            jobs.append(self.finish_turn(t, gen, version, cut))
        return [job for job in jobs if job is not None]

    def ready_weights(self, phase: int) -> int:
        """The weight version of this round's phase, readied by `weights_for_phase` (-1: versions not tracked).
        Waiting for newer weights is not the trajectories' time: their deadline moves by the wait."""
        if self.weights_for_phase is None:
            return -1
        started = time.monotonic()
        version = self.weights_for_phase(phase)
        if self.deadline is not None:
            self.deadline += time.monotonic() - started
        return version

    def finish_turn(self, t: Trajectory, gen: Generation, version: int = -1, cut: bool = False) -> _ToolJob | None:
        """Append a generated turn, or part of one (sampled by weight version `version`, -1: not tracked; `cut`: at
        the phase's token budget, the turn continues in the next phase); the tool call it makes (None when the
        trajectory stops here or its turn was cut)."""
        self.sampled_tokens += len(gen.token_ids)
        self.prompt_tokens += len(t.token_ids)
        self.cached_tokens += gen.cached_tokens
        start = len(t.response_ids) if t.open_turn is None else t.open_turn
        if t.open_turn is not None:
            gen = self.end_at_straddling_stop(t.response_ids[start:], gen)
        t.response_ids += gen.token_ids
        t.response_mask += [1] * len(gen.token_ids)
        t.response_logprobs += gen.logprobs
        if version >= 0:
            t.response_versions += [version] * len(gen.token_ids)
        turn_text = self.tokenizer.decode(t.response_ids[start:])  # the whole turn's: byte-level pieces join
        if t.open_turn is None:
            t.segments.append(("model", turn_text))
        else:
            t.segments[-1] = ("model", turn_text)
        t.open_turn = start if cut else None
        if cut:
            self.cut_turns += 1
            return None
        t.turns += 1
        cfg = self.cfg
        if gen.finish_reason == "error":
            t.stop_reason, t.infra = "infra_error", "engine"
        elif gen.finish_reason == "eos":
            t.stop_reason = "answered"
            t.void_turns += extract_boxed(answer_text(turn_text)) is None
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
                t.void_turns += 1
            return _ToolJob(t, call)
        return None

    def end_at_straddling_stop(self, before: list[int], gen: Generation) -> Generation:
        """A cut turn's continuation, ended where a stop string straddling the cut completes (the engine looked
        only at its own tokens; uncut, it would have stopped at that token, which it keeps)."""
        strings = self.protocol.stop_strings
        longest = max(map(len, strings), default=0)
        for i in range(1, min(len(gen.token_ids), longest) + 1):  # a token is at least one character
            tail = self.tokenizer.decode((before + gen.token_ids[:i])[-(longest + 2) :])
            if any(s in tail for s in strings):
                if i == len(gen.token_ids) and gen.finish_reason in ("stop", "eos"):
                    return gen
                return Generation(gen.token_ids[:i], gen.logprobs[:i], "stop", gen.cached_tokens)
        return gen

    def run_tools(self, jobs: list[_ToolJob]) -> list[tuple[_ToolJob, ToolOutput | None]]:
        """Run calls, each tool's together; returns (job, its output, or None for a malformed call)."""
        jitter("tools")  # the determinism tests' random delay (faults.py; nothing outside tests)
        outputs: dict[int, ToolOutput] = {}
        for name, tool in self.tools.items():
            mine = [i for i, job in enumerate(jobs) if job.call.name == name]
            if mine:
                outputs.update(zip(mine, tool.run_many([jobs[i].call.arguments for i in mine]), strict=True))
        return [(job, outputs.get(i)) for i, job in enumerate(jobs)]

    def apply_tool_results(self, done: list[tuple[_ToolJob, ToolOutput | None]]) -> None:
        for job, output in done:
            t = job.trajectory
            if t.stop_reason:  # stopped while its call ran (the deadline)
                continue
            if output is not None:
                t.tool_calls.append(job.call)
                t.tool_outputs.append(output)
                if output.infra_error:  # the tool broke, not the code: what follows would be evidence of nothing
                    t.stop_reason, t.infra = "infra_error", "sandbox"
                    continue
            ids = self.protocol.result_ids(output.text if output is not None else job.call.error)
            if len(t.response_ids) + len(ids) >= self.cfg.max_response_tokens:
                t.stop_reason, t.truncated = "length", True
            elif len(t.token_ids) + len(ids) >= self.max_context:
                t.stop_reason, t.truncated = "context_overflow", True
            else:
                t.response_ids += ids
                t.response_mask += [0] * len(ids)
                t.response_logprobs += [0.0] * len(ids)
                if self.weights_for_phase is not None:
                    t.response_versions += [-1] * len(ids)
                t.segments.append(("tool", self.tokenizer.decode(ids)))

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        n = max(1, len(trajectories))
        tool_tokens = sum(len(t.response_mask) - sum(t.response_mask) for t in trajectories)
        metrics = {
            "rollout/turns": sum(t.turns for t in trajectories) / n,
            # the code interpreter's, zero in a run without it (protocol=none): the curves every report draws
            "rollout/code_calls": 0.0,
            "rollout/invalid_calls": sum(t.invalid_calls for t in trajectories) / n,
            "rollout/void_turns": sum(t.void_turns for t in trajectories) / n,
            "rollout/code_error_rate": 0.0,
            "rollout/code_timeout_rate": 0.0,
            "rollout/code_killed_rate": 0.0,
            "rollout/tool_result_tokens": tool_tokens / n,
            "rollout/response_tokens": sum(len(t.response_ids) for t in trajectories) / n,
            "rollout/truncated": sum(t.truncated for t in trajectories) / n,
            "rollout/cut_turns": self.cut_turns / n,  # partial rollouts: turns cut at the token budget, continued
            # wall seconds with any request in flight, and the engine's utilisation: tokens decoded per second of it
            "rollout/generate_s": self.generate_s,
            "rollout/gen_tokens_per_s": self.sampled_tokens / self.generate_s if self.generate_s else 0.0,
            "rollout/wait_tools_s": self.wait_tools_s,  # time the loop waited on tools with nothing in flight
            # prompt tokens of all turns served from the engine's prefix cache (vLLM: the earlier turns' KV)
            "rollout/prefix_cache_hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
        }
        for reason in STOP_REASONS:
            metrics[f"rollout/stop_{reason}"] = sum(t.stop_reason == reason for t in trajectories) / n
        for cause in INFRA_CAUSES[:-1]:  # the judge's time-outs are counted when scored (reward/judge_timeouts)
            metrics[f"rollout/void_{cause}"] = sum(t.infra == cause for t in trajectories) / n
        for name, tool in self.tools.items():
            metrics.update(tool.metrics([o for t in trajectories for o in t.outputs_of(name)], len(trajectories)))
        return metrics
