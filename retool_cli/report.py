"""retool eval-report: eval run folders -> report.md (a table) and report.png (accuracy with error bars
against training step, format rate and code calls)."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

from retool_cli.errors import DataError
from retool_cli.files import atomic_open

log = logging.getLogger(__name__)


def collect(folders: list[Path]) -> list[dict]:
    """results.json of each folder (searched recursively): folders in the order given, the runs found in
    one folder ordered by training step."""
    runs = []
    for folder in folders:
        if not folder.exists():
            raise DataError(f"{folder}: no such folder")
        found = []
        for path in sorted(folder.rglob("results.json")):
            try:
                results = json.loads(path.read_text())
                results["metrics"], results["protocol"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise DataError(f"{path}: not an eval results file ({exc})") from None
            results["folder"] = str(path.parent)
            found.append(results)
        runs += sorted(found, key=lambda r: (r["protocol"].get("training_step") or 0, r["folder"]))
    if not runs:
        raise DataError(f"no results.json under {', '.join(map(str, folders))}")
    return runs


def markdown(runs: list[dict]) -> str:
    lines = ["| run | step | benchmark | n | avg@n | ± se (sampling) | ± se (problems) | 95% CI | maj@n | format | code calls |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for run in runs:
        m, p = run["metrics"], run["protocol"]
        n = m["samples_per_problem"]
        low, high = m["ci95_bootstrap"]
        lines.append(
            f"| {p.get('ckpt') or p['model']} | {p.get('training_step') if p.get('training_step') is not None else '-'} "
            f"| {p['benchmark']} | {n} | {100 * m[f'avg@{n}']:.1f} | {100 * m['se_sampling']:.1f} "
            f"| {100 * m['se_problems']:.1f} | [{100 * low:.1f}, {100 * high:.1f}] | {100 * m[f'maj@{n}']:.1f} "
            f"| {100 * m['format_rate']:.1f} | {m['code_calls']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["protocol"].get("training_step") for r in runs]
    increasing = all(s is not None for s in steps) and all(a < b for a, b in itertools.pairwise(steps))
    xs = steps if increasing else list(range(len(runs)))
    n = [r["metrics"]["samples_per_problem"] for r in runs]
    acc = [100 * r["metrics"][f"avg@{k}"] for r, k in zip(runs, n, strict=True)]
    err = [100 * 1.96 * r["metrics"]["se_problems"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].errorbar(xs, acc, yerr=err, marker="o", capsize=4)
    axes[0].set_title("accuracy (avg@n, ±1.96 se over problems)")
    axes[1].plot(xs, [100 * r["metrics"]["format_rate"] for r in runs], marker="o")
    axes[1].set_title("format rate (%)")
    axes[2].plot(xs, [r["metrics"]["code_calls"] for r in runs], marker="o")
    axes[2].set_title("code calls per sample")
    if not increasing:
        for ax in axes:
            ax.set_xticks(
                xs,
                [Path(r["protocol"].get("ckpt") or r["protocol"]["model"]).name for r in runs],
                rotation=20,
            )
    for ax in axes:
        ax.set_xlabel("training step" if increasing else "run (in the order given)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)


def write_report(folders: list[Path], out: Path | None = None) -> Path:
    runs = collect(folders)
    out = out or folders[0]
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / "report.md") as handle:
        handle.write(markdown(runs))
    plot(runs, out / "report.png")
    print(markdown(runs))
    print(f"wrote {out / 'report.md'} and {out / 'report.png'}")
    return out
