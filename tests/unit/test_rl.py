"""rl/step.py and rl/batch.py: the step's Batch envelope, DAPO dynamic sampling over several rounds, and the
update on it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from retool_cli.config import ProtocolConfig, ProtocolName, RetoolConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.protocol import build_protocol
from retool_cli.env.reward import Verifier
from retool_cli.interfaces import Runtime
from retool_cli.model.precision import resolve_precision
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rl.optim import build_optimizer, build_scheduler
from retool_cli.rl.step import StepPlan, collect, step_metrics
from retool_cli.rl.update import update
from tests.scripted import ScriptedEngine

EOS = "<|im_end|>"


def config(dynamic: bool) -> RetoolConfig:
    cfg = RetoolConfig()
    cfg.trainer.questions_per_step, cfg.trainer.dynamic_sampling, cfg.trainer.max_sampling_rounds = (
        2,
        dynamic,
        3,
    )
    cfg.rollout.group_size, cfg.rollout.max_response_tokens, cfg.rollout.max_tokens_per_turn = 4, 64, 64
    cfg.protocol = ProtocolConfig(name=ProtocolName.none)
    return cfg


def test_dynamic_sampling_samples_more_rounds_and_the_update_drops_equal_groups(tokenizer) -> None:
    """Round 1: every sample right (all groups degenerate). Round 2: alternately right and wrong (every group
    varied). With dynamic sampling, collect stops after round 2 with both rounds in one Batch, the rollout
    metrics of both merged, and the update trains on round 2's groups only."""
    examples = [MathExample(f"q{i}", f"What is {i} + 1?", str(i + 1), "test") for i in range(8)]
    calls = itertools.count()

    def script(context: str, turn: int) -> str:
        call = next(calls)
        question = int(context.split("What is ")[1].split(" ")[0])
        right = call < 8 or call % 2 == 0  # the first 8 calls are round 1 (2 questions x 4 samples)
        return f"\\boxed{{{question + 1 if right else question + 7}}}" + EOS

    cfg = config(dynamic=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    protocol = build_protocol(cfg.protocol, tokenizer)
    with Verifier(timeout_s=5, workers=1) as verifier:
        rt = Runtime(tokenizer, protocol, ScriptedEngine(tokenizer, script), [], verifier)
        batch, cursor = collect(StepPlan.of(cfg, resolve_precision(cfg, training=True)), examples, 0, 1, rt)
    assert cursor == 4 and len(batch) == 16  # two rounds of 2 questions x 4 samples
    assert batch.tensors["reward"][:8].tolist() == [1.0] * 8
    assert sorted(batch.tensors["reward"][8:].tolist()) == [-1.0] * 4 + [1.0] * 4
    metrics = step_metrics(batch, {})
    assert metrics["train/accuracy"] == pytest.approx(12 / 16) and metrics["rollout/turns"] == 1.0

    optimizer = build_optimizer(model, 1e-3, 0.0)
    stats = update(
        StepPlan.of(cfg, resolve_precision(cfg, training=True)),
        model,
        batch,
        optimizer,
        build_scheduler(optimizer, 0, 1, "constant"),
        tokenizer.pad_token_id,
    )
    assert stats["train/degenerate_group_rate"] == 0.5 and stats["train/optimizer_steps"] == 1.0
    assert stats["train/grad_norm"] > 0

    # without dynamic sampling: one round, whatever its groups
    calls = itertools.count()
    with Verifier(timeout_s=5, workers=1) as verifier:
        rt = Runtime(tokenizer, protocol, ScriptedEngine(tokenizer, script), [], verifier)
        plain = config(dynamic=False)
        once, cursor = collect(StepPlan.of(plain, resolve_precision(plain)), examples, 0, 1, rt)
    assert cursor == 2 and len(once) == 8 and torch.equal(once.tensors["reward"], torch.ones(8))


def test_entropy_metric_and_bonus(tokenizer) -> None:
    """train/entropy is the token-weighted mean entropy over the model's tokens (tool tokens excluded); with
    equal rewards (zero advantages) only trainer.entropy_coef moves the weights, and it raises the entropy."""
    from retool_cli.rl.step import rollout_batch
    from retool_cli.rollout.agent import Trajectory

    torch.manual_seed(0)
    prompt = tokenizer.encode("What is 3 * 7?")
    trajectories = []
    for j in range(4):
        response = torch.randint(10, 200, (12 + j,)).tolist()
        mask = [0 if 3 <= k < 6 else 1 for k in range(len(response))]  # a tool segment
        trajectories.append(Trajectory(MathExample("q0", "x", "21", "t"), j, prompt, response, mask))

    def step(coef: float) -> tuple[dict, AutoModelForCausalLM]:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        cfg = config(dynamic=False)
        cfg.trainer.entropy_coef, cfg.trainer.grad_clip = coef, 1e9
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        batch = rollout_batch(trajectories, torch.ones(4))  # equal rewards: every advantage is 0
        stats = update(
            StepPlan.of(cfg, resolve_precision(cfg, training=True)),
            model,
            batch,
            optimizer,
            build_scheduler(optimizer, 0, 1, "constant"),
            0,
        )
        return stats, model

    def mean_entropy(model) -> float:
        total = count = 0.0
        with torch.no_grad():
            for x in trajectories:
                logits = model(torch.tensor([x.token_ids])).logits[0, len(prompt) - 1 : -1]
                probs = torch.softmax(logits, -1)
                entropy = -(probs * probs.log()).sum(-1)  # computed here independently of the package
                mask = torch.tensor(x.response_mask, dtype=torch.float32)
                total, count = total + float((entropy * mask).sum()), count + float(mask.sum())
        return total / count

    before = mean_entropy(AutoModelForCausalLM.from_pretrained(tiny_model_path()))
    plain, unchanged = step(0.0)
    assert plain["train/entropy"] == pytest.approx(before, rel=1e-5)
    assert mean_entropy(unchanged) == pytest.approx(before, rel=1e-6)  # zero advantages: nothing to learn
    bonus, changed = step(0.5)
    assert bonus["train/grad_norm"] > 0 and mean_entropy(changed) > before


def test_rollout_metrics_of_several_rounds_merge() -> None:
    """Times add up, per-trajectory means are weighted by each round's trajectories, throughput is tokens over
    all generation time."""
    from retool_cli.rl.step import _merge_round_metrics, rollout_batch
    from retool_cli.rollout.agent import Trajectory

    def round_of(n: int, metrics: dict) -> object:
        trajectories = [Trajectory(MathExample("q", "x", "1", "t"), i, [1], [2], [1]) for i in range(n)]
        return rollout_batch(trajectories, torch.zeros(n), metrics=metrics)

    first = {"rollout/generate_s": 2.0, "rollout/gen_tokens_per_s": 100.0, "rollout/turns": 1.0}
    second = {"rollout/generate_s": 6.0, "rollout/gen_tokens_per_s": 50.0, "rollout/turns": 2.0}
    merged = _merge_round_metrics([round_of(8, first), round_of(24, second)])
    assert merged["rollout/generate_s"] == 8.0
    assert merged["rollout/gen_tokens_per_s"] == pytest.approx((200 + 300) / 8)
    assert merged["rollout/turns"] == pytest.approx((8 * 1 + 24 * 2) / 32)


def test_shuffled_reward_control_keeps_the_rewards_and_cuts_their_link(tokenizer) -> None:
    """reward.control=shuffled: the same rollouts and the same logged accuracy, the rewards the update trains on
    a permutation of the real ones (seeded, the same in a rerun), no longer each trajectory's own."""
    from retool_cli.config import RewardControl

    examples = [MathExample(f"q{i}", f"What is {i} + 1?", str(i + 1), "test") for i in range(8)]

    def collected(control: RewardControl):
        calls = itertools.count()

        def script(context: str, turn: int) -> str:  # right on every third sample: groups of mixed rewards
            question = int(context.split("What is ")[1].split(" ")[0])
            return f"\\boxed{{{question + 1 if next(calls) % 3 == 0 else question}}}" + EOS

        cfg = config(dynamic=False)
        cfg.trainer.questions_per_step = 4
        cfg.reward.control = control
        with Verifier(timeout_s=5, workers=1) as verifier:
            engine, protocol = ScriptedEngine(tokenizer, script), build_protocol(cfg.protocol, tokenizer)
            batch, _ = collect(
                StepPlan.of(cfg, resolve_precision(cfg, training=True)),
                examples,
                0,
                1,
                Runtime(tokenizer, protocol, engine, [], verifier),
            )
        return batch

    real, control = collected(RewardControl.none), collected(RewardControl.shuffled)
    again = collected(RewardControl.shuffled)
    own = [s.reward for s in real.objects["score"]]
    assert real.tensors["reward"].tolist() == own  # the real run trains on each trajectory's own reward
    assert [s.reward for s in control.objects["score"]] == own  # same rollouts, same judged accuracy...
    assert sorted(control.tensors["reward"].tolist()) == sorted(own)  # ...the same rewards...
    assert control.tensors["reward"].tolist() != own  # ...given to other trajectories
    assert step_metrics(control, {})["train/accuracy"] == step_metrics(real, {})["train/accuracy"]
    assert torch.equal(again.tensors["reward"], control.tensors["reward"])  # seeded


def test_a_void_trajectory_changes_nothing_in_the_update(tokenizer) -> None:
    """A trajectory the infrastructure failed (scored 0 as a stand-in) leaves the update exactly as if it had
    never been sampled: the same weights after the step as from the batch without it; scored as a wrong answer
    instead, it would move its group's statistics and the weights."""
    from retool_cli.rl.step import rollout_batch
    from retool_cli.rollout.agent import Trajectory

    torch.manual_seed(0)
    prompt = tokenizer.encode("What is 3 * 7?")
    trajectories = [
        Trajectory(MathExample(f"q{j // 4}", "x", "21", "t"), j % 4, prompt, torch.randint(10, 200, (10 + j,)).tolist())
        for j in range(8)
    ]
    for x in trajectories:
        x.response_mask = [1] * len(x.response_ids)
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0])

    def step(chosen: list[int], void: int | None = None) -> dict[str, torch.Tensor]:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        cfg = config(dynamic=False)
        cfg.trainer.grad_clip = 1e9
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        picked = [Trajectory(**{**vars(trajectories[i])}) for i in chosen]
        for x, i in zip(picked, chosen, strict=True):
            x.infra = "sandbox" if i == void else ""
        batch = rollout_batch(picked, rewards[chosen])
        stats = update(
            StepPlan.of(cfg, resolve_precision(cfg, training=True)),
            model,
            batch,
            optimizer,
            build_scheduler(optimizer, 0, 1, "constant"),
            0,
        )
        assert stats["train/void_rate"] == (1 / len(chosen) if void is not None else 0.0)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    everything = list(range(8))
    with_void = step(everything, void=1)
    without = step([i for i in everything if i != 1])
    scored_wrong = step(everything)
    assert all(torch.allclose(with_void[k], without[k], atol=1e-7) for k in with_void)
    assert any(not torch.allclose(with_void[k], scored_wrong[k], atol=1e-6) for k in with_void)


def test_every_rollout_correction_is_no_correction_when_the_sampler_is_the_trainer(tokenizer) -> None:
    """Sampling logprobs equal to the trainer's (to the bit): each correction's update is `none`'s to the last
    bit and the gap metrics read 0. Recorded 0.3 nats off on some tokens, the corrections change the update and
    the metrics see the gap."""
    from retool_cli.config import RolloutCorrection
    from retool_cli.rl.step import rollout_batch
    from retool_cli.rl.update import Forward, all_logprobs
    from retool_cli.rollout.agent import Trajectory

    torch.manual_seed(0)
    prompt = tokenizer.encode("What is 3 * 7?")
    trajectories = [
        Trajectory(MathExample(f"q{j // 4}", "x", "21", "t"), j % 4, prompt, torch.randint(10, 200, (10 + j,)).tolist())
        for j in range(8)
    ]
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    cfg = config(dynamic=False)
    own = all_logprobs(model, trajectories, Forward(0, torch.device("cpu"), 16384, False, False, 1.0))
    for x, logp in zip(trajectories, own, strict=True):
        x.response_mask = [1] * len(x.response_ids)
        x.response_logprobs = logp[len(prompt) - 1 :].tolist()

    def step(mode: RolloutCorrection, shift: float = 0.0) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        cfg.trainer.rollout_correction, cfg.trainer.rollout_correction_bounds = mode, [0.9, 1.1]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        picked = [Trajectory(**{**vars(x)}) for x in trajectories]
        for x in picked[::2]:  # every other trajectory's sampler put its tokens `shift` nats likelier
            x.response_logprobs = [v + shift * (k % 2) for k, v in enumerate(x.response_logprobs)]
        stats = update(
            StepPlan.of(cfg, resolve_precision(cfg, training=True)),
            model,
            rollout_batch(picked, rewards),
            optimizer,
            build_scheduler(optimizer, 0, 1, "constant"),
            0,
        )
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, stats

    plain, plain_stats = step(RolloutCorrection.none)
    assert plain_stats["train/mismatch_abs_logprob_diff"] == 0 and plain_stats["train/mismatch_kl_k3"] == 0
    assert plain_stats["train/mismatch_max_ratio"] == 1 == plain_stats["train/mismatch_min_ratio"]
    for mode in list(RolloutCorrection)[1:]:
        weights, stats = step(mode)
        assert all(torch.equal(weights[k], plain[k]) for k in plain), mode
        assert stats["train/mismatch_outside_share"] == 0, mode
    _, gap = step(RolloutCorrection.none, shift=0.3)
    assert gap["train/mismatch_min_ratio"] == pytest.approx(math.exp(-0.3), rel=1e-5)
    assert 0 < gap["train/mismatch_outside_share"] < 0.5 and gap["train/mismatch_kl_k3"] > 0
    for mode in list(RolloutCorrection)[1:]:
        weights, stats = step(mode, shift=0.3)
        assert any(not torch.equal(weights[k], plain[k]) for k in plain), mode
