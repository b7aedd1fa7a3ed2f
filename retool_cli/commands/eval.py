"""retool eval: avg@k / pass@k / maj@k with error bars for a model or checkpoint on a benchmark."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from retool_cli.config import RetoolConfig
from retool_cli.env.protocol import build_protocol, overlong_prompts
from retool_cli.errors import DataError
from retool_cli.eval.sampling import (
    SamplingPlan,
    eval_rollout,
    load_benchmark,
    sample_problems,
    summarize,
    training_step,
)
from retool_cli.files import write_json
from retool_cli.model.loading import load_tokenizer
from retool_cli.model.precision import resolve_precision
from retool_cli.provenance import data_record, package_versions
from retool_cli.run_keys import config_key, setting_key, training_record
from retool_cli.runtime import from_checkpoint, open_runtime, run_folder

log = logging.getLogger(__name__)
EVAL_OUTPUTS = ("samples.jsonl", "results.json")  # what eval.resume=false replaces in its folder


def run(config: RetoolConfig, run_dir: Path) -> None:
    precision = resolve_precision(config)  # a CUDA setting on a machine without CUDA: refused before anything loads
    config = from_checkpoint(config)  # a training checkpoint replaces the model; its step labels the report
    problems, _ = load_benchmark(config)
    bench = config.benchmark
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(config.model)
    protocol = build_protocol(config.protocol, tokenizer)
    if overlong := overlong_prompts(protocol, problems, config.rollout.max_prompt_tokens):
        raise DataError(
            f"{bench.name}: {len(overlong)} problems have a prompt longer than rollout.max_prompt_tokens="
            f"{config.rollout.max_prompt_tokens} (first: {overlong[0].id}); raise it (and "
            "model.max_context_tokens with it): a benchmark is measured whole"
        )
    key = config_key(config)
    out_dir = run_folder(config, run_dir, key, "results.json", resume=config.eval.resume, outputs=EVAL_OUTPUTS)
    log.info(
        "%s: %d problems x %d samples, model %s, protocol %s -> %s",
        bench.name,
        len(problems),
        bench.n_samples,
        config.model.name_or_path,
        config.protocol.name.value,
        out_dir,
    )

    with open_runtime(config, precision, tokenizer, protocol) as rt:
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task(f"eval {bench.name}", total=len(problems))
            plan = SamplingPlan.of(config, eval_rollout(config), config.eval.questions_per_batch)
            advance = lambda n: progress.advance(task, n)
            rows = sample_problems(problems, out_dir, plan, rt, advance)
        metrics, table = summarize(rows, problems, bench.n_samples, rt.judge, config.eval.bootstrap, config.seed)
    results = {
        "metrics": metrics,
        "protocol": {
            "model": config.model.name_or_path,
            "ckpt": config.ckpt,
            "training": (training := training_record(Path(config.model.name_or_path) if config.ckpt else None)),
            "setting": setting_key(config, training),  # shared by the runs of a seed sweep
            "training_step": training_step(config.model.name_or_path if config.ckpt else None),
            # what was read: a local file (path, sha256) or the hub (id, revision, the commit it resolved to)
            "benchmark": bench.name,
            "data": data_record(bench.data or config.data),
            "tool_protocol": config.protocol.name.value,
            "n_samples": bench.n_samples,
            "temperature": bench.temperature,
            "top_p": bench.top_p,
            "max_response_tokens": bench.max_response_tokens,
            "seed": config.seed,
            "engine": config.rollout.engine.value,
            "versions": package_versions(),
        },
        "problems": table,
    }
    write_json(out_dir / "results.json", results)
    _print_summary(bench.name, metrics, out_dir)


def _print_summary(name: str, metrics: dict, out_dir: Path) -> None:
    n = metrics["samples_per_problem"]
    table = Table(title=f"retool eval: {name} ({metrics['problems']} problems x {n} samples)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    low, high = metrics["ci95_bootstrap"]
    table.add_row(f"avg@{n} (pass@1)", f"{100 * metrics[f'avg@{n}']:.1f}%")
    table.add_row("  ± se, sampling (these problems)", f"{100 * metrics['se_sampling']:.1f}")
    table.add_row("  ± se, over problems", f"{100 * metrics['se_problems']:.1f}")
    table.add_row("  95% bootstrap interval", f"[{100 * low:.1f}, {100 * high:.1f}]")
    for key in [k for k in metrics if k.startswith(("pass@", "maj@"))]:
        table.add_row(key, f"{100 * metrics[key]:.1f}%")
    for key in ("format_rate", "truncation_rate", "solved_with_code", "code_error_rate", "code_timeout_rate"):
        table.add_row(key, f"{100 * metrics[key]:.1f}%")
    for key in ("turns", "code_calls", "response_tokens"):
        table.add_row(key, f"{metrics[key]:.2f}")
    Console().print(table)
    log.info("wrote %s", out_dir / "results.json")
