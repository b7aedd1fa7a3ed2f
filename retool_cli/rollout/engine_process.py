"""rollout.placement=separate: the overlapped sampler's engines (rl/overlap.py) in processes of their own, each
on its own cores (rollout.engine_threads) and so out of the trainer's way, with the weights shipped from the
trainer by torch.distributed broadcasts in buckets (gloo; the trainer is rank 0 of a two-process group with each
engine process).

    trainer process                                       engine process p (spawned)
      SlotEngine(p, i).update_weights(snapshot)
        --("load", i, layout)-->                            receives each bucket: one flat tensor in the sampling
        broadcast bucket 1 .. n ======================>     dtype, copied into slot i's model
        <--("ok", None)--
      SlotEngine(p, i).generate(prompts, ...)
        --("generate", i, ...)-->                           HFEngine(slot i's model).generate
        <--("ok", generations)--

An engine process holds one model per slot (a batch in flight: rl/overlap.py runs up to k + 1 of them, each with
its own weight version) and serves one request at a time; slots are dealt out over rollout.engine_processes
processes. A request's tokens depend on its prompt, seed and weights alone (rollout/hf_engine.py), so which process
serves which slot, and how many there are, changes the wall time and nothing else.

What can go wrong, and what bounds it: every wait for an engine process is bounded by rollout.engine_timeout_s and
looks at the process every half second. One that dies (killed, out of memory) is restarted by the call that meets
it, every slot's weights are sent again, and the call is repeated (the same tokens: the request is a function of
its inputs), up to rollout.engine_restarts times a run; then the run stops with an error naming the process. An
engine process ignores stop signals (the trainer ends the run at a step's end, with the batches in flight) and
exits when the trainer does, even by SIGKILL (it watches its parent).
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from retool_cli import stops
from retool_cli.config import RetoolConfig, RolloutEngine
from retool_cli.errors import EngineTimeout, Resumable, RetoolError
from retool_cli.faults import die_if_due, jitter
from retool_cli.interfaces import Engine, Generation
from retool_cli.model.loading import sampler_model
from retool_cli.model.precision import Precision
from retool_cli.rollout import vllm_arguments
from retool_cli.rollout.weight_slots import SlotEngine, WeightSlots

log = logging.getLogger(__name__)
POLL_S = 0.5  # how often a waiting trainer looks at the engine process
START_TIMEOUT_S = 300.0  # an engine process's start (imports, building its models) is bounded by this too
EXIT_WAIT_S = 5.0  # how long a closing engine process may take to exit before it is killed
NO_LIMIT_S = 365 * 86400.0  # a broadcast's timeout where rollout.engine_timeout_s=0 asks for none

# A bucket's layout: the dtype its flat tensor has, and (name, shape) of each tensor in it, in order.
Layout = list[tuple[torch.dtype, list[tuple[str, tuple[int, ...]]]]]


_TRANSFERS = itertools.count(1)  # the run's weight transfers, numbered (fault injection)


class EngineProcessDied(Resumable):
    """An engine process exited, and no restart is left."""


@dataclass
class EngineSpec:
    """What an engine process builds its engine from (pickled to it): no weights, which come by broadcast."""

    model_config: Any  # the policy's transformers config
    generation_config: Any
    tokenizer: Any
    dtype: torch.dtype  # the sampling dtype (precision.sampling, else the policy's)
    accelerate: bool  # model.accelerate: the KV decoder for Llama-family models
    threads: int  # torch's CPU threads in the engine process
    slots: list[int]  # the slots (batches in flight) this process serves
    vllm: dict[str, Any] | None = None  # rollout.engine=vllm: VLLMEngine's arguments (its weights' folder first)
    incarnation: int = 0  # how many times this process was restarted (fault injection dies in the first only)


def bucket_layout(state: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int) -> Layout:
    """`state`'s floating tensors cast to `dtype` (integer buffers as they are), in order, in buckets of at most
    `bucket_bytes` (a larger tensor is a bucket of its own) with one dtype each."""
    layout: Layout = []
    size = 0
    for name, tensor in state.items():
        kind = dtype if tensor.is_floating_point() else tensor.dtype
        nbytes = tensor.numel() * kind.itemsize
        if not layout or layout[-1][0] != kind or size + nbytes > bucket_bytes:
            layout.append((kind, []))
            size = 0
        layout[-1][1].append((name, tuple(tensor.shape)))
        size += nbytes
    return layout


def _broadcast(group: Any, flat: torch.Tensor, timeout_s: float) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    options.timeout = datetime.timedelta(seconds=timeout_s or NO_LIMIT_S)  # rollout.engine_timeout_s=0: no limit
    group.broadcast([flat], options).wait()


def send_weights(group: Any, state: dict[str, torch.Tensor], layout: Layout, timeout_s: float, number: int) -> None:
    """Rank 0's side: each bucket as one flat tensor (the receiver splits it by the layout). `number`: this
    transfer's in the run, for the resume tests' fault injection."""
    for index, (kind, entries) in enumerate(layout):
        if index == 1:
            die_if_due("transfer", number)  # killed mid-transfer (RETOOL_DIE_AFTER=transfer:N)
        parts = [state[name].detach().reshape(-1) for name, _ in entries]
        flat = torch.empty(sum(part.numel() for part in parts), dtype=kind)
        for part, into in zip(parts, flat.split([part.numel() for part in parts]), strict=True):
            into.copy_(part)  # cast and moved to the CPU in one copy
        _broadcast(group, flat, timeout_s)


def receive_weights(group: Any, layout: Layout, timeout_s: float) -> dict[str, torch.Tensor]:
    """Rank 1's side of send_weights: the tensors by name."""
    state: dict[str, torch.Tensor] = {}
    for kind, entries in layout:
        sizes = [int(torch.Size(shape).numel()) for _, shape in entries]
        flat = torch.empty(sum(sizes), dtype=kind)
        _broadcast(group, flat, timeout_s)
        for (name, shape), part in zip(entries, flat.split(sizes), strict=True):
            state[name] = part.view(shape)
    return state


def gloo_group(store: Any, rank: int, timeout_s: float) -> Any:
    """The trainer's (rank 0, whose `store` listens) and an engine process's two-process gloo group, over the
    loopback interface. Outside torch.distributed's default group: the trainer may have one of its own."""
    # _Options is private, and the only way to name the interface (the hostname may not resolve here)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = datetime.timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, 2, options)


# ---------------------------------------------------------------------- the engine process


def serve(spec: EngineSpec, conn: Connection, port: int, parent: int, timeout_s: float) -> None:
    """An engine process's main: build a model per slot, join the trainer's group, answer requests until told
    to exit or the trainer is gone."""
    for signum in stops.SIGNALS:
        signal.signal(signum, signal.SIG_IGN)  # a stop is the trainer's to handle; it ends this process
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops.SIGNALS)  # blocked since the spawn: one held now is dropped
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    torch.set_num_threads(spec.threads)
    if spec.incarnation == 0:
        die_if_due("engine_start", spec.slots[0])  # the start test (engine_start:P: process P, building its models)
    try:
        slots = _Slots(spec)
    except Exception as error:  # the trainer raises it
        conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
        return
    conn.send(("ok", None))  # ready: the trainer builds its side of the group once it reads this
    timeout = datetime.timedelta(seconds=START_TIMEOUT_S)
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timeout)
    group = gloo_group(store, 1, START_TIMEOUT_S)
    served = 0
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the trainer closed its end: it is gone
            return
        kind, slot, args = request
        if kind == "exit":
            return
        try:
            reply: Any = None
            if kind == "load":
                slots.load(slot, receive_weights(group, args, timeout_s))
            else:
                served += 1
                if spec.incarnation == 0:
                    die_if_due("engine", served)  # the killed-engine test (RETOOL_DIE_AFTER=engine:N)
                jitter("engine")  # the determinism tests' random delay (faults.py; nothing outside tests)
                reply = slots.generate(slot, args)
            conn.send(("ok", reply))
        except Exception as error:  # the trainer raises it, naming this process
            conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


class _Slots:
    """An engine process's weight versions, one per slot. hf: a model per slot. vLLM: one engine, whose weights
    are swapped for the slot a request names (rollout/weight_slots.py: vLLM's memory is sized for one engine a
    process; the slots' tensors wait in host memory)."""

    def __init__(self, spec: EngineSpec) -> None:
        self.vllm: WeightSlots | None = None
        if spec.vllm is not None:
            from retool_cli.rollout.vllm_engine import VLLMEngine

            self.vllm = WeightSlots(VLLMEngine(**spec.vllm, tokenizer=spec.tokenizer))
            return
        from retool_cli.rollout.hf_engine import HFEngine

        self.hf = {
            s: HFEngine(
                sampler_model(spec.model_config, spec.generation_config, spec.dtype),
                spec.tokenizer,
                accelerate=spec.accelerate,
            )
            for s in spec.slots
        }

    def load(self, slot: int, state: dict[str, torch.Tensor]) -> None:
        if self.vllm is not None:
            self.vllm.load(slot, _StateOf(state))
            return
        self.hf[slot].model.load_state_dict(state)
        self.hf[slot].update_weights(None)  # forget what the decoder prepacked from the old weights

    def generate(self, slot: int, args: tuple[Any, ...]) -> list[Generation]:
        if self.vllm is not None:
            return self.vllm.generate(slot, *args)
        return self.hf[slot].generate(*args)


class _StateOf:
    """Received tensors, as an engine loads a policy (`state_dict()`)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


# ---------------------------------------------------------------------- the trainer's side


class EngineProcess:
    """One engine process, seen from the trainer: started when made (`wait_started` before the first request),
    its requests one at a time, restarts when it dies, until it is closed."""

    def __init__(self, spec: EngineSpec, index: int, timeout_s: float, restarts: int, bucket_bytes: int) -> None:
        self.spec, self.index, self.timeout_s, self.bucket_bytes = spec, index, timeout_s, bucket_bytes
        self.restarts_left = restarts
        self.lock = threading.Lock()  # one request at a time: the process serves them in turn
        self.loaded: dict[int, dict[str, torch.Tensor]] = {}  # slot -> the weights it holds (sent again on restart)
        # Closed for good (the run ends or fails): a request still in flight in a sampler's thread then fails
        # rather than start a process again, which nothing would end and the interpreter's exit would wait for
        # (a non-daemon child). `starting` orders a start against the close.
        self.closed = False
        self.starting = threading.Lock()
        self._launch()

    def _start(self) -> None:
        self._launch()
        self.wait_started()

    def _launch(self) -> None:
        """Start the process, not waiting for it: `wait_started` does (so that several start at once)."""
        context = multiprocessing.get_context("spawn")  # never fork a process with threads and a torch pool
        with self.starting:
            if self.closed:
                raise EngineProcessDied(f"engine process {self.index} was closed: the run is ending")
            self.conn, child = context.Pipe()
            self.started = False  # (wait_started: its models built, its group joined)
            # the store listens first (port 0: any free port), the child joins it, then both build the group
            timeout = datetime.timedelta(seconds=START_TIMEOUT_S)
            self.store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
            self.process = context.Process(
                target=serve,
                args=(self.spec, child, self.store.port, os.getpid(), self.timeout_s),
                name=f"retool-engine-{self.index}",
                daemon=False,  # vLLM may start processes of its own; close() ends this one (and it its parent's end)
            )
            # The stop signals blocked in this thread while it spawns: the child inherits the mask across exec, so a
            # Ctrl-C to the process group while it imports is held until serve() ignores it, instead of killing it
            # with a KeyboardInterrupt (this thread's own stop, if one comes, is delivered as the block ends).
            # multiprocessing's resource tracker is started first: its start unblocks SIGINT and SIGTERM.
            resource_tracker.ensure_running()
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stops.SIGNALS)
            try:
                self.process.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child.close()
        log.info("engine process %d started (pid %d)", self.index, self.process.pid)

    def wait_started(self) -> None:
        """Wait for the process's models (or why it has none), then join its side of the weights' group."""
        self._answer("start", max(self.timeout_s, START_TIMEOUT_S))
        try:
            self.group = gloo_group(self.store, 0, START_TIMEOUT_S)
        except RuntimeError as error:  # the child died before joining, or never joined in time
            self._died(f"while starting ({error})")
        self.started = True

    def _died(self, when: str) -> NoReturn:
        self.process.join(timeout=EXIT_WAIT_S)
        code = self.process.exitcode
        raise _Died(f"engine process {self.index} (pid {self.process.pid}) {_how_it_ended(code)} {when}")

    def request(self, kind: str, slot: int, args: Any) -> Any:
        """Send a request and wait for its answer, restarting a dead process (weights sent again) and repeating
        the request up to the restarts left."""
        with self.lock:
            restart = False
            while True:
                try:
                    if restart:
                        self._restart()
                    return self._exchange(kind, slot, args)
                except _Died as died:
                    if self.closed:  # killed by close(): the run is ending
                        raise EngineProcessDied(f"{died}, closed as the run ends") from None
                    if self.restarts_left == 0:
                        raise EngineProcessDied(
                            f"{died}; no restart left (rollout.engine_restarts). Stopping; the run resumes from its "
                            "last checkpoint"
                        ) from None
                    self.restarts_left -= 1
                    log.warning("%s; restarting it and sending its weights again", died)
                    restart = True

    def load(self, slot: int, weights: Any) -> None:
        """Slot `slot` samples with `weights` (anything with `state_dict()`) from now on: sent now."""
        self.request("load", slot, weights.state_dict())

    def generate(self, slot: int, *args: Any) -> list[Generation]:
        """Engine.generate(*args) on slot `slot`'s weights."""
        generations: list[Generation] = self.request("generate", slot, args)
        return generations

    def _restart(self) -> None:
        self.end_by(time.monotonic() + EXIT_WAIT_S)
        self.spec.incarnation += 1
        self._start()
        for slot, state in self.loaded.items():
            self._exchange("load", slot, state)

    def _exchange(self, kind: str, slot: int, args: Any) -> Any:
        try:
            if kind == "load":
                state = args
                layout = bucket_layout(state, self.spec.dtype, self.bucket_bytes)
                self.conn.send(("load", slot, layout))
                send_weights(self.group, state, layout, self.timeout_s, next(_TRANSFERS))
                self.loaded[slot] = state
            else:
                self.conn.send((kind, slot, args))
        except (OSError, RuntimeError) as error:  # the pipe or the group met a dead process
            self._died(f"during a {kind} request ({error})")
        return self._answer(kind, self.timeout_s)

    def _answer(self, kind: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        while not self.conn.poll(POLL_S):
            if not self.process.is_alive():
                self._died(f"during a {kind} request")
            if deadline is not None and time.monotonic() > deadline:
                raise EngineTimeout(
                    f"engine process {self.index} did not answer a {kind} request within rollout.engine_timeout_s="
                    f"{timeout_s:g} s: it is stuck or far slower than expected. Stopping; the run resumes from its "
                    "last checkpoint (with a larger rollout.engine_timeout_s if the engine is only slow)"
                )
        try:
            status, reply = self.conn.recv()
        except (EOFError, OSError):
            self._died(f"during a {kind} request")
        if status == "error":
            raise RetoolError(f"engine process {self.index} failed a {kind} request: {reply}")
        return reply

    def close(self) -> None:
        """End the process for good (see `closed`)."""
        self.ask_to_exit()
        self.end_by(time.monotonic() + EXIT_WAIT_S)

    def ask_to_exit(self) -> None:
        with self.starting:
            self.closed = True
        with contextlib.suppress(OSError):
            self.conn.send(("exit", 0, None))

    def end_by(self, deadline: float) -> None:
        """Wait until `deadline` for the process to exit, then kill it and what it started. One still starting
        reads no request before its models are built (minutes, for a large model): killed at once."""
        if self.started:
            self.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.process.is_alive() and self.process.pid is not None:
            stops.kill_descendants(self.process.pid)  # (vLLM's own processes, if it started any)
            self.process.kill()
            self.process.join()
        self.conn.close()


def _how_it_ended(code: int | None) -> str:
    """A process's exit code in words (multiprocessing's -N: killed by signal N)."""
    if code is None:
        return "stopped answering"
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name if -code in {s.value for s in signal.Signals} else f"signal {-code}"
    oom = " (by the kernel's out-of-memory killer, if `dmesg` says so)" if -code == signal.SIGKILL else ""
    return f"was killed by {name}{oom}"


class _Died(RetoolError):
    """An engine process exited (restarted by `request` while restarts are left)."""


@contextlib.contextmanager
def engine_processes(
    config: RetoolConfig, precision: Precision, model: Any, tokenizer: Any, slots: int
) -> Iterator[list[Engine]]:
    """rollout.placement=separate: `slots` engines for the overlapped sampler, dealt out over
    rollout.engine_processes processes (at most one per slot), each with rollout.engine_threads of the trainer's
    CPU threads; closed (their processes ended) on leaving."""
    r = config.rollout  # (on CPU: rl/launch.check_placement refused an accelerator before the run began)
    count = min(r.engine_processes, slots)
    if count < r.engine_processes:
        log.warning(
            "rollout.engine_processes=%d: only %d batches are ever in flight, so %d processes",
            r.engine_processes,
            slots,
            count,
        )
    dtype = precision.sampling or next(model.parameters()).dtype
    # vLLM: its own engine in each process, on the policy's architecture and tokenizer; never asleep (the
    # trainer is elsewhere)
    vllm = {**vllm_arguments(config, precision), "sleep_mode": False} if r.engine is RolloutEngine.vllm else None
    bucket_bytes = int(r.weight_bucket_mb * 2**20)
    trainer_threads = torch.get_num_threads()
    processes: list[EngineProcess] = []
    try:
        for index in range(count):
            spec = EngineSpec(
                model.config,
                model.generation_config,
                tokenizer,
                dtype,
                config.model.accelerate,
                r.engine_threads,
                slots=list(range(index, slots, count)),
                vllm=vllm,
            )
            processes.append(EngineProcess(spec, index, r.engine_timeout_s, r.engine_restarts, bucket_bytes))
        # all started at once: each imports and builds its models on its own cores. One trainer process: a stop
        # meanwhile (minutes, for a large model) ends the wait at once, with nothing trained to lose
        alone = not dist.is_initialized() or dist.get_world_size() == 1
        with stops.interruptible(alone):
            for process in processes:
                process.wait_started()
        torch.set_num_threads(max(1, trainer_threads - count * r.engine_threads))  # the engines' cores are theirs
        log.info(
            "rollout.placement=separate: %d engine processes x %d threads, the trainer %d threads",
            count,
            r.engine_threads,
            torch.get_num_threads(),
        )
        yield [SlotEngine(processes[slot % count], slot) for slot in range(slots)]
    finally:
        torch.set_num_threads(trainer_threads)
        for process in processes:  # all asked first, then waited for: they exit at once
            process.ask_to_exit()
        deadline = time.monotonic() + EXIT_WAIT_S
        for process in processes:
            process.end_by(deadline)
