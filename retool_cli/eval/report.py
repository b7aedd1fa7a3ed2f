"""retool eval-report: eval run folders -> report.md, report.json and report.png.

    results.json of each run --run_row--> one row per run (its seed, training seed, step, accuracy)
      --group_rows: same setting and step--> one result per (setting, step) with its spread over seeds
      --paired_comparisons: each result against the one before it, problem by problem (samples.jsonl)

A setting is everything an eval measures except the seeds (results.json's `setting`: the eval config and the
checkpoint's training config, both without their seed), so the runs of `retool train -m seed=1,2,3` evaluated
at one step are the seeds of one result: the mean over seeds, the standard deviation and standard error over
seeds (how much a rerun would move), and apart from those the sampling error within runs (how much more
samples per problem would move it).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections import defaultdict
from pathlib import Path

from retool_cli.errors import DataError
from retool_cli.eval.metrics import paired_difference
from retool_cli.files import atomic_open, read_jsonl_log, write_json

log = logging.getLogger(__name__)


def collect(folders: list[Path]) -> list[dict]:
    """results.json of each folder (searched recursively), in the order the folders are given."""
    runs = []
    for folder in folders:
        if not folder.exists():
            raise DataError(f"{folder}: no such folder")
        for path in sorted(folder.rglob("results.json")):
            try:
                results = json.loads(path.read_text())
                results["metrics"], results["protocol"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise DataError(f"{path}: not an eval results file ({exc})") from None
            results["folder"] = str(path.parent)
            runs.append(results)
    if not runs:
        raise DataError(f"no results.json under {', '.join(map(str, folders))}")
    return runs


def run_row(results: dict) -> dict:
    """The fields of one run the report uses."""
    m, p = results["metrics"], results["protocol"]
    n = m["samples_per_problem"]
    training = p.get("training") or {}
    return {
        "folder": results["folder"],
        "setting": p.get("setting") or results["folder"],
        "benchmark": p["benchmark"],
        "model": p.get("ckpt") or p["model"],
        "training_run": training.get("run"),
        "step": p.get("training_step"),
        "seed": p.get("seed"),
        "training_seed": training.get("seed"),
        "n": n,
        "accuracy": m[f"avg@{n}"],
        "se_sampling": m["se_sampling"],
        "se_problems": m["se_problems"],
        "ci95": m["ci95_bootstrap"],
        "majority": m[f"maj@{n}"],
        "format_rate": m["format_rate"],
        "code_calls": m["code_calls"],
    }


def group_rows(rows: list[dict]) -> list[dict]:
    """One result per (setting, step), in the order the settings first appear, steps ascending."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["setting"], row["step"])].append(row)
    order = {setting: i for i, setting in reversed(list(enumerate(r["setting"] for r in rows)))}
    results = []
    for (setting, step), members in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1] or 0)):
        acc = [r["accuracy"] for r in members]
        k, mean = len(acc), sum(acc) / len(acc)
        std = math.sqrt(sum((a - mean) ** 2 for a in acc) / (k - 1)) if k > 1 else None
        results.append(
            {
                "setting": setting,
                "label": label_of([r["training_run"] or r["model"] for r in members]),
                "benchmark": members[0]["benchmark"],
                "step": step,
                "seeds": [_seed(r) for r in members],
                "n_seeds": k,
                "mean": mean,
                "std_seeds": std,
                "se_seeds": std / math.sqrt(k) if std is not None else None,
                # the sampling error of the mean of k runs, each with its own (independent) sampling error
                "se_sampling": math.sqrt(sum(r["se_sampling"] ** 2 for r in members)) / k,
                "se_problems": sum(r["se_problems"] for r in members) / k,
                "runs": [r["folder"] for r in members],
            }
        )
    return results


def problem_accuracy(folder: str) -> dict[str, float]:
    """Per problem: the share of right samples in a run's samples.jsonl ({} when it has none)."""
    totals: dict[str, list[int]] = {}
    for row in read_jsonl_log(Path(folder) / "samples.jsonl"):
        totals.setdefault(str(row["problem_id"]), []).append(int(bool(row.get("correct"))))
    return {problem: sum(v) / len(v) for problem, v in totals.items()}


def paired_comparisons(groups: list[dict]) -> list[dict]:
    """Each result against the one before it on the same benchmark (the order of the folders given: SFT then RL),
    paired over the problems both sampled (a setting's seeds averaged per problem): B - A with its paired
    standard error, paired bootstrap interval and sign-flip p-value of "no difference" (eval/metrics.py)."""
    by_problem = []
    for g in groups:
        runs = [problem_accuracy(folder) for folder in g["runs"]]
        common = set.intersection(*(set(r) for r in runs)) if runs else set()
        by_problem.append({p: sum(r[p] for r in runs) / len(runs) for p in sorted(common)})
    out = []
    for (ga, a), (gb, b) in itertools.pairwise(zip(groups, by_problem, strict=True)):
        if ga["benchmark"] != gb["benchmark"] or not set(a) & set(b):
            continue
        d = paired_difference(a, b)
        out.append(
            {
                "a": ga["label"],
                "a_step": ga["step"],
                "b": gb["label"],
                "b_step": gb["step"],
                "benchmark": ga["benchmark"],
                "problems": d.problems,
                "difference": d.mean,
                "se_paired": d.se,
                "ci95_paired_bootstrap": list(d.ci95),
                "p_value": d.p_value,
            }
        )
    return out


def _seed(row: dict) -> int | None:
    """The seed that tells a sweep's runs apart: the training seed of the checkpoint, else the eval seed."""
    return row["training_seed"] if row["training_seed"] is not None else row["seed"]


def label_of(paths: list[str]) -> str:
    """A setting's name: its run path, or the common part of its runs' paths with `*` where they differ."""
    if len(set(paths)) == 1:
        return paths[0]
    return os.path.commonprefix(paths) + "*"  # noqa: RUF071  (by characters: runs/seed_1, runs/seed_2 -> runs/seed_*)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(rows: list[dict], groups: list[dict], pairs: list[dict]) -> str:
    lines = [
        "## Results (mean over seeds)",
        "",
        "| setting | step | benchmark | seeds | mean avg@n | ± std (seeds) | ± se (seeds) | ± se (sampling) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in groups:
        lines.append(
            f"| {g['label']} | {_or_dash(g['step'])} | {g['benchmark']} | {g['n_seeds']} | {_pct(g['mean'])} "
            f"| {_pct(g['std_seeds'])} | {_pct(g['se_seeds'])} | {_pct(g['se_sampling'])} |"
        )
    if pairs:
        lines += [
            "",
            "## Paired comparisons (B - A over the problems both sampled)",
            "",
            "| A | B | problems | B - A | ± se (paired) | 95% CI (paired bootstrap) | p (no difference) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for c in pairs:
            low, high = c["ci95_paired_bootstrap"]
            lines.append(
                f"| {c['a']} | {c['b']} | {c['problems']} | {_pct(c['difference'])} | {_pct(c['se_paired'])} "
                f"| [{_pct(low)}, {_pct(high)}] | {c['p_value']:.2g} |"
            )
    lines += [
        "",
        "## Runs",
        "",
        "| run | step | seed | benchmark | n | avg@n | ± se (sampling) | ± se (problems) | 95% CI | maj@n | format "
        "| code calls |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        low, high = r["ci95"]
        lines.append(
            f"| {r['model']} | {_or_dash(r['step'])} | {_or_dash(_seed(r))} | {r['benchmark']} | {r['n']} "
            f"| {_pct(r['accuracy'])} | {_pct(r['se_sampling'])} | {_pct(r['se_problems'])} "
            f"| [{_pct(low)}, {_pct(high)}] | {_pct(r['majority'])} | {_pct(r['format_rate'])} "
            f"| {r['code_calls']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def plot(rows: list[dict], groups: list[dict], path: Path) -> None:
    """Accuracy per setting: against training step (one faint line per seed, the mean over seeds bold) where a
    setting has several steps, else one position per setting (each seed a faint dot); bars are ±1.96 se over
    seeds (over problems for a single run), clipped to [0, 100]. Beside it, format rate and code calls per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(g["setting"] for g in groups))
    curves = any(sum(g["setting"] == s for g in groups) > 1 for s in settings)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, setting in enumerate(settings):
        points = [g for g in groups if g["setting"] == setting]
        xs = [g["step"] or 0 for g in points] if curves else [i]
        color = f"C{i % 10}"
        for seed in dict.fromkeys(s for g in points for s in g["seeds"]):  # each seed faint, the mean bold
            mine = sorted(
                (r["step"] or 0, 100 * r["accuracy"]) for r in rows if r["setting"] == setting and _seed(r) == seed
            )
            steps, accs = zip(*mine, strict=True)
            axes[0].plot(steps if curves else [i] * len(accs), accs, color=color, alpha=0.3, lw=1, marker=".")
        means = [100 * g["mean"] for g in points]
        err = [196 * (g["se_seeds"] if g["se_seeds"] is not None else g["se_problems"]) for g in points]
        low = [min(e, m) for e, m in zip(err, means, strict=True)]  # clipped: accuracy stays in [0, 100]
        high = [min(e, 100 - m) for e, m in zip(err, means, strict=True)]
        label = (
            f"{points[0]['label']} ({points[0]['n_seeds']} seeds)" if points[0]["n_seeds"] > 1 else points[0]["label"]
        )
        axes[0].errorbar(xs, means, yerr=[low, high], marker="o", capsize=4, color=color, lw=2, label=label)
    axes[0].set_ylim(0, 100)
    axes[0].set_title("accuracy, avg@n (%): mean over seeds, ±1.96 se")
    axes[0].set_xlabel("training step" if curves else "setting")
    if not curves:
        axes[0].set_xticks(range(len(settings)), [Path(g["label"]).name for g in groups], rotation=15)
    axes[0].legend(fontsize=7)
    order = list(range(len(rows)))
    axes[1].bar(order, [100 * r["format_rate"] for r in rows], color="C1")
    axes[1].set_title("format rate per run (%)")
    axes[2].bar(order, [r["code_calls"] for r in rows], color="C2")
    axes[2].set_title("code calls per sample, per run")
    for ax in axes[1:]:
        ax.set_xticks(order, [f"step {_or_dash(r['step'])}\nseed {_or_dash(_seed(r))}" for r in rows], fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)


def write_report(folders: list[Path], out: Path | None = None) -> Path:
    rows = [run_row(results) for results in collect(folders)]
    groups = group_rows(rows)
    pairs = paired_comparisons(groups)
    out = out or folders[0]
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, groups, pairs)
    with atomic_open(out / "report.md") as handle:
        handle.write(text)
    write_json(out / "report.json", {"results": groups, "paired_comparisons": pairs, "runs": rows})
    plot(rows, groups, out / "report.png")
    print(text)
    print(f"wrote {out / 'report.md'}, {out / 'report.json'} and {out / 'report.png'}")
    return out
