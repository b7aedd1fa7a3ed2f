"""rl/launch.py: the run's layout from the command line and from a Slurm allocation (a recorded environment
of a 2-node job), and the torchrun command each node runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from retool_cli import run_lock, stops
from retool_cli.config import TrainerConfig
from retool_cli.errors import ConfigError
from retool_cli.rl import launch
from retool_cli.rl.launch import Rendezvous, expand_hostlist, resolve_rendezvous, slurm_values

# `env | grep SLURM` inside `srun --nodes=2 --ntasks-per-node=1` on a cluster, task of the second node
# (job 4127733; values as Slurm 23.02 sets them)
SLURM_2_NODES = {
    "SLURM_JOB_ID": "4127733",
    "SLURM_JOBID": "4127733",
    "SLURM_JOB_NAME": "retool",
    "SLURM_JOB_NODELIST": "gpu-st-p4d-[017-018]",
    "SLURM_NODELIST": "gpu-st-p4d-[017-018]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_STEP_NODELIST": "gpu-st-p4d-[017-018]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_CPUS_ON_NODE": "96",
    "SLURMD_NODENAME": "gpu-st-p4d-018",
    "SLURM_SUBMIT_DIR": "/fsx/users/me/retool",
}


def test_hostlists_expand_in_order_with_their_padding() -> None:
    assert expand_hostlist("gpu-st-p4d-[017-018]") == ["gpu-st-p4d-017", "gpu-st-p4d-018"]
    assert expand_hostlist("node[1-3,10],login2,a[08-09]") == [
        "node1",
        "node2",
        "node3",
        "node10",
        "login2",
        "a08",
        "a09",
    ]
    assert expand_hostlist("single") == ["single"] and expand_hostlist("") == []


def test_a_two_node_allocation_gives_the_layout() -> None:
    assert slurm_values(SLURM_2_NODES) == {
        "nnodes": 2,
        "node_rank": 1,
        "master_addr": "gpu-st-p4d-017",
        "master_port": 20000 + 4127733 % 20000,
    }
    layout = resolve_rendezvous(TrainerConfig(), SLURM_2_NODES, typed=set())
    assert layout == Rendezvous(2, 1, "gpu-st-p4d-017", 27733)
    assert slurm_values({"PATH": "/usr/bin"}) == {}  # not in an allocation
    assert resolve_rendezvous(TrainerConfig(), {}, set()) == Rendezvous(1, 0, "127.0.0.1", 29500)


def test_what_the_command_line_types_wins_over_slurm() -> None:
    trainer = TrainerConfig(master_port=31000, master_addr="10.0.0.5")
    layout = resolve_rendezvous(trainer, SLURM_2_NODES, typed={"master_port", "master_addr"})
    assert layout == Rendezvous(2, 1, "10.0.0.5", 31000)


def test_a_node_rank_outside_the_nodes_is_an_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="trainer.node_rank"):
        resolve_rendezvous(TrainerConfig(nnodes=2, node_rank=2), {}, set())
    with pytest.raises(ConfigError, match="trainer.nnodes"):
        TrainerConfig(nnodes=0)


def test_each_node_runs_torchrun_with_its_rank_and_the_master(monkeypatch, tmp_path: Path) -> None:
    """torchrun through rl/torchrun.py: node 0 hosts the store on the master's address, later nodes host nothing;
    one node binds it to 127.0.0.1 (a free port) and keeps gloo and NCCL on loopback; every node's ranks learn
    the launcher (its folder lock, its stop report)."""
    launched: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(launch, "supervise", lambda command, env: launched.append((command, env)) or 0)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv(launch.RANK_START_ENV, "exec")  # ranks as fresh interpreters: `-m retool_cli train ...`
    trainer = TrainerConfig(nproc=4, nnodes=2)
    layout = Rendezvous(2, 1, "gpu-st-p4d-017", 27733)
    overrides = ["recipe=dapo_smoke", "trainer.nproc=4", "trainer.node_rank=0", "hydra.run.dir=elsewhere"]
    launch.launch_processes(trainer, layout, overrides, tmp_path / "run")
    [(command, env)] = launched
    assert command[1:7] == ["-m", "retool_cli.rl.torchrun", "gpu-st-p4d-017", "27733", "0", "exec"]  # no store
    assert {"--nnodes=2", "--node_rank=1", "--rdzv_backend=static", "--nproc_per_node=4"} <= set(command)
    assert "GLOO_SOCKET_IFNAME" not in env and env[run_lock.LAUNCHER_ENV] == str(os.getpid())
    assert stops.REPORT_ENV in env
    tail = command[command.index("retool_cli") + 1 :]
    assert tail[0] == "train" and "recipe=dapo_smoke" in tail and "trainer.node_rank=0" not in tail
    assert "trainer.node_rank=1" in tail and tail[-1] == f"hydra.run.dir={tmp_path / 'run'}"
    launched.clear()
    monkeypatch.setenv(launch.RANK_START_ENV, "fork")  # ranks forked from torchrun's agent, running rl/rank.py
    with run_lock.holding():
        launch.launch_processes(TrainerConfig(nproc=2), Rendezvous(1, 0, "127.0.0.1", 29500), [], tmp_path)
    [(command, env)] = launched
    assert command[3:7] == ["127.0.0.1", "0", "1", "fork"]
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    rank = command.index("--run-path")
    assert "--start-method=fork" in command and command[rank + 1 : rank + 3] == [str(launch.RANK_SCRIPT), "train"]


def test_ranks_are_forked_only_where_torch_has_no_cuda_and_no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process forked from one that touched CUDA cannot use it: with a CUDA build, fresh interpreters."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    assert launch.rank_start({}) == "exec" and launch.rank_start({launch.RANK_START_ENV: "fork"}) == "fork"
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    assert launch.rank_start({}) == "fork" and launch.rank_start({launch.RANK_START_ENV: "exec"}) == "exec"
    assert launch.rank_start({}, vllm=True) == "exec"  # vLLM's CPU tensor parallelism needs a process's own exit
    with pytest.raises(ConfigError, match="RETOOL_RANK_START='spawn': use fork or exec"):
        launch.rank_start({launch.RANK_START_ENV: "spawn"})


def test_only_node_zero_holds_the_run_folder() -> None:
    assert launch.later_node(["trainer.node_rank=1"], {}) and not launch.later_node(["trainer.node_rank=0"], {})
    assert launch.later_node([], SLURM_2_NODES)  # the second node's task, as Slurm says
    assert not launch.later_node(["trainer.node_rank=0"], SLURM_2_NODES)  # typed wins
    assert not launch.later_node([], {})


def test_the_rendezvous_store_listens_where_it_is_bound() -> None:
    """The store rl/torchrun.py opens listens on 127.0.0.1 alone (a TCPStore of its own binds every interface)
    and serves the store torchrun then opens on the same port, in the same process."""
    import datetime
    from pathlib import Path as P

    from torch.distributed import TCPStore

    from retool_cli.rl.torchrun import serve_store

    store, sock = serve_store("127.0.0.1", 0)
    port = sock.getsockname()[1]
    torchruns = TCPStore("127.0.0.1", port, 1, True, datetime.timedelta(seconds=5), multi_tenant=True)
    torchruns.set("key", "value")
    assert store.get("key") == b"value"  # type: ignore[attr-defined]
    listening = [
        line.split()[1]
        for table in ("tcp", "tcp6")
        for line in P(f"/proc/net/{table}").read_text().splitlines()[1:]
        if line.split()[3] == "0A" and int(line.split()[1].rsplit(":", 1)[1], 16) == port
    ]
    assert listening == [f"0100007F:{port:04X}"]


def test_a_killed_vllm_runs_shared_memory_is_released_and_a_live_ones_kept(tmp_path: Path) -> None:
    """The segments vLLM's CPU build names after its span (fixed names): those no process maps (a SIGKILLed
    run's) are removed before a launch, those a live process maps stay (here: this process maps one)."""
    import mmap

    from retool_cli.rollout.vllm_engine import release_stale_shared_memory

    stale, live, other = tmp_path / "-tp:0-[0-1]-cpushm_0", tmp_path / "-tp:0-[0-1]-cpushm_1", tmp_path / "weights"
    for segment in (stale, live, other):
        segment.write_bytes(b"\0" * mmap.PAGESIZE)
    with live.open("r+b") as file, mmap.mmap(file.fileno(), mmap.PAGESIZE):
        assert release_stale_shared_memory(tmp_path) == [stale]
        assert not stale.exists() and live.exists() and other.exists()
    assert release_stale_shared_memory(tmp_path) == [live]  # unmapped now
    assert release_stale_shared_memory(tmp_path) == [] and other.exists()


def test_a_vllm_span_held_by_another_run_is_named_in_the_error() -> None:
    """vLLM's CPU build's words when a segment exists already (seen when a killed run's were left): the error
    says that another run holds them and what to do; other errors are left as they are."""
    from retool_cli.rollout.vllm_engine import start_failure

    held = str(start_failure("ckpt", RuntimeError("create shm in SHMManager failed. errno: 17")))
    assert held.startswith("vLLM could not start on ckpt: create shm") and "Another run on this machine" in held
    other = str(start_failure("ckpt", ValueError("max_model_len is larger than the model's")))
    assert other == "vLLM could not start on ckpt: max_model_len is larger than the model's"


@pytest.mark.parametrize("device, cuda, refused", [("auto", True, True), ("auto", False, False), ("cpu", True, False)])
def test_engine_processes_on_an_accelerator_are_refused_before_the_run_begins(
    monkeypatch: pytest.MonkeyPatch, device: str, cuda: bool, refused: bool
) -> None:
    """rollout.placement=separate sends weights by gloo to engine processes on CPU; NCCL engine processes are not
    built, so a run whose policy would sit on CUDA is refused naming the key (only the device lookup is faked)."""
    from dataclasses import replace

    from retool_cli.config import RetoolConfig, RolloutPlacement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    config = RetoolConfig()
    config = replace(config, model=replace(config.model, device=device))
    config = replace(config, rollout=replace(config.rollout, placement=RolloutPlacement.separate))
    config = replace(config, trainer=replace(config.trainer, max_staleness=1))
    if refused:
        with pytest.raises(ConfigError, match=r"rollout\.placement=separate runs its engine processes on CPU"):
            launch.check_placement(config)
    else:
        launch.check_placement(config)
    launch.check_placement(replace(config, rollout=replace(config.rollout, placement=RolloutPlacement.colocated)))
