from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.zygote import Forked, zygote_for

# A training run of seconds on the smoke recipe: 2 steps of 2 questions x 2 samples, a small synthetic set.
SMALL_TRAIN = [
    "recipe=dapo_smoke",
    "trainer.total_steps=2",
    "trainer.save_every=2",
    "trainer.questions_per_step=2",
    "rollout.group_size=2",
    "rollout.max_response_tokens=48",
    "data.synthetic.num_examples=60",
]


# The small synthetic set of the end-to-end tests.
TINY = ["recipe=dapo_smoke", "data.synthetic.num_examples=120", "data.dev_size=20"]
# The SFT run every test that starts from an SFT checkpoint shares (tests/conftest.py: sft_checkpoint, made once a
# test run), and its arguments for the tests that stop it and resume: 60 steps give a checkpoint that writes calls
# (most still malformed); metrics every 5 steps (a stop at step 5 has a row to wait for), checkpoints every 20.
SFT = [*TINY, "sft.steps=60", "sft.batch_size=16", "sft.log_every=5", "sft.save_every=20", "sft.warmup_steps=5"]


# Metrics that measure the machine's speed, not the run: left out where runs are compared.
TIMING = ("time/", "rollout/generate_s", "rollout/wait_tools_s", "rollout/gen_tokens_per_s", "rollout/reward_s")


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics rows without their timings."""
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


def run_retool(
    *args: str, cwd: Path, check: bool = False, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real command line in a process of its own (as a user would), capturing its output."""
    proc = start_retool(*args, cwd=cwd, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if check and proc.returncode != 0:
        raise AssertionError(f"retool {' '.join(args)} failed ({proc.returncode}):\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def command_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """A test command's environment: this process's, the hub offline, wide log lines, then `env`."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200", **(env or {})}


def start_retool(
    *args: str, cwd: Path, env: dict[str, str] | None = None, text: bool = True, merged: bool = False
) -> subprocess.Popen | Forked:
    """Start `python -m retool_cli ARGS` (stdout and stderr captured; `merged`: both in stdout) with this
    process's environment, the hub offline, and `env`: forked from the test process's zygote (tests/zygote.py: the
    imports done once), a plain subprocess where RETOOL_TEST_ZYGOTE=0."""
    env = command_env(env)
    zygote = zygote_for(env, list(args))
    if zygote is not None:
        return zygote.start(list(args), env, cwd, text, merged)
    stderr = subprocess.STDOUT if merged else subprocess.PIPE
    command = [sys.executable, "-m", "retool_cli", *args]
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=text)


def die_after(args: list[str], cwd: Path, when: str) -> None:
    """Run `retool ARGS` and let it die by SIGKILL at a chosen point (`when`: step:N or chunk:N, see
    retool_cli/faults.py): the same point on every run, unlike killing it from outside on a timer."""
    proc = run_retool(*args, cwd=cwd, env={"RETOOL_DIE_AFTER": when})
    assert proc.returncode == -signal.SIGKILL, f"expected death at {when}, got {proc.returncode}:\n{proc.stderr}"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie waiting for a parent that is gone counts as gone)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.append(pid)
    return left
