"""rl/overlap.py's schedule on its own: which weight version samples each step, whatever the speeds; what a
checkpoint keeps; errors and a stuck engine reach the trainer instead of a hang. The engine and the batches are
stand-ins here (what matters is which weights were loaded when); tests/cli/test_overlap.py runs the real
trainer, engine and sandbox."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from retool_cli.errors import EngineTimeout
from retool_cli.rl.batch import Batch
from retool_cli.rl.overlap import Pipeline, behaviour_version, phase_version, staleness_metrics
from retool_cli.rollout.agent import Trajectory


class VersionModel(torch.nn.Module):
    """A policy whose one weight is its version."""

    def __init__(self) -> None:
        super().__init__()
        self.version = torch.nn.Parameter(torch.zeros(()))


class RecordingEngine:
    """Loads weights as an engine does; `loaded` is the version it holds."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.loaded = -1.0
        self.delay_s = delay_s

    def update_weights(self, policy) -> None:
        time.sleep(random.uniform(0, self.delay_s))
        self.loaded = float(policy.state_dict()["version"])


TURNS = 3  # turns of each stand-in batch


def turn_version(step: int, k: int, turn: int, partial_turns: int | None) -> int:
    """The version that samples a turn when partial rollouts switch after `partial_turns` turns (None: never)."""
    return phase_version(step, k, int(partial_turns is not None and turn >= partial_turns))


def run(
    k: int,
    steps: int,
    start: int = 0,
    state=None,
    delays=(0.0, 0.0),
    dynamic: bool = False,
    partial_turns: int | None = None,
) -> tuple[dict, dict]:
    """Train `steps` steps against a pipeline whose sampler records the version its engine held for each turn
    of each step's batch (TURNS turns), with random delays in the sampler and the trainer, from a checkpoint
    `state` of step `start` if given; `dynamic`: each batch's cursor known only at its end (one batch in
    flight); `partial_turns`: partial rollouts. Returns ({step: the version of each turn}, {step: the
    checkpoint state after it})."""
    sample_s, update_s = delays
    engines, model = [RecordingEngine(sample_s) for _ in range(1 if dynamic else k + 1)], VersionModel()
    sampled_with: dict[int, list[float]] = {}
    in_flight, most = set(), [0]

    def collect(step: int, cursor: int, engine, weights_for_phase) -> tuple[Batch, int]:
        in_flight.add(step)
        most[0] = max(most[0], len(in_flight))
        versions = []
        for turn in range(TURNS):
            version = weights_for_phase(int(partial_turns is not None and turn >= partial_turns))
            assert engine.engine.loaded == version
            time.sleep(random.uniform(0, sample_s / TURNS))
            versions.append(engine.engine.loaded)
        sampled_with[step] = versions
        in_flight.discard(step)
        return Batch({"reward": torch.zeros(1)}, {}, {"step": step}), cursor + 10

    states = {}
    with torch.no_grad():
        model.version.fill_(start)
    cursor, pending = (state["cursor"], state["pending"]) if state else (0, [])
    per_step = None if dynamic else 10
    partial = partial_turns is not None
    with Pipeline(collect, engines, k, start, steps, cursor, pending, 30.0, per_step, partial) as pipeline:
        pipeline.publish(start, model)
        for step in range(start + 1, steps + 1):
            batch, cursor, _ = pipeline.take(step)
            assert batch.meta["step"] == step and cursor == step * 10
            time.sleep(random.uniform(0, update_s))
            with torch.no_grad():
                model.version.fill_(step)  # the update
            pipeline.publish(step, model)
            states[step] = pipeline.checkpoint_state(step, cursor)
    assert most[0] <= len(engines)
    return sampled_with, states


def test_the_versions_of_a_batch_and_of_its_partial_turns() -> None:
    assert [behaviour_version(s, 1) for s in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [behaviour_version(s, 2) for s in range(1, 6)] == [0, 0, 0, 1, 2]
    # partial rollouts: phase 1 (turns from partial_turns on) takes the next version, never newer than s - 1
    assert [phase_version(s, 1, 1) for s in range(1, 6)] == [0, 1, 2, 3, 4]
    assert [phase_version(s, 2, 0) for s in range(1, 6)] == [behaviour_version(s, 2) for s in range(1, 6)]
    assert [turn_version(s, 1, 1, 1) for s in range(1, 6)] == [0, 1, 2, 3, 4]
    assert [turn_version(s, 2, 1, 1) for s in range(1, 6)] == [0, 1, 1, 2, 3]
    assert [turn_version(s, 2, 0, 1) for s in range(1, 6)] == [0, 0, 0, 1, 2]
    assert [turn_version(4, 2, t, 2) for t in range(4)] == [1, 1, 2, 2]
    assert [turn_version(4, 2, t, None) for t in range(4)] == [1, 1, 1, 1]


@pytest.mark.parametrize("partial_turns", [None, 1, 2], ids=["whole", "partial after 1", "partial after 2"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["k+1 in flight", "one in flight"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_each_step_is_sampled_by_its_version_whatever_the_speeds(k: int, dynamic: bool, partial_turns) -> None:
    steps = 7
    want = {s: [float(turn_version(s, k, t, partial_turns)) for t in range(TURNS)] for s in range(1, steps + 1)}
    for delays in [(0.0, 0.0), (0.02, 0.0), (0.0, 0.02), (0.01, 0.01)]:
        sampled_with, states = run(k, steps, delays=delays, dynamic=dynamic, partial_turns=partial_turns)
        assert sampled_with == want, delays
        # a checkpoint of step s keeps the batches of s+1 .. s+k and the cursor after the last of them
        for s, state in states.items():
            kept = [batch.meta["step"] for batch, _ in state["pending"]]
            assert kept == list(range(s + 1, min(s + k, steps) + 1))
            assert state["cursor"] == 10 * min(s + k, steps)


def test_batches_overlap_when_their_weights_allow() -> None:
    """k = 2: steps 1-3 are all sampled by the initial weights, so all three sample at once."""
    k, started, gate = 2, [], threading.Event()

    def collect(step: int, cursor: int, engine, weights_for_phase) -> tuple[Batch, int]:
        started.append(step)
        if len(started) == 3:
            gate.set()
        assert gate.wait(10), f"only {started} started"
        return Batch({}, {}, {"step": step}), cursor + 1

    engines = [RecordingEngine() for _ in range(k + 1)]
    with Pipeline(collect, engines, k, 0, 3, 0, [], 30.0, 1) as pipeline:
        pipeline.publish(0, VersionModel())
        assert [pipeline.take(s)[0].meta["step"] for s in (1, 2, 3)] == [1, 2, 3]
    assert sorted(started) == [1, 2, 3]


def test_a_resumed_pipeline_hands_over_the_kept_batches_then_samples_with_the_checkpoint_weights() -> None:
    k, steps = 2, 6
    _, states = run(k, steps)
    sampled_with, _ = run(k, steps, start=2, state=states[2])
    assert sampled_with == {s: [float(behaviour_version(s, k))] * TURNS for s in range(5, steps + 1)}  # 3, 4 kept
    _, states = run(k, steps, partial_turns=1)
    sampled_with, _ = run(k, steps, start=2, state=states[2], partial_turns=1)
    assert sampled_with == {s: [float(turn_version(s, k, t, 1)) for t in range(TURNS)] for s in range(5, steps + 1)}


def test_a_sampler_error_reaches_the_trainer() -> None:
    def collect(step: int, cursor: int, engine, weights_for_phase):
        raise ValueError(f"bad batch {step}")

    engines = [RecordingEngine(), RecordingEngine()]
    with pytest.raises(ValueError, match="bad batch 1"), Pipeline(collect, engines, 1, 0, 3, 0, [], 30, 1) as p:
        p.publish(0, VersionModel())
        p.take(1)


def test_a_stuck_engine_call_is_an_error_not_a_hang() -> None:
    release = threading.Event()

    class StuckEngine(RecordingEngine):
        def generate(self, *args, **kwargs):
            release.wait(30)
            return []

    # through the pipeline's watched engine, as collect's rollouts are
    def collect(step: int, cursor: int, engine, weights_for_phase):
        engine.generate([[1]], [1], [], None)
        return Batch({}, {}, {}), cursor + 1

    pipeline = Pipeline(collect, [StuckEngine()], 1, 0, 3, 0, [], 0.5, 1)
    started = time.monotonic()
    with pytest.raises(EngineTimeout, match="rollout.engine_timeout_s=0.5"), pipeline:
        pipeline.publish(0, VersionModel())
        pipeline.take(1)
    release.set()
    assert time.monotonic() - started < 5


def test_staleness_is_counted_over_the_sampled_tokens_of_each_version() -> None:
    """Step 5 (trainer at version 4), k = 2: a trajectory of version 2 throughout, one whose second turn
    version 3 sampled (a tool result between, not counted), one with no tokens."""

    def trajectory(versions: list[int]) -> Trajectory:
        return Trajectory(None, 0, [1], response_versions=versions, response_mask=[int(v >= 0) for v in versions])

    whole, partial, empty = trajectory([2, 2, 2]), trajectory([2, 2, -1, -1, 3, 3, 3]), trajectory([])
    metrics = staleness_metrics(5, 2, Batch({}, {"trajectory": [whole, partial, empty]}, {}))
    assert metrics["rollout/tokens_lag_2"] == 5 and metrics["rollout/tokens_lag_1"] == 3
    assert metrics["rollout/tokens_lag_0"] == 0
    assert metrics["rollout/staleness_mean"] == pytest.approx((5 * 2 + 3 * 1) / 8)
    assert metrics["rollout/staleness_max"] == 2
    assert metrics["rollout/partial_share"] == pytest.approx(1 / 3)
    assert metrics["rollout/behaviour_version"] == 2
