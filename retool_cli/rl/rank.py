"""One process of a run that `retool train` launched (trainer.nproc > 1 or trainer.nnodes > 1), forked by
torchrun's agent: `python -m retool_cli.rl.torchrun ... fork` imports torch, transformers and the trainer once
and runs torchrun with `--start-method=fork --run-path` this file, so each rank starts as a copy of the agent
instead of a fresh interpreter that imports them again (6-7 s of a core per process on a 2-core machine; more on
a cluster node whose ranks import from a shared file system at once).

Only where torch has no CUDA and the ranks run no vLLM (launch.rank_start): a process forked from one that has
touched CUDA cannot use it, and vLLM's CPU tensor parallelism releases its shared memory only at a process's own
exit. Otherwise ranks are fresh interpreters (`-m retool_cli`), as torchrun makes them.

A forked rank is not a fresh interpreter, so it becomes one here: the agent's signal handlers and exit handlers
are dropped, torch's thread count is the one torchrun gives fresh ranks (OMP_NUM_THREADS, read by a fresh process
at load), and the rank ends as torchrun's agent expects a forked one to: its failures as an exit status, success
by returning (the agent waits for every rank's result; a rank that exits 0 without one would leave it waiting).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import sys
import threading

from retool_cli import stops

# What a rank of `retool train` imports, most of it lazily as it runs (`python -X importtime`): the trainer, the
# model classes, the plots, numba's compiler for the rollout kernels. Imported by the agent before it forks.
PRELOAD = (
    "retool_cli.cli",
    "retool_cli.commands.train",
    "retool_cli.rollout.hf_engine",
    "transformers.models.auto.modeling_auto",
    "transformers.modeling_layers",
    "matplotlib.pyplot",
    "numba.np.arraymath",
)


def preload() -> None:
    """Import PRELOAD in torchrun's agent, so that every rank forked from it starts with them imported. Imports
    only: nothing here computes, so no thread pool exists yet to be lost in a fork."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def main() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_DFL)  # torchrun's agent's handlers; the command installs its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # the agent's exit handlers are not this process's
    os.environ[stops.FORKED_RANK_ENV] = "1"  # stops.exit_quietly: a stop's exit 0 returns here
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    code = 0
    try:
        runpy.run_module("retool_cli", run_name="__main__", alter_sys=True)  # as `python -m retool_cli` runs
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:  # SystemExit("message"): printed, status 1, as the interpreter does
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # as at an interpreter's exit: threads joined, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code:
        os._exit(code)


if __name__ == "__main__":
    main()
