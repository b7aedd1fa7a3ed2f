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
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Protocol

from retool_cli.interfaces import Engine, Generation, Sampling


class WeightSlots:
    """`engine` shared by slots, each with the weights it samples with (anything with `state_dict()`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
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
        with self.lock:
            serial, weights = self.weights[slot]
            if self.held != (slot, serial):
                self.engine.update_weights(weights)
                self.held = (slot, serial)
            return self.engine.generate(*args)


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
