"""What a benchmark reports, in one shape, so that `make bench` (benchmarks/run_all.py) can gather every
benchmark's numbers into one file and one table, and a test can check each still reports what its table names.

A benchmark script takes `--json-out PATH` (`add_json_out`) and ends with `write(...)`: a JSON object

    {"benchmark": "sandbox",
     "quantities": {"trivial/ours_per_s": {"median": 214.0, "min": 201.3, "max": 220.9, "n": 3, "values": [...]}, ...},
     "ratios":     {"trivial/ours_over_fresh": {"median": 5.4, "min": 5.1, "max": 5.9, "n": 3, "values": [...]}, ...},
     "checks":     {"trivial/cache_hits": 0, ...}}

Quantities and ratios are spreads over the benchmark's repeats (`spread`); a ratio is taken repeat by repeat
(ours and the peer measured side by side in that repeat), never as a ratio of medians, so its spread is the
spread a claim has to survive. `checks` are the facts that say the benchmark measured what it names (the
sandbox's execution rows had no cache hit; both loops sampled the same trajectories); run_all.py and the test
fail when one is false.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any


def spread(values: list[float]) -> dict[str, Any]:
    """Median, extremes and count of one quantity over repeats."""
    if not values:
        raise ValueError("a spread needs at least one value")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": list(values),
    }


def paired_ratios(ours: list[float], peer: list[float]) -> dict[str, Any]:
    """ours[i] / peer[i] for each repeat i (both measured in repeat i), as a spread."""
    if len(ours) != len(peer):
        raise ValueError(f"{len(ours)} values of ours against {len(peer)} of the peer: repeats must pair up")
    return spread([o / p for o, p in zip(ours, peer, strict=True)])


def add_json_out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json-out", type=Path, default=None, help="also write the results here as JSON")


def write(
    path: Path | None,
    benchmark: str,
    quantities: dict[str, Any],
    ratios: dict[str, Any] | None = None,
    checks: dict[str, Any] | None = None,
) -> None:
    """The benchmark's results as JSON at `path` (nothing when None), written atomically."""
    if path is None:
        return
    data = {"benchmark": benchmark, "quantities": quantities, "ratios": ratios or {}, "checks": checks or {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def shown(value: Any) -> str:
    """A quantity or ratio as the tables show it: `median (min-max, n)` for a spread, else the value."""
    if isinstance(value, dict):
        if value["n"] == 1:
            return number(value["median"])
        return f"{number(value['median'])} ({number(value['min'])}-{number(value['max'])}, n={value['n']})"
    return number(value) if isinstance(value, float) else str(value)


def number(x: float) -> str:
    if x == 0 or abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}" if abs(x) >= 0.01 else f"{x:.2g}"
