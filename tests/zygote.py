"""A process that has imported torch, transformers and every module of retool_cli once, and forks a copy of itself
for each `retool` command a test runs (tests/helpers.py: run_retool, start_retool). A fresh `python -m retool_cli
train ...` spends 6-7 s of a core of this machine importing before it does anything.

The command still runs in a process of its own, started as `python -m retool_cli ARGS` would be: its own pid, the
test's environment, working folder, stdout and stderr (files the test passed over), its exit status (a signal's
as -N), atexit handlers and uncaught exceptions as at an interpreter's exit. Only what the imports read from the
environment is fixed when the zygote starts: each environment but its RUN_TIME variables has a zygote of its own
(`zygote_for`). Forking is safe because the zygote never computes: torch's OpenMP pool does not exist yet (and
OpenBLAS, which starts its threads at import where OMP_NUM_THREADS allows, restarts them after a fork).

Protocol, over a Unix socket pair: the test sends one request (JSON: args, env, cwd) with four descriptors (stdin,
stdout, stderr, and its end of a reply socket pair); the zygote forks a monitor, which forks the command and
writes back over the reply socket the command's pid, then its wait status. The zygote ends when the test's end of
the socket closes. The test's side: `Zygote` (one per test process and environment) and `Forked`, the part of
subprocess.Popen the tests use.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import pkgutil
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

# Environment variables read when a command runs, not when it imports (pytest sets the last one for each test).
RUN_TIME = ("RETOOL_", "COLUMNS", "PYTEST_CURRENT_TEST")
MODELS = [f"transformers.models.{arch}.modeling_{arch}" for arch in ("qwen2", "qwen3", "llama")]
VLLM_MODULES = ("vllm.entrypoints.llm", "vllm.v1.engine.llm_engine", "vllm.v1.worker.cpu_model_runner")
NOT_IMPORTED = ("retool_cli.__main__", "retool_cli.env.sandbox_worker")  # run as scripts, never imported


def preload(vllm: bool) -> None:
    from retool_cli.cli import _quiet_libraries

    _quiet_libraries()  # what main() sets, before the imports that read it
    import retool_cli

    for module in pkgutil.walk_packages(retool_cli.__path__, "retool_cli."):
        if module.name not in NOT_IMPORTED:
            importlib.import_module(module.name)
    # What commands import lazily as they run: the model classes the tests build, Hydra's plugins, numba's compiler
    for name in ["transformers.modeling_utils", "transformers.tokenization_utils_fast", *MODELS]:
        importlib.import_module(name)
    from hydra.core.plugins import Plugins

    Plugins.instance()  # scans hydra_plugins once
    import matplotlib

    matplotlib.use("Agg")  # as metrics_log.plot_metrics sets it: half a second at every train and sft's end
    import matplotlib.pyplot

    warm_numba()
    if vllm:
        preload_vllm()
    gc.freeze()  # the collector leaves what is here alone in the forks: their memory stays shared, not copied


def warm_numba() -> None:
    """numba's compiler set up (half a second at a command's first kernel; cpu_kernels.py's come from its disk
    cache), by compiling a function that starts no thread."""
    import numba

    numba.njit(lambda x: x + 1)(1)


def preload_vllm() -> None:
    """vLLM and the modules its CPU engine loads as it starts (5-6 s of a core at each `rollout=vllm` command's
    first engine), imported as the command would: after the command's environment (`_quiet_libraries`) and
    through `_import_vllm`. Only for commands that leave VLLM_BATCH_INVARIANT alone, which some of vLLM's
    modules read when imported (`uses_vllm`). Imports only: vLLM starts no thread until an engine is built."""
    from retool_cli.rollout.vllm_engine import _import_vllm

    _import_vllm()
    for name in VLLM_MODULES:
        importlib.import_module(name)


def send(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    header = struct.pack("!I", len(payload))
    if fds:
        socket.send_fds(sock, [header + payload], fds)
    else:
        sock.sendall(header + payload)


def receive(sock: socket.socket, nfds: int = 0) -> tuple[bytes, list[int]]:
    """One message (b"" when the other end closed) and the descriptors that came with it."""
    head, fds, _, _ = socket.recv_fds(sock, 4, nfds) if nfds else (sock.recv(4), [], 0, None)
    if len(head) < 4:
        return b"", fds
    size = struct.unpack("!I", head)[0]
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return b"", fds
        body += chunk
    return body, fds


def run_command(request: dict, stdio: list[int]) -> None:
    """In the forked command process: become `python -m retool_cli ARGS` and never return."""
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # as `python -m` puts the working folder first
    sys.argv = ["retool_cli", *request["args"]]
    code = 0
    try:
        runpy.run_module("retool_cli", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = exit_status(stop)
    except KeyboardInterrupt:  # uncaught, as the interpreter ends: by SIGINT itself
        exit_now(0, signal.SIGINT)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    exit_now(code)


def exit_status(stop: SystemExit) -> int:
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def exit_now(code: int, signum: int | None = None) -> None:
    """The interpreter's exit without its teardown of every module and object (seconds, with the zygote's 3,000
    modules: a fresh process has imported only what its command needs): threads joined, atexit handlers run,
    streams flushed, as at a normal exit."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if signum is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code)


def monitor(request: dict, fds: list[int]) -> None:
    """In the forked monitor: start the command, report its pid, wait for it, report its wait status."""
    *stdio, reply_fd = fds
    reply = socket.socket(fileno=reply_fd)
    pid = os.fork()
    if pid == 0:
        reply.close()
        run_command(request, stdio)
    for fd in stdio:
        os.close(fd)
    send(reply, str(pid).encode())
    _, status = os.waitpid(pid, 0)
    send(reply, str(status).encode())
    os._exit(0)


def serve(control: socket.socket) -> None:
    while True:
        message, fds = receive(control, nfds=4)
        if not message:
            return
        if os.fork() == 0:
            control.close()
            monitor(json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        while True:  # reap the monitors that finished
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


class Forked:
    """A command forked by the zygote, used as the tests use subprocess.Popen: pid, poll, wait, send_signal, kill,
    communicate, returncode. Its stdout and stderr go to files (read at the end: no pipe to fill and block on)."""

    def __init__(self, zygote: Zygote, args: list[str], env: dict[str, str], cwd: Path, text: bool, merged: bool):
        self.args, self.text, self.returncode = args, text, None
        self.out = tempfile.TemporaryFile()  # noqa: SIM115 (open while the command runs; closed with the handle)
        self.err = self.out if merged else tempfile.TemporaryFile()  # noqa: SIM115
        self.reply, theirs = socket.socketpair()
        request = json.dumps({"args": args, "env": env, "cwd": str(Path(cwd).resolve())}).encode()
        with open(os.devnull) as stdin, theirs, zygote.lock:
            send(zygote.control, request, [stdin.fileno(), self.out.fileno(), self.err.fileno(), theirs.fileno()])
        self.reply.settimeout(600)  # the zygote's imports first, on a machine busy with the other workers' commands
        pid = receive(self.reply)[0]
        if not pid:
            raise RuntimeError(f"the test zygote (tests/zygote.py) died: exit status {zygote.proc.poll()}")
        self.pid = int(pid)

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.reply], [], [], 0)[0]:
            self.returncode = os.waitstatus_to_exitcode(int(receive(self.reply)[0]))
            self.reply.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.reply], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.poll()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        self.wait(timeout)
        return self._read(self.out), None if self.err is self.out else self._read(self.err)

    def _read(self, file: IO[bytes]) -> str | bytes:
        """What a pipe would have given: bytes, or text decoded with universal newlines."""
        file.seek(0)
        data = file.read()
        return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n") if self.text else data


class Zygote:
    """The test's end of a zygote started with `env`."""

    def __init__(self, env: dict[str, str], vllm: bool) -> None:
        self.env = env
        self.control, theirs = socket.socketpair()
        self.lock = threading.Lock()  # one request at a time on the control socket
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", str(theirs.fileno()), *(["vllm"] if vllm else [])],
            cwd=Path(__file__).resolve().parent.parent,
            env=env,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()

    def start(self, args: list[str], env: dict[str, str], cwd: Path, text: bool = True, merged: bool = False) -> Forked:
        """`python -m retool_cli ARGS` forked, with `env` (which may differ from the zygote's in RUN_TIME only)."""
        assert all(k.startswith(RUN_TIME) for k, _ in set(env.items()) ^ set(self.env.items()))
        return Forked(self, args, env, cwd, text, merged)

    def close(self) -> None:
        """It exits once the commands it forked are under way (their monitors wait for them)."""
        if self.control.fileno() != -1:
            self.control.close()
            self.proc.wait(timeout=600)


_zygotes: dict[tuple[int, bool, frozenset], Zygote] = {}  # the most recently used last
KEEP = 3  # zygotes per test process (0.5-1 GB each, mostly shared with its forks)


def uses_vllm(args: list[str]) -> bool:
    """Whether a command chooses vLLM on its command line, leaving its batch-invariant kernels off (preload_vllm)."""
    chosen = any(arg in ("rollout=vllm", "rollout.engine=vllm") for arg in args)
    return chosen and not any("vllm_batch_invariant" in arg for arg in args)


def zygote_for(env: dict[str, str], args: list[str]) -> Zygote | None:
    """This process's zygote for `env` but its RUN_TIME variables, with vLLM preloaded where `args` choose it
    (started on first use, again if it died), or None where RETOOL_TEST_ZYGOTE=0 (in `env`: a test that wants
    a fresh interpreter)."""
    if env.get("RETOOL_TEST_ZYGOTE", "1") == "0":
        return None
    base = {k: v for k, v in env.items() if not k.startswith(RUN_TIME)}
    vllm = uses_vllm(args)
    key = (os.getpid(), vllm, frozenset(base.items()))
    zygote = _zygotes.pop(key, None)
    if zygote is None or zygote.proc.poll() is not None:
        zygote = Zygote(base, vllm)
        atexit.register(zygote.close)
    _zygotes[key] = zygote
    while len(_zygotes) > KEEP:
        _zygotes.pop(next(iter(_zygotes))).close()
    return zygote


if __name__ == "__main__":
    preload(vllm=sys.argv[2:] == ["vllm"])
    serve(socket.socket(fileno=int(sys.argv[1])))
    os._exit(0)  # no teardown of every module (and no complaints from native ones about it)
