"""The sandbox's warm worker: runs inside the jail as a plain script (the package is not visible there).

It imports the preloaded modules once, then for every request forks a child that drops to an
unprivileged uid, applies the limits and runs the snippet. Forking a warm interpreter costs a few
milliseconds, where a fresh `python -c` with sympy costs hundreds. Everything a snippet changes
(globals, modules, builtins, RNG, environment, files in its scratch folder) dies with its child.

Protocol on the worker's stdin/stdout: 4-byte big-endian length + UTF-8 JSON, both ways.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import gc
import importlib
import io
import json
import linecache
import os
import random
import resource
import selectors
import shutil
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

EXIT_MEMORY = 250  # child exit code: the snippet hit the memory limit (MemoryError)
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# Kernel objects that outlive the process that made them and that no namespace of ours scopes to one call: System
# V shared memory, semaphores and message queues, POSIX message queues, and the kernel keyring (per uid, not
# namespaced at all; Docker's default seccomp profile refuses it for the same reason). A snippet's call of any
# of them fails with EPERM. POSIX shared memory and semaphores are files in /dev/shm, emptied after each call.
_REFUSED_SYSCALLS = {
    # arch (AUDIT_ARCH_*): syscall numbers of shmget shmat shmctl shmdt semget semop semctl semtimedop msgget
    # msgsnd msgrcv msgctl mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr add_key
    # request_key keyctl
    "x86_64": (0xC000003E, [29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71,
                            240, 241, 242, 243, 244, 245, 248, 249, 250]),
    "aarch64": (0xC00000B7, [194, 196, 195, 197, 190, 193, 191, 192, 186, 189, 188, 187,
                             180, 181, 182, 183, 184, 185, 217, 218, 219]),
}  # fmt: skip


# ------------------------------------------------------------------ protocol


def read_message(fd: int) -> dict[str, Any] | None:
    header = _read_exact(fd, 4)
    if header is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, remaining = [], n
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def write_message(fd: int, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(fd, data) :]


# ------------------------------------------------------------------ the child: one snippet


def run_snippet(code: str) -> int:
    """Execute `code` as a script; print the value of a final bare expression (decided on the AST).
    Returns the process exit code."""
    filename = "<snippet>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)  # source in tracebacks
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        tree = ast.parse(code, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        assert last is None or isinstance(last, ast.Expr)
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
            if value is not None:
                print(repr(value))
        return 0
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF or 1
        print(exc.code, file=sys.stderr)
        return 1
    except MemoryError:
        print("MemoryError: the snippet exceeded its memory limit", file=sys.stderr)
        return EXIT_MEMORY
    except BaseException:
        _print_snippet_traceback()
        return 1


def _print_snippet_traceback() -> None:
    """The traceback without the worker's own frames (they mean nothing to the model)."""
    etype, value, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename != "<snippet>":
        tb = tb.tb_next
    traceback.print_exception(etype, value, tb)


def child_main(setup: dict[str, Any], code_r: int, out_w: int, err_w: int, scratch: str) -> None:
    """In the forked child: isolate, limit, drop privileges, wait for the code, run it, exit. Never returns."""
    try:
        os.setsid()  # own process group: the worker kills the whole group on timeout
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # stdin closed: input() gets EOF at once
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd > 2 and fd != code_r:  # the protocol pipes and everything else of the worker
                with contextlib.suppress(OSError):
                    os.close(fd)
        limits = setup["limits"]
        _set_limit(resource.RLIMIT_AS, _vm_bytes() + limits["memory_bytes"])
        # CPU: SIGXCPU at the soft limit (reported as a timeout), SIGKILL one second later
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_time_s"], limits["cpu_time_s"] + 1))
        _set_limit(resource.RLIMIT_FSIZE, limits["max_file_bytes"])
        _set_limit(resource.RLIMIT_NOFILE, limits["max_open_files"])
        _set_limit(resource.RLIMIT_CORE, 0)
        _refuse_lasting_kernel_objects()
        uid = setup["uid"]
        if uid is not None:
            _set_limit(resource.RLIMIT_NPROC, limits["max_processes"])
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # from root: clears every capability
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(setup["env"])
        os.environ.update({"HOME": scratch, "TMPDIR": scratch, "PWD": scratch})
        time.tzset()  # TZ=UTC from the environment above: local time is UTC
        os.cpu_count = lambda: 1  # the machine's size is not the snippet's business (nor a source of variation)
        random.seed(setup["seed"])
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(setup["seed"] % 2**32)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = _text_stream(1)
        sys.stderr = _text_stream(2)
        with os.fdopen(code_r, "rb") as pipe:  # blocks until the worker hands over a snippet
            source = pipe.read().decode("utf-8", "surrogatepass")  # as the worker encoded it: lone surrogates kept
        code = run_snippet(source)
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
    except MemoryError:
        code = EXIT_MEMORY
    except BaseException:
        with contextlib.suppress(BaseException):
            os.write(2, traceback.format_exc().encode())
        code = 1
    os._exit(code)  # threads the snippet started die here, atexit handlers do not run


def _refuse_lasting_kernel_objects() -> None:
    """Install the seccomp filter of _REFUSED_SYSCALLS in this process (inherited by all it starts): those calls
    fail with EPERM; a call of another architecture's ABI (i386 or x32 numbers on x86_64) fails too, so the
    filter cannot be walked around. A machine of another architecture runs without it (the README says so)."""
    import platform

    arch = _REFUSED_SYSCALLS.get(platform.machine())
    if arch is None:
        return
    audit_arch, numbers = arch
    # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_RET|BPF_K
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, refuse = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    n = len(numbers)
    program = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, audit_arch),
        (ret, 0, 0, refuse),  # another ABI's calls
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jge, n + 1, 0, 0x40000000),  # x32 numbers (__X32_SYSCALL_BIT): refused
        *[(jeq, n - i, 0, number) for i, number in enumerate(numbers)],
        (ret, 0, 0, allow),
        (ret, 0, 0, refuse),
    ]

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    instructions = (Instruction * len(program))(*[Instruction(*i) for i in program])
    libc = ctypes.CDLL(None, use_errno=True)
    # no_new_privs: what lets an unprivileged process install a filter (and keeps setuid programs from undoing it)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), instructions)), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(open(fd, "wb", closefd=False), encoding="utf-8", errors="backslashreplace")


def _set_limit(which: int, value: int | None) -> None:
    if value is not None:
        resource.setrlimit(which, (value, value))  # soft == hard: the snippet cannot raise it back


# ------------------------------------------------------------------ the worker: supervise one child


class Pending:
    """A child forked ahead of time, set up and waiting for its code: forking a warm interpreter costs
    a few milliseconds, and this takes them off the path of the next call."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self.scratch = os.path.join(setup["scratch_root"], "call")
        os.makedirs(self.scratch, mode=0o700)
        if setup["uid"] is not None:
            os.chown(self.scratch, setup["uid"], setup["uid"])
        code_r, self.code_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            child_main(setup, code_r, out_w, err_w, self.scratch)
        for fd in (code_r, out_w, err_w):
            os.close(fd)

    def run(self, code: str, setup: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        try:
            with os.fdopen(self.code_w, "wb") as pipe:
                pipe.write(code.encode("utf-8", "surrogatepass"))
        except BrokenPipeError:
            pass  # the child died while waiting; _supervise reports how
        result = _supervise(self.pid, self.out_r, self.err_r, setup, started)
        result["duration_s"] = time.monotonic() - started
        return result


def _supervise(pid: int, out_r: int, err_r: int, setup: dict[str, Any], started: float) -> dict[str, Any]:
    """Collect output until the child exits, the deadline passes or the output cap is hit."""
    limits = setup["limits"]
    deadline = started + setup["timeout_s"]
    cap = limits["max_output_bytes"]
    buffers = {out_r: bytearray(), err_r: bytearray()}
    pidfd = os.pidfd_open(pid)
    selector = selectors.DefaultSelector()
    for fd in (out_r, err_r, pidfd):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    reason, exited = "", False
    while not exited:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = "timeout"
            break
        for key, _ in selector.select(remaining):
            if key.fd == pidfd:
                exited = True
            elif not _read_into(key.fd, buffers[key.fd], selector):
                continue
        if len(buffers[out_r]) + len(buffers[err_r]) > cap:
            reason = "output"
            break
    if reason:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    kill_descendants()  # before draining: nothing may keep writing into the pipes
    for fd in (out_r, err_r):  # what is still in the pipes (the writers are dead or killed)
        with contextlib.suppress(OSError):
            while len(buffers[fd]) <= cap and _read_into(fd, buffers[fd], None):
                pass
    selector.close()
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
    stdout, stderr = bytes(buffers[out_r]), bytes(buffers[err_r])
    truncated = len(stdout) + len(stderr) > cap
    stdout, stderr = stdout[:cap], stderr[: max(0, cap - len(stdout))]
    return {
        **_classify(status, reason, limits),
        "stdout": stdout.decode("utf-8", "replace"),
        "stderr": stderr.decode("utf-8", "replace"),
        "truncated": truncated,
    }


def _read_into(fd: int, buffer: bytearray, selector: selectors.BaseSelector | None) -> bool:
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return False
    if not chunk:
        if selector is not None:
            selector.unregister(fd)
        return False
    buffer += chunk
    return True


def _classify(status: int, reason: str, limits: dict[str, Any]) -> dict[str, Any]:
    """Map how the child ended to (status, reason, exit_code)."""
    if reason == "timeout":
        return {"status": "timeout", "reason": "wall-clock time limit exceeded", "exit_code": None}
    if reason == "output":
        limit = limits["max_output_bytes"]
        return {"status": "killed", "reason": f"output limit of {limit} bytes exceeded", "exit_code": None}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return {"status": "timeout", "reason": "CPU time limit exceeded", "exit_code": None}
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        why = {int(signal.SIGXFSZ): " (file size limit)", int(signal.SIGSEGV): " (segmentation fault)"}.get(sig, "")
        return {"status": "killed", "reason": f"killed by signal {name}{why}", "exit_code": -sig}
    code = os.WEXITSTATUS(status)
    if code == 0:
        return {"status": "ok", "reason": "", "exit_code": 0}
    if code == EXIT_MEMORY:
        return {"status": "killed", "reason": "memory limit exceeded", "exit_code": code}
    return {"status": "error", "reason": f"exit code {code}", "exit_code": code}


def _children() -> list[int]:
    """Pids of this process's children, from /proc/self/task/*/children (cheap) or a /proc scan."""
    me = os.getpid()
    try:
        return [
            int(pid)
            for task in os.listdir("/proc/self/task")
            for pid in open(f"/proc/self/task/{task}/children").read().split()
        ]
    except OSError:
        pass
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            # the field after the ")" closing the command name is the state, then the parent pid
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == me:
                pids.append(int(entry))
    return pids


def kill_descendants() -> None:
    """Kill whatever the snippet left behind (daemons, setsid escapees, fork-bomb remains). The worker is
    a child subreaper, so orphans of the snippet become its children and show up here."""
    for _ in range(200):
        pids = _children()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def clean_scratch(roots: list[str]) -> None:
    """Remove everything the call wrote, also in folders a snippet made unreadable to itself."""
    for root in roots:
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, onerror=_force_remove)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def clean_owned(roots: list[str], uid: int | None) -> None:
    """rlimits isolation: the machine's shared folders (/tmp, /dev/shm: POSIX shared memory and semaphores) are
    the snippet's too; remove what its uid made there, so that no call finds what an earlier one left."""
    if uid is None:
        return
    for root in roots:
        with contextlib.suppress(OSError), os.scandir(root) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, onerror=_force_remove)
                    else:
                        os.unlink(entry.path)


def _force_remove(func: Callable[[str], object], path: str, _exc: object) -> None:
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
    with contextlib.suppress(OSError):
        func(path)


def main() -> None:
    setup = json.loads(sys.argv[1])
    for path in reversed(setup["sys_path"]):
        sys.path.insert(0, path)
    for name in setup["preload"]:
        importlib.import_module(name)
    if "numpy" in sys.modules:
        importlib.import_module("numpy.random")  # lazily loaded otherwise, at the first seed of a child
    if setup["warmup"]:  # fill lazy imports and caches once, so that children inherit them
        exec(compile(setup["warmup"], "<warmup>", "exec"), {"__name__": "__warmup__"})
    # The protocol moves to private descriptors; stray prints of the worker go to stderr.
    proto_in, proto_out = os.dup(0), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.makedirs(setup["scratch_root"], exist_ok=True)
    clean_owned(setup["shared_dirs"], setup["uid"])  # what a crashed earlier holder of this uid left
    gc.collect()
    gc.freeze()  # keep the warm heap shared copy-on-write between the forked children
    pending = Pending(setup)
    write_message(proto_out, {"ready": True})
    while True:
        request = read_message(proto_in)
        if request is None:
            return
        try:
            result = pending.run(request["code"], setup)
        except Exception:
            result = {"infra_error": traceback.format_exc()}
        finally:
            kill_descendants()
            clean_scratch([setup["scratch_root"], *setup["clean_dirs"]])
            clean_owned(setup["shared_dirs"], setup["uid"])
        write_message(proto_out, result)
        pending = Pending(setup)  # after the reply: the fork is off the caller's path


def _vm_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main()
