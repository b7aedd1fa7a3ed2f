"""trainer.max_staleness: sampling that overlaps the update (rl/overlap.py), end to end through the command
line. Which weights sample each step is fixed by the config: random delays in the tools, the engine and the
update change nothing but the wall time; a run killed anywhere resumes to the uninterrupted run's metrics,
kept trajectories and weights (its checkpoints keep the batches sampled ahead)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli.test_stops import resume_line, rows_of, signal_when
from tests.cli.test_vllm import VLLM
from tests.helpers import TINY, alive, command_env, die_after, read_jsonl, run_retool
from tests.helpers import comparable as timeless

STEPS = 4
ARGS = [
    "train",
    *TINY,
    f"trainer.total_steps={STEPS}",
    "trainer.save_every=1",
    f"trainer.keep_last={STEPS}",
    "trainer.questions_per_step=2",
    "rollout.group_size=4",
    "rollout.max_response_tokens=64",
    "rollout.max_tokens_per_turn=48",
    "trainer.lr=1e-3",  # updates large enough that a stale batch differs from a fresh one
    "trainer.mask_truncated=false",
    "reward.overlong_buffer_tokens=48",  # lengths vary the reward: every group has a gradient
]
EVAL = ["trainer.eval_every=2", "trainer.eval_problems=2", "benchmark.n_samples=2", "benchmark.max_response_tokens=48"]
JITTER = {"RETOOL_JITTER": "tools:0.05,engine:0.05,update:0.4"}


CACHES = ("rollout/code_cache_hit_rate", "rollout/prefix_cache_hit_rate")


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics without timings, nor the caches' hit rates: with batches sampling at once, which of two calls of
    the same code ran it and which was answered from the cache depends on their timing, and what vLLM's prefix
    cache holds on which engine process served which batch (what the model reads is the same either way)."""
    return [{k: v for k, v in row.items() if k not in CACHES} for row in timeless(rows)]


def train(folder: Path, *extra: str, env: dict[str, str] | None = None) -> list[dict]:
    folder.mkdir()
    run_retool(*ARGS, *extra, "hydra.run.dir=run", cwd=folder, check=True, env=env)
    return read_jsonl(folder / "run" / "metrics.jsonl")


def weights(folder: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    [run] = [p.parent for p in folder.rglob("final.txt")]
    return load_file(run / "checkpoints" / f"step_{step}" / "model.safetensors")


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_same_run(a: Path, b: Path) -> None:
    """The finished runs under folders `a` and `b` logged the same metrics (timings aside), kept the same
    trajectories and ended with the same weights."""
    [run_a], [run_b] = ([p.parent for p in folder.rglob("final.txt")] for folder in (a, b))
    assert comparable(read_jsonl(run_a / "metrics.jsonl")) == comparable(read_jsonl(run_b / "metrics.jsonl"))
    assert read_jsonl(run_a / "rollouts.jsonl") == read_jsonl(run_b / "rollouts.jsonl")
    assert same_weights(weights(a), weights(b))


def test_stale_sampling_is_fixed_by_the_config_not_by_speed(sft_checkpoint: Path, tmp_path: Path) -> None:
    """k = 1 twice, once with random delays everywhere (and a periodic eval pausing the sampler): the same
    metrics, evals, kept trajectories and weights. Against k = 0: step 1 (sampled by the initial weights in
    both) is the same bit for bit, and from step 2 on k = 1 trains on tokens one version old, which the
    sampler-trainer gap shows."""
    init = f"trainer.init_from={sft_checkpoint}"
    stale = [init, "trainer.max_staleness=1", *EVAL]
    steady = train(tmp_path / "steady", *stale)
    train(tmp_path / "shaken", *stale, env=JITTER)
    assert_same_run(tmp_path / "shaken", tmp_path / "steady")
    assert "eval/accuracy" in steady[1] and "eval/accuracy" in steady[3]
    assert [r["rollout/behaviour_version"] for r in steady] == [0, 0, 1, 2]
    assert [r["rollout/staleness_max"] for r in steady] == [0, 1, 1, 1]
    assert all(0 <= r["time/trainer_idle_share"] <= 1 and 0 <= r["time/sampler_idle_share"] <= 1 for r in steady), [
        (r["time/trainer_idle_share"], r["time/sampler_idle_share"]) for r in steady
    ]
    assert all(r["train/grad_norm"] > 0 for r in steady)
    # GRPO groups of different lengths, right-padded per micro-batch (the tiny model has no shared-prefix pass)
    assert all(0 < r["train/padding_share"] < 1 and r["time/train_tokens_per_s"] > 0 for r in steady)

    on_policy = train(tmp_path / "on_policy", init, *EVAL)
    assert comparable(on_policy)[0] == {k: v for k, v in comparable(steady)[0].items() if k in on_policy[0]}
    assert same_weights(weights(tmp_path / "on_policy", 1), weights(tmp_path / "steady", 1))
    # the gap between the sampler's log-probs and the trainer's before the update: rounding on-policy, one
    # update's worth with k = 1
    assert all(r["train/mismatch_kl_k3"] < 1e-9 for r in on_policy)
    assert all(r["train/mismatch_kl_k3"] > 1e-4 for r in steady[1:])


def test_partial_rollouts_sample_later_turns_with_newer_weights_whatever_the_speeds(
    sft_checkpoint: Path, tmp_path: Path
) -> None:
    """k = 1 with partial rollouts, twice, once with random delays everywhere: the same metrics, kept
    trajectories and weights; from step 2 on, the turns after a trajectory's first were sampled by the
    trainer's own weights (lag 0) and its first turn one version behind, so a step's lag is a mix of both.
    The update trains on packed rows (trainer.pack_sequences): mixed-version batches without padding."""
    init = f"trainer.init_from={sft_checkpoint}"
    partial = [init, "trainer.pack_sequences=true", "trainer.max_staleness=1", "rollout.partial=true"]
    partial += ["rollout.max_tokens_per_turn=24"]  # turns short enough that trajectories take several
    steady = train(tmp_path / "steady", *partial)
    train(tmp_path / "shaken", *partial, env=JITTER)
    assert_same_run(tmp_path / "shaken", tmp_path / "steady")
    assert [r["rollout/behaviour_version"] for r in steady] == [0, 0, 1, 2]
    mixed = [r for r in steady[1:] if r["rollout/partial_share"] > 0]
    assert mixed, [r["rollout/partial_share"] for r in steady]
    for r in mixed:  # both versions sampled tokens; the mean lag between them
        assert r["rollout/tokens_lag_0"] > 0 and r["rollout/tokens_lag_1"] > 0
        assert 0 < r["rollout/staleness_mean"] < 1 and r["rollout/staleness_max"] == 1
    assert steady[0]["rollout/staleness_max"] == 0  # step 1: version 0 is the trainer's own
    assert all(r["train/padding_share"] == 0 for r in steady)

    whole = train(tmp_path / "whole", *partial[:-2], "rollout.max_tokens_per_turn=24")
    assert comparable(whole)[0] == comparable(steady)[0]  # step 1 cannot be partial: one version exists
    assert [r["rollout/partial_share"] for r in whole] == [0, 0, 0, 0]
    assert all(r["rollout/staleness_mean"] == r["rollout/staleness_max"] for r in whole)


# turns short enough that trajectories take several; each trajectory's first turn cut after 16 tokens and continued
PARTIAL = ["rollout.partial=true", "rollout.max_tokens_per_turn=24", "rollout.partial_tokens=16"]
# engine processes of their own, the weights sent in many buckets (a kill mid-transfer falls between two)
SEPARATE = ["rollout.placement=separate", "rollout.weight_bucket_mb=0.05"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the trainer's and every engine's: the same arithmetic in each placement


def assert_resumes_after_kill(
    folder: Path, extra: list[str], when: str, whole: Path, resume_with: tuple[str, ...] = ()
) -> None:
    """A run (one thread) killed by SIGKILL at `when` (faults.py) in `folder`, then the same command (with
    `resume_with`: values that are not the experiment, run_keys.NOT_THE_EXPERIMENT): the finished run under
    `whole`."""
    folder.mkdir()
    proc = run_retool(*ARGS, *extra, cwd=folder, env={**ONE_THREAD, "RETOOL_DIE_AFTER": when})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    run_retool(*ARGS, *extra, *resume_with, cwd=folder, check=True, env=ONE_THREAD)
    assert len(list(folder.rglob("metrics.jsonl"))) == 1  # the killed run continued, not a new one started
    assert_same_run(folder, whole)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_lora_policy_overlaps_in_either_placement_and_resumes_exactly(
    sft_checkpoint: Path, tmp_path: Path, engine: str
) -> None:
    """k = 1 with partial rollouts on a LoRA policy: the sampler's engines are plain models with the adapters merged
    in (hf colocated: a merged copy; vLLM colocated: the merged weights loaded per slot; separate: the merged
    weights broadcast). Colocated, and separate with random delays, give the same metrics, trajectories and
    weights; hf, killed as update 3 starts, resumes to them exactly, in engine processes with a longer engine
    timeout and another checkpoint interval (the placement and the bounds are not the experiment: a run resumes
    under other values of them, as an EngineTimeout's message advises)."""
    extra = [f"trainer.init_from={sft_checkpoint}", "trainer.max_staleness=1", *PARTIAL, "model.lora_rank=4"]
    extra += ["trainer.lr=1e-3"]  # the adapters move the policy enough to change what later versions sample
    extra += VLLM if engine == "vllm" else []  # rollout.loop=auto takes turns, as partial rollouts need
    colocated = train(tmp_path / "colocated", *extra, env=ONE_THREAD)
    assert max(r["rollout/partial_share"] for r in colocated) > 0 and all(r["train/grad_norm"] > 0 for r in colocated)
    [run] = [p.parent for p in (tmp_path / "colocated").rglob("final.txt")]
    assert (run / "checkpoints" / f"step_{STEPS}" / "adapter" / "adapter_model.safetensors").exists()
    assert not same_weights(weights(tmp_path / "colocated", 1), weights(tmp_path / "colocated"))
    train(tmp_path / "separate", *extra, *SEPARATE, env={**ONE_THREAD, **JITTER})
    assert_same_run(tmp_path / "separate", tmp_path / "colocated")
    if engine == "vllm":  # (its resume: test_vllm_samples_the_same_whatever_the_placement_the_speeds_and_...)
        return
    other_bounds = (*SEPARATE, "rollout.engine_timeout_s=900", "trainer.save_every=2")
    assert_resumes_after_kill(tmp_path / "broken", extra, "update:3", tmp_path / "colocated", other_bounds)


@pytest.mark.parametrize(
    ("when", "variant"),
    [
        ("step:2", []),
        ("update:3", []),
        ("sampling:4", []),
        ("update:3", PARTIAL),
        ("transfer:3", SEPARATE),
    ],
    ids=["step:2", "update:3", "sampling:4", "update:3-partial", "transfer:3-separate"],
)
def test_overlapped_training_resumes_exactly_after_sigkill(
    sft_checkpoint: Path, tmp_path: Path, when: str, variant: list[str]
) -> None:
    """k = 2, killed after step 2's checkpoint (which keeps the batches of steps 3 and 4, sampled ahead), as
    update 3 starts, or as the sampler starts step 4's batch (during update 1 or 2); with partial rollouts
    too; with engine processes, in the middle of the third weight transfer: the same command ends with the
    uninterrupted run's metrics, kept trajectories and weights."""
    extra = [f"trainer.init_from={sft_checkpoint}", "trainer.max_staleness=2", *variant]
    whole = train(tmp_path / "whole", *extra)
    assert [r["rollout/behaviour_version"] for r in whole] == [0, 0, 0, 1]
    broken = tmp_path / "broken"
    broken.mkdir()
    die_after([*ARGS, *extra], cwd=broken, when=when)
    run_retool(*ARGS, *extra, cwd=broken, check=True)
    assert_same_run(broken, tmp_path / "whole")  # (killed before its first row: a fresh run folder, found)


def test_overlapped_training_stops_at_a_step_and_resumes_exactly(sft_checkpoint: Path, tmp_path: Path) -> None:
    """SIGTERM while the sampler waits before step 3's batch (k = 1: during update 2): the run ends step 2,
    saves it with the batch sampled ahead (save_on_signal), exits 143 saying how to resume, and that command
    gives the uninterrupted run's metrics and weights."""
    extra = [f"trainer.init_from={sft_checkpoint}", "trainer.max_staleness=1", "trainer.save_on_signal=true"]
    extra += [f"trainer.save_every={STEPS}"]  # only the stop saves mid-run
    whole = train(tmp_path / "whole", *extra)
    run = tmp_path / "run"
    args = [*ARGS, *extra, f"hydra.run.dir={run}"]
    result, _ = signal_when(args, tmp_path, signal.SIGTERM, lambda: len(rows_of(run)) >= 1, pause="rollouts:3")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    logged = [r["step"] for r in rows_of(run)]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [f"step_{logged[-1]}"]
    run_retool(*resume_line(result, signal.SIGTERM), cwd=tmp_path, check=True)
    assert comparable(rows_of(run)) == comparable(whole)
    assert same_weights(weights(run), weights(tmp_path / "whole"))


def engine_pids(said: str) -> list[int]:
    """The engine processes a run started, each once (a log line may show twice where the progress bar redraws)."""
    return list(dict.fromkeys(int(pid) for pid in re.findall(r"engine process \d+ started \(pid (\d+)\)", said)))


def test_engine_processes_sample_what_the_colocated_sampler_does(sft_checkpoint: Path, tmp_path: Path) -> None:
    """k = 1 with partial rollouts: the sampler's engines in threads of the trainer (colocated), in one engine
    process with random delays in the tools, the engine process and the update, and in two engine processes
    each killed at its third request (restarted, its weights sent again, the request repeated):
    the same metrics, kept trajectories and weights; the weights reach the engines by broadcast, timed."""
    extra = [f"trainer.init_from={sft_checkpoint}", "trainer.max_staleness=1", *PARTIAL]
    colocated = train(tmp_path / "colocated", *extra, env=ONE_THREAD)
    separate = train(tmp_path / "separate", *extra, *SEPARATE, env={**ONE_THREAD, **JITTER})
    assert_same_run(tmp_path / "separate", tmp_path / "colocated")
    assert all(r["time/weight_transfer_s"] > 0 for r in separate)
    assert max(r["rollout/partial_share"] for r in colocated) > 0  # partial rollouts did load newer weights
    assert max(r["rollout/cut_turns"] for r in colocated) > 0  # and continued turns cut at rollout.partial_tokens

    two = tmp_path / "two"
    two.mkdir()
    args = [*ARGS, *extra, *SEPARATE, "rollout.engine_processes=2", "hydra.run.dir=run"]
    result = run_retool(*args, cwd=two, env={**ONE_THREAD, "RETOOL_DIE_AFTER": "engine:3"})
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert len(engine_pids(said)) == 4, said[-3000:]  # two, and the two restarted
    assert "restarting it and sending its weights again" in said
    assert_same_run(two, tmp_path / "colocated")
    assert not alive(engine_pids(said))


def test_an_engine_process_that_dies_for_good_stops_the_run_with_an_error(tmp_path: Path) -> None:
    """No restart left: the run stops (no hang) with an error naming the process and the setting, and the
    command that resumes it in its folder (resume turned on, which this run had off, so the same command would
    start over; such a line resuming: tests/cli/test_stops.py); no engine process outlives it; nor one outlives a
    trainer killed in the middle of a weight transfer."""
    args = [*ARGS, "trainer.max_staleness=1", *SEPARATE, "rollout.engine_restarts=0"]
    env = {"RETOOL_DIE_AFTER": "engine:5"}  # its last batch's last call: after two or three steps
    result = run_retool(*args, "trainer.resume=false", cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "engine process 0" in said and "rollout.engine_restarts" in said
    assert "Traceback" not in said
    assert not alive(engine_pids(said))
    [line] = re.findall(r"to resume, run: retool (.*?hydra\.run\.dir=\S+)", " ".join(said.split()))
    resume = shlex.split(line)
    assert "trainer.resume=true" in resume and "trainer.resume=false" not in resume
    folder = Path(resume[-1].removeprefix("hydra.run.dir="))
    assert 1 <= len(rows_of(folder)) < STEPS and (folder / "checkpoints").is_dir()

    (tmp_path / "killed").mkdir()  # (here, the same command would resume the run above)
    killed = run_retool(*args, cwd=tmp_path / "killed", env={"RETOOL_DIE_AFTER": "transfer:2"}, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    pids = engine_pids(killed.stdout + killed.stderr)
    assert pids
    deadline = time.monotonic() + 10  # an orphan notices its parent is gone within a second or two
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pids)


def test_an_engine_process_killed_as_it_starts_stops_the_run_and_the_other_one(tmp_path: Path) -> None:
    """Two engine processes start at once; the second is killed as it builds its models (as the out-of-memory
    killer would): the run stops with an error naming the process and how it ended, no traceback, no run folder
    (nothing was written), and neither process left."""
    args = [*ARGS, "trainer.max_staleness=1", *SEPARATE, "rollout.engine_processes=2", "hydra.run.dir=run"]
    result = run_retool(*args, cwd=tmp_path, env={"RETOOL_DIE_AFTER": "engine_start:1"}, timeout=120)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said[-3000:]
    assert re.search(r"engine process 1 \(pid \d+\) was killed by SIGKILL .*during a start request", said), said
    assert "Traceback" not in said and not (tmp_path / "run").exists()
    pids = engine_pids(said)
    assert len(pids) == 2 and not alive(pids)


def test_a_stop_during_a_fresh_runs_first_batch_ends_it_at_once(tmp_path: Path) -> None:
    """SIGTERM while a fresh run's sampler works on its first batch (k = 1; held there by RETOOL_PAUSE_AT): with
    nothing trained, the run stops at once rather than sample, update and save a step first (minutes, on a real
    model): exit 143, no step logged, no folder kept; the same command again runs the whole run. A fresh
    interpreter (not the tests' zygote, whose exit skips the teardown): the sampler's thread, abandoned inside
    torch's generate, must not abort the exit ("terminate called without an active exception", exit 134)."""
    run, paused = tmp_path / "run", tmp_path / "paused"
    args = [*ARGS, "trainer.max_staleness=1", "model.accelerate=false", f"hydra.run.dir={run}"]
    env = {"RETOOL_PAUSED_FILE": str(paused), "RETOOL_TEST_ZYGOTE": "0"}
    result, _ = signal_when(args, tmp_path, signal.SIGTERM, paused.exists, pause="rollouts:1", env=env)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 128 + signal.SIGTERM, said[-3000:]
    assert "stopped by SIGTERM before anything was written" in said and "Traceback" not in said, said[-3000:]
    assert not rows_of(run)
    run_retool(*args, cwd=tmp_path, check=True)
    assert [row["step"] for row in rows_of(run)] == list(range(1, STEPS + 1))


def test_ctrl_c_as_engine_processes_start_stops_the_run_cleanly(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) as two engine processes are spawned,
    while they import: they hold it until they ignore it (a stop is the trainer's), and the trainer, with nothing
    trained, stops at once rather than wait for their start and a first step: exit 130, well within the default
    stop grace; no KeyboardInterrupt from an engine process, and nothing left. (A plain process in a session of
    its own: the signal must not reach the test.)"""
    args = [*ARGS, "trainer.max_staleness=1", *SEPARATE, "rollout.engine_processes=2", "hydra.run.dir=run"]
    command = [sys.executable, "-m", "retool_cli", *args]
    env = command_env({"COLUMNS": "400"})
    out = subprocess.PIPE
    proc = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    said = []
    for line in proc.stdout:  # (the run goes on past the signal: the loop ends at the line or at its end)
        said.append(line)
        if "engine process 1 started" in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    text = " ".join(("".join(said) + proc.communicate(timeout=120)[0]).split())
    assert proc.returncode == 128 + signal.SIGINT, text[-3000:]
    assert "stopped by SIGINT before anything was written" in text, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "did not stop within" not in text
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    pids = engine_pids(text)
    assert len(pids) == 2 and not alive(pids)


def test_vllm_samples_the_same_whatever_the_placement_the_speeds_and_the_engine_count(
    sft_checkpoint: Path, tmp_path: Path
) -> None:
    """vLLM's CPU build, k = 1 with partial rollouts: colocated (the trainer's own engine, shared by the batches
    in flight and periodic evaluation, weights swapped per call: rollout/weight_slots.py), in one engine process
    holding both batches' weights, and in two, the last two with random delays in the tools, the engines and
    the update, and colocated again, killed as update 3 starts and resumed: the same metrics, kept trajectories
    and weights."""
    extra = [f"trainer.init_from={sft_checkpoint}", "trainer.max_staleness=1", *PARTIAL, *VLLM, *EVAL]
    one = train(tmp_path / "colocated", *extra, env=ONE_THREAD)
    assert "eval/accuracy" in one[1]  # the trainer's evaluation ran on the shared engine, with its own weights
    assert [r["rollout/behaviour_version"] for r in one] == [0, 0, 1, 2]
    assert max(r["rollout/partial_share"] for r in one) > 0 and max(r["rollout/cut_turns"] for r in one) > 0
    train(tmp_path / "one", *extra, *SEPARATE, env={**ONE_THREAD, **JITTER})
    assert_same_run(tmp_path / "one", tmp_path / "colocated")
    train(tmp_path / "two", *extra, *SEPARATE, "rollout.engine_processes=2", env={**ONE_THREAD, **JITTER})
    assert_same_run(tmp_path / "two", tmp_path / "colocated")
    # colocated, killed as update 3 starts: the resumed run's new engine samples step 4 beside the resumed update
    # 3 (its first call once compiled a sampling op, which changed that update's last bits in about half of the
    # resumes: vllm_engine._compile_sampling_ops)
    assert_resumes_after_kill(tmp_path / "broken", extra, "update:3", tmp_path / "colocated")
