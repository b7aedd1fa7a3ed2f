"""One writer per run folder: a command that writes a run folder holds an exclusive lock on its `.retool.lock`
file, and a second command into a folder that a live run holds is refused with an error naming the folder and
the process that holds it.

The lock is flock(2) on an open file: the kernel drops it when its process ends, however it ends (SIGKILL, a
node's crash), so a lock left by a dead run never blocks a rerun; the file stays and only says who held it last.
Under `retool train` with several processes the launcher holds the folder for its ranks (`LAUNCHER_ENV` names
it): rank 0 writes there as the launcher's own, and only rank 0 claims a folder.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from retool_cli.errors import ConfigError

LOCK_NAME = ".retool.lock"
LAUNCHER_ENV = "RETOOL_LAUNCHER_PID"  # the pid of the `retool train` that launched this process through torchrun

_held: dict[Path, int] | None = None  # the folders this command holds: their lock files' descriptors


class RunFolderBusy(ConfigError):
    """The run folder is being written by another live run."""


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """The span of one command: the folders it claims inside are released at its end."""
    global _held
    _held = {}
    try:
        yield
    finally:
        for fd in _held.values():
            os.close(fd)
        _held = None


def holder(folder: Path) -> str | None:
    """Who holds `folder` now ("pid 123 on host h: retool train, since ..."), or None when no live process does."""
    path = folder / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
    finally:
        os.close(fd)
    return None


def check(folder: Path) -> None:
    """Refuse `folder` if another live run holds it (this command itself and its launcher are not others). A
    process of a multi-process run other than rank 0 writes nothing there, and checks nothing."""
    if os.environ.get("RANK", "0") != "0":
        return
    folder = folder.resolve()
    if _held is not None and folder in _held:
        return
    who = holder(folder)
    if who is None or _is_ours(who):
        return
    raise RunFolderBusy(
        f"{folder} is in use by another run ({who}): one run writes a folder at a time. Wait for it to finish, "
        "stop it, or give this command another hydra.run.dir"
    )


def claim(folder: Path, command: str) -> None:
    """Hold `folder` for this command (see the module); only rank 0 of a run of several processes claims."""
    if _held is None or os.environ.get("RANK", "0") != "0":
        return
    folder = folder.resolve()
    if folder in _held:
        return
    check(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        who = holder(folder)
        if who is not None and _is_ours(who):
            return  # held by our launcher for us
        raise RunFolderBusy(
            f"{folder} is in use by another run ({who}): give this command another hydra.run.dir"
        ) from None
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    text = f"pid {os.getpid()} on {socket.gethostname()}: retool {command}, since {since}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    _held[folder] = fd


def _is_ours(who: str) -> bool:
    """Whether the holder described by `who` is this process or the launcher of this process."""
    pid = who.split()[1] if who.startswith("pid ") else ""
    on_this_host = f" on {socket.gethostname()}:" in who
    return on_this_host and pid in (str(os.getpid()), os.environ.get(LAUNCHER_ENV, ""))


def refuse_if_busy(overrides: list[str]) -> None:
    """Before Hydra writes its .hydra/ files into a typed `hydra.run.dir`: refuse a folder a live run holds, with
    one line and exit status 1, so that the live run's recorded config is never overwritten."""
    typed = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    if not typed:
        return
    try:
        check(Path(typed[-1]))
    except RunFolderBusy as busy:
        print(f"error: {busy}", file=sys.stderr)
        raise SystemExit(1) from None
