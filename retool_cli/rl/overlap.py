"""Sampling that overlaps the update (trainer.max_staleness = k > 0): sampler threads sample the next steps'
batches, each on an engine with its own copy of the weights, while the trainer updates on the current one.

What samples what is fixed by the config, never by timing:

    step s's batch is sampled by weight version  v(s) = max(0, s - 1 - k)     (version v: the weights after v updates)

so batch s can be sampled as soon as update s - 1 - k is done, while updates s - k .. s - 1 run; at update s the
trainer is (s - 1) - v(s) = min(s - 1, k) versions ahead of the tokens it trains on. The sampler produces the
batches in step order from one data cursor, each with its own step's seeds (rl/step.py: collect; a request's
tokens depend on its prompt and seed alone), so a faster or slower trainer, engine or interpreter changes the
wall time and nothing else. k = 0 is the synchronous schedule, which the trainer runs without this module.

    trainer (main thread)                            dispatcher (a thread)
      take(s): waits for batch s                       for s = first .. last: wait for version v(s) and a free
      update s                                           engine (k + 1 of them; one with dynamic sampling, whose
      publish(s, model): a snapshot of version s         next cursor only the batch before knows), then start
      checkpoint_state(s): batches s+1 .. s+k            a thread for batch s: load v(s), collect(s), hand the
        (waits for them) with the data cursor after each  batch over; so batch s samples beside s-1's stragglers

A checkpoint of step c keeps the batches of steps c+1 .. c+k, in flight when it was written (regenerating them
would need the weights of versions c-k .. c-1, which a checkpoint does not keep): a resumed run hands them over
first and samples step c+k+1 with version c, the checkpoint's own weights, as the uninterrupted run did. A stop
signal ends the run at a step's end, after the batches in flight (stops.py's grace bounds it; a kill resumes
from the last checkpoint as exactly).

Partial rollouts (rollout.partial): a trajectory samples its first `partial_turns` turns (and, with
`partial_tokens`, at most that many model tokens) with version v(s), and the rest with

    the tail version  t(s) = min(v(s) + 1, s - 1)

loaded into the batch's engine once every trajectory of the batch has reached that point (rollout/agent.py: the
loop's phases). A tool call in flight finishes first; a turn cut at the token budget keeps its tokens and
continues under the tail version. Which version samples which token is again a function of the step, the turn
and the token count, never of timing; each token records its version (Trajectory.response_versions) beside the
sampler's log-prob. The tails are fresher (lag k - 1), and wait for update s - k: with k = 1 that is the update
just before their step, so the trainer waits for them.

The loss on stale tokens is decoupled PPO (Hilton et al. 2022, arXiv 2110.00641; AReaL, Fu et al. 2025, arXiv
2505.24298): the behaviour policy is the sampler's log-prob per token (kept with each trajectory), the proximal
policy the trainer's weights before the update (rl/update.py: `old`), the clipped ratio current / proximal, and
trainer.rollout_correction weighs proximal / behaviour (token_tis: AReaL's capped importance weight).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from retool_cli.errors import EngineTimeout
from retool_cli.interfaces import Engine, Generation, Sampling
from retool_cli.model.loading import is_lora, merged_state_dict, sampler_model
from retool_cli.rl.batch import Batch
from retool_cli.rl.distributed import is_sharded, whole_model_state

# (step, data cursor, engine, weights_for_phase) -> (the step's batch sampled with the engine, the data cursor
# after it); weights_for_phase(phase) readies the engine's weights for a phase of the batch (0: its own, 1: the
# tail of partial rollouts) and returns their version (run_rollouts)
Collect = Callable[[int, int, Engine, Callable[[int], int]], tuple[Batch, int]]
WAIT_POLL_S = 0.5  # how often a waiting trainer looks at the sampler's health


def behaviour_version(step: int, max_staleness: int) -> int:
    """The weight version (updates done) that samples step `step`'s batch."""
    return max(0, step - 1 - max_staleness)


def phase_version(step: int, max_staleness: int, phase: int) -> int:
    """The weight version that samples phase `phase` of step `step`'s trajectories: 0, the batch's own; 1 (partial
    rollouts, after the first rollout.partial_turns turns or partial_tokens tokens) the next one, at most the
    trainer's (s - 1)."""
    version = behaviour_version(step, max_staleness)
    return version if phase == 0 else min(version + 1, step - 1)


class WeightSnapshot:
    """A copy of a policy's weights, which an engine loads as it loads a policy (`state_dict()`): the sampler's
    engines are plain models of the base architecture (plain_policy). A LoRA policy's adapters are merged in,
    under the base model's names; an FSDP2 policy's shards are all-gathered into whole tensors on every process
    (a collective: every process of the run snapshots together), each of which samples its own share."""

    def __init__(self, model: torch.nn.Module) -> None:
        if is_lora(model):
            self.state = merged_state_dict(model)
        elif is_sharded(model):
            self.state = whole_model_state(model)
        else:
            self.state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state


def plain_policy(model: Any) -> Any:
    """What the colocated hf sampler's engines copy: a LoRA or FSDP2 policy as a frozen model of its base
    architecture holding the snapshot's weights (a copy: the policy is untouched; FSDP2: a collective), which
    samples as engines fed WeightSnapshots do; any other policy as it is (the engines copy it)."""
    if not (is_lora(model) or is_sharded(model)):
        return model
    base: Any = model.get_base_model() if is_lora(model) else model
    weight = next(base.parameters())  # a DTensor under FSDP2: its dtype and (local) device
    plain = sampler_model(base.config, base.generation_config, weight.dtype, weight.device)
    plain.load_state_dict(WeightSnapshot(model).state_dict())
    return plain


class _WatchedEngine:
    """The sampler's engine, noting when its current call started: the trainer, waiting, bounds each call by
    rollout.engine_timeout_s (watchdog.time_limit interrupts only the main thread)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.busy_since: float | None = None

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_strings: list[str],
        sampling: Sampling,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        self.busy_since = time.monotonic()
        try:
            return self.engine.generate(prompts, max_new_tokens, stop_strings, sampling, seeds)
        finally:
            self.busy_since = None

    def update_weights(self, policy: Any) -> None:
        self.busy_since = time.monotonic()
        try:
            self.engine.update_weights(policy)
        finally:
            self.busy_since = None

    def sleep(self) -> None:
        """The sampler's engine never sleeps: it samples while the trainer runs."""

    def wake_up(self) -> None:
        """See `sleep`."""


@dataclass
class _Sampled:
    batch: Batch
    cursor: int  # the data cursor after this batch
    seconds: float  # the sampler's time on it (rollouts and rewards)


class Pipeline:
    """The sampler's threads and what the trainer asks of them; see the module docstring."""

    def __init__(
        self,
        collect: Collect,
        engines: list[Engine],
        max_staleness: int,
        start: int,
        last: int,
        cursor: int,
        pending: list[tuple[Batch, int]],
        engine_timeout_s: float,
        questions_per_step: int | None,
        partial: bool = False,
    ) -> None:
        """`collect` samples a step's batch with one of `engines` (each a copy of the weights: up to that many
        batches in flight, k + 1 at most); `start`: the step the policy's weights are at (a resumed
        checkpoint's, else 0), which the trainer publishes first; `last`: the run's last step; `pending`: the
        batches of steps start+1 .. that a checkpoint kept, each with the data cursor after it; `cursor`: the
        data cursor after the last of them (after step `start`'s without them); `questions_per_step`: what each
        batch advances the cursor by, or None when only the batch knows (dynamic sampling: one in flight);
        `partial`: rollout.partial (each batch's tail sampled by the next version)."""
        self.collect, self.engines = collect, [_WatchedEngine(e) for e in engines]
        self.k, self.last, self.engine_timeout_s = max_staleness, last, engine_timeout_s
        self.partial = partial
        self.newest_needed = self.tail_version(last)  # the last version to publish
        self.cursor, self.per_step = cursor, questions_per_step  # cursor: after the last batch sampled
        self.cond = threading.Condition()  # guards what follows
        self.sampled = {start + 1 + i: _Sampled(batch, cursor, 0.0) for i, (batch, cursor) in enumerate(pending)}
        self.snapshots: dict[int, WeightSnapshot] = {}  # published versions a batch still to start needs
        self.loaded: list[int | None] = [None] * len(engines)  # the version each engine holds
        self.published = -1  # the newest version published
        self.in_flight: dict[int, int] = {}  # step -> the engine sampling it
        self.error: BaseException | None = None
        self.closing = False
        self.idle_s = 0.0  # the sampler's time with no batch in flight (waiting for weights, or done)
        self.idle_since: float | None = time.monotonic()
        self.trainer_wait_s = 0.0  # the trainer's time waiting for batches
        self.weights_wait_s = 0.0  # batches' time waiting for their tail version (partial rollouts)
        self.transfer_s = 0.0  # engines' time loading weights (separate placement: the broadcasts)
        self.last_report = (time.monotonic(), 0.0, 0.0, 0.0, 0.0)  # when, then the four times above
        self.first = start + 1 + len(pending)
        self.thread = threading.Thread(target=self._dispatch, name="retool-sampler", daemon=True)

    def __enter__(self) -> Pipeline:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Ending the run (or failing): no batch starts any more; those in flight are abandoned (daemon
        threads), as synchronous rollouts are when a step fails."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        if exc[0] is None:
            self.thread.join()

    # ------------------------------------------------------------------ the sampler's threads

    def tail_version(self, step: int) -> int:
        """The newest weights that sample step `step`'s batch (its own version, without partial rollouts)."""
        return phase_version(step, self.k, int(self.partial))

    def _dispatch(self) -> None:
        """Start each step's batch, in step order, once its weights are published, an engine is free and
        (dynamic sampling) the batch before it knows its cursor."""
        cursor = self.cursor
        try:
            for step in range(self.first, self.last + 1):
                version = behaviour_version(step, self.k)
                engine = step % len(self.engines)
                with self.cond:
                    while not self.closing and not self._can_start(step, version, engine):
                        self.cond.wait()
                    if self.closing:
                        return
                    if self.per_step is None:  # the batch before this one has ended (_can_start)
                        cursor = self.cursor
                    snapshot = self.snapshots[version]
                    # no batch to start needs older versions, nor does a batch in flight (its tail version)
                    tails = [self.tail_version(s) for s in self.in_flight]
                    for old in [v for v in self.snapshots if v < min([version, *tails])]:
                        del self.snapshots[old]
                    self.in_flight[step] = engine
                    self._note_activity()
                args = (step, cursor, engine, version, snapshot)
                threading.Thread(target=self._sample, args=args, name=f"retool-sampler-{step}", daemon=True).start()
                if self.per_step is not None:
                    cursor += self.per_step
        except BaseException as error:  # handed to the trainer, which raises it
            self._fail(error)

    def _can_start(self, step: int, version: int, engine: int) -> bool:
        if version not in self.snapshots or engine in self.in_flight.values():
            return False
        return self.per_step is not None or step - 1 not in self.in_flight  # dynamic sampling: one at a time

    def _sample(self, step: int, cursor: int, engine: int, version: int, snapshot: WeightSnapshot) -> None:
        try:
            started = time.perf_counter()

            def weights_for_phase(phase: int) -> int:
                want = phase_version(step, self.k, phase)
                if self.loaded[engine] != want:
                    weights = snapshot if want == version else self._published(want)
                    loading = time.perf_counter()
                    self.engines[engine].update_weights(weights)
                    with self.cond:
                        self.transfer_s += time.perf_counter() - loading
                    self.loaded[engine] = want
                return want

            weights_for_phase(0)
            batch, after = self.collect(step, cursor, self.engines[engine], weights_for_phase)
            if self.per_step is not None and after != cursor + self.per_step:
                raise RuntimeError(
                    f"step {step}'s batch moved the data cursor by {after - cursor}, not {self.per_step}"
                )
            with self.cond:
                self.sampled[step] = _Sampled(batch, after, time.perf_counter() - started)
                self.cursor = max(self.cursor, after)  # dynamic sampling: where the next batch starts
                del self.in_flight[step]
                self._note_activity()
                self.cond.notify_all()
        except BaseException as error:
            self._fail(error)

    def _published(self, version: int) -> WeightSnapshot:
        """Weight version `version`, once published (a batch's tail version, which a later update makes)."""
        started = time.monotonic()
        with self.cond:
            while version not in self.snapshots:
                if self.closing:  # the run ends: this batch is abandoned
                    raise RuntimeError(f"the run ended while a batch waited for weights {version}")
                if version <= self.published:  # dropped before this batch took it: it would wait forever
                    raise RuntimeError(f"weights {version} were dropped before a batch in flight took them")
                self.cond.wait()
            self.weights_wait_s += time.monotonic() - started
            return self.snapshots[version]

    def _fail(self, error: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = error
            self.cond.notify_all()

    def _note_activity(self) -> None:
        """Count the sampler's idle time: from when its last batch ends to when the next starts (held: cond)."""
        now = time.monotonic()
        if self.in_flight and self.idle_since is not None:
            self.idle_s += now - self.idle_since
            self.idle_since = None
        elif not self.in_flight and self.idle_since is None:
            self.idle_since = now

    # ------------------------------------------------------------------ the trainer's side

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Weight version `version` (after that many updates) is the policy's now: snapshot it for the sampler
        when a batch still to start needs it (every version up to the last step's does: v(s) grows by at most
        one a step)."""
        if self.first > self.last or version > self.newest_needed:
            return
        snapshot = WeightSnapshot(model)
        with self.cond:
            self.snapshots[version] = snapshot
            self.published = version
            self.cond.notify_all()

    def take(self, step: int) -> tuple[Batch, int, float]:
        """Step `step`'s batch (waiting for it), the data cursor after it, and the sampler's seconds on it."""
        started = time.monotonic()
        sampled = self._wait_for(step)
        with self.cond:
            del self.sampled[step]
            self.cond.notify_all()
        self.trainer_wait_s += time.monotonic() - started
        return sampled.batch, sampled.cursor, sampled.seconds

    def checkpoint_state(self, step: int, cursor: int) -> dict[str, Any]:
        """What a checkpoint of step `step` keeps of the sampler: the batches of the steps after it up to k
        (waiting for them) with the cursor after each, and the cursor after the last of them (`cursor`: the
        one after step `step`'s batch)."""
        pending = [self._wait_for(s) for s in range(step + 1, min(step + self.k, self.last) + 1)]
        kept = [(p.batch, p.cursor) for p in pending]
        return {"cursor": kept[-1][1] if kept else cursor, "pending": kept}

    def _wait_for(self, step: int) -> _Sampled:
        with self.cond:
            while step not in self.sampled:
                if self.error is not None:
                    raise self.error
                version = behaviour_version(step, self.k)
                if step not in self.in_flight and version not in self.snapshots:  # would never end
                    raise RuntimeError(f"batch {step} waits for weights {version}, which only this wait holds up")
                self._check_engines()
                self.cond.wait(WAIT_POLL_S)
            return self.sampled[step]

    def _check_engines(self) -> None:
        now = time.monotonic()
        for engine in self.engines:
            since = engine.busy_since
            if self.engine_timeout_s > 0 and since is not None and now - since > self.engine_timeout_s:
                raise EngineTimeout(
                    f"a sampler's engine call did not return within rollout.engine_timeout_s="
                    f"{self.engine_timeout_s:g} s: the engine is stuck or far slower than expected. Stopping; the "
                    "run resumes from its last checkpoint (with a larger rollout.engine_timeout_s if the engine is "
                    "only slow)"
                )

    def metrics(self, step: int, batch: Batch) -> dict[str, float]:
        """Step `step`'s staleness metrics, and since the last call the shares of wall time the trainer waited
        for batches and the sampler had no batch in flight."""
        with self.cond:  # one clock reading for the idle time and the wall time
            now = time.monotonic()
            idle = self.idle_s + (now - self.idle_since if self.idle_since is not None else 0.0)
            weights_wait, transfer = self.weights_wait_s, self.transfer_s
        when, waited, idled, weights_waited, transferred = self.last_report
        self.last_report = (now, self.trainer_wait_s, idle, weights_wait, transfer)
        wall = max(now - when, 1e-9)
        return {
            **staleness_metrics(step, self.k, batch),
            "time/trainer_idle_share": (self.trainer_wait_s - waited) / wall,
            "time/sampler_idle_share": (idle - idled) / wall,
            "time/sampler_weights_wait_s": weights_wait - weights_waited,  # batches waiting for tail versions
            "time/weight_transfer_s": transfer - transferred,  # weights loaded into the sampler's engines
            "time/step_wall_s": wall,  # since the last step's metrics (rollout_s and update_s overlap)
        }


def staleness_metrics(step: int, max_staleness: int, batch: Batch) -> dict[str, float]:
    """How far behind the trainer (version step - 1) the step's tokens were sampled, from the version each
    sampled token records: the lag in versions (mean and max over tokens), the batch's own version, the share
    of trajectories sampled by more than one version (partial rollouts), and tokens per lag."""
    lags: Counter[int] = Counter()  # lag -> sampled tokens
    partial = 0
    trajectories = batch.objects["trajectory"]
    for x in trajectories:
        versions = [v for v, sampled in zip(x.response_versions, x.response_mask, strict=True) if sampled]
        partial += len(set(versions)) > 1
        lags.update(step - 1 - v for v in versions)
    tokens = max(1, sum(lags.values()))
    metrics = {
        "rollout/staleness_mean": sum(lag * n for lag, n in lags.items()) / tokens,
        "rollout/staleness_max": float(max(lags, default=0)),
        "rollout/behaviour_version": float(behaviour_version(step, max_staleness)),
        "rollout/partial_share": partial / max(1, len(trajectories)),
    }
    metrics.update({f"rollout/tokens_lag_{j}": float(lags[j]) for j in range(max_staleness + 1)})
    return metrics
