"""Stops a cluster sends (retool_cli/stops.py): SIGTERM (kill, timeout, scancel, preemption) and SIGINT (Ctrl-C)
to the real command line while it works: every process of the run gone within 30 s, exit status 128 + signal,
one line saying how to resume, and that command continuing to exactly what an uninterrupted run gives. Also one
writer per run folder (retool_cli/run_lock.py) and a rendezvous that listens on loopback alone."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from retool_cli.stops import descendants
from tests.helpers import SFT, TINY, alive, read_jsonl, run_retool, start_retool
from tests.helpers import comparable as timeless

TRAIN = [
    "train",
    *TINY,
    "trainer.total_steps=3",  # signalled in step 2: a step or two to resume, and the uninterrupted run to match
    "trainer.save_every=2",
    "trainer.questions_per_step=2",
    "rollout.group_size=2",
    "rollout.max_response_tokens=40",
]


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics without timings (SFT's elapsed `seconds` too)."""
    return [{k: v for k, v in row.items() if k != "seconds"} for row in timeless(rows)]


def rows_of(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    return read_jsonl(run / name) if (run / name).exists() else []


def signal_when(
    args: list[str],
    cwd: Path,
    signum: int,
    ready: Callable[[], bool],
    checks: Callable[[int], None] | None = None,
    pause: str = "",
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess, list[int]]:
    """Run `retool ARGS`, send `signum` once `ready()` holds (after `checks(pid)`, done while it works); its result
    and every process that was part of it then (torchrun, ranks, sandbox and judge workers). `pause`: where the
    command waits for the signal (RETOOL_PAUSE_AT, retool_cli/faults.py), so that it cannot finish first; `env`: more
    of the command's environment."""
    proc = start_retool(*args, cwd=cwd, env={"COLUMNS": "400", "RETOOL_PAUSE_AT": pause, **(env or {})}, text=False)
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        assert time.monotonic() < deadline, "the run never got to the point of the signal"
        time.sleep(0.1)
    if checks is not None:
        checks(proc.pid)
    tree = [proc.pid, *descendants(proc.pid)]
    proc.send_signal(signum)
    try:
        stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running 30 s after {signal.Signals(signum).name}") from None
    for _ in range(20):  # what it started: gone with it (a sandbox worker's jail may take a moment to be reaped)
        if not alive(tree):
            break
        time.sleep(0.1)
    assert not alive(tree), [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in alive(tree)]
    return subprocess.CompletedProcess(args, proc.returncode, stdout.decode(), stderr.decode()), tree


def resume_line(result: subprocess.CompletedProcess, signum: int) -> list[str]:
    """The command the stopped run says resumes it (its arguments after `retool`), checked to be said once."""
    text = " ".join((result.stdout + result.stderr).split())  # the log's own line wrapping undone
    lines = re.findall(
        rf"stopped by {signal.Signals(signum).name}; to resume, run: retool (.*?hydra\.run\.dir=\S+)", text
    )
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    return shlex.split(lines[0])


def listening_addresses(pids: list[int]) -> list[str]:
    """The local addresses of the TCP sockets the processes listen on (from the kernel's socket table)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1].split(":")[0])
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc/net/tcp{,6} write them


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The uninterrupted one-process training run every stopped run must come back to."""
    work = tmp_path_factory.mktemp("reference")
    run_retool(*TRAIN, "hydra.run.dir=run", cwd=work, check=True)
    return comparable(rows_of(work / "run"))


@pytest.mark.parametrize(
    ("signum", "extra"),
    [(signal.SIGTERM, []), (signal.SIGINT, ["trainer.save_on_signal=true", "trainer.resume=false"])],
    ids=["sigterm", "sigint-save_on_signal-resume_never"],
)
def test_train_stops_cleanly_and_resumes_exactly(
    tmp_path: Path, reference: list[dict], signum: int, extra: list
) -> None:
    """Signalled once step 1 is logged (in step 2's rollouts, or later): the run stops, says how to resume, and
    that command gives the uninterrupted run's metrics. With save_on_signal the last complete step is saved, so
    the resumed run redoes nothing; with resume off, the printed command turns it on."""
    run = tmp_path / "run"
    args = [*TRAIN, *extra, f"hydra.run.dir={run}"]
    result, _ = signal_when(args, tmp_path, signum, lambda: len(rows_of(run)) >= 1, pause="rollouts:2")
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    again = resume_line(result, signum)
    assert again[0] == "train" and f"hydra.run.dir={run}" in again
    logged = [r["step"] for r in rows_of(run)]
    saved = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    if extra:  # every logged step is in a checkpoint: nothing finished is lost
        assert "trainer.resume=true" in again and saved and saved[-1] == logged[-1] < 3
    run_retool(*again, cwd=tmp_path, check=True)
    assert comparable(rows_of(run)) == reference
    assert (run / "final.txt").exists()


@pytest.fixture(scope="module")
def two_process_reference(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("reference2")
    # from an empty model cache: the launcher builds model=tiny before its ranks (a rank > 0 could not write it)
    fresh = {"RETOOL_CACHE": str(work / "cache")}
    run_retool(*TRAIN, "trainer.nproc=2", "hydra.run.dir=run", cwd=work, check=True, env=fresh)
    return comparable(rows_of(work / "run"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_two_process_train_stops_every_rank_and_listens_on_loopback(
    tmp_path: Path, two_process_reference: list[dict], signum: int
) -> None:
    """A signal to the command (the launcher) reaches torchrun's ranks (forked from its agent: rl/rank.py): all
    stop at one step boundary, every process is gone, the launcher says how to resume, and that gives the
    uninterrupted two-process run; while it ran, nothing of it listened beyond 127.0.0.1."""
    run = tmp_path / "run"
    seen: list[str] = []
    commands: list[bytes] = []

    def checks(pid: int) -> None:
        seen.extend(listening_addresses([pid, *descendants(pid)]))
        commands.extend(Path(f"/proc/{p}/cmdline").read_bytes() for p in descendants(pid))

    result, tree = signal_when(
        [*TRAIN, "trainer.nproc=2", f"hydra.run.dir={run}"],
        tmp_path,
        signum,
        lambda: len(rows_of(run)) >= 1,
        checks=checks,
        pause="rollouts:2",
    )
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    assert len(tree) >= 4  # the launcher, torchrun, two ranks (and their workers)
    assert sum(b"retool_cli.rl.torchrun" in c for c in commands) == 3  # torchrun's agent and its two forks
    assert seen and set(seen) <= LOOPBACK, seen  # the rendezvous store and gloo's connections
    run_retool(*resume_line(result, signum), cwd=tmp_path, check=True)
    assert comparable(rows_of(run)) == two_process_reference
    assert not list((run / "checkpoints").glob(".step_*.tmp"))  # no checkpoint half-written


@pytest.mark.parametrize(
    ("signum", "extra"),
    [(signal.SIGINT, ["trainer.save_on_signal=true"]), (signal.SIGTERM, [])],
    ids=["sigint-save_on_signal", "sigterm"],
)
def test_sft_stops_at_a_step_and_resumes_exactly(
    tmp_path: Path, sft_checkpoint: Path, signum: int, extra: list[str]
) -> None:
    """SFT ends the step it is in (with save_on_signal: and saves it, else its last checkpoint is where it
    resumes, at step 20 or none), and the resumed run's losses and weights are the uninterrupted run's."""
    run = tmp_path / "run"
    args = ["sft", *SFT, *extra, f"hydra.run.dir={run}"]
    result, _ = signal_when(args, tmp_path, signum, lambda: len(rows_of(run)) >= 1, pause="step:5")
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    saved = [int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*")]
    if extra:
        assert len(saved) == 1 and 5 <= saved[0] < 60
    run_retool(*resume_line(result, signum), cwd=tmp_path, check=True)
    assert comparable(rows_of(run)) == comparable(rows_of(sft_checkpoint))
    from safetensors.torch import load_file

    resumed, uninterrupted = (
        load_file(r / "checkpoints" / "step_60" / "model.safetensors") for r in (run, sft_checkpoint)
    )
    assert all((resumed[k] == uninterrupted[k]).all() for k in uninterrupted)


def eval_args(folder: Path) -> list[str]:
    data = folder / "problems.jsonl"
    data.write_text("".join(f'{{"problem": "What is {i} * 7?", "answer": "{i * 7}"}}\n' for i in range(16)))
    args = ["eval", *TINY, "benchmark=file", f"benchmark.data.path={data}", "benchmark.n_samples=2"]
    return [*args, "benchmark.max_response_tokens=40", "eval.questions_per_batch=2", "model.name_or_path=tiny"]


@pytest.fixture(scope="module")
def eval_reference(tmp_path_factory) -> list[dict]:
    work = tmp_path_factory.mktemp("eval_reference")
    run_retool(*eval_args(work), "hydra.run.dir=run", cwd=work, check=True)
    return rows_of(work / "run", "samples.jsonl")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_eval_stops_and_resumes_without_redoing_samples(
    tmp_path: Path, eval_reference: list[dict], signum: int
) -> None:
    """Signalled once the first samples are written: the samples written stay, the rerun finishes the rest, and
    the samples are the uninterrupted run's."""
    run = tmp_path / "run"
    started = lambda: bool(rows_of(run, "samples.jsonl"))
    result, _ = signal_when([*eval_args(tmp_path), f"hydra.run.dir={run}"], tmp_path, signum, started, pause="chunk:1")
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    kept = rows_of(run, "samples.jsonl")
    run_retool(*resume_line(result, signum), cwd=tmp_path, check=True)
    resumed = rows_of(run, "samples.jsonl")
    assert resumed[: len(kept)] == kept  # nothing written was redone
    key = lambda r: (r["problem_id"], r["sample_index"])
    strip = lambda r: {k: v for k, v in r.items() if not k.endswith(("duration_s", "seconds", "time"))}
    assert sorted(map(strip, resumed), key=key) == sorted(map(strip, eval_reference), key=key)


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    """While a run writes a folder, the same folder typed again is refused before anything is written there (the
    live run's recorded config untouched), and so is the same command without a folder (it would continue the
    live run's unfinished folder); both name the folder and the process (tests/unit/test_run_lock.py: a dead
    run's lock)."""
    run = tmp_path / "outputs" / "train" / "live"
    args = [*TRAIN, "trainer.total_steps=40"]

    def second_writers(pid: int) -> None:
        recorded = (run / ".hydra" / "config.yaml").read_text()
        for extra in ([f"hydra.run.dir={run}", "trainer.lr=0.5"], []):
            refused = run_retool(*args, *extra, cwd=tmp_path)
            assert refused.returncode == 1, refused.stderr[-2000:]
            message = " ".join((refused.stdout + refused.stderr).split())
            assert f"{run} is in use by another run (pid {pid} on " in message and "retool train" in message
            assert "Traceback" not in refused.stderr
        assert (run / ".hydra" / "config.yaml").read_text() == recorded
        assert [p.parent for p in (tmp_path / "outputs").rglob("provenance.json")] == [run]  # no folder left

    result, _ = signal_when(
        [*args, f"hydra.run.dir={run}"],
        tmp_path,
        signal.SIGTERM,
        lambda: len(rows_of(run)) >= 1,
        checks=second_writers,
        pause="rollouts:2",  # the live run waits there while the others are refused
    )
    assert result.returncode == 128 + signal.SIGTERM
