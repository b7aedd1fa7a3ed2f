"""trainer.max_staleness with several trainer processes (torchrun, gloo on CPU), end to end: each process samples
its share of every batch ahead, and a checkpoint keeps each process's share of the batches in flight."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_overlap import (
    ARGS,
    JITTER,
    ONE_THREAD,
    PARTIAL,
    SEPARATE,
    assert_same_run,
    comparable,
    train,
)
from tests.cli.test_stops import rows_of
from tests.cli.test_vllm import VLLM
from tests.helpers import run_retool

PIPELINE_KEYS = ("trainer.max_staleness", "rollout.partial")  # what a synchronous run of the same config drops
LAYOUTS = {
    # switching between turns only: a turn cut at rollout.partial_tokens continues with a seed of its own, so
    # step 1 would not be the synchronous run's
    "fsdp": ["trainer.fsdp=true", *PARTIAL[:2]],
    # dynamic sampling: the processes count the groups whose rewards differ in their samplers' threads (in a
    # process group of their own), for as many rounds as it takes
    "data-parallel-separate": [*SEPARATE, *PARTIAL, "trainer.dynamic_sampling=true", "trainer.max_sampling_rounds=3"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_several_trainer_processes_overlap_and_resume_exactly(
    sft_checkpoint: Path, tmp_path: Path, layout: str
) -> None:
    """Two trainer processes, k = 1 with partial rollouts, each sampling its share of every batch ahead (FSDP2:
    from whole weights all-gathered into every process's snapshots; data parallel: in engine processes of each
    trainer's own). Killed as update 3 starts, with random delays everywhere, the same command resumes, each
    process with its own share of the batch the checkpoint kept, to the uninterrupted run's metrics, kept
    trajectories and weights; in one process it refuses to. FSDP2's step 1, sampled by the initial weights, is
    the synchronous run's bit for bit."""
    extra = [f"trainer.init_from={sft_checkpoint}", "trainer.nproc=2", "trainer.max_staleness=1", *LAYOUTS[layout]]
    whole = train(tmp_path / "whole", *extra, env=ONE_THREAD)
    assert [r["rollout/behaviour_version"] for r in whole] == [0, 0, 1, 2]
    assert max(r["rollout/partial_share"] for r in whole) > 0 and whole[0]["train/grad_norm"] > 0
    broken = tmp_path / "broken"
    broken.mkdir()
    args = [*ARGS, *extra, "hydra.run.dir=run"]
    result = run_retool(*args, cwd=broken, env={**ONE_THREAD, **JITTER, "RETOOL_DIE_AFTER": "update:3"})
    assert result.returncode != 0 and len(rows_of(broken / "run")) == 2, result.stderr[-3000:]
    if layout == "fsdp":
        one = run_retool(*args, "trainer.nproc=1", cwd=broken, env=ONE_THREAD)
        said = " ".join((one.stdout + one.stderr).split())  # the error, as the terminal wrapped it
        assert one.returncode == 1 and "by 2 trainer process(es)" in said and "nnodes = 2" in said, said[-3000:]
    run_retool(*args, cwd=broken, check=True, env={**ONE_THREAD, **JITTER})
    assert_same_run(broken, tmp_path / "whole")
    if layout == "fsdp":
        synchronous = [a for a in extra if a.split("=")[0] not in PIPELINE_KEYS]
        on_policy = train(tmp_path / "on_policy", *synchronous, "trainer.total_steps=1")
        assert comparable(on_policy)[0] == {k: v for k, v in comparable(whole)[0].items() if k in on_policy[0]}


def test_a_vllm_engine_spanning_two_processes_samples_ahead_as_one_process_does(
    sft_checkpoint: Path, tmp_path: Path
) -> None:
    """rollout.vllm_tensor_parallel_size=2 with trainer.max_staleness=1 (colocated): the two trainer processes
    are one vLLM engine, whose calls their samplers' threads make in the order the first process takes them
    (rollout/weight_slots.py: CallOrder). Under random delays everywhere, killed as update 3 starts and resumed
    by the same command, it samples what one process's engine samples ahead, every step, with the same weight
    versions, and each process trains on half of it (the gradient as one process's, to rounding)."""
    extra = [f"trainer.init_from={sft_checkpoint}", "trainer.max_staleness=1", *PARTIAL, *VLLM, "rollout.loop=turns"]
    one = train(tmp_path / "one", *extra)
    args = [*ARGS, *extra, "trainer.nproc=2", "rollout.vllm_tensor_parallel_size=2", "hydra.run.dir=run"]
    result = run_retool(*args, cwd=tmp_path, env={**JITTER, "RETOOL_DIE_AFTER": "update:3"})
    assert result.returncode != 0 and len(rows_of(tmp_path / "run")) == 2, result.stderr[-3000:]
    run_retool(*args, cwd=tmp_path, check=True, env=JITTER)
    spanning = rows_of(tmp_path / "run")
    assert [r["rollout/behaviour_version"] for r in spanning] == [0, 0, 1, 2]
    assert max(r["rollout/partial_share"] for r in spanning) > 0
    sampled = ("rollout/response_tokens", "rollout/code_calls", "rollout/turns", "rollout/behaviour_version")
    for tp, alone in zip(spanning, one, strict=True):  # the engine's whole share; each process trains on half
        assert {k: tp[k] for k in sampled} == {k: alone[k] for k in sampled}
        assert tp["train/grad_norm"] == pytest.approx(alone["train/grad_norm"], rel=1e-4)
