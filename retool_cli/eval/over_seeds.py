"""Results over seeds, what `retool eval-report` and the HTML report (report/analysis.py) both compute from
eval run folders:

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
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from retool_cli.errors import DataError
from retool_cli.eval.metrics import paired_difference
from retool_cli.files import read_jsonl_log


def collect(folders: list[Path]) -> list[dict[str, Any]]:
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


def run_row(results: dict[str, Any]) -> dict[str, Any]:
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


def group_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per (setting, step), in the order the settings first appear, steps ascending."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
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
                "seeds": [seed_of(r) for r in members],
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


def paired_comparisons(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def seed_of(row: dict[str, Any]) -> int | None:
    """The seed that tells a sweep's runs apart: the training seed of the checkpoint, else the eval seed."""
    seed: int | None = row["training_seed"] if row["training_seed"] is not None else row["seed"]
    return seed


def label_of(paths: list[str]) -> str:
    """A setting's name: its run path, or the common part of its runs' paths with `*` where they differ."""
    if len(set(paths)) == 1:
        return paths[0]
    return os.path.commonprefix(paths) + "*"  # noqa: RUF071  (by characters: runs/seed_1, runs/seed_2 -> runs/seed_*)
