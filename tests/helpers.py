from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def run_retool(
    *args: str, cwd: Path, check: bool = False, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run the real command line in a subprocess (as a user would), capturing its output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "retool_cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"retool {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def kill_after(args: list[str], cwd: Path, marker: str, done: str, timeout: float = 300) -> None:
    """Start `retool ARGS` and SIGKILL it as soon as a file matching `marker` appears below `cwd`; fails if the
    run wrote `done` (it finished before it could be killed)."""
    proc = subprocess.Popen([sys.executable, "-m", "retool_cli", *args], cwd=cwd, env={**os.environ},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if list(cwd.rglob(marker)):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert not list(cwd.rglob(done)), "the run finished before it could be killed"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
