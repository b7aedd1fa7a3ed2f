"""Deterministic fault injection, for the resume tests: RETOOL_DIE_AFTER=step:N makes `retool train` or
`retool sft` die right after step N (its metrics and any checkpoint written), update:N as train's update N
starts, sampling:N as train's sampler thread (trainer.max_staleness > 0) starts step N's batch, chunk:N makes
a sampling run (eval, filter-pass-rate) die right after its N-th chunk reached samples.jsonl, file:N makes
`retool prepare` die after writing its N-th output into its staging folder and placed:N after moving its N-th
into place, engine_start:P makes engine process P (rollout.placement=separate) die as it builds its models. It
dies as a node failure would: SIGKILL to itself, no cleanup, no exit handlers.
RETOOL_PAUSE_AT=rollouts:N (before step N's rollouts), step:N (sft, after step N) or chunk:N makes the command wait
there for a stop signal (60 s at most): the stop tests' fixed point to signal at, whatever the machine's speed; with
RETOOL_PAUSED_FILE set, that file is made as the wait begins. RETOOL_JITTER=tools:S,engine:S,update:S delays each
batch of tool calls, engine call or policy update by a random 0-S seconds, drawn from the OS's entropy (never from
the run's seeded streams): the determinism tests' way to show that speeds change the wall time and nothing else.
Unset (always, outside tests) they do nothing."""

from __future__ import annotations

import os
import random
import signal
import time

from retool_cli import stops

ENV = "RETOOL_DIE_AFTER"
PAUSE_ENV = "RETOOL_PAUSE_AT"
PAUSED_FILE_ENV = "RETOOL_PAUSED_FILE"
JITTER_ENV = "RETOOL_JITTER"
_entropy = random.SystemRandom()


def die_if_due(kind: str, count: int) -> None:
    """SIGKILL this process when RETOOL_DIE_AFTER is `kind:count`."""
    if os.environ.get(ENV) == f"{kind}:{count}":
        os.kill(os.getpid(), signal.SIGKILL)


def pause_if_due(kind: str, count: int) -> None:
    """Wait for a stop signal when RETOOL_PAUSE_AT is `kind:count` (where a stop is raised at once, it is raised
    in this wait; inside stops.deferred() the wait ends and the command stops where it would)."""
    if os.environ.get(PAUSE_ENV) != f"{kind}:{count}":
        return
    if os.environ.get(PAUSED_FILE_ENV):
        open(os.environ[PAUSED_FILE_ENV], "w").close()
    deadline = time.monotonic() + 60
    while stops.requested() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def jitter(kind: str) -> None:
    """Sleep a random 0-S seconds when RETOOL_JITTER names `kind` with S (`tools:0.05,update:0.2`)."""
    spec = os.environ.get(JITTER_ENV)
    if not spec:
        return
    for part in spec.split(","):
        name, _, most = part.partition(":")
        if name == kind:
            time.sleep(_entropy.uniform(0.0, float(most)))
