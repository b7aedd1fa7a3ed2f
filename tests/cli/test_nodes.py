"""Training across nodes, proven as two nodes on one host: two `retool train` commands with trainer.nnodes=2 and
node ranks 0 and 1 (one gloo process each, rendezvous on 127.0.0.1) make exactly the run of one node with
trainer.nproc=2; a node that dies stops the other with a clear error, and rerunning both resumes exactly."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cli.test_train import TRAIN, comparable, metrics_of
from tests.cli.test_vllm import VLLM
from tests.helpers import run_retool, start_retool
from tests.zygote import Forked

ARGS = [*TRAIN, "trainer.mask_truncated=false", "reward.overlong_buffer_tokens=48", "trainer.keep_last=4"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen | Forked:
    return start_retool("train", *args, cwd=cwd, env=env, merged=True)


def two_nodes(args: list[str], cwd: Path, die: str | None = None) -> list[tuple[int, str, float]]:
    """Both nodes' commands at once (node 1 SIGKILLed after `die`, e.g. step:2): each one's exit code, output
    and the time it ended (seconds since the start)."""
    port = free_port()
    started = time.monotonic()
    procs = [
        start(
            [*args, "trainer.nnodes=2", f"trainer.node_rank={rank}", f"trainer.master_port={port}"],
            cwd,
            {"RETOOL_DIE_AFTER": die} if die and rank == 1 else None,
        )
        for rank in (0, 1)
    ]
    out = []
    for proc in procs:
        text, _ = proc.communicate(timeout=600)
        out.append((proc.returncode, text, time.monotonic() - started))
    return out


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{step}" / "model.safetensors")


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def two_nodes_and_one(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The run as two node commands (folder `nodes`) and as one command with trainer.nproc=2 (folder `one`):
    the same metrics and final weights, bit for bit. Returns the one-node command's result."""
    nodes = two_nodes([*args, "hydra.run.dir=nodes"], cwd)
    assert [code for code, _, _ in nodes] == [0, 0], nodes[0][1][-3000:] + nodes[1][1][-3000:]
    one = run_retool("train", *args, "trainer.nproc=2", "hydra.run.dir=one", cwd=cwd, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    for said in (nodes[0][1], nodes[1][1], one.stdout + one.stderr):  # a clean end: no process's exit complains
        assert "Traceback" not in said, said[-3000:]
    assert comparable(metrics_of(cwd / "nodes")) == comparable(metrics_of(cwd / "one"))
    steps = metrics_of(cwd / "one")[-1]["step"]
    assert same_weights(weights(cwd / "nodes", steps), weights(cwd / "one", steps))
    assert not (cwd / "outputs").exists()  # one run folder, written by node 0's rank 0
    return one


def test_two_nodes_with_fsdp2_make_the_run_of_one_node(sft_checkpoint: Path, tmp_path: Path) -> None:
    two_nodes_and_one(
        [*ARGS, "trainer.total_steps=2", f"trainer.init_from={sft_checkpoint}", "trainer.fsdp=true"], tmp_path
    )


def test_two_nodes_with_vllm_engines_and_a_periodic_eval(sft_checkpoint: Path, tmp_path: Path) -> None:
    """Each process runs its own vLLM engine in-process (external launcher), and rank 0's engine alone serves
    the periodic eval (no collective inside vLLM's generate waits for another rank): on two nodes as on one."""
    args = [*ARGS, *VLLM, "trainer.total_steps=2", f"trainer.init_from={sft_checkpoint}", "trainer.eval_every=2"]
    args += ["trainer.eval_problems=3", "benchmark.n_samples=2", "benchmark.max_response_tokens=48"]
    one = two_nodes_and_one(args, tmp_path)
    assert (one.stdout + one.stderr).count("external launcher (one per process)") == 2
    for run in ("nodes", "one"):
        rows = metrics_of(tmp_path / run)
        assert [r["step"] for r in rows] == [1, 2] and rows[1]["train/grad_norm"] > 0
        assert 0.0 <= rows[1]["eval/accuracy"] <= 1.0
        assert len((tmp_path / run / "evals" / "step_2" / "samples.jsonl").read_text().splitlines()) == 6
        assert (tmp_path / run / "final.txt").exists()


def test_a_dead_node_stops_the_other_and_both_resume_exactly(sft_checkpoint: Path, tmp_path: Path) -> None:
    """Node 1 is SIGKILLed right after step 2: node 0 stops with an error saying so within seconds (no hang),
    and the same two commands again continue from step 2 (step 3 from its weights and optimizer state) to the
    metrics and weights of an uninterrupted run on one node with two processes (so two nodes train as one node
    with two processes, and resume exactly)."""
    args = [*ARGS, "trainer.total_steps=3", f"trainer.init_from={sft_checkpoint}", "hydra.run.dir=run"]
    (tmp_path / "whole").mkdir()
    (tmp_path / "broken").mkdir()
    whole = run_retool("train", *args, "trainer.nproc=2", cwd=tmp_path / "whole", timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    (node0, out0, ended0), (node1, _, ended1) = two_nodes(args, tmp_path / "broken", die="step:2")
    assert node1 != 0 and node0 == 1
    assert "another process of this run died or stopped answering" in out0
    assert ended0 - ended1 < 60  # bounded by the dead peer's closed connections, not a time-out
    run = tmp_path / "broken" / "run"
    assert [r["step"] for r in metrics_of(run)] == [1, 2]
    shutil.copytree(tmp_path / "broken", tmp_path / "elsewhere")
    resumed = two_nodes(args, tmp_path / "broken")
    assert [code for code, _, _ in resumed] == [0, 0], resumed[0][1][-3000:]
    assert comparable(metrics_of(run)) == comparable(metrics_of(tmp_path / "whole" / "run"))
    assert same_weights(weights(run, 3), weights(tmp_path / "whole" / "run", 3))
    assert not (tmp_path / "broken" / "outputs").exists()  # one run folder, written by node 0's rank 0
    # the checkpoint resumes on another layout too (one process on one node): step 3 is trained from
    # step 2's weights and optimizer state, with other data shares, so other numbers
    one = run_retool("train", *args, cwd=tmp_path / "elsewhere", timeout=600)
    assert one.returncode == 0 and "resumed from" in one.stdout + one.stderr, one.stderr[-3000:]
    rows = metrics_of(tmp_path / "elsewhere" / "run")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[:2] == metrics_of(run)[:2]


def test_hybrid_sharding_across_two_nodes(sft_checkpoint: Path, tmp_path: Path) -> None:
    """trainer.fsdp_sharding=hybrid on 2 nodes x 2 processes (HSDP: a sharded copy per node, replicated across
    them) trains as full sharding over 4 processes does, to float rounding (the sums are taken in another
    order), and writes plain HF checkpoints."""
    args = [*ARGS, "trainer.total_steps=2", "trainer.questions_per_step=4", f"trainer.init_from={sft_checkpoint}"]
    args += ["trainer.fsdp=true", "trainer.nproc=2"]
    nodes = two_nodes([*args, "trainer.fsdp_sharding=hybrid", "hydra.run.dir=hybrid"], tmp_path)
    assert [code for code, _, _ in nodes] == [0, 0], nodes[0][1][-3000:]
    full = run_retool("train", *args, "trainer.nproc=4", "hydra.run.dir=full", cwd=tmp_path, timeout=600)
    assert full.returncode == 0, full.stderr[-3000:]
    hybrid, sharded = metrics_of(tmp_path / "hybrid"), metrics_of(tmp_path / "full")
    for a, b in zip(hybrid, sharded, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-5)
        assert a["reward/mean"] == b["reward/mean"]
    h, f = weights(tmp_path / "hybrid", 2), weights(tmp_path / "full", 2)
    assert all(torch.allclose(h[k], f[k], atol=1e-6) for k in h)


def test_a_vllm_engine_spanning_two_processes(sft_checkpoint: Path, tmp_path: Path) -> None:
    """rollout.vllm_tensor_parallel_size=2 with trainer.nproc=2: the two training processes are one vLLM
    engine (tensor parallel, colocated, through vLLM's external launcher); it samples what one process's
    engine samples, each process trains on half of it, and the update and the weight syncs match the
    one-process run's (the sampler-trainer gap stays at rounding level after each sync)."""
    args = [
        *ARGS,
        "trainer.total_steps=2",
        f"trainer.init_from={sft_checkpoint}",
        *VLLM,
    ]
    runs = {}
    shared_memory = set(Path("/dev/shm").glob("*cpushm*"))
    for name, extra in (("tp", ["trainer.nproc=2", "rollout.vllm_tensor_parallel_size=2"]), ("one", [])):
        proc = run_retool("train", *args, *extra, f"hydra.run.dir={name}", cwd=tmp_path, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # a clean end: each process's engine shut down before the run's groups (it once found them gone at exit)
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
        runs[name] = metrics_of(tmp_path / name)
    # vLLM's CPU all-reduce segments (fixed names) released at the ranks' exit: a next run can make them again
    assert set(Path("/dev/shm").glob("*cpushm*")) <= shared_memory
    for tp, one in zip(runs["tp"], runs["one"], strict=True):
        for key in ("rollout/response_tokens", "rollout/code_calls", "rollout/turns"):  # the engine's whole share
            assert tp[key] == one[key], key
        assert tp["train/grad_norm"] == pytest.approx(one["train/grad_norm"], rel=1e-5)
        assert tp["train/mismatch_abs_logprob_diff"] < 1e-5
