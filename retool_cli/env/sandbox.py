"""The code interpreter: a pool of warm, jailed workers that run model-written Python safely and fast.

    Sandbox.run_many(codes) --one thread per worker--> _Worker.call(request)
      --length-prefixed JSON over pipes--> sandbox_worker.py (inside bubblewrap, or plain under rlimits)
      --fork--> child: setsid, limits, drop to an unprivileged uid, run the snippet, exit
      <-- ExecResult(stdout, stderr, status, duration_s, reason, exit_code, truncated)

Isolation `bwrap`: no network (own network namespace), a private size-limited /tmp and /dev/shm, a fresh
/proc of its own pid namespace, the system and the interpreter read-only, no project files, no home
directories, an empty environment, and (when started as root) every snippet as an unprivileged uid
that cannot signal or trace the worker. Isolation `rlimits` (where bubblewrap is unavailable): the
same limits, scrubbed environment and scratch folder, but no filesystem or network isolation.

In both, nothing a call makes outlives it: the kernel objects that are not files of the call's scratch
folder (System V IPC, POSIX message queues, the kernel keyring, which no namespace covers) are refused
by a seccomp filter, and each Sandbox claims snippet uids no other sandbox on the machine holds (a lock
file per uid), so no run shares a process quota or a uid's files with another.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import re
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from retool_cli.config import Isolation, SandboxConfig
from retool_cli.env.exec_cache import ExecCache, sandbox_fingerprint
from retool_cli.errors import RetoolError
from retool_cli.interfaces import ExecResult
from retool_cli.stops import descendants

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("sandbox_worker.py")
STATUSES = ("ok", "error", "timeout", "killed")
_SNIPPET_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "TZ": "UTC",  # what a snippet sees of the machine is fixed where it can be (README, The interpreter cache)
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
START_ATTEMPTS = 3  # a worker that fails to (re)start is tried this many times before the sandbox gives up
UID_RANGE = 4096  # snippet uids claimed from sandbox.uid_base upwards
UID_LOCKS = Path("/run/lock/retool-sandbox-uids")  # one lock file per snippet uid in use on this machine
_warned_rlimits = False


# An object's address in its repr ("<generator object <genexpr> at 0x7f3b48d90c80>"): where the process's memory
# lies, which the kernel randomises for each process (ASLR), so the same snippet would print another text in
# another run, and the model would continue differently.
_ADDRESS = re.compile(r"(?<= at )0x[0-9a-f]{6,16}\b")


def without_addresses(text: str) -> str:
    """`text` with each object address written as a fixed one, numbered by first appearance (two objects stay two
    addresses, one object printed twice stays one), so that an output is the same in every run."""
    if " at 0x" not in text:
        return text
    seen: dict[str, str] = {}
    return _ADDRESS.sub(lambda m: seen.setdefault(m.group(0), f"0x{0x7F0000000000 + 0x10 * len(seen):x}"), text)


class SandboxError(RetoolError):
    """The sandbox itself is broken (cannot start a worker, bubblewrap refused): not the snippet's fault."""


# ------------------------------------------------------------------ isolation


def bwrap_usable() -> tuple[bool, str]:
    """Whether bubblewrap can start a jail here (installed, namespaces allowed); the reason if not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bubblewrap (bwrap) is not installed"
    probe = subprocess.run(
        [exe, *_namespace_flags(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
        capture_output=True,
        text=True,
        env={},
        timeout=30,
    )
    if probe.returncode != 0:
        return False, f"bwrap cannot create namespaces here: {probe.stderr.strip()}"
    return True, ""


def resolve_isolation(requested: Isolation) -> Isolation:
    global _warned_rlimits
    if requested is Isolation.rlimits:
        return requested
    usable, why = bwrap_usable()
    if usable:
        return Isolation.bwrap
    if requested is Isolation.bwrap:
        raise SandboxError(f"sandbox.isolation=bwrap but {why}; install bubblewrap or set sandbox.isolation=rlimits")
    if not _warned_rlimits:
        log.warning(  # loud on purpose: a silently weaker sandbox is how tool RL quietly goes wrong
            "SANDBOX IS NOT JAILED: %s. Falling back to sandbox.isolation=rlimits: limits, scrubbed environment and "
            "scratch folder only; snippets can read world-readable files and reach the network.",
            why,
        )
        _warned_rlimits = True
    return Isolation.rlimits


def _namespace_flags() -> list[str]:
    # As root, no user namespace: the jail's root can then drop to a real unprivileged uid (a user
    # namespace would map only uid 0). As a normal user, a user namespace is what makes bwrap work.
    if os.geteuid() == 0:
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return ["--unshare-all", "--cap-drop", "ALL"]


def _site_dirs(modules: list[str]) -> list[str]:
    """The folders (outside the interpreter's own prefix) that hold the preloaded packages."""
    base = os.path.realpath(sys.base_prefix)
    dirs: list[str] = []
    for name in modules:
        spec = find_spec(name)
        if spec is None:
            raise SandboxError(f"sandbox.preload: module {name!r} is not installed")
        if spec.origin in (None, "built-in", "frozen"):
            continue
        location = os.path.realpath(spec.origin)
        top = (
            os.path.dirname(location)
            if spec.submodule_search_locations is None
            else os.path.dirname(os.path.dirname(location))
        )
        if not top.startswith(base + os.sep) and top not in dirs:
            dirs.append(top)
    return dirs


def _bwrap_command(config: SandboxConfig, setup: dict[str, Any]) -> list[str]:
    base = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(sys.executable)
    in_usr = base == "/usr" or base.startswith("/usr/")
    py_root = base if in_usr else "/opt/python"
    # No --die-with-parent: its parent-death signal fires when the *thread* that started bwrap exits.
    # The worker exits on EOF of its request pipe instead, which also happens when the host dies.
    cmd = ["env", "-i", shutil.which("bwrap") or "bwrap", *_namespace_flags(), "--new-session"]
    cmd += ["--hostname", "sandbox"]  # its own UTS namespace: not the machine's name
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    cmd += ["--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", "/opt/site"]
    if not in_usr:
        cmd += ["--ro-bind", base, py_root]
    for i, site in enumerate(setup["host_site_dirs"]):
        cmd += ["--ro-bind", site, f"/opt/site/{i}"]
    cmd += ["--ro-bind", str(WORKER_SCRIPT), "/opt/retool_worker.py"]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "1777", "--size", str(config.scratch_mb << 20), "--tmpfs", "/dev/shm"]
    cmd += ["--perms", "1777", "--size", str(config.scratch_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    cmd += ["--clearenv", "--setenv", "LD_LIBRARY_PATH", f"{py_root}/lib"]
    for key, value in _SNIPPET_ENV.items():
        cmd += ["--setenv", key, value]
    if os.geteuid() == 0:
        # The worker keeps only what it needs to drop each child to another uid and clean up after it.
        caps = "-all,+setuid,+setgid,+kill,+dac_override,+fowner,+chown"
        cmd += ["--", shutil.which("setpriv") or "setpriv", "--no-new-privs", f"--bounding-set={caps}"]
    else:
        cmd += ["--"]
    jail_exe = exe if in_usr else os.path.join(py_root, os.path.relpath(exe, base))
    jail_setup = {
        **setup,
        "sys_path": [f"/opt/site/{i}" for i in range(len(setup["host_site_dirs"]))],
        "scratch_root": "/tmp",
        "clean_dirs": ["/dev/shm"],
        "shared_dirs": [],  # the jail shares no writable folder with the machine
    }
    # No -E: the environment is ours alone (cleared above), and PYTHONHASHSEED must reach the worker, whose
    # children inherit its hash secret (with -E every worker hashed strings differently).
    return [*cmd, jail_exe, "-s", "-B", "/opt/retool_worker.py", json.dumps(jail_setup)]


# ------------------------------------------------------------------ one worker


class _Worker:
    """One warm worker process and the pipes to it. Used by one thread at a time."""

    def __init__(self, config: SandboxConfig, isolation: Isolation, uid: int | None) -> None:
        self.config, self.isolation, self.uid = config, isolation, uid
        self.proc: subprocess.Popen[bytes] | None = None
        self._scratch: str | None = None
        self._errors: Any = None  # the worker's stderr (a temporary file): what a failed start is explained by
        self._started: set[int] = set()  # the processes a start made: killed with it, even if bwrap died first

    def start(self) -> None:
        """(Re)start the worker: a start that fails (the process died or hung) is tried again, START_ATTEMPTS in
        all, so that one killed start (the OOM killer, a signal) does not stop a run; then the error says why."""
        failures = []
        for attempt in range(START_ATTEMPTS):
            try:
                self.launch()
                self.wait_ready()
                return
            except SandboxError as error:
                failures.append(f"attempt {attempt + 1}: {error}")
                time.sleep(0.2 * (attempt + 1))
        raise SandboxError(
            f"a sandbox worker ({self.isolation.value}) failed to start {START_ATTEMPTS} times:\n" + "\n".join(failures)
        )

    def launch(self) -> None:
        cfg = self.config
        site_dirs = _site_dirs(cfg.preload)
        setup = {
            "preload": cfg.preload,
            "warmup": cfg.warmup,
            "host_site_dirs": site_dirs,
            "uid": self.uid,
            "env": _SNIPPET_ENV,
            "seed": cfg.seed,
            "timeout_s": cfg.timeout_s,
            "limits": {
                "memory_bytes": cfg.memory_mb << 20,
                "cpu_time_s": cfg.cpu_time_s,
                "max_file_bytes": cfg.max_file_mb << 20,
                "max_open_files": cfg.max_open_files,
                "max_processes": cfg.max_processes,
                "max_output_bytes": cfg.max_output_bytes,
            },
        }
        if self.isolation is Isolation.bwrap:
            cmd = _bwrap_command(self.config, setup)
        else:
            self._scratch = tempfile.mkdtemp(prefix="retool-sandbox-")
            os.chmod(self._scratch, 0o711)  # the snippet's uid may enter its own call folder, nothing else
            shared = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d)]
            setup = {**setup, "sys_path": site_dirs, "scratch_root": self._scratch, "clean_dirs": []}
            setup["shared_dirs"] = shared
            cmd = [os.path.realpath(sys.executable), "-s", "-B", str(WORKER_SCRIPT), json.dumps(setup)]
        env = dict(_SNIPPET_ENV) if self.isolation is Isolation.rlimits else None
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            env=env,
            cwd=self._scratch or "/",
            start_new_session=True,  # no terminal signal reaches it: the host stops it
        )

    def wait_ready(self) -> None:
        """Wait for the worker's "ready"; a start whose process ended (bwrap or the worker killed) fails at once
        rather than after sandbox.start_timeout_s, and what it had started (a jail left behind) is killed."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + self.config.start_timeout_s
        ready = None
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout.fileno(), selectors.EVENT_READ)
            while time.monotonic() < deadline and self.proc.poll() is None:
                self._started |= set(descendants(self.proc.pid))
                if selector.select(0.2):  # the message (or the pipe's end)
                    with contextlib.suppress(OSError, ValueError):
                        ready = self._receive(deadline)
                    break
        if ready and ready.get("ready"):
            self._started.clear()  # from now on its processes are found below bwrap (pids of the past may be reused)
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            assert self.proc is not None
            self.proc.wait(timeout=1.0)  # a worker that died: its exit status
        why = self.diagnosis()
        self.stop()
        raise SandboxError(why)

    def diagnosis(self) -> str:
        """What became of a worker that did not answer: how it ended (or that it hung) and the end of its stderr."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            what = f"not ready within sandbox.start_timeout_s={self.config.start_timeout_s:g} s"
        elif code < 0:
            what = f"killed by {signal.Signals(-code).name} while starting"
        else:
            what = f"exited with code {code} while starting"
        tail = ""
        if self._errors is not None:
            self._errors.seek(0, os.SEEK_END)
            self._errors.seek(max(0, self._errors.tell() - 2000))
            tail = self._errors.read().decode("utf-8", "replace").strip()
        return f"{what}; its stderr: {tail}" if tail else f"{what}; it printed nothing on stderr"

    def call(self, code: str) -> ExecResult:
        """Run one snippet. A dead or hung worker gives an infra_error result and is restarted."""
        started = time.monotonic()
        try:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
                started = time.monotonic()  # the reply's deadline counts from here, not from before the restart
            self._send({"code": code})
            reply = self._receive(started + self.config.timeout_s + 10.0)  # the worker enforces timeout_s itself
        except (OSError, ValueError):
            reply = None
        if reply is None or "infra_error" in reply:
            detail = "sandbox worker died or stopped answering" if reply is None else reply["infra_error"]
            self.stop()
            return ExecResult("", "", "killed", time.monotonic() - started, detail, None, False, infra_error=True)
        return ExecResult(
            without_addresses(reply["stdout"]),
            without_addresses(reply["stderr"]),
            reply["status"],
            reply["duration_s"],
            reply["reason"],
            reply["exit_code"],
            reply["truncated"],
        )

    def kill(self) -> None:
        """SIGKILL the worker's processes (bwrap, the jail's init, worker, snippet) and nothing else: a call in
        flight on another thread sees its pipe close and returns; that thread then cleans up (`stop`)."""
        proc = self.proc
        if proc is not None:
            for pid in {proc.pid, *descendants(proc.pid), *self._started}:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            self.kill()
            self._started.clear()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]
            self.proc = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        if self._errors is not None:
            self._errors.close()
            self._errors = None

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message).encode()  # ASCII: a lone surrogate in the code travels as its \\u escape
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(struct.pack(">I", len(body)) + body)
        self.proc.stdin.flush()

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        header = _read_exact(fd, 4, deadline)
        body = None if header is None else _read_exact(fd, struct.unpack(">I", header)[0], deadline)
        return None if body is None else json.loads(body)


def _world_readable(path: str) -> bool:
    """Whether every folder down to `path` lets other users in."""
    path = os.path.realpath(path)
    while True:
        if not os.stat(path).st_mode & 0o001:
            return False
        if path == os.path.dirname(path):
            return True
        path = os.path.dirname(path)


def _read_exact(fd: int, n: int, deadline: float) -> bytes | None:
    chunks, remaining = [], n
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while remaining:
            timeout = deadline - time.monotonic()
            if timeout <= 0 or not selector.select(timeout):
                return None
            chunk = os.read(fd, remaining)
            if not chunk:
                return None
            chunks.append(chunk)
            remaining -= len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------ the pool


class Sandbox:
    """Run Python snippets safely. Use as a context manager (or call close()).

    with Sandbox() as sandbox:
        results = sandbox.run_many(["print(2**100)", "import sympy; sympy.factorint(2**64 - 1)"])
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.isolation = resolve_isolation(self.config.isolation)
        root = os.geteuid() == 0
        if root and self.isolation is Isolation.rlimits and not _world_readable(sys.base_prefix):
            log.warning(
                "sandbox: snippets run as an unprivileged uid that cannot read %s; only the modules in "
                "sandbox.preload can be imported (use bwrap isolation, or a world-readable Python)",
                os.path.realpath(sys.base_prefix),
            )
        self._uid_locks: list[int] = []  # open lock files: the snippet uids this sandbox holds
        uids = self._claim_uids(self.config.uid_base, self.config.workers) if root else [None] * self.config.workers
        self._workers = [_Worker(self.config, self.isolation, uid) for uid in uids]
        for worker in self._workers:  # start them side by side: launch all, then wait for each
            worker.launch()
        try:
            for worker in self._workers:
                try:
                    worker.wait_ready()
                except SandboxError:
                    worker.start()  # the first start failed: tried again, with the reason if it keeps failing
        except SandboxError:
            self.close()
            raise
        self._free: queue.Queue[_Worker] = queue.Queue()
        for worker in self._workers:
            self._free.put(worker)
        self._pool = ThreadPoolExecutor(len(self._workers), thread_name_prefix="sandbox")
        self._lock = threading.Lock()
        fingerprint = sandbox_fingerprint(self.config, self.isolation, WORKER_SCRIPT) if self.config.cache else ""
        self.cache = ExecCache(fingerprint, self.config.cache_max_mib << 20) if self.config.cache else None
        self.reset_stats()

    def run(self, code: str) -> ExecResult:
        """One snippet's result: from the cache when this code already ran here (sandbox.cache), else run."""
        if self.cache is None:
            return self._run_in_worker(code)
        return self.cache.run(code, self._run_in_worker)

    def _run_in_worker(self, code: str) -> ExecResult:
        worker = self._free.get()
        try:
            result = worker.call(code)
        finally:
            self._free.put(worker)
        self._record(result)
        return result

    def run_many(self, codes: list[str]) -> list[ExecResult]:
        """Run snippets concurrently over the workers; results in input order."""
        return list(self._pool.map(self.run, codes))

    # -- health: callers read per-batch numbers and reset them

    def reset_stats(self) -> None:
        with self._lock:
            self._counts: Counter[str] = Counter()
            self._latencies: list[float] = []
        if self.cache is not None:
            self.cache.reset_stats()

    def stats(self) -> dict[str, float]:
        """Counts per status of the snippets run (cache hits aside), infra errors (worker deaths/hangs), rates and
        latency since the last reset; the cache's hits and lookups."""
        with self._lock:
            counts, latencies = Counter(self._counts), sorted(self._latencies)
        total = sum(counts[s] for s in STATUSES)
        out: dict[str, float] = {
            "calls": total,
            **{s: counts[s] for s in STATUSES},
            "infra_errors": counts["infra"],
        }
        out["infra_error_rate"] = counts["infra"] / total if total else 0.0
        out["cache_hits"] = float(self.cache.hits if self.cache else 0)
        out["cache_lookups"] = float(self.cache.lookups if self.cache else 0)
        out["latency_p50_s"] = latencies[len(latencies) // 2] if latencies else 0.0
        out["latency_p95_s"] = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))] if latencies else 0.0
        return out

    def _record(self, result: ExecResult) -> None:
        with self._lock:
            self._counts[result.status] += 1
            self._counts["infra"] += result.infra_error
            self._latencies.append(result.duration_s)

    def _claim_uids(self, base: int, count: int) -> list[int]:
        """`count` snippet uids from `base` up that no other sandbox on this machine holds, each held by an
        exclusive lock on its own file until close (the kernel drops the lock of a process that died, so a
        crashed run leaves nothing that blocks a later one)."""
        UID_LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
        uids: list[int] = []
        for uid in range(base, base + UID_RANGE):
            fd = os.open(UID_LOCKS / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._uid_locks.append(fd)
            uids.append(uid)
            if len(uids) == count:
                return uids
        self._release_uids()
        raise SandboxError(
            f"no {count} free snippet uids in [{base}, {base + UID_RANGE}): other sandboxes on this machine hold "
            f"them (lock files in {UID_LOCKS}); lower sandbox.workers or set another sandbox.uid_base"
        )

    def _release_uids(self) -> None:
        for fd in self._uid_locks:
            os.close(fd)
        self._uid_locks = []

    def close(self) -> None:
        """Stop at once: the workers are killed first (a call in flight returns as an infrastructure error rather
        than being waited for, so a stopping run does not wait out sandbox.timeout_s), then the threads end."""
        for worker in self._workers:
            worker.kill()
        if hasattr(self, "_pool"):
            self._pool.shutdown(wait=True, cancel_futures=True)
        for worker in self._workers:
            worker.stop()
        self._release_uids()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
