"""One writer per run folder (retool_cli/run_lock.py): a live holder refuses others, naming itself; a holder
that died (SIGKILL: no cleanup at all) blocks nobody; a launcher's folder is its ranks' own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from retool_cli import run_lock

HOLD = (
    "import sys, time\nfrom pathlib import Path\nfrom retool_cli import run_lock\n"
    "with run_lock.holding():\n    run_lock.claim(Path(sys.argv[1]), 'train')\n    print('held', flush=True)\n"
    "    time.sleep(60)\n"
)


def holder_process(folder: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_live_holder_refuses_others_and_a_dead_one_nobody(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    other = holder_process(folder)
    try:
        assert run_lock.holder(folder).startswith(f"pid {other.pid} on ")
        with run_lock.holding(), pytest.raises(run_lock.RunFolderBusy, match=rf"{folder} is in use .*pid {other.pid}"):
            run_lock.claim(folder, "eval")
        with pytest.raises(SystemExit):  # a typed hydra.run.dir: refused before Hydra writes into it
            run_lock.refuse_if_busy(["seed=1", f"hydra.run.dir={folder}"])
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    assert (folder / run_lock.LOCK_NAME).exists() and run_lock.holder(folder) is None  # stale: blocks nobody
    with run_lock.holding():
        run_lock.claim(folder, "eval")
        assert run_lock.holder(folder).startswith(f"pid {os.getpid()} on ")
        run_lock.check(folder)  # this command's own folder
    assert run_lock.holder(folder) is None  # released at the command's end


def test_rank_zero_writes_in_its_launchers_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "run"
    launcher = holder_process(folder)
    try:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv(run_lock.LAUNCHER_ENV, str(launcher.pid))
        with run_lock.holding():
            run_lock.claim(folder, "train")  # the launcher's: no error
        monkeypatch.setenv(run_lock.LAUNCHER_ENV, "1")
        with run_lock.holding(), pytest.raises(run_lock.RunFolderBusy):
            run_lock.claim(folder, "train")
    finally:
        launcher.kill()
        launcher.wait()
