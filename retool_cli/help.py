"""`retool COMMAND --help`: what the command does, what it reads and writes, the keys it needs with the
documentation each field declares in config/ (`config.doc`) and their values under the overrides given, and
examples. `--cfg job` stays the full composed config; `--hydra-help` Hydra's own flags."""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from dataclasses import dataclass

from retool_cli.compose import CONF_DIR, RECIPES_DIR
from retool_cli.config import RetoolConfig


@dataclass(frozen=True)
class CommandHelp:
    what: str
    reads: str
    writes: str
    keys: tuple[str, ...]
    examples: tuple[str, ...]


_SAMPLING = ("rollout.engine", "rollout.max_prompt_tokens", "model.max_context_tokens", "protocol.name")
COMMANDS = {
    "prepare": CommandHelp(
        "A dataset source -> clean, deduplicated examples (DAPO template stripped, control characters repaired).",
        "the `data` section: the hub (data=dapo_math_17k, aime24, ...), a local file (data.path) or the built-in task",
        "RUN/train.jsonl, RUN/dev.jsonl, RUN/manifest.json (counts, drops, hashes, the hub commit read)",
        (
            "data.source",
            "data.path",
            "data.hub_id",
            "data.revision",
            "data.dev_size",
            "data.max_examples",
            "seed",
        ),
        (
            "retool prepare recipe=dapo_smoke",
            "retool prepare data=dapo_math_17k data.dev_size=500",
            "retool prepare data=file data.path=my.parquet data.columns.question=prompt",
        ),
    ),
    "decontaminate": CommandHelp(
        "Drop training problems that overlap evaluation benchmarks (n-gram coverage; exact short matches).",
        "decontam.input (a MathExample JSONL) or the train split of `data`; the benchmarks in decontam.benchmarks",
        "RUN/clean.jsonl, RUN/removed.jsonl (with the matching benchmark item), RUN/report.json",
        (
            "decontam.input",
            "decontam.benchmarks",
            "decontam.benchmark_paths",
            "decontam.rule",
            "decontam.threshold",
        ),
        (
            "retool decontaminate decontam.input=outputs/prepare/DAY/TIME/train.jsonl",
            "retool decontaminate decontam.benchmark_paths.aime24=aime24.jsonl   # offline: local copies",
        ),
    ),
    "filter-pass-rate": CommandHelp(
        "Sample each problem n times with the policy; keep those it solves sometimes (low < pass rate < high).",
        "filter.input or the train split of `data`; the policy (ckpt or model.name_or_path)",
        "RUN/samples.jsonl (resumable), RUN/pass_rates.jsonl, RUN/filtered.jsonl, RUN/pass_rates.png",
        (
            "filter.input",
            "ckpt",
            "filter.n_samples",
            "filter.low",
            "filter.high",
            "shard.index",
            "shard.count",
            *_SAMPLING,
        ),
        (
            "retool filter-pass-rate ckpt=outputs/sft/DAY/TIME filter.input=train.jsonl filter.low=0.1 filter.high=0.9",
            "retool filter-pass-rate ... shard.count=4 -m shard.index=0,1,2,3   # then retool filter-merge SWEEP",
        ),
    ),
    "sft": CommandHelp(
        "Cold-start fine-tuning on code-interleaved traces, rendered exactly as RL will see them; resumes its last "
        "checkpoint when rerun.",
        "sft.traces_file (chat traces with tool calls, or ReTool-SFT's; a file, folder or hub id), or traces "
        "synthesised for trainer.train_file / the `data` section",
        "RUN/checkpoints/step_N (loadable with from_pretrained), RUN/metrics.jsonl, RUN/sft.png",
        (
            "trainer.train_file",
            "sft.traces_file",
            "sft.traces_revision",
            "sft.steps",
            "sft.lr",
            "sft.batch_size",
            "sft.save_every",
            "sft.resume",
            "model.name_or_path",
        ),
        (
            "retool sft recipe=dapo_smoke trainer.train_file=outputs/prepare/DAY/TIME/train.jsonl",
            "retool sft sft.traces_file=JoeYing/ReTool-SFT sft.traces_revision=COMMIT model.name_or_path=MODEL",
        ),
    ),
    "train": CommandHelp(
        "Multi-turn RL (GRPO/DAPO family) with the code interpreter; resumes its last checkpoint when rerun.",
        "trainer.train_file or the `data` section; the policy (trainer.init_from or model.name_or_path)",
        "RUN/checkpoints/step_N, RUN/metrics.jsonl, RUN/train.png, RUN/evals/ (with trainer.eval_every)",
        (
            "trainer.train_file",
            "trainer.init_from",
            "trainer.total_steps",
            "trainer.questions_per_step",
            "rollout.group_size",
            "rollout.max_response_tokens",
            "rollout.max_tokens_per_turn",
            "trainer.lr",
            "trainer.advantage",
            "trainer.resume",
            "trainer.save_on_signal",
            "trainer.nproc",
            *_SAMPLING,
        ),
        (
            "retool train recipe=dapo_smoke trainer.init_from=outputs/sft/DAY/TIME",
            "retool train -m recipe=dapo_smoke seed=1,2,3 hydra.sweep.dir=outputs/sweep/train "
            "'hydra.sweep.subdir=seed_${seed}'",
            "retool train recipe=retool_qwen2.5_7b trainer.init_from=SFT_RUN   # 8 GPUs, vLLM",
        ),
    ),
    "eval": CommandHelp(
        "A model or checkpoint on a benchmark: avg@k, pass@k, maj@k with error bars; resumes when rerun.",
        "the benchmark's problems (benchmark=aime24 ..., benchmark.data.path for a local copy); ckpt or model",
        "RUN/samples.jsonl (every trajectory), RUN/results.json (metrics, what was read, the setting)",
        (
            "ckpt",
            "benchmark.name",
            "benchmark.n_samples",
            "benchmark.temperature",
            "benchmark.top_p",
            "benchmark.max_response_tokens",
            "benchmark.data.path",
            "benchmark.max_problems",
            *_SAMPLING,
        ),
        (
            "retool eval recipe=dapo_smoke ckpt=outputs/train/DAY/TIME",
            "retool eval benchmark=aime24 benchmark.data.path=aime24.jsonl ckpt=RUN",
            "retool eval -m seed=1,2,3 'ckpt=outputs/sweep/train/seed_${seed}' hydra.sweep.dir=outputs/sweep/eval",
        ),
    ),
}


def field_docs(schema: type = RetoolConfig, prefix: str = "") -> dict[str, str]:
    """{dotted key: its documentation}: the `help` each field declares with `config.doc`, for every key reachable
    from RetoolConfig (a nested section's keys under its name)."""
    docs: dict[str, str] = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        docs[key] = f.metadata.get("help", "")
        nested = [t for t in (hints[f.name], *typing.get_args(hints[f.name])) if dataclasses.is_dataclass(t)]
        if nested:
            docs.update(field_docs(typing.cast(type, nested[0]), f"{key}."))
    return docs


def _options(group: str) -> str:
    folder = RECIPES_DIR if group == "recipe" else CONF_DIR / group
    return ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))


def render(command: str, values: dict[str, object] | None = None) -> str:
    """The help text of one command; `values`: the keys' values under the overrides given (shown as `= ...`)."""
    spec, docs, values = COMMANDS[command], field_docs(), values or {}
    out = [
        f"retool {command}: {spec.what}",
        "",
        f"Reads:  {spec.reads}",
        f"Writes: {spec.writes}",
        "        (RUN: outputs/{command}/DAY/TIME, or hydra.run.dir=FOLDER)".replace("{command}", command),
        "",
        "Keys (KEY=VALUE on the command line; values as composed with what you typed):",
    ]
    for key in spec.keys:
        shown = f" = {values[key]}" if key in values else ""
        out.append(f"  {key}{shown}")
        if docs.get(key):
            out += textwrap.wrap(docs[key], width=110, initial_indent=" " * 6, subsequent_indent=" " * 6)
    out += ["", "Config groups (GROUP=OPTION):"]
    out += [f"  {group}: {_options(group)}" for group in ("recipe", "data", "benchmark", "rollout", "protocol")]
    out += [
        "",
        "Examples:",
        *(f"  {example}" for example in spec.examples),
        "",
        f"Every key: retool {command} --cfg job   (the composed config; any key of it can be set)",
        f"Hydra's flags (sweeps, launchers): retool {command} --hydra-help",
    ]
    return "\n".join(out) + "\n"
