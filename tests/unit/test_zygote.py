"""The tests' zygote (tests/zygote.py) gives a command what a fresh `python -m retool_cli` gives it: output, exit
status, environment, working folder, a process of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import command_env
from tests.zygote import zygote_for

ENV = command_env()


def fresh(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "retool_cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def forked(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    zygote = zygote_for(env, args)
    if zygote is None:
        pytest.skip("RETOOL_TEST_ZYGOTE=0")
    proc = zygote.start(args, env, cwd)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.pid not in (os.getpid(), zygote.proc.pid)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],  # stdout, exit 0
        ["train", "trainer.no_such_key=1"],  # Hydra's error, exit 1
        ["eval-report", "missing"],  # our error, naming the folder relative to the working folder
        ["prepare", "recipe=dapo_smoke", "data.synthetic.num_examples=-1", "hydra.run.dir=out"],  # a config check
        ["train", "rollout=vllm", "rollout.group_size=0"],  # from the zygote that preloaded vLLM: nothing of it shows
    ],
)
def test_a_forked_command_says_and_exits_as_a_fresh_one(args: list[str], tmp_path: Path) -> None:
    env = {**ENV, "COLUMNS": "120"}  # read at run time: the zygote's own 200 must not leak into the command
    want, got = fresh(args, tmp_path, env), forked(args, tmp_path, env)
    assert (got.returncode, timeless(got.stdout), timeless(got.stderr)) == (
        want.returncode,
        timeless(want.stdout),
        timeless(want.stderr),
    )


def timeless(log: str) -> str:
    return re.sub(r"\[\d\d:\d\d:\d\d\]", "[time]", log)


def test_a_forked_command_dies_by_the_signal_that_kills_it(tmp_path: Path) -> None:
    """RETOOL_DIE_AFTER makes the command SIGKILL itself (retool_cli/faults.py); a run-time variable, so the same
    zygote serves it."""
    args = ["train", "recipe=dapo_smoke", "trainer.total_steps=1", "data.synthetic.num_examples=60"]
    args += ["data.dev_size=10", "rollout.group_size=2", "trainer.questions_per_step=2", "hydra.run.dir=run"]
    got = forked(args, tmp_path, {**ENV, "RETOOL_DIE_AFTER": "step:1"})
    assert got.returncode == -9, got.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step_1").is_dir()
