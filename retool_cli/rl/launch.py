"""Where the processes of a training run come from: `retool train` with trainer.nproc > 1 or trainer.nnodes > 1
relaunches itself through torchrun, one torchrun per node.

    node r: retool train ... trainer.nnodes=N trainer.node_rank=r   (by hand, or `srun`: values from Slurm)
      --> python -m torch.distributed.run --nnodes=N --node_rank=r --master_addr=A --master_port=P
            --nproc_per_node=trainer.nproc -m retool_cli train ... hydra.run.dir=RUN
        --> processes of global rank r * nproc + local rank, one process group over all nodes

torchrun's static rendezvous (a c10d TCP store on the master) gives every process the rank its node and local
index say, so a run on N nodes of n processes is the run of one node with N * n processes, rank for rank
(the data shares and sampling seeds follow the rank). Under Slurm (`srun retool train ...` with one task per
node, or Hydra's submitit launcher) the values not typed on the command line come from the allocation.

What listens: on one node, the store and the gloo/NCCL connections on 127.0.0.1 only; on several, the store on
trainer.master_addr's address (node 0) and the backends' connections on each node's address (rl/torchrun.py).
A stop signal to the launcher goes to every rank (each stops at the end of its step; stops.py), and the launcher
kills what is left when they overrun the stop's time; torchrun and the ranks die with their parents.

The CLI reads this module before it knows the config is good (`later_node`), so torch and the engines load
inside the functions that need them: a mistake on the command line is said before they load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from retool_cli import run_lock, stops
from retool_cli.config import RetoolConfig, RolloutEngine, RolloutPlacement, TrainerConfig
from retool_cli.errors import ConfigError, RetoolError

log = logging.getLogger(__name__)
LAUNCH_KEYS = ("nnodes", "node_rank", "master_addr", "master_port")  # how a run is laid out, not what it computes
RANK_SCRIPT = Path(__file__).with_name("rank.py")  # what a forked rank runs (rank_start)
RANK_START_ENV = "RETOOL_RANK_START"  # fork | exec: overrides rank_start's choice


@dataclass(frozen=True)
class Rendezvous:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list ("gpu[01-03,07],login1") as host names, in order."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[\]]+)\[([^\]]+)\]|([^,\[\]]+)", hostlist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{len(low)}d}")
    return hosts


def slurm_values(env: Mapping[str, str]) -> dict[str, int | str]:
    """trainer.nnodes, node_rank, master_addr and master_port as a Slurm allocation gives them ({} outside
    one): the job step's nodes, this node's index, the first node, a port derived from the job id (so two
    jobs sharing a node do not collide)."""
    if "SLURM_JOB_ID" not in env:
        return {}
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    hosts = expand_hostlist(nodelist)
    values: dict[str, int | str] = {}
    nnodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if nnodes:
        values["nnodes"] = int(nnodes)
    if "SLURM_NODEID" in env:
        values["node_rank"] = int(env["SLURM_NODEID"])
    if hosts:
        values["master_addr"] = hosts[0]
    values["master_port"] = 20000 + int(env["SLURM_JOB_ID"]) % 20000
    return values


def later_node(overrides: list[str], env: Mapping[str, str]) -> bool:
    """Whether this `retool train` command starts a node after the first (trainer.node_rank > 0, as typed, else as
    a Slurm allocation gives it): node 0 writes and holds the shared run folder, and this one only joins."""
    typed = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == "trainer.node_rank"]
    if typed:
        return typed[-1].strip().isdigit() and int(typed[-1]) > 0
    return int(slurm_values(env).get("node_rank", 0)) > 0


def typed_trainer_keys(overrides: list[str]) -> set[str]:
    """The trainer keys a command line sets ("trainer.master_port=31000" -> "master_port")."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    return {k.removeprefix("trainer.") for k in keys if k.startswith("trainer.")}


def resolve_rendezvous(trainer: TrainerConfig, env: Mapping[str, str], typed: set[str]) -> Rendezvous:
    """The run's layout: what the command line typed (`typed`: the trainer keys given there), else Slurm's
    values inside an allocation, else the config's."""
    values: dict[str, int | str] = {key: getattr(trainer, key) for key in LAUNCH_KEYS}
    from_slurm = {k: v for k, v in slurm_values(env).items() if k not in typed}
    if from_slurm:
        log.info("Slurm allocation: %s", ", ".join(f"trainer.{k}={v}" for k, v in from_slurm.items()))
    values.update(from_slurm)
    layout = Rendezvous(
        int(values["nnodes"]), int(values["node_rank"]), str(values["master_addr"]), int(values["master_port"])
    )
    if not 0 <= layout.node_rank < layout.nnodes:
        raise ConfigError(f"trainer.node_rank: {layout.node_rank} is not a node of trainer.nnodes={layout.nnodes}")
    return layout


def launch_processes(
    trainer: TrainerConfig, layout: Rendezvous, overrides: list[str], run_dir: Path, vllm: bool = False
) -> None:
    """Run this same `retool train` job as trainer.nproc torchrun processes on this node, joined with the other
    nodes' (this job's overrides only, so a sweep job does not sweep again; the layout as resolved). A stop
    signal is passed to the ranks; their stop (rank 0 names its signal in a report file) is this command's.
    `vllm`: the ranks run vLLM engines (see rank_start)."""
    kept = [o for o in overrides if not o.startswith(("hydra.run.dir=", *(f"trainer.{k}=" for k in LAUNCH_KEYS)))]
    one_node = layout.nnodes == 1
    where = [f"--nnodes={layout.nnodes}", f"--node_rank={layout.node_rank}", "--rdzv_backend=static"]
    if not one_node:
        where.append(f"--rdzv_conf=timeout={int(trainer.collective_timeout_s)}")  # waiting for the other nodes
    addr, port = ("127.0.0.1", 0) if one_node else (layout.master_addr, layout.master_port)
    start = rank_start(os.environ, vllm)
    rank = ["--start-method=fork", "--run-path", str(RANK_SCRIPT)] if start == "fork" else ["-m", "retool_cli"]
    command = [
        sys.executable,
        "-m",
        "retool_cli.rl.torchrun",
        addr,
        str(port),
        "1" if layout.node_rank == 0 else "0",
        start,
        "--",
        *where,
        f"--nproc_per_node={trainer.nproc}",
        *rank,
        "train",
        *kept,
        *(f"trainer.{k}={getattr(layout, k)}" for k in LAUNCH_KEYS),
        f"hydra.run.dir={run_dir}",
    ]
    log.info(
        "launching %d processes on node %d of %d: %s", trainer.nproc, layout.node_rank, layout.nnodes, " ".join(command)
    )
    if layout.node_rank == 0:
        run_lock.claim(run_dir, "train")  # held for the ranks (rank 0 writes there as ours)
    from retool_cli.rollout.vllm_engine import release_stale_shared_memory

    if vllm and (stale := release_stale_shared_memory()):  # a killed run's: this run's engines could not start
        log.warning("removed the shared memory a killed vLLM run left: %s", ", ".join(map(str, stale)))
    with tempfile.TemporaryDirectory(prefix="retool-launch-") as scratch:
        report = Path(scratch) / "stopped"
        env = {**os.environ, run_lock.LAUNCHER_ENV: str(os.getpid()), stops.REPORT_ENV: str(report)}
        if one_node:  # the backends' connections on loopback too (gloo on CPU, NCCL's bootstrap on GPUs)
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        stops.set_grace(trainer.stop_timeout_s + 5)  # the ranks' own deadline first, then the launcher's
        returncode = supervise(command, env)
        stopped_by = report.read_text().strip() if report.exists() else ""
    if stopped_by or stops.requested():
        raise stops.Stopped(stops.requested() or signal.Signals[stopped_by])
    if returncode != 0:
        logged = run_dir / "train.log"
        see = f"see {logged}" if logged.is_file() and logged.stat().st_size else "see its error above"
        raise RetoolError(f"a training process failed (exit status {returncode}); {see} (and the other nodes' logs)")


def rank_start(env: Mapping[str, str], vllm: bool = False) -> str:
    """How torchrun starts the ranks: "fork" (copies of its agent, which imported the trainer once: rl/rank.py)
    where torch is built without CUDA, "exec" (a fresh interpreter each, as torchrun does) where it has CUDA,
    which a forked process cannot use once its parent touched it, and where the ranks run vLLM (`vllm`): a
    forked rank ends without the C++ teardown that releases the shared memory of vLLM's CPU tensor parallelism
    (its names are fixed: the next run would fail on them). RETOOL_RANK_START=fork|exec chooses."""
    import torch

    chosen = env.get(RANK_START_ENV) or ("exec" if vllm or torch.backends.cuda.is_built() else "fork")
    if chosen not in ("fork", "exec"):
        raise ConfigError(f"{RANK_START_ENV}={chosen!r}: use fork or exec")
    return chosen


def supervise(command: list[str], env: dict[str, str]) -> int:
    """Run torchrun (in a session of its own: a terminal's Ctrl-C reaches the launcher alone) until it exits; a stop
    signal received meanwhile is sent once to each of its ranks, so each stops as when signalled itself (torchrun
    would signal each rank's whole process group, judge workers included). Its exit status."""
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    forwarded = False
    with stops.deferred():  # the launcher's stop is the ranks' stop: it waits for them (bounded by stops' deadline)
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(timeout=0.2)
            signum = stops.requested()
            if signum is not None and not forwarded:
                ranks = stops.children(proc.pid)
                for pid in ranks or [proc.pid]:  # before the ranks exist: torchrun itself
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signum)
                forwarded = True


def check_engine_span(config: RetoolConfig, size: int) -> None:
    """rollout.vllm_tensor_parallel_size > 1 spans processes of one node: vLLM, and a whole number per node."""
    tp = config.rollout.vllm_tensor_parallel_size
    if tp == 1:
        return
    if config.rollout.engine is not RolloutEngine.vllm:
        raise ConfigError("rollout.vllm_tensor_parallel_size > 1 needs rollout.engine=vllm")
    if config.trainer.nproc % tp or size < tp:
        raise ConfigError(
            f"rollout.vllm_tensor_parallel_size={tp}: the engine's processes are training processes of one node, "
            f"so trainer.nproc ({config.trainer.nproc}) must be a multiple of it"
        )
    if config.trainer.eval_every:  # the periodic eval runs on rank 0 alone: an engine spanning processes cannot
        raise ConfigError("trainer.eval_every with rollout.vllm_tensor_parallel_size > 1 is not supported yet: set 0")


def check_placement(config: RetoolConfig) -> None:
    """rollout.placement=separate runs its engine processes on CPU (gloo broadcasts): engine processes on GPUs of
    their own (NCCL) are not built, so an accelerator run is refused before any process or folder is made."""
    from retool_cli.model.precision import resolve_device

    if config.rollout.placement is not RolloutPlacement.separate:
        return
    device = resolve_device(config.model.device)
    if device.type != "cpu":
        raise ConfigError(
            f"rollout.placement=separate runs its engine processes on CPU for now (model.device="
            f"{config.model.device} is {device}); use rollout.placement=colocated on accelerators"
        )


def check_devices(config: RetoolConfig) -> None:
    """A run of trainer.nproc processes on CUDA needs as many CUDA devices here (model.device=cuda without
    CUDA is refused by resolve_device)."""
    import torch

    from retool_cli.model.precision import resolve_device

    device, nproc = resolve_device(config.model.device), config.trainer.nproc
    if device.type == "cuda" and torch.cuda.device_count() < nproc:
        raise ConfigError(
            f"trainer.nproc={nproc}: one CUDA device per process, and this machine has {torch.cuda.device_count()}; "
            "lower trainer.nproc or run where the devices are"
        )
