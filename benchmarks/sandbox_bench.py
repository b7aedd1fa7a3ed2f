"""Sandbox throughput and latency: ours (warm jailed workers) against a fresh subprocess per snippet, then what
the interpreter cache adds on a training run's share of repeated code.

Execution (the sandbox itself): ours with the cache off (`sandbox.cache=false`; every call runs, which the
results check: no cache lookup) against the design of the public ReTool reproduction, `python -c CODE` per
call with the same resource limits, through the real interpreter (no version-manager shim). Both run 2 at a
time; each repeat measures ours then the baseline on each workload, and the ratio is taken per repeat.

Cache: a stream of snippets in which a share `--repeat-share` are repeats of earlier snippets of the stream
(default: the share of the smoke run's code calls its cache answered, read from outputs/smoke/train's metrics
when that run exists, else 0.5), run with the cache on and off; the sympy snippets differ in a constant, so
the first occurrence of each runs for real.

    python benchmarks/sandbox_bench.py [--n 200] [--baseline-n 40] [--repeats 3] [--isolation auto|bwrap|rlimits]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from retool_cli.config import Isolation, SandboxConfig
from retool_cli.env.sandbox import Sandbox

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write

WORKLOADS = {
    "trivial": "print(1 + 1)",
    "sympy_factor": "import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**6 - 1))",
    "numpy_det": "import numpy as np\nrng = np.random.default_rng(0)\nprint(np.linalg.det(rng.random((50, 50))))",
}
SMOKE_METRICS = Path("outputs/smoke/train/metrics.jsonl")


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


def measure(run_one, codes: list[str], concurrency: int = 2) -> dict[str, float]:
    """Latency percentiles and throughput of running `codes`, `concurrency` at a time (after one warm-up)."""
    run_one(codes[0])
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = sorted(pool.map(run_one, codes))
    wall = time.perf_counter() - started
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "per_s": len(codes) / wall,
    }


def smoke_repeat_share(metrics: Path = SMOKE_METRICS) -> float | None:
    """The share of the smoke training run's interpreter calls that its cache answered (code already run)."""
    if not metrics.exists():
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    # code calls per trajectory weigh each step's rate (every step samples the same number of trajectories)
    calls = [(r["rollout/code_calls"], r["rollout/code_cache_hit_rate"]) for r in rows]
    total = sum(n for n, _ in calls)
    return sum(n * rate for n, rate in calls) / total if total else None


def repeat_stream(n: int, share: float, seed: int = 0) -> list[str]:
    """n sympy snippets, each a repeat of an earlier one of the stream with probability `share`."""
    rng, stream = random.Random(seed), []
    for i in range(n):
        if stream and rng.random() < share:
            stream.append(rng.choice(stream))
        else:
            stream.append(f"import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**6 - {i + 1}))")
    return stream


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="snippets per workload and repeat for ours")
    parser.add_argument("--baseline-n", type=int, default=40, help="snippets per workload and repeat, baseline")
    parser.add_argument("--repeats", type=int, default=3, help="repeats: each ratio's spread is over these")
    parser.add_argument("--repeat-share", type=float, default=None, help="cache row: share of repeated snippets")
    parser.add_argument("--isolation", default="auto", choices=[i.value for i in Isolation])
    add_json_out(parser)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    cfg = SandboxConfig(isolation=Isolation(args.isolation), workers=2)
    runs: dict[str, list[dict[str, float]]] = {}
    checks: dict[str, object] = {}

    def ours_with(sandbox: Sandbox):
        def run_one(code: str) -> float:
            result = sandbox.run(code)
            assert result.status == "ok", result
            return result.duration_s

        return run_one

    with Sandbox(replace(cfg, cache=False)) as sandbox:
        print(f"isolation={sandbox.isolation.value} workers=2 cores={os.cpu_count()} cache=off")
        checks["isolation"] = sandbox.isolation.value
        for _ in range(args.repeats):
            for name, code in WORKLOADS.items():
                runs.setdefault(f"{name}/ours", []).append(measure(ours_with(sandbox), [code] * args.n))
                fresh = measure(lambda c: baseline_run(c, cfg), [code] * args.baseline_n)
                runs.setdefault(f"{name}/fresh", []).append(fresh)
        checks["execution_cache_lookups"] = sandbox.stats()["cache_lookups"]  # 0: every call ran
    quantities, ratios = {}, {}
    print(f"{'workload':<14}{'ours p50':>10}{'p95':>8}{'/s':>8}   {'fresh p50':>10}{'/s':>8}   ratio (min-max)")
    for name in WORKLOADS:
        for who in ("ours", "fresh"):
            for key in ("p50_ms", "p95_ms", "per_s"):
                quantities[f"{name}/{who}_{key}"] = spread([r[key] for r in runs[f"{name}/{who}"]])
        ratio = paired_ratios([r["per_s"] for r in runs[f"{name}/ours"]], [r["per_s"] for r in runs[f"{name}/fresh"]])
        ratios[f"{name}/throughput_ours_over_fresh"] = ratio
        q = {k: v["median"] for k, v in quantities.items() if k.startswith(name)}
        print(
            f"{name:<14}{q[f'{name}/ours_p50_ms']:>9.1f}ms{q[f'{name}/ours_p95_ms']:>6.1f}ms"
            f"{q[f'{name}/ours_per_s']:>8.0f}   {q[f'{name}/fresh_p50_ms']:>9.1f}ms{q[f'{name}/fresh_per_s']:>8.1f}"
            f"   {ratio['median']:.1f}x ({ratio['min']:.1f}-{ratio['max']:.1f}, {ratio['n']} repeats)"
        )

    measured = smoke_repeat_share()
    share = args.repeat_share if args.repeat_share is not None else measured if measured is not None else 0.5
    source = "--repeat-share" if args.repeat_share is not None else SMOKE_METRICS if measured is not None else "default"
    stream = repeat_stream(args.n, share)
    cached: dict[str, list[float]] = {"on": [], "off": []}
    hits = []
    for _ in range(args.repeats):
        for mode in ("off", "on"):  # a fresh sandbox each time: the cache starts empty, as a run's does
            with Sandbox(replace(cfg, cache=mode == "on")) as sandbox:
                cached[mode].append(measure(ours_with(sandbox), stream)["per_s"])
                if mode == "on":
                    stats = sandbox.stats()
                    hits.append(stats["cache_hits"] / stats["cache_lookups"])
    quantities["cache/repeat_share"] = share
    quantities["cache/hit_rate"] = spread(hits)
    quantities["cache/on_per_s"], quantities["cache/off_per_s"] = spread(cached["on"]), spread(cached["off"])
    ratios["cache/throughput_on_over_off"] = paired_ratios(cached["on"], cached["off"])
    checks["cache_repeat_share_source"] = str(source)
    print(
        f"cache on a stream of {len(stream)} sympy snippets, {share:.0%} repeats ({source}): hit rate "
        f"{statistics.median(hits):.0%}, {statistics.median(cached['on']):.0f}/s on, "
        f"{statistics.median(cached['off']):.0f}/s off, {ratios['cache/throughput_on_over_off']['median']:.2f}x"
    )
    write(args.json_out, "sandbox", quantities, ratios, checks)


if __name__ == "__main__":
    main()
