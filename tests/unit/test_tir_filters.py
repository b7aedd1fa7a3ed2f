"""TIR filters (rl/tir_filters.py): void turns counted by the agent loop and masked by the update, GRPO-RoC's
selection, the interpreter's error output cut to its last lines; a scripted engine and the real sandbox."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from retool_cli.config import RolloutConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.protocol import TaggedProtocol
from retool_cli.env.reward import Verifier
from retool_cli.env.tools import CodeInterpreter
from retool_cli.interfaces import Runtime, ToolOutput
from retool_cli.model.precision import resolve_precision
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rl.optim import build_scheduler
from retool_cli.rl.step import StepPlan, collect, rollout_batch
from retool_cli.rl.tir_filters import roc_select
from retool_cli.rl.update import update
from retool_cli.rollout.agent import Trajectory, run_rollouts
from tests.scripted import ScriptedEngine
from tests.unit.test_rl import config

EOS = "<|im_end|>"
CODE_TURN = "Let me compute.\n<code>\n```python\nprint(12 * 34)\n```\n</code>"
ANSWER_TURN = "So the answer is \\boxed{408}." + EOS


def rollouts(tokenizer, sandbox, script, **overrides):
    cfg = RolloutConfig(**{"group_size": 1, "max_response_tokens": 400, "max_turns": 4, **overrides})
    examples = [MathExample("q0", "What is 12 * 34?", "408", "test")]
    tools = [CodeInterpreter(sandbox, tokenizer, cfg)]
    engine, protocol = ScriptedEngine(tokenizer, script), TaggedProtocol(tokenizer, "SYS")
    return run_rollouts(examples, engine, protocol, tools, cfg, seed=0, max_context_tokens=1024)


def test_void_turns_are_turns_without_a_call_or_an_answer(tokenizer, sandbox) -> None:
    scripts = {
        "a call, then the answer": (lambda c, turn: CODE_TURN if turn == 0 else ANSWER_TURN, 0),
        "a malformed call, then the answer": (lambda c, turn: "oops </code>" if "Error:" not in c else ANSWER_TURN, 1),
        "stops without an answer": (lambda c, turn: "I am not sure." + EOS, 1),
        "a call, then no answer": (lambda c, turn: CODE_TURN if turn == 0 else "It is 408." + EOS, 1),
        "answers in code only": (
            lambda c, turn: "<code>\n```python\nprint('\\\\boxed{408}')\n```\n</code>" if turn == 0 else "Done." + EOS,
            1,
        ),
    }
    for name, (script, void) in scripts.items():
        [t], metrics = rollouts(tokenizer, sandbox, script)
        assert t.void_turns == void and metrics["rollout/void_turns"] == void, name


def test_filter_void_turns_takes_their_trajectories_out_of_the_loss(tokenizer) -> None:
    """With the filter, the update equals one on the same batch with those trajectories' masks zeroed by hand
    (their group statistics kept: they were sampled and scored); without it they train."""
    torch.manual_seed(0)
    prompt = tokenizer.encode("What is 3 * 7?")
    trajectories = [
        Trajectory(MathExample(f"q{j // 4}", "x", "21", "t"), j % 4, prompt, torch.randint(10, 200, (12 + j,)).tolist())
        for j in range(8)
    ]
    for j, x in enumerate(trajectories):
        x.response_mask = [1] * len(x.response_ids)
        x.void_turns = int(j in (1, 6))
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0])

    def step(filter_void: bool, zero_by_hand: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        cfg = config(dynamic=False)
        cfg.trainer.filter_void_turns = filter_void
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        picked = [Trajectory(**{**vars(x)}) for x in trajectories]
        if zero_by_hand:
            for x in picked:
                x.response_mask = [0] * len(x.response_ids) if x.void_turns else x.response_mask
        scheduler = build_scheduler(optimizer, 0, 1, "constant")
        stats = update(
            StepPlan.of(cfg, resolve_precision(cfg, training=True)),
            model,
            rollout_batch(picked, rewards),
            optimizer,
            scheduler,
            0,
        )
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, stats

    filtered, stats = step(True, False)
    by_hand, _ = step(False, True)
    kept, _ = step(False, False)
    assert stats["train/void_turn_filtered"] == 0.25
    assert all(torch.equal(filtered[k], by_hand[k]) for k in filtered)
    assert any(not torch.equal(filtered[k], kept[k]) for k in filtered)


@dataclass
class Score:
    correct: bool
    formatted: bool = True


def trajectory(errors: int = 0, invalid: int = 0) -> Trajectory:
    t = Trajectory(MathExample("q", "x", "1", "t"), 0, [1])
    t.tool_outputs = [ToolOutput("", "error")] * errors + [ToolOutput("", "ok")]
    t.invalid_calls = t.void_turns = invalid  # a malformed call is a void turn, as the agent loop counts it
    return t


def test_roc_keeps_the_cleanest_correct_answers_and_random_wrong_ones() -> None:
    """Two questions x 8 samples (group_size 4, oversampled 2x). q0: 4 right with 2, 0, 1 (a malformed call)
    and 0 problems, 4 wrong; q1: all right. Kept: q0's two clean right ones and two of its wrong ones; q1's
    four cleanest."""
    q0 = [trajectory(errors=2), trajectory(), trajectory(invalid=1), trajectory()] + [trajectory(errors=3)] * 4
    q1 = [trajectory(errors=1), trajectory(), trajectory(errors=2), trajectory(), trajectory()]
    q1 += [trajectory(errors=4, invalid=1), trajectory(), Trajectory(MathExample("q", "x", "1", "t"), 0, [1])]
    scores = [Score(True)] * 4 + [Score(False)] * 4 + [Score(True)] * 7 + [Score(False, formatted=False)]
    scores[15] = Score(True, formatted=False)  # q1's last: right, but its answer is not where it must be
    kept, metrics = roc_select(q0 + q1, scores, group_size=4, oversample=2, seed=0)
    assert len(kept) == 8 and kept == sorted(kept)
    assert kept[:2] == [1, 3] and all(4 <= i < 8 for i in kept[2:4])
    assert set(kept[4:]) == {9, 11, 12, 14}  # no tool errors, formatted
    assert metrics["rollout/roc_correct_penalty_after"] < metrics["rollout/roc_correct_penalty_before"]
    assert metrics["rollout/roc_sampled"] == 16
    wrong_draws = {tuple(roc_select(q0 + q1, scores, 4, 2, seed)[0][2:4]) for seed in range(20)}
    assert len(wrong_draws) > 1 and roc_select(q0 + q1, scores, 4, 2, 0)[0] == kept  # seeded, uniform over wrong


def test_roc_keeps_each_groups_share_of_correct_answers() -> None:
    rng = random.Random(0)
    for _ in range(200):
        group, oversample = rng.randint(2, 6), rng.randint(2, 3)
        right = rng.randint(0, group * oversample)
        scores = [Score(k < right) for k in range(group * oversample)]
        rng.shuffle(scores)
        kept, _ = roc_select([trajectory(rng.randint(0, 2)) for _ in scores], scores, group, oversample, 1)
        kept_right = sum(scores[i].correct for i in kept)
        assert len(kept) == group and len(set(kept)) == group
        assert abs(kept_right - group * right / (group * oversample)) <= 1  # its share, rounded
        assert (kept_right > 0) == (right > 0) and (kept_right < group) == (right < group * oversample)


def test_collect_with_roc_trains_on_group_size_samples_per_question(tokenizer) -> None:
    examples = [MathExample(f"q{i}", f"What is {i} + 1?", str(i + 1), "test") for i in range(4)]

    calls = itertools.count()

    def script(context: str, turn: int) -> str:  # right on every third sample
        question = int(context.split("What is ")[1].split(" ")[0])
        return f"\\boxed{{{question + 1 if next(calls) % 3 == 0 else question}}}" + EOS

    cfg = config(dynamic=False)
    cfg.trainer.roc_oversample = 3
    with Verifier(timeout_s=5, workers=1) as verifier:
        engine = ScriptedEngine(tokenizer, script)
        rt = Runtime(tokenizer, TaggedProtocol(tokenizer, "SYS"), engine, [], verifier)
        batch, _ = collect(StepPlan.of(cfg, resolve_precision(cfg, training=True)), examples, 0, 1, rt)
    assert len(engine.seen_prompts) == 2 * 4 * 3  # 2 questions x 4 x 3 sampled
    assert [x.example.id for x in batch.objects["trajectory"]] == ["q0"] * 4 + ["q1"] * 4
    metrics = batch.meta["metrics"]
    assert metrics["rollout/roc_sampled"] == 24
    scores = batch.objects["score"]
    assert [sum(s.correct for s in scores[k : k + 4]) for k in (0, 4)] == [1, 1]  # 4 of 12 right: a share of 1/3


def test_the_interpreter_shows_the_last_lines_of_an_error(tokenizer, sandbox) -> None:
    code = "def f(n):\n    return 1 / n\nf(0)"

    def shown(lines: int) -> str:
        interpreter = CodeInterpreter(sandbox, tokenizer, RolloutConfig(error_tail_lines=lines))
        [out] = interpreter.run_many([{"code": code}])
        return out.text

    whole = shown(100).splitlines()
    assert whole[0].startswith("Traceback") and whole[-1] == "ZeroDivisionError: division by zero" and len(whole) >= 5
    assert shown(1) == whole[-1] and shown(3).splitlines() == whole[-3:]
