"""retool eval: avg@k / pass@k / maj@k with error bars for a model or checkpoint on a benchmark."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from retool_cli.config import Engine, ProtocolName, RetoolConfig
from retool_cli.env.protocol import build_protocol, overlong_prompts
from retool_cli.env.reward import Verifier
from retool_cli.env.sandbox import Sandbox
from retool_cli.errors import DataError
from retool_cli.eval.sampling import (
    eval_rollout,
    load_benchmark,
    resolve_checkpoint,
    sample_problems,
    summarize,
    training_step,
)
from retool_cli.files import write_json
from retool_cli.model.loading import load_model, load_tokenizer
from retool_cli.provenance import data_record, package_versions
from retool_cli.rollout import build_engine
from retool_cli.runs import config_key, find_resumable, setting_key, training_record, write_key

log = logging.getLogger(__name__)


def run(config: RetoolConfig, run_dir: Path) -> None:
    if config.ckpt:  # a training checkpoint replaces the model; its step labels the report
        config = replace(config, model=replace(config.model, name_or_path=str(resolve_checkpoint(config.ckpt))))
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
    out_dir = find_resumable(run_dir, key, Path.cwd() / "outputs" / "eval") if config.eval.resume else run_dir
    write_key(out_dir, key)
    log.info(
        "%s: %d problems x %d samples, model %s, protocol %s -> %s",
        bench.name,
        len(problems),
        bench.n_samples,
        config.model.name_or_path,
        config.protocol.name.value,
        out_dir,
    )

    model = None if config.rollout.engine is Engine.vllm else load_model(config.model).eval()  # vLLM loads its own
    engine = build_engine(config, model, tokenizer)
    use_tool = config.protocol.name is not ProtocolName.none
    with contextlib.ExitStack() as stack:
        sandbox = stack.enter_context(Sandbox(config.sandbox)) if use_tool else None
        verifier = stack.enter_context(Verifier(config.reward.judge_timeout_s, config.reward.judge_workers))
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task(f"eval {bench.name}", total=len(problems))
            rows = sample_problems(
                problems,
                config,
                out_dir,
                engine,
                protocol,
                sandbox,
                verifier,
                eval_rollout(config),
                config.eval.questions_per_batch,
                progress=lambda n: progress.advance(task, n),
            )
        metrics, table = summarize(rows, problems, bench.n_samples, verifier, config.eval.bootstrap, config.seed)
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
