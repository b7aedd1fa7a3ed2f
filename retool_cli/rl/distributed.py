"""Several processes (torchrun; gloo on CPU, nccl on CUDA): the process group, the collectives the RL update
needs, and FSDP2 sharding of the policy (`trainer.fsdp`).

Data parallel (default): every process holds the whole model; the loss is normalised by global token and
sequence counts and gradients are summed, so N processes make the update one process makes on the union of
their batches. FSDP2: parameters, gradients and optimizer state are sharded over the processes (each layer
is all-gathered for its forward and backward); gradients are reduce-scattered as sums, same update.
Collectives must be called by every process the same number of times: see `equal_count`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from retool_cli import stops
from retool_cli.errors import ConfigError, RetoolError

log = logging.getLogger(__name__)


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without torch.distributed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def init_distributed(timeout_s: float = 3600.0) -> tuple[int, int]:
    """Join the process group that torchrun describes in the environment (gloo on CPU, nccl on CUDA). Every
    collective must complete within `timeout_s` (trainer.collective_timeout_s): a dead peer is an error, not
    a hang."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1 or world()[1] > 1:
        return world()
    stops.die_with_parent()  # torchrun killed: this rank stops rather than train on as an orphan
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return world()


@contextlib.contextmanager
def peers_alive() -> Iterator[None]:
    """A collective that fails because another process of the run died (its connections closed) or stopped
    answering (trainer.collective_timeout_s) ends this one with one clear error, not a backend traceback."""
    try:
        yield
    except RuntimeError as exc:
        text = str(exc)
        lost = isinstance(exc, torch.distributed.DistError) or any(
            sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "Timed out")
        )
        if world()[1] == 1 or not lost:
            raise
        signum = stops.requested()
        if signum is not None:  # the peer stopped for the same signal: a stop, not a failure
            raise stops.Stopped(signum) from None
        raise RetoolError(
            f"rank {world()[0]}: another process of this run died or stopped answering "
            f"({text.splitlines()[0][:200]}), so this one stops too. Its checkpoints are kept: run the same "
            "command on every node again to resume from the last one"
        ) from exc


def same_folder_everywhere(folder: Path) -> Path:
    """Rank 0's run folder, checked to be the same folder for every process: rank 0 writes a token into it and
    every process must read it back (a run across nodes needs a shared filesystem). A process that cannot
    is an error naming its host, at start, instead of a run whose checkpoints half the nodes never see."""
    rank, size = world()
    if size == 1:
        return folder
    shared = [str(folder), uuid.uuid4().hex]
    torch.distributed.broadcast_object_list(shared, src=0)  # rank 0's folder and token
    folder, marker = Path(shared[0]), Path(shared[0]) / f".shared-{shared[1]}"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(shared[1])
    torch.distributed.barrier()
    seen = False
    for _ in range(50):  # a network filesystem may show a new file a little later
        seen = marker.is_file() and marker.read_text() == shared[1]
        if seen:
            break
        time.sleep(0.1)
    everyone: list[Any] = [None] * size
    torch.distributed.all_gather_object(everyone, (socket.gethostname(), seen))
    torch.distributed.barrier()
    if rank == 0:
        marker.unlink()
    blind = [f"{host} (rank {r})" for r, (host, ok) in enumerate(everyone) if not ok]
    if blind:
        raise ConfigError(
            f"the run folder {folder} is not shared: {', '.join(blind)} cannot read what rank 0 writes there. "
            "Every node must see the same run folder (a shared filesystem; give hydra.run.dir a path on it)"
        )
    return folder


def leave_process_group() -> None:
    """The end of a run of several processes: all of them meet, then the group is torn down before the
    interpreter exits (a gloo group left to the exit handlers can abort a process: "terminate called without
    an active exception")."""
    if world()[1] > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def barrier() -> None:
    if world()[1] > 1:
        torch.distributed.barrier()


def all_reduce_sum(value: float, group: Any = None) -> float:
    """`value` summed over processes, in `group` (default: the run's; the overlapped sampler's threads use a
    group of their own, so that their collectives never interleave with the trainer's)."""
    if world()[1] == 1:
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64)
    torch.distributed.all_reduce(tensor, group=group)
    return float(tensor.item())


def side_group(timeout_s: float) -> Any:
    """A second gloo group of all processes, for collectives a thread other than the trainer's runs (a
    collective: every process creates it at the same point); None for one process."""
    if world()[1] == 1:
        return None
    return torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def engine_span_group(span: int, timeout_s: float) -> Any:
    """A gloo group of this process's engine span: the `span` consecutive processes one vLLM engine spans
    (rollout.vllm_tensor_parallel_size), for the collectives a sampler's threads run; None when `span` is 1. (A
    collective: every process creates every span's group at the same point.)"""
    if span == 1:
        return None
    rank, size = world()
    timeout = datetime.timedelta(seconds=timeout_s)
    spans = [list(range(first, first + span)) for first in range(0, size, span)]
    groups = [torch.distributed.new_group(ranks=ranks, timeout=timeout, backend="gloo") for ranks in spans]
    return groups[rank // span]


def agreed_stop() -> int | None:
    """The stop signal any process of the run received (a collective: every process asks at the same step), so
    that all of them stop at the same step boundary; None when none did."""
    signum = stops.requested() or 0
    if world()[1] > 1:
        signum = int(all_reduce_max(float(signum)))
    return signum or None


def all_reduce_max(value: float) -> float:
    if world()[1] == 1:
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return float(tensor.item())


def equal_count(count: int) -> int:
    """The largest `count` over processes: how many forward/backward passes each must run under FSDP2, whose
    all-gathers and reduce-scatters are collectives (a process short of work runs empty passes)."""
    if world()[1] == 1:
        return count
    tensor = torch.tensor([count], dtype=torch.int64)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_gradients(model: torch.nn.Module) -> None:
    """Sum gradients over processes (the loss is already normalised by global counts). One flat buffer, one
    collective; parameters without a gradient on this rank contribute zeros. FSDP2 did it in backward."""
    if world()[1] == 1 or is_sharded(model):
        return
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


# ------------------------------------------------------------------ FSDP2


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model: Any, replicas: int = 1) -> None:
    """FSDP2 over all processes: each decoder layer is one unit (gathered for its own forward/backward), the
    rest (embeddings, final norm, head) is the root's. Gradients are summed, not averaged: the loss is
    normalised by global counts already. `replicas` > 1 (trainer.fsdp_sharding=hybrid, one per node): HSDP,
    each node's processes hold one sharded copy and the copies are kept equal by an all-reduce of the
    gradients across nodes (a 2-D device mesh: replicate x shard)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    size = world()[1]
    if size % replicas:
        raise ConfigError(f"trainer.fsdp_sharding=hybrid: {size} processes do not split into {replicas} nodes")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape, names = ((replicas, size // replicas), ("replicate", "shard")) if replicas > 1 else ((size,), ("shard",))
    mesh = init_device_mesh(device, shape, mesh_dim_names=names)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)  # (FSDP2's defaults, named: full_weights restores them)
    for module in _units(model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-multiplied sum)


def _units(model: Any) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_weights(model: Any) -> Iterator[None]:
    """Every parameter all-gathered for the duration (rollouts: the engine's decode loop calls the layers'
    submodules directly, outside FSDP's hooks). A collective: every process enters together. Inside, a forward
    through FSDP's hooks (transformers' own, with model.accelerate off or for a model it does not cover) keeps
    the weights gathered instead of resharding after it: each process decodes its own number of steps (rank 0
    alone evaluates), so those forwards must not gather, a collective the other processes never join."""
    if not is_sharded(model):
        yield
        return
    units = _units(model)
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(unit is not model, recurse=False)  # as shard() set them
            unit.reshard()


def grad_norm(norm: torch.Tensor) -> float:
    """clip_grad_norm_'s result as a float (a DTensor under FSDP2)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def full_state(model: Any, optimizer: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Under FSDP2: the whole model and optimizer state, gathered to CPU on rank 0 (a collective; other
    ranks get empty dicts). (None, None) otherwise: the caller uses the objects' own state_dict()."""
    if not is_sharded(model):
        return None, None
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def whole_model_state(model: Any) -> dict[str, Any]:
    """An FSDP2 policy's whole weights on every process, on its device (a collective; the overlapped sampler's
    snapshots: rl/overlap.py)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return state


def load_optimizer_state(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """Load a full optimizer state (as saved by rank 0): each process keeps its shard under FSDP2."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
