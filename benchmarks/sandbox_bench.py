"""Sandbox throughput and latency: ours (warm jailed workers) against a fresh subprocess per snippet.

The baseline is the design of the public ReTool reproduction: `python -c CODE` per call with the same
resource limits, run through the real interpreter (no version-manager shim). Both use 2 concurrent
workers. Prints p50/p95 latency and snippets/s per workload, and the throughput ratio.

    python benchmarks/sandbox_bench.py [--n 200] [--isolation auto|bwrap|rlimits]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from retool_cli.config import Isolation, SandboxConfig
from retool_cli.env.sandbox import Sandbox

WORKLOADS = {
    "trivial": "print(1 + 1)",
    "sympy_factor": "import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**6 - 1))",
    "numpy_det": "import numpy as np\nrng = np.random.default_rng(0)\nprint(np.linalg.det(rng.random((50, 50))))",
}


def baseline_run(code: str, cfg: SandboxConfig) -> float:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cfg.cpu_time_s, cfg.cpu_time_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (cfg.max_file_mb << 20,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (cfg.max_open_files,) * 2)

    started = time.perf_counter()
    proc = subprocess.run(
        [os.path.realpath(sys.executable), "-c", code],
        capture_output=True,
        timeout=cfg.timeout_s,
        preexec_fn=limits,
        env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    return time.perf_counter() - started


def measure(run_one, code: str, n: int, concurrency: int) -> dict[str, float]:
    run_one(code)  # warm-up
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = sorted(pool.map(lambda _: run_one(code), range(n)))
    wall = time.perf_counter() - started
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "per_s": n / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="snippets per workload for ours")
    parser.add_argument("--baseline-n", type=int, default=40, help="snippets per workload for the baseline")
    parser.add_argument("--isolation", default="auto", choices=[i.value for i in Isolation])
    args = parser.parse_args()
    cfg = SandboxConfig(isolation=Isolation(args.isolation), workers=2)

    def ours(code: str) -> float:
        result = sandbox.run(code)
        assert result.status == "ok", result
        return result.duration_s

    with Sandbox(cfg) as sandbox:
        print(f"isolation={sandbox.isolation.value} workers=2 cores={os.cpu_count()}")
        print(
            f"{'workload':<14}{'ours p50':>10}{'p95':>8}{'/s':>8}   {'fresh p50':>10}{'p95':>8}{'/s':>8}   {'ratio':>6}"
        )
        for name, code in WORKLOADS.items():
            mine = measure(ours, code, args.n, 2)
            base = measure(lambda c: baseline_run(c, cfg), code, args.baseline_n, 2)
            print(
                f"{name:<14}{mine['p50_ms']:>9.1f}ms{mine['p95_ms']:>6.1f}ms{mine['per_s']:>8.0f}   "
                f"{base['p50_ms']:>9.1f}ms{base['p95_ms']:>6.1f}ms{base['per_s']:>8.1f}   "
                f"{mine['per_s'] / base['per_s']:>5.1f}x"
            )


if __name__ == "__main__":
    main()
