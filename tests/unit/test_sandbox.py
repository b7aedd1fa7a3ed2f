"""Adversarial suite for the code interpreter, run under each isolation mode available here.

Every guarantee of retool_cli/env/sandbox.py has a case: hostile snippets must fail inside the call,
leave nothing behind, and never harm this (the host) process.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from retool_cli.config import Isolation, SandboxConfig
from retool_cli.env.sandbox import Sandbox, SandboxError, bwrap_usable
from retool_cli.stops import descendants
from tests.helpers import alive

BWRAP_OK, BWRAP_WHY = bwrap_usable()
MODES = [
    pytest.param(Isolation.bwrap, marks=pytest.mark.skipif(not BWRAP_OK, reason=f"no bubblewrap jail: {BWRAP_WHY}")),
    Isolation.rlimits,
]
ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
os.environ["RETOOL_TEST_SECRET"] = "hunter2-" + uuid.uuid4().hex  # set before any sandbox starts


def config(isolation: Isolation, **overrides) -> SandboxConfig:
    values = {
        "isolation": isolation,
        "workers": 2,
        "timeout_s": 3.0,
        "cpu_time_s": 3,
        "memory_mb": 256,
        "max_output_bytes": 4096,
        "uid_base": 62000,
        "cache": False,  # these tests are of the workers: every call runs (tests/unit/test_exec_cache.py: the cache)
        **overrides,
    }
    return SandboxConfig(**values)


@pytest.fixture(scope="module", params=MODES, ids=lambda m: m.value)
def sandbox(request):
    with Sandbox(config(request.param)) as box:
        yield box


def snippet_processes(box: Sandbox) -> list[str]:
    """Command lines of the processes running as `box`'s snippet uids."""
    uids = {w.uid for w in box._workers}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return found


def assert_nothing_left(box: Sandbox) -> None:
    """Only the children forked ahead for the next calls (one per worker, the worker's own
    interpreter waiting for code) may run as a snippet uid after a call."""
    time.sleep(0.2)  # the next child is forked just after the reply
    left = snippet_processes(box)
    assert len(left) <= len(box._workers), left
    assert all("retool_worker" in c or "sandbox_worker" in c for c in left), left


# ------------------------------------------------------------------ benign snippets


@pytest.mark.parametrize(
    ("code", "stdout"),
    [
        ("print(6 * 7)", "42\n"),
        ("x = 3\nx * 2", "6\n"),  # a final bare expression is printed
        ("for i in range(3):\n    i", ""),  # ...but not an expression inside a block
        ("def f(n):\n    return n + 1\nf(1)", "2\n"),
        ("x = None\nx", ""),  # None is not printed
        ("'text'", "'text'\n"),
        ("import numpy as np\nint(np.linalg.det(np.array([[2, 1], [1, 3]])).__round__())", "5\n"),
        ("import sympy\nsympy.factorint(2**32 + 1)", "{641: 1, 6700417: 1}\n"),
        ("from fractions import Fraction\nFraction(1, 3) + Fraction(1, 6)", "Fraction(1, 2)\n"),
        ("import itertools, functools, collections, math\nmath.comb(10, 3)", "120\n"),
        ("print('ünïcode ✓')", "ünïcode ✓\n"),
        (
            "import os\nopen('f.txt', 'w').write('hi')\nprint(open('f.txt').read(), os.listdir('.'))",
            "hi ['f.txt']\n",
        ),
    ],
)
def test_benign_snippets(sandbox: Sandbox, code: str, stdout: str) -> None:
    result = sandbox.run(code)
    assert (result.status, result.stdout, result.stderr) == ("ok", stdout, "")


def test_blas_single_thread_and_big_code(sandbox: Sandbox) -> None:
    result = sandbox.run("import os\nprint(os.environ['OPENBLAS_NUM_THREADS'])\n" + "x = 1\n" * 50_000 + "x")
    assert result.status == "ok" and result.stdout == "1\n1\n"


def test_run_many_keeps_order(sandbox: Sandbox) -> None:
    results = sandbox.run_many([f"print({i} * {i})" for i in range(40)])
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(40)]


# ------------------------------------------------------------------ errors and exits


@pytest.mark.parametrize(
    ("code", "status", "in_stderr", "reason"),
    [
        ("raise ValueError('boom')", "error", "ValueError: boom", "exit code 1"),
        ("1 / 0", "error", 'File "<snippet>", line 1', "exit code 1"),
        ("def f(:\n  pass", "error", "SyntaxError", "exit code 1"),
        ("import sys\nsys.exit('bye')", "error", "bye", "exit code 1"),
        ("import sys\nsys.exit(3)", "error", "", "exit code 3"),
        ("import os\nos._exit(5)", "error", "", "exit code 5"),
        ("import sys\nsys.exit(0)", "ok", "", ""),
        ("input()", "error", "EOFError", "exit code 1"),  # stdin is closed, not blocking
        ("import os\nos.kill(os.getpid(), 9)", "killed", "", "SIGKILL"),
        ("import ctypes\nctypes.string_at(0)", "killed", "", "SIGSEGV"),
        ("def f(n):\n    return f(n + 1)\nf(0)", "error", "RecursionError", "exit code 1"),
        ("fs = [open('/dev/null') for _ in range(100_000)]", "error", "Too many open files", "exit code 1"),
        (
            "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
            "error",
            "Error",
            "exit code 1",
        ),
        (
            "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))",
            "error",
            "Error",
            "exit code 1",
        ),
    ],
)
def test_errors_are_reported_not_raised(sandbox: Sandbox, code: str, status: str, in_stderr: str, reason: str) -> None:
    started = time.monotonic()
    result = sandbox.run(code)
    assert result.status == status, result
    assert in_stderr in result.stderr
    assert reason in result.reason
    assert time.monotonic() - started < 2.5  # none of these waits for the timeout


def test_deep_recursion_with_raised_limit_dies_inside_the_call(sandbox: Sandbox) -> None:
    result = sandbox.run("import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)")
    assert result.status in ("killed", "error", "timeout")
    assert sandbox.run("print('alive')").stdout == "alive\n"


# ------------------------------------------------------------------ limits


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "sum(range(10**13))",
        "import time\ntime.sleep(60)",
        "import threading\nthreading.Event().wait()",
    ],
)
def test_timeouts_kill_python_and_c_loops(sandbox: Sandbox, code: str) -> None:
    started = time.monotonic()
    result = sandbox.run(code)
    assert result.status == "timeout"
    assert time.monotonic() - started < 3.0 + 2.0


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(2 * 1024**3)",
        "import numpy as np\nnp.ones((1024, 1024, 1024))",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
    ],
)
def test_memory_bombs_are_killed(sandbox: Sandbox, code: str) -> None:
    result = sandbox.run(code)
    assert result.status == "killed"
    assert "memory" in result.reason


@pytest.mark.skipif(not ROOT, reason="RLIMIT_NPROC needs the snippet to run as its own uid (root host)")
@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import multiprocessing as mp\n"
        "ps = [mp.Process(target=lambda: __import__('time').sleep(60)) for _ in range(200)]\n"
        "[p.start() for p in ps]",
        "import subprocess\n[subprocess.Popen(['sleep', '60']) for _ in range(200)]",
        "import threading, time\n[threading.Thread(target=time.sleep, args=(60,)).start() for _ in range(500)]",
    ],
)
def test_fork_bombs_die_and_leave_nothing(sandbox: Sandbox, code: str) -> None:
    result = sandbox.run(code)
    assert result.status in ("error", "timeout", "killed")
    assert_nothing_left(sandbox)
    assert sandbox.run("print('alive')").stdout == "alive\n"


def test_output_flood_is_cut_without_buffering_it_all(sandbox: Sandbox) -> None:
    for code in ["print('x' * 10**8)", "while True:\n    print('y' * 1000)"]:
        result = sandbox.run(code)
        assert result.status == "killed" and "output limit" in result.reason
        assert result.truncated
        assert len(result.stdout) + len(result.stderr) <= 4096


def test_file_size_and_scratch_limits(sandbox: Sandbox) -> None:
    big_file = sandbox.run("f = open('big', 'wb')\nwhile True:\n    f.write(b'0' * 2**20)")
    assert big_file.status == "error" and "File too large" in big_file.stderr
    assert sandbox.run("import os\nos.listdir('.')").stdout == "[]\n"  # the scratch folder is fresh


def test_threads_and_daemons_do_not_outlive_the_call(sandbox: Sandbox) -> None:
    code = (
        "import subprocess, threading, time\n"
        "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "threading.Thread(target=time.sleep, args=(600,)).start()\n"
        "print('returned')"
    )
    result = sandbox.run(code)
    assert result.status == "ok" and result.stdout == "returned\n"
    if ROOT:
        assert_nothing_left(sandbox)


# ------------------------------------------------------------------ isolation


def test_fresh_state_every_call() -> None:
    with Sandbox(config(Isolation.bwrap if BWRAP_OK else Isolation.rlimits, workers=1)) as box:
        probe = (
            "import math, os, random, sys, numpy\n"
            "print(math.pi, os.environ.get('POISON'), os.listdir('.'), random.random(), numpy.random.rand(),"
            " 'json' in sys.modules, print is __builtins__.print if hasattr(__builtins__, 'print') else True)"
        )
        before = box.run(probe)
        poison = box.run(
            "import math, os, random, builtins, sys, numpy\n"
            "math.pi = 3\nos.environ['POISON'] = '1'\nopen('marker', 'w').write('x')\n"
            "random.seed(123)\nnumpy.random.seed(123)\nsys.modules['json'] = None\nbuiltins.print = None\n"
            "os.chdir('/')"
        )
        assert poison.status == "ok"
        after = box.run(probe)
        assert before.status == after.status == "ok"
        assert after.stdout == before.stdout
        assert box.run("import json\njson.dumps([1])").stdout == "'[1]'\n"


def test_same_seed_same_random_numbers(sandbox: Sandbox) -> None:
    code = "import random, numpy\nprint(random.random(), numpy.random.rand())"
    assert sandbox.run(code).stdout == sandbox.run(code).stdout


def test_object_addresses_print_the_same_in_every_run() -> None:
    """A repr's address (`<function f at 0x7f...>`) lies where the kernel put the process's memory, which differs
    from process to process: written as a fixed one, so a snippet's output is the same in another run (whose
    workers are other processes); two objects keep two addresses, one object printed twice keeps one."""
    code = "f = lambda: 0\ng = (d for d in '1')\nprint(f, g, f)"
    outputs = []
    for _ in range(2):
        with Sandbox(config(Isolation.bwrap if BWRAP_OK else Isolation.rlimits, workers=1)) as box:
            outputs.append(box.run(code).stdout)
    first, second = outputs
    assert first == second
    f, g, f_again = re.findall(r"at (0x[0-9a-f]+)>", first)
    assert f == f_again != g


def test_host_secrets_are_invisible(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = os.environ["RETOOL_TEST_SECRET"]
    code = (
        "import os\n"
        "seen = str(dict(os.environ))\n"
        "for path in ['/proc/1/environ', '/proc/self/environ', '/proc/' + str(os.getppid()) + '/environ']:\n"
        "    try:\n        seen += open(path, 'rb').read().decode('latin1')\n    except OSError:\n        pass\n"
        "print(seen)"
    )
    result = sandbox.run(code)
    assert result.status == "ok"
    assert secret not in result.stdout
    if ROOT:  # a secret file of the host user (under /root) cannot be read
        secret_file = Path("/root") / f".retool-test-{uuid.uuid4().hex}"
        secret_file.write_text(secret)
        try:
            assert secret not in sandbox.run(f"print(open('{secret_file}').read())").stdout
        finally:
            secret_file.unlink()


def test_cannot_signal_or_trace_outside_the_call(sandbox: Sandbox) -> None:
    host = os.getpid()
    code = (
        "import ctypes, os, signal\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for pid in [os.getppid(), 1, {host}]:\n"
        "    for action in (lambda: os.kill(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGSTOP)):\n"
        "        try:\n            action()\n            print('signalled', pid)\n"
        "        except OSError:\n            pass\n"
        "    if libc.ptrace(16, pid, None, None) == 0:\n        print('traced', pid)\n"
        "try:\n    os.nice(-5)\n    print('reniced')\nexcept OSError:\n    pass\n"
    )
    if not ROOT and sandbox.isolation is Isolation.rlimits:
        pytest.skip("rlimits mode as a normal user runs snippets as the host's own uid")
    result = sandbox.run(code)
    assert result.status == "ok", result
    assert result.stdout == ""
    assert sandbox.run("print('worker alive')").stdout == "worker alive\n"


@pytest.mark.parametrize("isolation", [MODES[0]])
def test_jail_hides_files_network_and_processes(isolation: Isolation, tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    marker = f"retool-probe-{uuid.uuid4().hex}"
    code = (
        "import os, socket\n"
        f"print(os.path.exists({str(REPO / 'pyproject.toml')!r}), os.path.exists('/root'), os.path.exists('/home'))\n"
        f"print(os.path.exists('/proc/{os.getpid()}/cmdline')"
        f" and 'pytest' in open('/proc/{os.getpid()}/cmdline').read())\n"
        "for target in ['/etc/x', '/usr/x', '/x']:\n"
        "    try:\n        open(target, 'w')\n        print('wrote', target)\n    except OSError:\n        pass\n"
        f"open('/tmp/{marker}', 'w').write('x')\n"
        "try:\n    open('/proc/sys/kernel/core_pattern', 'w')\n    print('core_pattern writable')\n"
        "except OSError:\n    pass\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
        "except OSError:\n    pass\n"
    )
    with Sandbox(config(isolation, workers=1)) as box:
        result = box.run(code)
    server.close()
    assert result.status == "ok", result
    assert result.stdout == "False False False\nFalse\n"
    assert not (Path("/tmp") / marker).exists()


def test_dead_worker_is_replaced() -> None:
    with Sandbox(config(Isolation.bwrap if BWRAP_OK else Isolation.rlimits, workers=1)) as box:
        worker = box._workers[0]
        # the worker dies in the middle of a call (as under the OOM killer)
        threading.Timer(
            0.5, lambda: [os.kill(pid, 9) for pid in [worker.proc.pid, *descendants(worker.proc.pid)]]
        ).start()
        broken = box.run("import time\ntime.sleep(2)")
        assert broken.infra_error and broken.status == "killed"
        assert "worker died" in broken.reason
        started = time.monotonic()
        assert box.run("print(2)").stdout == "2\n"
        assert time.monotonic() - started < 5
        stats = box.stats()
        assert stats["infra_errors"] == 1 and stats["ok"] == 1 and stats["calls"] == 2
        box.reset_stats()
        assert box.stats()["calls"] == 0


def test_run_many_from_threads_and_stats(sandbox: Sandbox) -> None:
    sandbox.reset_stats()
    outputs: list[list[str]] = []

    def batch() -> None:
        outputs.append([r.stdout for r in sandbox.run_many(["print(1)", "1/0", "print(2)"])])

    threads = [threading.Thread(target=batch) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outputs == [["1\n", "", "2\n"]] * 3
    stats = sandbox.stats()
    assert (stats["calls"], stats["ok"], stats["error"]) == (9, 6, 3)
    assert 0 < stats["latency_p50_s"] <= stats["latency_p95_s"]


def test_bwrap_required_but_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("retool_cli.env.sandbox.shutil.which", lambda name: None)
    with pytest.raises(SandboxError, match="sandbox.isolation=rlimits"):
        Sandbox(config(Isolation.bwrap))


def test_nothing_left_after_close() -> None:
    box = Sandbox(config(Isolation.bwrap if BWRAP_OK else Isolation.rlimits))
    procs = [w.proc for w in box._workers]
    box.run_many(["import subprocess\nsubprocess.Popen(['sleep', '600'])"] * 2)
    box.close()
    assert all(p.poll() is not None for p in procs)
    if ROOT:
        time.sleep(0.2)
        assert snippet_processes(box) == []


# ------------------------------------------------------------------ state that outlives a call

# Looks for what an earlier call may have left, then leaves the same: System V shared memory, semaphores and
# message queues, a POSIX message queue, a key in the uid's keyring, files in /tmp, /dev/shm and /var/tmp.
# A second run of the same program must print what the first printed: nothing seen, nothing kernel-side made.
LEFTOVERS = r"""
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {'x86_64': (248, 250), 'aarch64': (217, 219)}[platform.machine()]
KEY, CREATE = 0x52455430, 0o1666
seen, made = [], []
for name, get in [('shm', lambda flags: libc.shmget(KEY, 1 << 20, flags)),
                  ('sem', lambda flags: libc.semget(KEY, 1, flags)),
                  ('msg', lambda flags: libc.msgget(KEY, flags))]:
    if get(0o666) >= 0: seen.append(name)
    if get(CREATE) >= 0: made.append(name)
libc.mq_open.restype = ctypes.c_int
if libc.mq_open(b'/retool-probe', os.O_RDWR) >= 0: seen.append('mqueue')
if libc.mq_open(b'/retool-probe', os.O_RDWR | os.O_CREAT, 0o666, None) >= 0: made.append('mqueue')
KEYCTL_SEARCH, USER_KEYRING = 10, -4
if libc.syscall(KEYCTL, KEYCTL_SEARCH, USER_KEYRING, b'user', b'retool-probe', 0) >= 0: seen.append('key')
if libc.syscall(ADD_KEY, b'user', b'retool-probe', b'secret', 6, USER_KEYRING) >= 0: made.append('key')
for folder in ('/tmp', '/dev/shm', '/var/tmp'):
    path = os.path.join(folder, 'retool-probe')
    if os.path.exists(path): seen.append(path)
    try:
        open(path, 'w').write('x')
    except OSError:
        pass
print('seen', seen, 'made', made)
"""


@pytest.mark.parametrize("isolation", MODES)
def test_nothing_a_call_makes_reaches_a_later_call(isolation: Isolation) -> None:
    """IPC objects and keys are refused (EPERM: no namespace scopes them to the call), files are removed after
    the call: the same program run twice, by the same worker and by a new sandbox, prints the same."""
    if not ROOT and isolation is Isolation.rlimits:
        pytest.skip("rlimits mode as a normal user runs snippets as the host's own uid, sharing its files")
    with Sandbox(config(isolation, workers=1)) as box:
        first, second = box.run(LEFTOVERS), box.run(LEFTOVERS)
    with Sandbox(config(isolation, workers=1)) as other:  # another run, after this one closed
        third = other.run(LEFTOVERS)
    assert first.status == "ok", first
    assert first.stdout == "seen [] made []\n"
    assert second.stdout == third.stdout == first.stdout


@pytest.mark.parametrize("isolation", MODES)
def test_shared_memory_cannot_pass_the_memory_limit(isolation: Isolation) -> None:
    """256 MB memory limit: attaching and touching System V segments one after another (each detached, so the
    address-space limit never sees them all) would pin 512 MB; refused at the first segment."""
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "held = 0\nfor i in range(8):\n"
        "    sid = libc.shmget(0, 64 << 20, 0o1600)\n"
        "    if sid < 0:\n        break\n"
        "    address = libc.shmat(sid, None, 0)\n    ctypes.memset(address, 1, 64 << 20)\n"
        "    libc.shmdt(ctypes.c_void_p(address))\n    held += 64\n"
        "print(held, ctypes.get_errno())"
    )
    with Sandbox(config(isolation, workers=1)) as box:
        result = box.run(code)
    assert result.status == "ok", result
    assert result.stdout == "0 1\n"  # EPERM


@pytest.mark.skipif(not ROOT, reason="snippets run as their own uids only when the host runs as root")
def test_each_sandbox_on_the_machine_has_its_own_uids(tmp_path: Path) -> None:
    """Another run (another process, the same sandbox.uid_base) holds its snippets' whole process quota
    (sandbox.max_processes sleeping processes) while this run's snippet starts threads: they run, since the two
    sandboxes' uids differ. A run killed with SIGKILL leaves no claim behind."""
    script = tmp_path / "other_run.py"
    hold_quota = (
        "import os, time\nfor _ in range(20):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n    except OSError:\n        break\ntime.sleep(30)"
    )
    script.write_text(
        "import sys\nfrom retool_cli.config import SandboxConfig, Isolation\n"
        "from retool_cli.env.sandbox import Sandbox\n"
        "box = Sandbox(SandboxConfig(isolation=Isolation(sys.argv[1]), workers=2, uid_base=62000, max_processes=8,"
        " cache=False))\n"
        "print(*[w.uid for w in box._workers], flush=True)\n"
        f"box.run({hold_quota!r})\n"
    )
    isolation = Isolation.bwrap if BWRAP_OK else Isolation.rlimits
    other = subprocess.Popen([sys.executable, str(script), isolation.value], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None
        held = {int(uid) for uid in other.stdout.readline().split()}
        time.sleep(1.0)  # its snippet forks up to its quota
        with Sandbox(config(isolation, workers=2, max_processes=8)) as box:
            mine = {w.uid for w in box._workers}
            code = "import threading\nts = [threading.Thread(target=int) for _ in range(4)]\n"
            code += "[t.start() for t in ts]\nprint('ok')"
            result = box.run(code)
        assert held and mine and not held & mine, (held, mine)
        assert result.stdout == "ok\n", result
    finally:
        other.kill()
        other.wait()
    with Sandbox(config(isolation, workers=2)) as again:  # the killed run's uids are free again
        assert {w.uid for w in again._workers} == held


@pytest.mark.parametrize("victim", ["worker", "bwrap"])
def test_a_worker_killed_while_it_restarts_is_started_again(monkeypatch: pytest.MonkeyPatch, victim: str) -> None:
    """The worker died, and its replacement is killed while it starts (the worker's interpreter, as the OOM
    killer would; or the process we started, bwrap itself, leaving its jail behind): the restart is tried again
    at once, the call runs, and nothing of the killed start is left."""
    from retool_cli.env import sandbox as sandbox_module

    with Sandbox(config(Isolation.bwrap if BWRAP_OK else Isolation.rlimits, workers=1)) as box:
        worker = box._workers[0]
        worker.kill()
        worker.proc.wait()
        launch, launches = sandbox_module._Worker.launch, []

        killed: list[int] = []

        def launch_then_die(self) -> None:
            launch(self)
            launches.append(self.proc.pid)
            if len(launches) > 1:
                return
            for _ in range(100):  # until the worker's interpreter runs (bwrap's last descendant)
                tree = [self.proc.pid, *descendants(self.proc.pid)]
                if len(tree) >= 3 or (not BWRAP_OK and len(tree) >= 1):
                    break
                time.sleep(0.02)
            killed.extend(tree)
            os.kill(tree[-1] if victim == "worker" else tree[0], 9)

        monkeypatch.setattr(sandbox_module._Worker, "launch", launch_then_die)
        started = time.monotonic()
        assert box.run("print(2)").stdout == "2\n"
        assert len(launches) == 2 and time.monotonic() - started < 15
        time.sleep(0.2)
        assert not alive(killed)


def test_a_worker_that_cannot_start_says_why() -> None:
    """A worker that fails every start: the error names how it ended and what it printed, for each attempt."""
    isolation = Isolation.bwrap if BWRAP_OK else Isolation.rlimits
    broken = config(isolation, workers=1, warmup="raise RuntimeError('warm-up broke')")
    with pytest.raises(SandboxError) as error:
        Sandbox(broken)
    message = str(error.value)
    assert "failed to start 3 times" in message and "exited with code 1" in message
    assert message.count("RuntimeError: warm-up broke") == 3
