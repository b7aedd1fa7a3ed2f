"""`retool eval` and `retool train` with `rollout=vllm` (vLLM's CPU build) through the real command line:
greedy parity with the hf engine from the first step, exact resume after SIGKILL, two processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_train import SFT, TRAIN, comparable, metrics_of
from tests.helpers import die_after, read_jsonl, run_retool

VLLM = ["rollout=vllm", "rollout.vllm_kv_cache_gib=0.25"]
GREEDY_EVAL = [
    "recipe=dapo_smoke",
    "data.synthetic.num_examples=120",
    "data.dev_size=20",
    "benchmark.max_problems=8",
    "benchmark.n_samples=1",
    "benchmark.temperature=0",
    "benchmark.max_response_tokens=96",
    "eval.bootstrap=100",
]
ROLLOUT_METRICS = (
    "reward/",
    "rollout/code_calls",
    "rollout/response_tokens",
    "rollout/turns",
    "rollout/stop_",
)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("sft")
    run_retool("sft", *SFT, "hydra.run.dir=run", cwd=work, check=True)
    return work / "run"


def test_greedy_eval_through_vllm_equals_the_hf_engines(sft_run: Path, tmp_path: Path) -> None:
    """The whole eval (agent loop, interpreter, judge) on an SFT checkpoint: vLLM and hf write the same samples
    when decoding greedily, and the command line's `rollout=vllm` beats the recipe's `rollout.engine: hf`."""
    results = {}
    for engine, extra in (("hf", ["rollout=hf"]), ("vllm", VLLM)):
        run_retool("eval", *GREEDY_EVAL, *extra, f"ckpt={sft_run}", f"hydra.run.dir={engine}", cwd=tmp_path, check=True)
        results[engine] = json.loads((tmp_path / engine / "results.json").read_text())
    assert results["vllm"]["protocol"]["engine"] == "vllm" and results["hf"]["protocol"]["engine"] == "hf"
    samples = {e: read_jsonl(tmp_path / e / "samples.jsonl") for e in results}
    assert len(samples["vllm"]) == 8
    assert [s["segments"] for s in samples["vllm"]] == [s["segments"] for s in samples["hf"]]
    assert results["vllm"]["metrics"] == results["hf"]["metrics"]


def test_train_with_vllm_samples_from_init_from_at_step_one(sft_run: Path, tmp_path: Path) -> None:
    """vLLM starts from the weights the policy starts from (here `trainer.init_from`), not the base model:
    greedy rollouts of step 1 are the hf engine's."""
    rows = {}
    for engine, extra in (("hf", ["rollout=hf"]), ("vllm", VLLM)):
        run_retool(
            "train",
            *TRAIN,
            *extra,
            "trainer.total_steps=1",
            "rollout.temperature=0",
            f"trainer.init_from={sft_run}",
            f"hydra.run.dir={engine}",
            cwd=tmp_path,
            check=True,
        )
        [row] = metrics_of(tmp_path / engine)
        rows[engine] = {k: v for k, v in row.items() if k.startswith(ROLLOUT_METRICS)}
    assert rows["vllm"] == rows["hf"]
    assert rows["hf"]["rollout/response_tokens"] > 0


def test_train_with_vllm_resumes_exactly_after_sigkill(sft_run: Path, tmp_path: Path) -> None:
    """vLLM's per-request seeds make its CPU sampling reproducible across processes: a run killed after its
    step-2 checkpoint and started again ends with the metrics of an uninterrupted run (the resumed engine
    samples from the checkpoint's weights)."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    args = ["train", *TRAIN, *VLLM, f"trainer.init_from={sft_run}"]
    run_retool(*args, cwd=whole, check=True)
    reference = metrics_of(whole)
    assert [r["step"] for r in reference] == [1, 2, 3, 4]
    die_after(args, cwd=broken, when="step:2")  # killed right after step 2
    run_retool(*args, cwd=broken, check=True)
    assert comparable(metrics_of(broken)) == comparable(reference)


def test_two_processes_each_with_its_own_vllm_engine(sft_run: Path, tmp_path: Path) -> None:
    """trainer.nproc=2 with vLLM on CPU: each gloo process runs its engine in-process (external launcher), and
    rank 0's engine alone serves the periodic eval (no collective inside vLLM's generate waits for rank 1)."""
    proc = run_retool(
        "train",
        *TRAIN,
        *VLLM,
        "trainer.total_steps=2",
        "trainer.nproc=2",
        "trainer.mask_truncated=false",
        "reward.overlong_buffer_tokens=48",
        f"trainer.init_from={sft_run}",
        "hydra.run.dir=run",
        "trainer.eval_every=2",
        "trainer.eval_problems=3",
        "benchmark.n_samples=2",
        "benchmark.max_response_tokens=48",
        cwd=tmp_path,
        check=True,
    )  # lengths vary the reward
    rows = metrics_of(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["train/grad_norm"] > 0
    assert 0.0 <= rows[1]["eval/accuracy"] <= 1.0
    assert len((tmp_path / "run" / "evals" / "step_2" / "samples.jsonl").read_text().splitlines()) == 6
    assert (proc.stdout + proc.stderr).count("external launcher (one per process)") == 2
    assert (tmp_path / "run" / "final.txt").exists()
