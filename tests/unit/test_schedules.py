"""The two schedules of the agent loop (rollout.loop=async | turns) sample the same trajectories whatever the
tool latencies; deadlines, engine time-outs and infrastructure failures end trajectories (or the run) the way
they should. The real sandbox throughout; the hf engine on a tiny policy trained to call the interpreter.
vLLM's stream is tested in tests/cli/test_vllm.py (on the SFT checkpoint of the smoke recipe)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from retool_cli.config import Isolation, RolloutConfig, RolloutLoop, SandboxConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.protocol import TaggedProtocol
from retool_cli.env.sandbox import Sandbox
from retool_cli.env.tools import CodeInterpreter
from retool_cli.errors import EngineTimeout
from retool_cli.interfaces import ExecResult, Generation, Sampling, ToolOutput
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rollout.agent import request_seed, run_rollouts
from retool_cli.rollout.hf_engine import HFEngine
from retool_cli.rollout.watchdog import EXIT_STUCK, time_limit
from tests.real_models import load_real_tokenizer
from tests.scripted import ScriptedEngine

ASYNC, TURNS = RolloutLoop["async"], RolloutLoop.turns
CODE = "Let me compute.\n<code>\n```python\nprint({a} * {b})\n```\n</code>"
ANSWER = "So the answer is \\boxed{{{value}}}.<|im_end|>"


def questions(n: int) -> list[MathExample]:
    return [MathExample(f"q{i}", f"What is {12 + i} * {30 + i}?", str((12 + i) * (30 + i)), "test") for i in range(n)]


class Delayed:
    """A tool that returns its inner tool's outputs after `delay(calls)` seconds."""

    def __init__(self, inner: Any, delay: Any) -> None:
        self.inner, self.delay = inner, delay
        self.name, self.schema = inner.name, inner.schema

    def run_many(self, calls: list[dict[str, Any]]) -> list[ToolOutput]:
        time.sleep(self.delay(calls))
        return self.inner.run_many(calls)

    def reset(self) -> None:
        self.inner.reset()

    def row(self, outputs: list[ToolOutput]) -> dict[str, float]:
        return self.inner.row(outputs)

    def metrics(self, outputs: list[ToolOutput], trajectories: int) -> dict[str, float]:
        return self.inner.metrics(outputs, trajectories)


def jittered(inner: Any, most_s: float) -> Delayed:
    """Calls finish after a random delay drawn from true randomness: the order in which they finish differs from
    run to run (and from the order they were made)."""
    rng = random.SystemRandom()
    return Delayed(inner, lambda calls: rng.uniform(0, most_s))


class SeededScript(ScriptedEngine):
    """A scripted model whose turns depend on each request's seed, as a sampled model's do: with it the
    schedules can agree only if every request gets the same seed under both."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, lambda context, turn: "")
        self.seeds: list[int] = []

    def generate(self, prompts, max_new_tokens, stop_strings, sampling, seeds=None):
        assert seeds is not None
        out = []
        for prompt, budget, seed in zip(prompts, max_new_tokens, seeds, strict=True):
            self.seeds.append(seed)
            text = self.turn_text(random.Random(seed))
            self.script = lambda context, turn_index: text  # noqa: B023 (called at once, below)
            out += super().generate([prompt], [budget], stop_strings, sampling)
        return out

    def turn_text(self, rng: random.Random) -> str:
        turn = CODE.format(a=rng.randint(2, 99), b=rng.randint(2, 99)) if rng.random() < 0.7 else ANSWER
        return turn.format(value=rng.randint(1, 9))


def run(engine, tokenizer, tools, loop, n=4, **overrides) -> tuple[list, dict]:
    values = {"group_size": 3, "max_response_tokens": 400, "max_turns": 5, "max_code_calls": 4, "loop": loop}
    cfg = RolloutConfig(**{**values, **overrides})
    protocol = TaggedProtocol(tokenizer, "SYS")
    return run_rollouts(questions(n), engine, protocol, tools, cfg, seed=5, max_context_tokens=1024)


def same(a: list, b: list) -> None:
    assert [t.response_ids for t in a] == [t.response_ids for t in b]
    assert [t.response_mask for t in a] == [t.response_mask for t in b]
    assert [t.stop_reason for t in a] == [t.stop_reason for t in b]
    assert [[o.text for o in t.tool_outputs] for t in a] == [[o.text for o in t.tool_outputs] for t in b]


def test_request_seeds_follow_the_request_not_the_schedule() -> None:
    seeds = {request_seed(0, q, j, turn) for q in ("q0#0", "q0#1", "q1#0") for j in range(4) for turn in range(3)}
    assert len(seeds) == 36 and all(0 <= s < 2**63 for s in seeds)
    assert request_seed(0, "q0#0", 1, 2) == request_seed(0, "q0#0", 1, 2) != request_seed(1, "q0#0", 1, 2)


def test_the_schedules_sample_the_same_trajectories_under_random_tool_latencies(tokenizer, sandbox) -> None:
    """A scripted model whose turns follow each request's seed, the real sandbox behind a tool that finishes
    calls in a random order: async (twice, with other latencies) and turns (with and without cohorts) agree
    call for call; the seeds asked for are the same set."""
    tools = [jittered(CodeInterpreter(sandbox, tokenizer, RolloutConfig()), most_s=0.05)]
    runs = {}
    schedules = (("turns", TURNS, False), ("cohorts", TURNS, True), ("a1", ASYNC, True), ("a2", ASYNC, True))
    for name, loop, overlap in schedules:
        engine = SeededScript(tokenizer)
        trajectories, metrics = run(engine, tokenizer, tools, loop, overlap_sandbox=overlap)
        runs[name] = (trajectories, sorted(engine.seeds), metrics)
    reference, seeds, _ = runs["turns"]
    assert sum(len(t.tool_calls) for t in reference) >= 8 and len({t.turns for t in reference}) >= 2
    assert all(t.stop_reason in ("answered", "code_budget", "turn_budget") for t in reference)
    for name, (trajectories, asked, metrics) in runs.items():
        same(trajectories, reference)
        assert asked == seeds, name
        assert metrics["rollout/generate_s"] > 0 and metrics["rollout/void_sandbox"] == 0


def test_both_schedules_record_the_weights_version_of_overlapped_training(tokenizer, sandbox) -> None:
    """Overlapped training passes `weights_for_phase` (rl/overlap.py). Without partial rollouts both schedules take
    it (the async one asks once, the turns one every round, always for phase 0) and give every sampled token its
    version, every tool token -1, and the same trajectories; partial rollouts switch versions between phases,
    which only the turns loop keeps apart: the async loop refuses them."""
    tools = [CodeInterpreter(sandbox, tokenizer, RolloutConfig())]
    asked: dict[str, list[int]] = {"turns": [], "async": []}
    runs = {}
    for name, loop in (("turns", TURNS), ("async", ASYNC)):
        protocol = TaggedProtocol(tokenizer, "SYS")
        cfg = RolloutConfig(group_size=3, max_response_tokens=400, max_turns=5, max_code_calls=4, loop=loop)

        def weights_for_phase(phase: int, name: str = name) -> int:
            asked[name].append(phase)
            return 7

        runs[name], _ = run_rollouts(
            questions(4),
            SeededScript(tokenizer),
            protocol,
            tools,
            cfg,
            seed=5,
            max_context_tokens=1024,
            weights_for_phase=weights_for_phase,
        )
    same(runs["async"], runs["turns"])
    assert asked["async"] == [0] and len(asked["turns"]) >= 2 and set(asked["turns"]) == {0}
    for t in runs["async"]:
        assert len(t.response_versions) == len(t.response_ids)
        assert [v for v, m in zip(t.response_versions, t.response_mask, strict=True) if m] == [7] * sum(t.response_mask)
        assert all(v == -1 for v, m in zip(t.response_versions, t.response_mask, strict=True) if not m)
    assert [t.response_versions for t in runs["async"]] == [t.response_versions for t in runs["turns"]]

    partial = RolloutConfig(group_size=3, loop=ASYNC, partial=True)
    with pytest.raises(ValueError, match="partial rollouts need rollout.loop=turns"):
        run_rollouts(
            questions(1),
            SeededScript(tokenizer),
            TaggedProtocol(tokenizer, "SYS"),
            tools,
            partial,
            seed=5,
            max_context_tokens=1024,
            weights_for_phase=lambda turn: 0,
        )


class ContinuingScript(SeededScript):
    """A scripted model that continues a cut turn where it was cut (as a model with unchanged weights would), and,
    as an engine does, looks for stop strings only in the tokens it generates: past a stop string that straddles
    the cut it keeps writing."""

    FILLER = " and then some more words"

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.turns: list[tuple[list[int], list[int]]] = []  # (a turn's prompt, the turn's ids)
        self.straddled = 0

    def turn_text(self, rng: random.Random) -> str:
        return f"Step {rng.randint(10_000, 99_999)}: " + super().turn_text(rng)  # samples begin apart

    def generate(self, prompts, max_new_tokens, stop_strings, sampling, seeds=None):
        out = []
        for prompt, budget, seed in zip(prompts, max_new_tokens, seeds, strict=True):
            begun = [(start, turn) for start, turn in self.turns if continues(prompt, start, turn)]
            if not begun:  # a new turn
                fresh = super().generate([prompt], [10_000], stop_strings, sampling, [seed])[0]
                self.turns.append((list(prompt), fresh.token_ids))
                kept = fresh.token_ids[:budget]
                finish = fresh.finish_reason if len(fresh.token_ids) <= budget else "length"
                out.append(Generation(kept, [0.0] * len(kept), finish))
                continue
            assert len({tuple(turn) for _, turn in begun}) == 1, "two samples began alike: which one goes on?"
            start, turn = begun[0]
            rest = turn[len(prompt) - len(start) :]
            finish = "eos" if rest and rest[-1] == self.tokenizer.eos_token_id else "length"
            if finish == "length" and any(s in self.tokenizer.decode(rest) for s in stop_strings):
                finish = "stop"
            elif finish == "length" and any(self.tokenizer.decode(turn).endswith(s) for s in stop_strings):
                self.straddled += 1  # the stop string began before the cut: the engine does not see it
                rest = rest + self.tokenizer.encode(self.FILLER, add_special_tokens=False)
            out.append(
                Generation(rest[:budget], [0.0] * len(rest[:budget]), finish if len(rest) <= budget else "length")
            )
        return out


def continues(prompt: list[int], start: list[int], turn: list[int]) -> bool:
    """Does `prompt` hold the turn begun at `start` cut short?"""
    n = len(start)
    return n < len(prompt) < n + len(turn) and prompt[:n] == start and prompt[n:] == turn[: len(prompt) - n]


def run_phased(engine, tokenizer, tools, n: int = 4, **overrides) -> tuple[list, list[int]]:
    """run() with overlapped training's weights: phase p samples with version 3 + p; also the phases asked for."""
    values = {"group_size": 3, "max_response_tokens": 400, "max_turns": 5, "max_code_calls": 4, "loop": TURNS}
    cfg = RolloutConfig(**{**values, **overrides})
    asked: list[int] = []

    def weights_for_phase(phase: int) -> int:
        asked.append(phase)
        return 3 + phase

    protocol = TaggedProtocol(tokenizer, "SYS")
    trajectories, _ = run_rollouts(
        questions(n), engine, protocol, tools, cfg, seed=5, max_context_tokens=1024, weights_for_phase=weights_for_phase
    )
    return trajectories, asked


def versions_of_model_tokens(t) -> list[int]:
    return [v for v, m in zip(t.response_versions, t.response_mask, strict=True) if m]


@pytest.mark.parametrize("overlap", [False, True], ids=["one cohort", "two cohorts"])
@pytest.mark.parametrize("vocabulary", ["tiny", "qwen2.5-instruct"])
def test_partial_rollouts_cut_turns_at_the_token_budget_and_continue_them(
    tokenizer, sandbox, overlap, vocabulary
) -> None:
    """rollout.partial_tokens = P: each trajectory's first P model tokens sample in phase 0, the rest in phase 1,
    a turn cut at P continuing from its tokens. With a model that continues a cut turn as it would have written
    it, the trajectories are the uncut ones token for token (tool calls, segments, turns, stop reasons), for every
    cut point, stop strings straddling the cut included (the real vocabulary spells `</code>` in pieces); the
    phases are asked for in order, 0s then 1s."""
    if vocabulary != "tiny":
        tokenizer = load_real_tokenizer(vocabulary)
    tools = [CodeInterpreter(sandbox, tokenizer, RolloutConfig())]
    whole, _ = run_phased(ContinuingScript(tokenizer), tokenizer, tools, overlap_sandbox=overlap)
    assert sum(len(t.tool_calls) for t in whole) >= 8 and all(versions_of_model_tokens(t) for t in whole)
    straddled = 0
    for cut in range(14, 40, 2):
        engine = ContinuingScript(tokenizer)
        partial, asked = run_phased(
            engine, tokenizer, tools, overlap_sandbox=overlap, partial=True, partial_turns=5, partial_tokens=cut
        )
        straddled += engine.straddled
        same(partial, whole)
        for a, b in zip(partial, whole, strict=True):
            assert (a.turns, a.segments, a.tool_calls, a.open_turn) == (b.turns, b.segments, b.tool_calls, None)
            model_tokens = sum(a.response_mask)
            assert versions_of_model_tokens(a) == [3] * min(cut, model_tokens) + [4] * (model_tokens - cut)
        assert asked == sorted(asked) and asked[0] == 0 and asked[-1] == 1, cut
    if len(tokenizer.encode("</code>", add_special_tokens=False)) > 1:
        assert straddled >= 3  # some cuts fell inside a stop string; the loop ended those turns where it completed


@pytest.fixture(scope="module")
def code_policy(tokenizer, sandbox):
    """The tiny model trained on a few code-calling trajectories: sampled at temperature 1 it writes code calls
    (of varied lengths, some malformed), and the real sandbox runs them."""
    protocol = TaggedProtocol(tokenizer, "SYS")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    texts = []
    for ex, (a, b) in zip(questions(3), [(12, 30), (13, 31), (14, 32)], strict=True):
        result = "\n<interpreter>\n" + str(a * b) + "\n</interpreter>\n"
        turns = CODE.format(a=a, b=b) + result + ANSWER.format(value=a * b)
        texts.append(protocol.prompt_ids(ex.question) + tokenizer.encode(turns, add_special_tokens=False))
    torch.manual_seed(0)
    for step in range(120):
        ids = torch.tensor([texts[step % 3]])
        optimizer.zero_grad()
        model(ids, labels=ids).loss.backward()
        optimizer.step()
    return model.eval()


def test_the_schedules_agree_on_a_sampled_policy_through_the_real_sandbox(tokenizer, sandbox, code_policy) -> None:
    """The hf engine at temperature 1 on a policy that calls the interpreter: async (through the stream that
    batches what is ready) equals turns token for token, logprobs included, under random tool latencies."""
    engine = HFEngine(code_policy, tokenizer, accelerate=True)
    interpreter = CodeInterpreter(sandbox, tokenizer, RolloutConfig())
    turns, _ = run(engine, tokenizer, [interpreter], TURNS, n=3, max_tokens_per_turn=60)
    scheduled, _ = run(engine, tokenizer, [jittered(interpreter, 0.05)], ASYNC, n=3, max_tokens_per_turn=60)
    same(turns, scheduled)
    for a, b in zip(turns, scheduled, strict=True):
        assert torch.allclose(torch.tensor(a.response_logprobs), torch.tensor(b.response_logprobs), atol=1e-5)
    assert sum(len(t.tool_calls) for t in turns) >= 3 and len({len(t.response_ids) for t in turns}) >= 3


def test_a_cut_turn_continues_on_the_real_engine_as_if_uncut(tokenizer, sandbox, code_policy) -> None:
    """The hf engine, greedy, the same weights in both phases: trajectories cut at every few tokens (continued from
    their tokens by a fresh prefill) are the uncut ones token for token, through the real sandbox."""
    engine = HFEngine(code_policy, tokenizer, accelerate=True)
    tools = [CodeInterpreter(sandbox, tokenizer, RolloutConfig())]
    whole, _ = run_phased(engine, tokenizer, tools, n=3, temperature=0.0, max_tokens_per_turn=60)
    assert sum(len(t.tool_calls) for t in whole) >= 3
    for cut in (5, 17, 29):
        phased = {"partial": True, "partial_turns": 5, "partial_tokens": cut}
        partial, asked = run_phased(engine, tokenizer, tools, n=3, temperature=0.0, max_tokens_per_turn=60, **phased)
        assert asked[0] == 0 and asked[-1] == 1
        same(partial, whole)
        assert [a.segments for a in partial] == [b.segments for b in whole]
        for t in partial:  # cut inside the first turn (a code call of more than 29 tokens)
            assert versions_of_model_tokens(t) == [3] * cut + [4] * (sum(t.response_mask) - cut)


@pytest.mark.parametrize("loop", [ASYNC, TURNS])
def test_a_trajectory_past_its_deadline_stops_void(tokenizer, sandbox, loop) -> None:
    """One question's code hangs (5 s) past rollout.trajectory_timeout_s (1 s): the batch returns in bounded time,
    the others that finished keep their answers, the late ones stop with `deadline` and are void."""
    slow = "print(12 * 30)"

    def script(context: str, turn: int) -> str:
        if turn == 0:
            return f"<code>\n```python\n{slow if '12 * 30' in context else 'print(1)'}\n```\n</code>"
        return ANSWER.format(value=1)

    hangs = lambda calls: 5.0 if any(call["code"] == slow for call in calls) else 0.0
    tools = [Delayed(CodeInterpreter(sandbox, tokenizer, RolloutConfig()), hangs)]
    started = time.monotonic()
    trajectories, metrics = run(ScriptedEngine(tokenizer, script), tokenizer, tools, loop, trajectory_timeout_s=1.0)
    assert time.monotonic() - started < 8
    late = [t for t in trajectories if t.example.id == "q0"]
    assert {t.stop_reason for t in late} == {"deadline"} and {t.infra for t in late} == {"deadline"}
    if loop is ASYNC:  # the others did not wait for q0's call
        assert {t.stop_reason for t in trajectories if t.example.id != "q0"} == {"answered"}
    assert metrics["rollout/void_deadline"] == metrics["rollout/stop_deadline"] >= 0.25


def test_a_dead_sandbox_worker_voids_its_trajectory_only(tokenizer, sandbox, monkeypatch) -> None:
    """A call whose worker died (infra_error) ends that trajectory as void (`sandbox`); the batch goes on."""
    real = sandbox.run_many

    def dying(codes: list[str]) -> list[ExecResult]:
        out = real(codes)
        return [
            ExecResult("", "", "killed", 0.0, "worker died", None, False, True) if "13 * 31" in c else r
            for c, r in zip(codes, out, strict=True)
        ]

    monkeypatch.setattr(sandbox, "run_many", dying)
    script = lambda context, turn: (
        CODE.format(a=13, b=31)
        if "13 * 31" in context and turn == 0
        else CODE.format(a=2, b=3)
        if turn == 0
        else ANSWER.format(value=6)
    )
    for loop in (ASYNC, TURNS):
        tools = [CodeInterpreter(sandbox, tokenizer, RolloutConfig())]
        trajectories, metrics = run(ScriptedEngine(tokenizer, script), tokenizer, tools, loop, n=3)
        void = [t for t in trajectories if t.infra]
        assert {t.example.id for t in void} == {"q1"} and {t.stop_reason for t in void} == {"infra_error"}
        assert {t.infra for t in void} == {"sandbox"} and void[0].tool_outputs[0].infra_error
        assert all(t.stop_reason == "answered" for t in trajectories if not t.infra)
        assert metrics["rollout/void_sandbox"] == pytest.approx(1 / 3)


def test_an_engine_that_drops_a_request_voids_that_trajectory(tokenizer, sandbox) -> None:
    class Dropping(ScriptedEngine):
        def generate(self, prompts, max_new_tokens, stop_strings, sampling, seeds=None):
            out = super().generate(prompts, max_new_tokens, stop_strings, sampling, seeds)
            texts = [self.tokenizer.decode(p) for p in prompts]
            return [Generation([], [], "error") if "13 * 31" in t else g for t, g in zip(texts, out, strict=True)]

    for loop in (ASYNC, TURNS):
        engine = Dropping(tokenizer, lambda context, turn: ANSWER.format(value=1))
        trajectories, metrics = run(engine, tokenizer, [], loop, n=2)
        assert [t.infra for t in trajectories] == ["", "", "", "engine", "engine", "engine"]
        assert metrics["rollout/void_engine"] == 0.5 and metrics["rollout/stop_infra_error"] == 0.5


def test_an_engine_call_past_its_time_limit_is_a_clear_error(tokenizer) -> None:
    class Stuck(ScriptedEngine):
        def generate(self, *args, **kwargs):
            time.sleep(30)
            raise AssertionError("not interrupted")

    for loop in (ASYNC, TURNS):
        started = time.monotonic()
        with pytest.raises(EngineTimeout, match=r"engine.*rollout.engine_timeout_s=0.3"):
            run(Stuck(tokenizer, lambda c, t: ""), tokenizer, [], loop, engine_timeout_s=0.3)
        assert time.monotonic() - started < 5


def test_a_call_stuck_in_native_code_ends_the_process_with_the_reason(tmp_path) -> None:
    """Where the interrupt cannot land (here: its signal ignored, as native code that never returns to Python
    behaves), the watchdog ends the process after the grace period, saying why and where it was stuck."""
    script = textwrap.dedent(
        """
        import signal, time
        from retool_cli.rollout.watchdog import INTERRUPT, time_limit
        with time_limit(0.3, "the weight sync into the engine", "rollout.engine_timeout_s", grace_s=0.3):
            signal.signal(INTERRUPT, signal.SIG_IGN)
            time.sleep(30)
        """
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert time.monotonic() - started < 15
    assert proc.returncode == EXIT_STUCK
    assert "the weight sync into the engine did not return within rollout.engine_timeout_s=0.3" in proc.stderr
    assert "time.sleep" in proc.stderr or "line 6" in proc.stderr  # the stuck thread's stack


def test_time_limit_leaves_a_call_in_time_alone() -> None:
    for _ in range(200):  # armed and disarmed at every async step: nothing fires late
        with time_limit(5.0, "a step", "rollout.engine_timeout_s"):
            pass
    with time_limit(0.0, "a step", "rollout.engine_timeout_s"):  # 0: no limit
        time.sleep(0.01)
    time.sleep(0.05)


def test_sampling_loop_is_resolved_per_engine() -> None:
    from retool_cli.config import RolloutEngine
    from retool_cli.rollout.agent import loop_of

    assert loop_of(RolloutConfig(engine=RolloutEngine.vllm)) == "async"
    assert loop_of(RolloutConfig(engine=RolloutEngine.hf)) == "turns"
    assert loop_of(RolloutConfig(engine=RolloutEngine.hf, loop=ASYNC)) == "async"
    assert loop_of(replace(RolloutConfig(engine=RolloutEngine.vllm), loop=TURNS)) == "turns"
    # where the async loop cannot serve, auto takes turns with vLLM too: partial rollouts switch a batch's weights
    # between rounds, and an engine spanning processes must meet the same batches in each
    assert loop_of(RolloutConfig(engine=RolloutEngine.vllm, partial=True)) == "turns"
    assert loop_of(RolloutConfig(engine=RolloutEngine.vllm, vllm_tensor_parallel_size=2)) == "turns"
    assert loop_of(RolloutConfig(engine=RolloutEngine.vllm, partial=True, loop=ASYNC)) == "async"  # refused later
    assert Sampling().seed == 0


def test_the_interpreter_cache_changes_no_trajectory(tokenizer, code_policy) -> None:
    """sandbox.cache on and off, the hf engine sampling the code-calling policy at temperature 1 through the real
    sandbox (async, calls finishing in random order): the same trajectories, tool outputs included; with the
    cache, the group's repeated code ran once."""
    engine = HFEngine(code_policy, tokenizer, accelerate=True)
    runs = {}
    for cache in (False, True):
        with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=2, timeout_s=5, cache=cache)) as box:
            interpreter = CodeInterpreter(box, tokenizer, RolloutConfig())
            trajectories, metrics = run(
                engine, tokenizer, [jittered(interpreter, 0.05)], ASYNC, n=3, max_tokens_per_turn=60
            )
            runs[cache] = (trajectories, metrics, box.stats())
    (plain, plain_metrics, plain_stats), (cached, cached_metrics, cached_stats) = runs[False], runs[True]
    same(plain, cached)
    calls = sum(len(t.tool_calls) for t in plain)
    assert plain_metrics["rollout/code_cache_hit_rate"] == 0 and plain_stats["calls"] == calls >= 6
    assert cached_metrics["rollout/code_cache_hit_rate"] > 0
    assert cached_stats["calls"] + cached_stats["cache_hits"] == calls and cached_stats["calls"] < calls
