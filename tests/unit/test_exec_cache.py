"""The interpreter cache (env/exec_cache.py, sandbox.cache) with the real sandbox: each distinct snippet runs
once however many callers send it at the same time, the key covers what can change an output, a sandbox failure
is never reused, and what a snippet sees of the machine is fixed, so a cached result is the result."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from retool_cli.config import Isolation, SandboxConfig
from retool_cli.env.exec_cache import ExecCache, result_bytes, sandbox_fingerprint
from retool_cli.env.sandbox import WORKER_SCRIPT, Sandbox
from retool_cli.interfaces import ExecResult

PROBE = (
    "import os, random, time, numpy\n"
    "print(hash('retool'), random.random(), numpy.random.rand(), os.cpu_count(), time.strftime('%Z'), os.getcwd())"
)


def test_identical_code_runs_once_whatever_the_concurrency() -> None:
    """Eight threads send the same snippet while the first run is in flight (it sleeps 0.3 s): one sandbox run,
    seven hits marked cached, every caller the same output; other code still runs."""
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=2, timeout_s=5)) as box:
        box.reset_stats()
        code = "import time\ntime.sleep(0.3)\nprint(sum(range(10**5)))"
        results: list[ExecResult] = []
        threads = [threading.Thread(target=lambda: results.append(box.run(code))) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stats = box.stats()
        assert [r.stdout for r in results] == ["4999950000\n"] * 8
        assert sorted(r.cached for r in results) == [False] + [True] * 7
        assert (stats["calls"], stats["cache_hits"], stats["cache_lookups"]) == (1, 7, 8)
        assert box.run("print(6 * 7)").stdout == "42\n" and box.stats()["calls"] == 2
        assert box.run_many(["1/0", "1/0"])[1].cached and box.stats()["error"] == 1  # errors are outputs too


def test_a_cached_result_is_the_result_of_a_fresh_sandbox() -> None:
    """What a snippet sees of hashing, random streams, the CPU count, the time zone and its folder is fixed:
    a new sandbox (new workers) gives the cached output again, so reusing it changes nothing."""
    cfg = SandboxConfig(isolation=Isolation.auto, workers=2, timeout_s=5, cache=False)
    with Sandbox(cfg) as first:
        outputs = [r.stdout for r in first.run_many([PROBE] * 4)]
    with Sandbox(cfg) as second:
        again = second.run(PROBE).stdout
    assert outputs == [outputs[0]] * 4 and again == outputs[0]
    assert " 1 UTC " in outputs[0]  # os.cpu_count() and the time zone


def test_the_key_covers_limits_seed_packages_and_the_interpreter(monkeypatch, tmp_path: Path) -> None:
    base = SandboxConfig()
    key = sandbox_fingerprint(base, Isolation.rlimits, WORKER_SCRIPT)
    assert key == sandbox_fingerprint(replace(base, workers=7), Isolation.rlimits, WORKER_SCRIPT)  # pool size
    for changed in (
        replace(base, memory_mb=base.memory_mb * 2),
        replace(base, timeout_s=base.timeout_s + 1),
        replace(base, seed=base.seed + 1),
        replace(base, preload=[*base.preload, "json"]),
    ):
        assert sandbox_fingerprint(changed, Isolation.rlimits, WORKER_SCRIPT) != key
    assert sandbox_fingerprint(base, Isolation.bwrap, WORKER_SCRIPT) != key
    other_worker = tmp_path / "worker.py"
    other_worker.write_text(WORKER_SCRIPT.read_text() + "\n# changed\n")
    assert sandbox_fingerprint(base, Isolation.rlimits, other_worker) != key
    monkeypatch.setattr("retool_cli.env.exec_cache.metadata.version", lambda name: "999.0")  # numpy, sympy upgraded
    assert sandbox_fingerprint(base, Isolation.rlimits, WORKER_SCRIPT) != key
    monkeypatch.setattr("retool_cli.env.exec_cache.sys.version", "3.99.0")
    assert ExecCache(sandbox_fingerprint(base, Isolation.rlimits, WORKER_SCRIPT)).key("x") != ExecCache(key).key("x")


def test_a_sandbox_failure_is_never_reused_and_the_cache_is_bounded() -> None:
    runs: list[str] = []

    def execute(code: str) -> ExecResult:
        runs.append(code)
        broken = len(runs) == 1  # the first run: the worker died
        return ExecResult("" if broken else "ok\n", "", "killed" if broken else "ok", 0.01, infra_error=broken)

    two = 2 * result_bytes(ExecResult("ok\n", "", "ok", 0.01)) + 10  # room for two results
    cache = ExecCache("fingerprint", max_bytes=two)
    assert cache.run("a", execute).infra_error and not cache.run("a", execute).infra_error
    assert cache.run("a", execute).cached and runs == ["a", "a"]
    cache.run("b", execute)
    cache.run("c", execute)  # "a" is the least recently used of three: dropped
    assert not cache.run("a", execute).cached and runs == ["a", "a", "b", "c", "a"]


def test_the_cache_is_bounded_in_bytes_not_entries() -> None:
    """Outputs of up to max_output_bytes each: the cache keeps what fits in its budget (the most recently used),
    counting non-ASCII text at what Python stores it in, and stores nothing larger than the whole budget."""
    budget = 1 << 20
    cache = ExecCache("fingerprint", max_bytes=budget)
    for i in range(200):  # 200 x 60 KiB (x 4 bytes a character: the text is not ASCII) would be ~48 MiB
        cache.run(f"print({i})", lambda code: ExecResult("\U0001f600" * 60_000, "", "ok", 0.01))
    assert cache.bytes <= budget and 0 < len(cache._done) <= budget // (4 * 60_000)
    assert cache.bytes == sum(result_bytes(r) for r in cache._done.values())
    assert cache.run("print(199)", lambda code: ExecResult("fresh", "", "ok", 0.0)).cached  # the newest kept
    assert not cache.run("print(0)", lambda code: ExecResult("fresh", "", "ok", 0.0)).cached  # the oldest dropped
    small = ExecCache("fingerprint", max_bytes=1000)
    small.run("big", lambda code: ExecResult("x" * 5000, "", "ok", 0.0))
    assert small.bytes == 0 and not small.run("big", lambda code: ExecResult("x", "", "ok", 0.0)).cached


def test_code_no_encoding_can_hold_never_raises_in_the_host() -> None:
    """Lone surrogates (a str that UTF-8 cannot encode), NUL bytes, invalid escapes, huge and empty code: each
    call returns a result, from a cold run and from the cache alike; nothing raises here."""
    hostile = [
        "x = '\udc80'\nprint(len(x))",
        "# \ud800 in a comment\nprint(1)",
        "\udcff",
        "print('a\x00b')",
        "\x00",
        "",
        "print('\\N{NOT A NAME}')",
        "'\udc80' + 1",
        "x = 1\n" * 20_000 + "print(x)",
        "x = 1" * 20_000,  # one long bad line: its syntax error's echo is over the output cap
    ]
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=2, timeout_s=5)) as box:
        first = box.run_many(hostile)
        again = box.run_many(hostile)  # from the cache
    assert not any(r.infra_error for r in first), first
    assert [r.status for r in first] == ["error"] * 5 + ["ok", "error", "error", "ok", "killed"]
    assert "UnicodeEncodeError" in first[0].stderr and "null bytes" in first[3].stderr  # what python3 says
    assert first[8].stdout == "1\n"
    assert [(r.stdout, r.stderr) for r in again] == [(r.stdout, r.stderr) for r in first]
    assert all(r.cached for r in again)
