"""A time limit on every engine call and weight sync: nothing in a run waits forever on a stuck engine.

    with time_limit(cfg.engine_timeout_s, "vLLM weight sync", "rollout.engine_timeout_s"):
        engine.update_weights(model)

One daemon thread watches whichever limit is armed. When one expires it sends SIGUSR2 to the main thread (a
real signal: a blocking system call returns, and its handler raises at the next Python instruction; not
SIGINT, which is a person's Ctrl-C and stops the run: stops.py), which `time_limit` turns into an
EngineTimeout naming the call and the key. A call stuck inside C code never
reaches a Python instruction: after `grace_s` more the watchdog prints the message and every thread's stack to
stderr and ends the process (exit code 3). A run then resumes from its last checkpoint. Arming and disarming
cost a lock each, so the async loop guards every engine step.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from retool_cli.errors import EngineTimeout

EXIT_STUCK = 3  # the process's exit code when a call stuck in C code is ended by the watchdog
INTERRUPT = signal.SIGUSR2


class _Expired(BaseException):
    """Raised in the main thread by the watchdog's signal (a BaseException: no `except Exception` takes it)."""


def _raise_expired(signum: int, frame: object) -> None:
    raise _Expired


class _Watchdog:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.deadline: float | None = None  # monotonic time the armed limit expires
        self.message = ""
        self.grace_s = 30.0
        self.generation = 0  # bumped at each arm: a late wake-up never fires a limit that was since disarmed
        self.fired = False
        self.wakes_at = float("inf")  # when the watching thread next looks (inf: only when notified)
        self.thread: threading.Thread | None = None

    def arm(self, seconds: float, message: str, grace_s: float) -> int:
        with self.cond:
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, name="retool-watchdog", daemon=True)
                self.thread.start()
            self.generation += 1
            self.deadline, self.message, self.grace_s, self.fired = time.monotonic() + seconds, message, grace_s, False
            if self.deadline < self.wakes_at:  # else it wakes before the deadline anyway: no thread switch per step
                self.cond.notify()
            return self.generation

    def disarm(self) -> bool:
        """Returns whether the limit fired."""
        with self.cond:
            fired, self.deadline, self.fired = self.fired, None, False
            if fired:  # the watching thread is in its grace period: release it
                self.cond.notify()
            return fired

    def _watch(self) -> None:
        with self.cond:
            while True:
                if self.deadline is None:
                    self.wakes_at = float("inf")
                    self.cond.wait()
                    continue
                left = self.deadline - time.monotonic()
                if left > 0:
                    self.wakes_at = self.deadline
                    self.cond.wait(left)
                    continue
                self.fired = True
                self._interrupt(self.generation)

    def _interrupt(self, generation: int) -> None:
        """Interrupt the main thread; end the process if it has not disarmed `grace_s` later (held: self.cond)."""
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, INTERRUPT)
        self.cond.wait_for(lambda: self.generation != generation or self.deadline is None, self.grace_s)
        if self.generation == generation and self.deadline is not None:
            sys.stderr.write(f"retool: {self.message} (stuck in native code: ending the process)\n")
            faulthandler.dump_traceback(sys.stderr, all_threads=True)
            sys.stderr.flush()
            os._exit(EXIT_STUCK)


_watchdog = _Watchdog()


@contextlib.contextmanager
def time_limit(seconds: float, what: str, key: str, grace_s: float = 30.0) -> Iterator[None]:
    """Raise EngineTimeout if the block runs past `seconds` (0: no limit). `what` names the call, `key` the
    config key that sets the limit. Only the main thread can be interrupted: elsewhere this is no limit."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    message = (
        f"{what} did not return within {key}={seconds:g} s: the engine is stuck or far slower than expected. "
        f"Stopping; the run resumes from its last checkpoint (with a larger {key} if the engine is only slow)"
    )
    if signal.getsignal(INTERRUPT) is not _raise_expired:
        signal.signal(INTERRUPT, _raise_expired)
    _watchdog.arm(seconds, message, grace_s)
    try:
        yield
    except _Expired:
        _watchdog.disarm()
        raise EngineTimeout(message) from None
    finally:
        _watchdog.disarm()
