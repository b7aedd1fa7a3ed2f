"""retool filter-pass-rate: sample each problem n times with the policy, keep those solved sometimes.

Outputs per shard: samples.jsonl (resumable), pass_rates.jsonl, filtered.jsonl, pass_rates.png and a summary;
`retool filter-merge DIR` joins the shards of a sweep into the same files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from retool_cli.config import RetoolConfig
from retool_cli.data.dataset import MathExample, load_examples, load_jsonl, prepare_dataset
from retool_cli.env.protocol import build_protocol
from retool_cli.errors import DataError
from retool_cli.eval.sampling import SamplingPlan, sample_problems
from retool_cli.files import atomic_open, text_lines, write_jsonl
from retool_cli.model.loading import load_tokenizer
from retool_cli.model.precision import resolve_precision
from retool_cli.run_keys import config_key
from retool_cli.runtime import from_checkpoint, open_runtime, run_folder

log = logging.getLogger(__name__)


def run(config: RetoolConfig, run_dir: Path) -> None:
    cfg = config.filter
    precision = resolve_precision(config)  # a CUDA setting on a machine without CUDA: refused before anything loads
    config = from_checkpoint(config)
    problems = load_examples(cfg.input, "filter.input") if cfg.input else prepare_dataset(config.data, config.seed)[0]
    shard = problems[config.shard.index :: config.shard.count]
    out_dir = run_folder(config, run_dir, config_key(config), "pass_rates.jsonl")
    log.info(
        "pass rates of %d problems (shard %d/%d) x %d samples with %s",
        len(shard),
        config.shard.index,
        config.shard.count,
        cfg.n_samples,
        config.model.name_or_path,
    )
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(config.model)
    rollout = replace(config.rollout, group_size=cfg.n_samples)
    with open_runtime(config, precision, tokenizer, build_protocol(config.protocol, tokenizer)) as rt:
        plan = SamplingPlan.of(config, rollout, per_batch=1, per_problem_seeds=True)
        rows = sample_problems(shard, out_dir, plan, rt)
    positions = list(range(config.shard.index, len(problems), config.shard.count))  # places in the whole input
    write_jsonl(out_dir / "problems.jsonl", [p.to_dict() for p in shard])
    write_outputs(out_dir, shard, pass_rates(rows, shard, cfg.n_samples, positions), cfg.low, cfg.high)


def pass_rates(rows: list[dict], problems: list[MathExample], n: int, positions: list[int]) -> list[dict]:
    by_problem: dict[str, list[dict]] = {}
    for row in rows:
        by_problem.setdefault(row["problem_id"], []).append(row)
    out = []
    for p, position in zip(problems, positions, strict=True):
        samples = by_problem[p.id][:n]
        correct = sum(bool(r["correct"]) for r in samples)
        out.append(
            {
                "problem_id": p.id,
                "position": position,
                "n": len(samples),
                "correct": correct,
                "pass_rate": correct / len(samples),
                "mean_code_calls": sum(r["code_calls"] for r in samples) / len(samples),
            }
        )
    return out


def write_outputs(out_dir: Path, problems: list[MathExample], rates: list[dict], low: float, high: float) -> None:
    rate_of = {r["problem_id"]: r["pass_rate"] for r in rates}
    kept = [p.to_dict() for p in problems if low < rate_of[p.id] < high]
    write_jsonl(out_dir / "filtered.jsonl", kept)
    write_jsonl(out_dir / "pass_rates.jsonl", rates)
    _histogram([r["pass_rate"] for r in rates], low, high, out_dir / "pass_rates.png")
    never = sum(r == 0 for r in rate_of.values())
    always = sum(r == 1 for r in rate_of.values())
    Console().print(
        f"[bold]filter-pass-rate[/bold]: {len(problems)} problems, kept {len(kept)} with {low} < pass rate "
        f"< {high}; never solved {never}, always solved {always} -> {out_dir / 'filtered.jsonl'}"
    )


def _histogram(values: list[float], low: float, high: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(values, bins=20, range=(0, 1))
    for edge in (low, high):
        ax.axvline(edge, color="red", linestyle="--")
    ax.set_xlabel("pass rate")
    ax.set_ylabel("problems")
    fig.tight_layout()
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=100)
    plt.close(fig)


def shard_rows(path: Path) -> list[dict]:
    """A finished shard's pass rates; a damaged line (a torn copy, an edit) is an error naming the file and line."""
    rows = []
    for line_no, line in text_lines(path):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{line_no}: malformed JSON ({exc.msg}); run this shard again") from None
    return rows


def merge(folders: list[Path], out: Path, low: float, high: float) -> None:
    """Join shard folders: every problem's pass rate, in the order of the original input, filtered again."""
    problems: dict[str, MathExample] = {}
    rates: list[dict] = []
    for folder in folders:
        for path in sorted(folder.rglob("pass_rates.jsonl")):
            rates += shard_rows(path)
            problems.update({p.id: p for p in load_jsonl(path.parent / "problems.jsonl")})
    if not rates:
        raise DataError(f"no pass_rates.jsonl under {', '.join(map(str, folders))}")
    rates.sort(key=lambda r: r["position"])
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, [problems[r["problem_id"]] for r in rates], rates, low, high)
