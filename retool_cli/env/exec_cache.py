"""The interpreter cache (`sandbox.cache`): the samples of a GRPO group often send the same code, and a snippet's
output is a function of its code and of the sandbox it runs in, so each distinct snippet runs once per run.

    Sandbox.run(code) --ExecCache.run(code, run_in_worker)--> a stored result (marked cached), or: the first
    caller runs it while callers with the same code wait for that run, then it is stored

What makes this exact: every call runs in a fresh child of a warm worker (nothing carries over between calls),
with PYTHONHASHSEED, random / numpy.random seeds, the time zone, the host name and the CPU count it sees fixed
(sandbox_worker.py), under the same limits. The key holds everything else that can change an output: the
limits, the seed, the preloaded modules and their versions, the interpreter's version and the worker script.
What a snippet reads of the wall clock, of process ids or of the machine's speed (whether it beats a time
limit) is not fixed: for such code the cache returns the first run's result to every later caller, so within
a run identical code always gets identical output. A sandbox failure (a dead worker) is never stored. Nothing
a call leaves behind reaches a later call (sandbox.py: scratch emptied, IPC and keyrings refused, uids of its
own), so a fresh run of the code prints what the cache holds. The cache holds at most sandbox.cache_max_mib of
results (each output already capped at sandbox.max_output_bytes), least recently used dropped first.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path

from retool_cli.config import Isolation, SandboxConfig
from retool_cli.interfaces import ExecResult

ENTRY_OVERHEAD = 512  # bytes an entry takes besides its texts: the key, the ExecResult, the dict's slot


def sandbox_fingerprint(config: SandboxConfig, isolation: Isolation, worker_script: Path) -> str:
    """Everything besides the code that can change a snippet's output, as one digest."""
    versions = {}
    for module in config.preload:
        try:
            versions[module] = metadata.version(module)
        except metadata.PackageNotFoundError:  # a standard-library module: the interpreter's version covers it
            versions[module] = ""
    described = {
        "config": {k: v for k, v in asdict(config).items() if k not in ("cache", "workers")},
        "isolation": isolation.value,
        "python": sys.version,
        "packages": versions,
        "worker": hashlib.sha256(worker_script.read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


def result_bytes(result: ExecResult) -> int:
    """What a stored result takes in memory (a str of non-ASCII text takes up to 4 bytes a character)."""
    return sys.getsizeof(result.stdout) + sys.getsizeof(result.stderr) + sys.getsizeof(result.reason) + ENTRY_OVERHEAD


class ExecCache:
    """Results by code, for one sandbox (thread-safe), at most `max_bytes` of them (result_bytes). `hits` /
    `lookups` since the last `reset_stats`."""

    def __init__(self, fingerprint: str, max_bytes: int = 256 << 20) -> None:
        self.fingerprint, self.max_bytes = fingerprint, max_bytes
        self.bytes = 0  # what the stored results take now
        self._done: OrderedDict[str, ExecResult] = OrderedDict()
        self._running: dict[str, Future[ExecResult]] = {}
        self._lock = threading.Lock()
        self.hits = self.lookups = 0

    def key(self, code: str) -> str:
        # surrogatepass: model-written code may hold a lone surrogate ('\udc80'), which plain UTF-8 refuses
        return hashlib.sha256(f"{self.fingerprint}\0{code}".encode("utf-8", "surrogatepass")).hexdigest()

    def run(self, code: str, execute: Callable[[str], ExecResult]) -> ExecResult:
        """The stored result of `code`, or `execute(code)` (once, however many threads ask at the same time)."""
        key = self.key(code)
        with self._lock:
            self.lookups += 1
            if key in self._done:
                self.hits += 1
                self._done.move_to_end(key)
                return replace(self._done[key], cached=True)
            pending = self._running.get(key)
            if pending is None:
                pending = self._running[key] = Future()
                owner = True
            else:
                owner = False
                self.hits += 1
        if not owner:
            result = pending.result()
            if result.infra_error:  # the run we waited for failed in the sandbox: run it ourselves
                with self._lock:
                    self.hits -= 1
                    self.lookups -= 1
                return self.run(code, execute)
            return replace(result, cached=True)
        try:
            result = execute(code)
        except BaseException as error:
            with self._lock:
                del self._running[key]
            pending.set_exception(error)
            raise
        with self._lock:
            if not result.infra_error:
                self._store(key, result)
            del self._running[key]
        pending.set_result(result)
        return result

    def _store(self, key: str, result: ExecResult) -> None:
        """Keep `result` (under the lock), dropping the least recently used beyond max_bytes."""
        size = result_bytes(result)
        if size > self.max_bytes:
            return
        self._done[key] = result
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self._done.popitem(last=False)
            self.bytes -= result_bytes(dropped)

    def reset_stats(self) -> None:
        with self._lock:
            self.hits = self.lookups = 0
