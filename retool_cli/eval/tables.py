"""The files of `retool eval-report`: the markdown table (report.md) and the plot (report.png) of results over
seeds (eval/over_seeds.py computes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retool_cli.eval.over_seeds import seed_of
from retool_cli.files import atomic_open


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def markdown(rows: list[dict[str, Any]], groups: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> str:
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
            f"| {r['model']} | {_or_dash(r['step'])} | {_or_dash(seed_of(r))} | {r['benchmark']} | {r['n']} "
            f"| {_pct(r['accuracy'])} | {_pct(r['se_sampling'])} | {_pct(r['se_problems'])} "
            f"| [{_pct(low)}, {_pct(high)}] | {_pct(r['majority'])} | {_pct(r['format_rate'])} "
            f"| {r['code_calls']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def plot(rows: list[dict[str, Any]], groups: list[dict[str, Any]], path: Path) -> None:
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
                (r["step"] or 0, 100 * r["accuracy"]) for r in rows if r["setting"] == setting and seed_of(r) == seed
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
        ax.set_xticks(order, [f"step {_or_dash(r['step'])}\nseed {_or_dash(seed_of(r))}" for r in rows], fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
