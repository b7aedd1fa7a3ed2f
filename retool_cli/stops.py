"""How a run stops when it is asked to: SIGTERM (`kill`, `timeout`, Slurm's `scancel`, a preemption), SIGINT
(Ctrl-C) and SIGUSR1 (what `sbatch --signal=USR1@90` sends ahead of a time limit) all mean "stop now, keep what
is complete".

    signal --handler (main thread)--> Stopped raised where the command is, unless inside `deferred()`: then
      recorded, and raised where the command next calls `check()` (train: at the end of a step, all ranks agreed)
    Stopped --unwinds `with` blocks: sandbox, judge and engine closed--> the command's catch (cli.py): one line
      saying how to resume, exit status 128 + the signal's number (143 for SIGTERM, 130 for Ctrl-C)

What bounds it: a stop that has not ended the process `grace_s` after the first signal (a step that will not
finish, a collective waiting for a dead peer, code stuck in C) ends it anyway: every process it started is
killed, then itself. Checkpoints and logs are written so that a kill at any point loses only what was in
progress. A second Ctrl-C typed a second or more after the first does the same at once; the same signal
delivered twice (Slurm signals every process of a job step, torchrun forwards what it gets) is one stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
REPORT_ENV = "RETOOL_STOP_REPORT"  # set by `retool train`'s launcher: the file rank 0 names a stop's signal in
FORKED_RANK_ENV = "RETOOL_FORKED_RANK"  # set in a rank that torchrun forked from its agent (rl/rank.py)
PR_SET_PDEATHSIG = 1


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, as KeyboardInterrupt is: no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    installed = False
    deadline_started = False
    grace_s = 30.0
    signum: int | None = None  # the first stop signal received
    first_at = 0.0
    deferred = 0  # depth of `deferred()` blocks around the main thread's current point
    interruptible = 0  # depth of `interruptible()` blocks inside them
    resume_hint = ""  # the command line that resumes the run, said when a stop has to kill it
    notice: threading.Thread | None = None  # the thread that logs "SIGINT received" (_handler)


_state = _State()


def install(grace_s: float = 30.0) -> None:
    """Handle the stop signals in this process (the main thread of a command); `grace_s`: see the module. Again
    later: sets `grace_s` only. Outside the main thread (where Python cannot take signals): nothing."""
    _state.grace_s = grace_s
    if _state.installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _handler)
    # The handler above runs only when the main thread is back in Python; the C-level handler also writes the
    # signal's number to this pipe, so the deadline starts even while the main thread is stuck in C code.
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_end,), name="stop-watch", daemon=True).start()
    _state.installed = True


def set_grace(grace_s: float) -> None:
    _state.grace_s = grace_s


def set_resume_hint(command_line: str) -> None:
    _state.resume_hint = command_line


def requested() -> int | None:
    """The stop signal received so far (its number), or None."""
    return _state.signum


def check() -> None:
    """Raise Stopped if a stop signal arrived (a point where stopping leaves nothing half done)."""
    if _state.signum is not None:
        raise Stopped(_state.signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop signal arriving inside is recorded, not raised: the block decides where it stops (`check()`)."""
    _state.deferred += 1
    try:
        yield
    finally:
        _state.deferred -= 1


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """A write that must not be cut (a checkpoint's rename, a log's append): a stop arriving inside waits for its
    end, and is raised there unless an enclosing `deferred()` decides where the command stops."""
    raise_after = _state.deferred == 0 or _state.interruptible > 0
    interruptible_depth = _state.interruptible
    _state.deferred, _state.interruptible = _state.deferred + 1, 0
    try:
        yield
    finally:
        _state.deferred, _state.interruptible = _state.deferred - 1, interruptible_depth
    if raise_after:
        check()


@contextlib.contextmanager
def interruptible(enabled: bool = True) -> Iterator[None]:
    """Inside `deferred()`: a part that may be abandoned half way (sampling rollouts) stops at once again."""
    if not enabled:
        yield
        return
    _state.interruptible += 1
    try:
        check()
        yield
    finally:
        _state.interruptible -= 1


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state.signum is not None:
        human_again = signum == signal.SIGINT and time.monotonic() - _state.first_at > 1.0
        if human_again:
            log.error("second Ctrl-C: stopping at once")
            force_exit(signum)
        return  # the same stop delivered twice (Slurm signals every process, torchrun forwards)
    _state.signum, _state.first_at = signum, time.monotonic()
    # Logged from a thread of its own: the handler runs in the main thread between two bytecodes, maybe in the
    # middle of writing a log line, and a log call from here wrote that line twice (or a buffered stream refuses a
    # reentrant write); the thread waits for that write to end.
    notice = f"{signal.Signals(signum).name} received: stopping (the run is kept; see below how to resume)"
    _state.notice = threading.Thread(target=log.warning, args=(notice,), name="retool-stop-notice")
    _state.notice.start()
    _start_deadline(signum)
    if _state.deferred == 0 or _state.interruptible > 0:
        raise Stopped(signum)


_deadline_lock = threading.Lock()


def _start_deadline(signum: int) -> None:
    with _deadline_lock:
        if _state.deadline_started:
            return
        _state.deadline_started = True
    threading.Thread(target=_deadline, args=(signum,), name="stop-deadline", daemon=True).start()


def _watch(read_end: int) -> None:
    while True:
        for signum in os.read(read_end, 64):
            if signum in SIGNALS:
                _start_deadline(signum)


def _deadline(signum: int) -> None:
    time.sleep(_state.grace_s)
    log.error("the run did not stop within %.0f s of %s: killing it", _state.grace_s, signal.Signals(signum).name)
    force_exit(signum)


def force_exit(signum: int) -> None:
    """Kill every process this one started (sandbox and judge workers, torchrun and its ranks), then exit."""
    kill_descendants(os.getpid())
    if _state.resume_hint and REPORT_ENV not in os.environ:  # a rank's launcher says it
        log.error("completed checkpoints and logs are kept; to resume, run: %s", _state.resume_hint)
    exit_quietly(128 + signum)


def exit_quietly(code: int) -> None:
    """Exit now, logs flushed, without the interpreter's teardown: a process group of torch.distributed left to
    the exit handlers can abort the process, and a stopping process owes nothing more to anyone. A rank that
    torchrun forked (rl/rank.py) ends without a teardown anyway, and on success must return to its agent."""
    if code == 0 and os.environ.get(FORKED_RANK_ENV):
        raise SystemExit(0)
    if _state.notice is not None:
        _state.notice.join(timeout=2.0)  # (said: see _handler)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a closed pipe)
            stream.flush()
    os._exit(code)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask the kernel to send this process `signum` when its parent dies (torchrun's ranks when torchrun is killed,
    torchrun when its launcher is): no orphan keeps training after the command that started it is gone."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)


def children(pid: int) -> list[int]:
    """The processes `pid` started (any of its threads), through /proc."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), whatever session each is in."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        below = children(frontier.pop())
        found += below
        frontier += below
    return found


def kill_descendants(pid: int) -> None:
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
