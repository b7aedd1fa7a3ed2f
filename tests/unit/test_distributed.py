"""Several processes (gloo on CPU) on a global batch give the same update as one process on that batch."""

from __future__ import annotations

import multiprocessing
import os
import random
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from retool_cli.config import LossAgg, RetoolConfig
from retool_cli.data.dataset import MathExample
from retool_cli.model.precision import resolve_precision
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rl.distributed import full_state, shard
from retool_cli.rl.optim import build_scheduler
from retool_cli.rl.step import StepPlan, rollout_batch
from retool_cli.rl.update import update
from retool_cli.rollout.agent import Trajectory
from retool_cli.rollout.vllm_engine import whole_tensors


def batch(tokenizer) -> tuple[list[Trajectory], torch.Tensor]:
    """2 questions x 4 samples with varied lengths, tool tokens (mask 0) and rewards."""
    rng = random.Random(0)
    trajectories, rewards = [], []
    for q in range(2):
        prompt = tokenizer.encode(f"What is {q + 3} * 7?")
        for j in range(4):
            # q1 is longer, so it needs more micro-batches: FSDP2 ranks pad with empty passes
            length = rng.randint(5, 30) + 25 * q
            response = [rng.randrange(10, len(tokenizer)) for _ in range(length)]
            mask = [0 if 3 <= k < 6 else 1 for k in range(length)]  # a tool segment
            trajectories.append(Trajectory(MathExample(f"q{q}", "x", "1", "t"), j, prompt, response, mask))
            rewards.append(float(rng.choice([-1, 1])))
    return trajectories, torch.tensor(rewards)


def spawn(fn, args: tuple, nprocs: int) -> None:
    """mp.spawn's processes, forked from a server that imported this module (torch, transformers, the trainer)
    once per test process, rather than each a fresh interpreter importing them (5-6 s of a core each)."""
    multiprocessing.set_forkserver_preload([__name__])
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def leave_group() -> None:
    """Both ranks done before the group goes, then out without the interpreter's teardown: gloo's threads can
    abort a finished process at exit ("terminate called without an active exception", SIGABRT, seen in CI)."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    os._exit(0)


def run_update(
    rank: int, world: int, init_file: str, out: str, loss_agg: str, fsdp: bool = False, pack: bool = False
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if world > 1:
        torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    path = tiny_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).train()
    if fsdp and world > 1:
        shard(model)
    trajectories, rewards = batch(tokenizer)
    mine = [i for i, t in enumerate(trajectories) if int(t.example.id[1:]) % world == rank]  # whole groups per rank
    cfg = RetoolConfig()
    cfg.trainer.loss_agg, cfg.trainer.grad_clip, cfg.trainer.micro_batch_tokens = LossAgg(loss_agg), 1e9, 96
    cfg.trainer.pack_sequences = pack
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the step is the gradient itself
    scheduler = build_scheduler(optimizer, 0, 1, "constant")
    mine_batch = rollout_batch([trajectories[i] for i in mine], rewards[mine])
    stats = update(
        StepPlan.of(cfg, resolve_precision(cfg, training=True)),
        model,
        mine_batch,
        optimizer,
        scheduler,
        tokenizer.pad_token_id,
    )
    weights, _ = full_state(model, optimizer)  # FSDP2: gathered on rank 0 (a collective)
    # what a vLLM engine per rank gets: whole tensors on every rank, gathered one at a time
    gathered = dict(whole_tensors(model.state_dict(), torch.float32))
    assert list(gathered) == list(model.state_dict())
    assert all(not hasattr(v, "full_tensor") for v in gathered.values())
    if rank == 0 and weights:
        assert all(torch.equal(gathered[k], weights[k]) for k in weights)
    if rank == 0:
        saved = {"weights": weights or model.state_dict(), "loss": stats["train/loss"]}
        saved |= {"padding_share": stats["train/padding_share"], "imbalance": stats.get("train/token_imbalance", 1.0)}
        torch.save(saved, out)
    if world > 1:
        leave_group()


@pytest.mark.parametrize(
    ("loss_agg", "fsdp", "pack"),
    [
        ("token_mean", False, False),
        ("seq_mean_token_mean", False, False),
        ("token_mean", True, False),
        ("seq_mean_token_mean", True, False),
        ("seq_mean_token_mean", True, True),
    ],
)
def test_two_processes_equal_one(tmp_path: Path, loss_agg: str, fsdp: bool, pack: bool) -> None:
    """Data parallel (whole model per process, gradients all-reduced) and FSDP2 (sharded parameters, gradients
    reduce-scattered; processes with fewer micro-batches run empty passes) both make one process's update;
    with packed rows (trainer.pack_sequences) too, against one process's padded update, each process then
    training on about the same number of tokens."""
    tiny_model_path()  # build once before the processes start
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    spawn(run_update, (1, str(tmp_path / "init1"), str(one), loss_agg), 1)
    spawn(run_update, (2, str(tmp_path / "init2"), str(two), loss_agg, fsdp, pack), 2)
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path()).state_dict()
    a, b = torch.load(one), torch.load(two)
    assert a["padding_share"] > 0 and (b["padding_share"] == 0) == pack
    # the longer question's process trains on more tokens, unless packing deals the samples out by tokens
    assert a["imbalance"] == 1.0 and (b["imbalance"] < 1.05) == pack and b["imbalance"] < 1.5
    moved = 0
    for name, weight in a["weights"].items():
        assert torch.allclose(weight, b["weights"][name], atol=1e-6), name
        moved += not torch.allclose(weight, initial[name], atol=1e-5)
    assert moved > len(initial) // 2  # the update did something, and did the same thing


def engine_arguments(rank: int, world: int, init_file: str, out: str) -> None:
    from retool_cli.rollout.vllm_engine import _per_process_engine

    if world > 1:
        torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    Path(f"{out}.{rank}").write_text(repr(_per_process_engine()))
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2])
def test_each_torchrun_process_gets_its_own_vllm_engine(tmp_path: Path, world: int) -> None:
    """vLLM's own worker would take the first visible GPU in every process; under torchrun it must run in
    the process (external_launcher), as TRL's colocate mode does. Checked without vLLM: its arguments."""
    out = str(tmp_path / "args")
    spawn(engine_arguments, (world, str(tmp_path / "init"), out), world)
    expected = "{'distributed_executor_backend': 'external_launcher'}" if world > 1 else "{}"
    assert [Path(f"{out}.{rank}").read_text() for rank in range(world)] == [expected] * world


def test_whole_tensors_cast_one_at_a_time() -> None:
    named = {f"w{i}": torch.randn(64, 64) for i in range(3)}
    stream = whole_tensors(named, torch.bfloat16)
    name, first = next(stream)  # a generator: nothing past the first tensor is cast yet
    assert name == "w0" and first.dtype == torch.bfloat16 and torch.equal(first, named["w0"].to(torch.bfloat16))
    assert [n for n, _ in stream] == ["w1", "w2"]


def rewrite_key(folder: str, key: str, stop_after_s: float) -> None:
    import time

    from retool_cli.run_keys import write_key

    deadline = time.monotonic() + stop_after_s
    while time.monotonic() < deadline:
        write_key(Path(folder), key)


def test_a_rank_reading_the_run_key_while_rank_0_writes_it_finds_it_whole(tmp_path: Path) -> None:
    """Every process of a resumed run checks the folder's key while rank 0 rewrites it: the reader sees the key,
    never an empty file taken for another run's (a CI failure of the FSDP2 resume test)."""
    import time

    from retool_cli.run_keys import find_resumable, write_key

    (tmp_path / "metrics.jsonl").write_text("{}\n")
    write_key(tmp_path, "k" * 16)
    writer = multiprocessing.get_context("fork").Process(target=rewrite_key, args=(str(tmp_path), "k" * 16, 1.5))
    writer.start()
    reads, deadline = 0, time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert find_resumable(tmp_path, "k" * 16, tmp_path, "final.txt", "metrics.jsonl") == tmp_path
        reads += 1
    writer.join()
    assert writer.exitcode == 0 and reads > 100


def check_folder(rank: int, world: int, init_file: str, folder: str, out: str, blind: bool) -> None:
    import ctypes

    from retool_cli.errors import ConfigError
    from retool_cli.rl.distributed import same_folder_everywhere

    if blind and rank == 1:  # this "node" has its own filesystem at the folder: a mount namespace with a tmpfs
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
            raise OSError(ctypes.get_errno(), "unshare")
        libc.mount(b"none", b"/", None, (1 << 14) | (1 << 18), None)  # MS_REC | MS_PRIVATE: nothing leaks out
        if libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 0, None) != 0:
            raise OSError(ctypes.get_errno(), "mount")
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result = f"ok {same_folder_everywhere(Path(folder) if rank == 0 else Path('/elsewhere'))}"
    except ConfigError as exc:
        result = f"error {exc}"
    Path(out, f"rank{rank}").write_text(result)
    torch.distributed.destroy_process_group()


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
@pytest.mark.parametrize("blind", [False, True], ids=["shared", "not shared"])
def test_every_process_must_see_rank_0s_run_folder(tmp_path: Path, blind: bool) -> None:
    """Every process adopts rank 0's run folder and reads back a token rank 0 wrote there; a process whose
    filesystem does not hold it (its own mount over the folder, as a node without the shared filesystem) makes
    every process stop with an error naming it, instead of training into folders that differ."""
    folder, out = tmp_path / "run", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    spawn(check_folder, (2, str(tmp_path / "init"), str(folder), str(out), blind), 2)
    results = [(out / f"rank{r}").read_text() for r in range(2)]
    if not blind:
        assert results == [f"ok {folder}"] * 2 and list(folder.iterdir()) == []  # the token is cleaned up
    else:
        assert all(r.startswith("error the run folder") and "(rank 1)" in r and "(rank 0)" not in r for r in results)
