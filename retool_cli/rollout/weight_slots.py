"""One engine that samples for several weight versions in turn: vLLM under overlapped training.

The overlapped sampler (rl/overlap.py) keeps up to k + 1 batches in flight, each sampled by its own weight
version, on an engine per batch (a slot). The hf engine can hold one model per slot; vLLM sizes its memory (the
KV cache) for one engine a process, so its slots share one: each slot's weights wait beside it (a snapshot, on
the policy's device), and a call for a slot whose weights the engine does not hold loads them first
(VLLMEngine.update_weights, which also resets the prefix cache). Calls take turns (a lock), so the engine
samples one batch's round at a time while the trainer updates beside it. A request's tokens depend on its
prompt, seed and weights alone, so the order in which the slots' calls arrive changes the wall time and nothing
else.

Used by rollout/engine_process.py (each engine process's slots) and, colocated, by rl/sampler.py, where the
trainer's own engine (periodic evaluation) is one more slot holding the live policy.

A vLLM engine spanning several trainer processes (rollout.vllm_tensor_parallel_size > 1) must meet the same call
in each of them at once (its collectives); each process's slots call when their own trajectories are ready, so
the first process of the span decides the order and the others follow it (CallOrder).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from retool_cli.interfaces import Engine, Generation, Sampling

END = "end"  # CallOrder's last message: no call follows


class WeightSlots:
    """`engine` shared by slots, each with the weights it samples with (anything with `state_dict()`)."""

    def __init__(self, engine: Engine, order: CallOrder | None = None) -> None:
        """`order`: an engine spanning processes' CallOrder."""
        self.engine, self.order = engine, order
        # slot -> (serial, weights): loaded into the engine when a call needs them; the serial tells a slot's new
        # weights from those the engine holds
        self.weights: dict[Any, tuple[int, Any]] = {}
        self.serials = itertools.count()
        self.held: tuple[Any, int] | None = None  # (slot, serial) of the weights in the engine
        self.lock = threading.Lock()  # one call at a time: a load must not land in another slot's generation

    def load(self, slot: Any, weights: Any) -> None:
        """`slot` samples with `weights` from its next call on (they are read then, not now). Takes no lock, so
        that a trainer handing over new weights never waits for another slot's call to end."""
        self.weights[slot] = (next(self.serials), weights)  # one assignment: atomic under the GIL

    def generate(self, slot: Any, *args: Any) -> list[Generation]:
        """engine.generate(*args) with `slot`'s weights."""
        with self.order.turn(slot) if self.order else contextlib.nullcontext(), self.lock:
            serial, weights = self.weights[slot]
            if self.held != (slot, serial):
                self.engine.update_weights(weights)
                self.held = (slot, serial)
            return self.engine.generate(*args)


class CallOrder:
    """The order in which the processes of an engine spanning them take their slots' calls. The span's first
    process (`leader`) broadcasts each call's slot over `group` (a gloo group of the span, for this alone) as the
    call starts; the others' calls wait for their turn, which a thread of theirs receives. Each slot makes the
    same calls in every process of the span (the same requests: rl/step.py, collect), so the engine meets the
    same call everywhere. A follower waiting for a turn counts as a busy engine: the sampler's engine timeout
    bounds it; a leader gone fails the receiving thread at the group's timeout, and the waiting call with it."""

    def __init__(self, group: Any, leader: int) -> None:
        self.group, self.leader = group, leader
        self.leads = torch.distributed.get_rank() == leader
        self.cond = threading.Condition()  # the leader: held through each call; a follower: guards what follows
        self.next: Any = None  # (a follower) the slot whose call is next, None between calls
        self.error: BaseException | None = None
        if not self.leads:
            threading.Thread(target=self._receive, name="retool-call-order", daemon=True).start()

    @contextlib.contextmanager
    def turn(self, slot: Any) -> Iterator[None]:
        """The call of `slot` in its turn: the leader's when it starts, a follower's when the leader's did."""
        if self.leads:
            with self.cond:
                self._send(slot)
                yield
            return
        with self.cond:
            while self.next != slot:
                if self.error is not None:
                    raise RuntimeError(f"the order of the engine's calls stopped coming: {self.error}")
                self.cond.wait()
        try:
            yield
        finally:
            with self.cond:
                self.next = None
                self.cond.notify_all()

    def __enter__(self) -> CallOrder:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """The run ended: the leader, its last call made, tells the followers that no call follows (before the
        process group ends). A run that stops or fails leaves batches in flight, whose threads end with the
        processes."""
        if self.leads and kind is None:
            with self.cond:
                self._send(END)

    def _send(self, message: Any) -> None:
        torch.distributed.broadcast_object_list([message], src=self.leader, group=self.group)

    def _receive(self) -> None:
        try:
            while True:
                message: list[Any] = [None]
                torch.distributed.broadcast_object_list(message, src=self.leader, group=self.group)
                if message[0] == END:
                    return
                with self.cond:
                    self.next = message[0]
                    self.cond.notify_all()
                    while self.next is not None:  # that call ends before the next is taken
                        self.cond.wait()
        except BaseException as error:
            with self.cond:
                self.error = error
                self.cond.notify_all()


class Slots(Protocol):
    """Weight versions by slot, sampled in turn: a WeightSlots, or an engine process (rollout/engine_process.py)."""

    def load(self, slot: Any, weights: Any) -> None: ...

    def generate(self, slot: Any, *args: Any) -> list[Generation]: ...


class SlotEngine:
    """One slot of `slots`, as the sampler sees an engine (interfaces.Engine)."""

    def __init__(self, slots: Slots, slot: Any) -> None:
        self.slots, self.slot = slots, slot

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_strings: list[str],
        sampling: Sampling,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        return self.slots.generate(self.slot, prompts, max_new_tokens, stop_strings, sampling, seeds)

    def update_weights(self, policy: Any) -> None:
        self.slots.load(self.slot, policy)

    def sleep(self) -> None:
        """Nothing: the other slots sample while the trainer updates (vLLM's sleep mode stays off; an engine
        process keeps its memory to itself)."""

    def wake_up(self) -> None:
        """See `sleep`."""
