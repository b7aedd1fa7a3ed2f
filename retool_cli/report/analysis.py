"""The numbers `retool report` draws: training curves grouped into settings (the seeds of one sweep), eval
results over seeds, and the problem-by-problem comparison of two evaluated checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retool_cli.eval.over_seeds import group_rows, label_of, run_row
from retool_cli.report.svg import PALETTE, Series

# (metrics.jsonl key, chart title); "time" is the step's wall time (see metric_value)
CURVES = [
    ("reward/mean", "reward"),
    ("train/accuracy", "accuracy (training rollouts)"),
    ("rollout/code_calls", "code calls per trajectory"),
    ("rollout/response_tokens", "response tokens"),
    ("train/entropy", "entropy (model tokens)"),
    ("train/void_rate", "void trajectories (infrastructure failures, left out of the loss)"),
    ("train/mismatch_kl_k3", "sampler-trainer gap (k3 KL, model tokens)"),
    ("rollout/code_cache_hit_rate", "interpreter calls answered from the cache"),
    ("rollout/staleness_mean", "staleness (weight versions behind the trainer, mean over tokens)"),
    ("rollout/partial_share", "partial rollouts (trajectories sampled by two weight versions)"),
    ("time/trainer_idle_share", "trainer idle (share of the step's wall time)"),
    ("time/sampler_idle_share", "sampler idle (share of the step's wall time)"),
    ("time/weight_transfer_s", "weight loading into the sampler's engines (s per step; separate: broadcasts)"),
    ("train/padding_share", "padding (share of the positions the loss passes computed)"),
    ("time/train_tokens_per_s", "training throughput (real tokens per second of the update)"),
    ("train/token_imbalance", "token imbalance (the busiest process's training tokens over the mean)"),
    ("kl", "KL"),
    ("time", "step time (s)"),
    ("eval/accuracy", "dev accuracy (periodic eval)"),
    ("loss", "SFT loss"),
]


def setting_of(run: dict[str, Any]) -> str:
    """What a run did apart from its seed: its command and the overrides of its job without seed= (so that
    the jobs of `retool train -m seed=1,2,3` are one setting)."""
    overrides = run["provenance"].get("overrides", [])
    kept = sorted(o for o in overrides if not o.startswith(("seed=", "hydra.")))
    return " ".join([run["command"], *kept]) if overrides else f"{run['command']} {run['folder']}"


def metric_value(row: dict[str, Any], key: str) -> float | None:
    """A curve's value in one metrics row: "kl" is the KL to the reference where the run has one, else the
    policy's approximate KL to the sampling policy; "time" is the step's wall time where the run measured it
    (overlapped training: its phases run at once), else the sum of its phase times (`time/*_s`)."""
    if key == "kl":
        key = "train/kl_ref" if "train/kl_ref" in row else "train/approx_kl"
    if key == "time":
        if "time/step_wall_s" in row:
            return float(row["time/step_wall_s"])
        times = [v for k, v in row.items() if k.startswith("time/") and k.endswith("_s") and not k.endswith("_per_s")]
        return sum(times) if times else None
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def training_series(runs: list[dict[str, Any]], key: str) -> list[Series]:
    """One chart's lines: per setting, each seed faint and the mean over seeds bold (at the steps every seed
    has); a setting of one run is one bold line."""
    settings: dict[str, list[dict]] = {}
    for run in runs:
        if run["metrics"]:
            settings.setdefault(setting_of(run), []).append(run)
    series = []
    for index, members in enumerate(settings.values()):
        color = PALETTE[index % len(PALETTE)]
        lines: list[list[tuple[float, float]]] = []
        for run in members:
            points = [(r["step"], metric_value(r, key)) for r in run["metrics"] if "step" in r]
            lines.append([(x, y) for x, y in points if y is not None])  # (step, value)
        label = label_of([run["folder"] for run in members])  # the folder, or a sweep's folders as seed_*
        if len(members) == 1:
            series.append(Series(label, lines[0], color))
            continue
        for run, line in zip(members, lines, strict=True):
            series.append(Series(f"seed {run['provenance'].get('seed')}", line, color, faint=True))
        common = set.intersection(*(set(x for x, _ in line) for line in lines))
        mean = [(x, sum(dict(p)[x] for p in lines) / len(lines)) for x in sorted(common)]
        series.append(Series(f"{label} (mean of {len(members)} seeds)", mean, color))
    return series


def eval_series(runs: list[dict[str, Any]]) -> tuple[list[dict], list[dict], list[Series], list[str] | None]:
    """The eval runs' rows and their results over seeds (eval-report's arithmetic), and the accuracy chart:
    per setting, its seeds faint and the mean bold, with +-1.96 se bars clipped to [0, 100]. Against the
    training step where a setting was evaluated at several steps; else one position per setting (steps of
    different runs, an SFT's and an RL run's, are not one axis), whose names come last."""
    rows = [run_row({**run["results"], "folder": run["folder"]}) for run in runs if run["results"]]
    groups = group_rows(rows)
    settings = list(dict.fromkeys(g["setting"] for g in groups))
    curves = any(sum(g["setting"] == s for g in groups) > 1 for s in settings)
    series = []
    for index, setting in enumerate(settings):
        color = PALETTE[index % len(PALETTE)]
        mine = [g for g in groups if g["setting"] == setting]

        def x(step: int | None, index: int = index) -> float:
            return (step or 0) if curves else index

        for seed in dict.fromkeys(s for g in mine for s in g["seeds"]):
            points = sorted(
                (x(r["step"]), 100 * r["accuracy"]) for r in rows if r["setting"] == setting and _seed(r) == seed
            )
            if mine[0]["n_seeds"] > 1:
                series.append(Series(f"seed {seed}", points, color, faint=True))
        errors = []
        for g in mine:
            se = g["se_seeds"] if g["se_seeds"] is not None else g["se_problems"]
            mean = 100 * g["mean"]
            errors.append((x(g["step"]), max(0.0, mean - 196 * se), min(100.0, mean + 196 * se)))
        label = f"{mine[0]['label']} ({mine[0]['n_seeds']} seeds)" if mine[0]["n_seeds"] > 1 else mine[0]["label"]
        series.append(Series(label, [(x(g["step"]), 100 * g["mean"]) for g in mine], color, errors=errors))
    names = None if curves else [Path(next(g["label"] for g in groups if g["setting"] == s)).name for s in settings]
    return rows, groups, series, names


def compare(a_rows: list[dict], b_rows: list[dict]) -> list[dict[str, Any]]:
    """Per problem both runs sampled: the fraction of samples right in each, and whether the majority verdict
    flipped ("gained": wrong in A, right in B; "lost": the reverse; "same"). Most changed first."""
    a, b = _accuracy_by_problem(a_rows), _accuracy_by_problem(b_rows)
    rows = []
    for problem in (p for p in a if p in b):
        right_a, right_b = a[problem] >= 0.5, b[problem] >= 0.5
        flip = "same" if right_a == right_b else ("gained" if right_b else "lost")
        rows.append({"problem_id": problem, "acc_a": a[problem], "acc_b": b[problem], "flip": flip})
    return sorted(rows, key=lambda r: (r["flip"] == "same", -abs(r["acc_b"] - r["acc_a"])))


def representative(rows: list[dict], problem: str, right: bool) -> dict | None:
    """A sample of `problem` with the majority's verdict (the first in the file), to show side by side."""
    mine = [r for r in rows if r["problem_id"] == problem]
    return next((r for r in mine if bool(r.get("correct")) == right), mine[0] if mine else None)


def _accuracy_by_problem(rows: list[dict]) -> dict[str, float]:
    totals: dict[str, list[int]] = {}
    for row in rows:
        totals.setdefault(row["problem_id"], []).append(int(bool(row.get("correct"))))
    return {problem: sum(v) / len(v) for problem, v in totals.items()}


def _seed(row: dict) -> int | None:
    return row["training_seed"] if row["training_seed"] is not None else row["seed"]
