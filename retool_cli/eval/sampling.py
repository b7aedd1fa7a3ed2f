"""Benchmark evaluation: sample every problem n times through the agent loop, judge, summarise.

    problems --chunks of eval.questions_per_batch--> run_rollouts (seed per chunk) --> score_batch
      --> samples.jsonl (appended chunk by chunk, fsync'd) --> summarize --> results.json

Resumable: a chunk is written only when complete and its seed depends on its index alone, so a
killed run continued later samples exactly what the uninterrupted run would have.
"""

from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from retool_cli import stops
from retool_cli.config import RetoolConfig, RewardConfig, RewardFunction, RolloutConfig, SplitPart
from retool_cli.data.dataset import MathExample, prepare_dataset
from retool_cli.env.reward import score_batch
from retool_cli.errors import ConfigError, DataError
from retool_cli.eval.metrics import avg_at_k, k_values, majority_answer, mean, pass_at_k
from retool_cli.faults import die_if_due, pause_if_due
from retool_cli.files import append_jsonl, read_jsonl_log
from retool_cli.interfaces import Judge, Runtime
from retool_cli.rollout.agent import STOP_REASONS, run_rollouts, sample_row

log = logging.getLogger(__name__)


def load_benchmark(cfg: RetoolConfig) -> tuple[list[MathExample], str | None]:
    """The problems to evaluate and the hub commit they came from (None for local or generated data)."""
    bench = cfg.benchmark
    train, dev, stats = prepare_dataset(
        bench.data or cfg.data, cfg.seed, "benchmark.data.path" if bench.data else "data.path"
    )
    if bench.part is SplitPart.dev:
        if not dev:
            raise ConfigError(f"benchmark.part=dev but the data has no dev split (data.dev_size=0) for {bench.name}")
        problems = dev
    else:
        problems = train + dev
    return (problems[: bench.max_problems] if bench.max_problems else problems), stats.resolved_revision


def training_step(path: str | None) -> int | None:
    match = re.search(r"step_(\d+)", path or "")
    return int(match.group(1)) if match else None


# ------------------------------------------------------------------ samples on disk


def read_samples(path: Path) -> list[dict[str, Any]]:
    """Rows of samples.jsonl; a torn last line (a kill in mid-write) is cut off the file."""
    return read_jsonl_log(path, cut_torn_tail=True)


# ------------------------------------------------------------------ sampling


def eval_rollout(cfg: RetoolConfig) -> RolloutConfig:
    """The agent loop's settings with the benchmark's samples per problem and sampling."""
    bench = cfg.benchmark
    return replace(
        cfg.rollout,
        group_size=bench.n_samples,
        temperature=bench.temperature,
        top_p=bench.top_p,
        max_response_tokens=bench.max_response_tokens,
    )


@dataclass(frozen=True)
class SamplingPlan:
    """How a set of problems is sampled and judged."""

    rollout: RolloutConfig  # the agent loop's settings; group_size = samples per problem
    reward: RewardConfig  # the judge's settings (scored by correctness alone, whatever its reward function)
    seed: int  # the run's seed; each chunk's seed follows from it
    max_context_tokens: int  # prompt + response bound of one trajectory
    per_batch: int  # problems per chunk (a chunk is sampled, judged and written at once)
    per_problem_seeds: bool = False  # one problem per chunk, seeded by its id: any sharding samples the same

    @classmethod
    def of(
        cls, cfg: RetoolConfig, rollout: RolloutConfig, per_batch: int, per_problem_seeds: bool = False
    ) -> SamplingPlan:
        return cls(rollout, cfg.reward, cfg.seed, cfg.context_tokens(), per_batch, per_problem_seeds)


def sample_problems(
    problems: list[MathExample],
    out_dir: Path,
    plan: SamplingPlan,
    rt: Runtime,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Sample and judge every problem `plan.rollout.group_size` times, skipping chunks already in samples.jsonl.

    Seeds follow the chunk index, or with `plan.per_problem_seeds` (one problem per chunk) the problem id, so that
    any split of the problems into shards samples the same trajectories."""
    rollout = plan.rollout
    path = out_dir / "samples.jsonl"
    done = {(r["problem_id"], r["sample_index"]) for r in read_samples(path)}
    if done:
        log.info(
            "resuming %s: %d of %d samples already there",
            out_dir,
            len(done),
            len(problems) * rollout.group_size,
        )
    correctness = replace(plan.reward, function=RewardFunction.correctness, format_weight=0.0, overlong_buffer_tokens=0)
    per_problem_seeds = plan.per_problem_seeds
    per_batch = 1 if per_problem_seeds else plan.per_batch
    chunks = [problems[i : i + per_batch] for i in range(0, len(problems), per_batch)]
    written = 0  # chunks this process appended
    for index, chunk in enumerate(chunks):
        if all((p.id, j) in done for p in chunk for j in range(rollout.group_size)):
            _advance(progress, len(chunk))
            continue
        seed = plan.seed * 1_000_003 + (zlib.crc32(chunk[0].id.encode()) if per_problem_seeds else index)
        trajectories, _ = run_rollouts(
            chunk, rt.engine, rt.protocol, rt.tools, rollout, seed=seed, max_context_tokens=plan.max_context_tokens
        )
        scores = score_batch([t.response() for t in trajectories], correctness, rt.judge)
        rows = [sample_row(t, s, seed, rt.tools) for t, s in zip(trajectories, scores, strict=True)]
        # a chunk torn in mid-append is redone whole (the same seed: the same samples); write only what is missing
        with stops.critical():  # a stop signal waits for the append (a stop anywhere else abandons the chunk)
            append_jsonl(path, [r for r in rows if (r["problem_id"], r["sample_index"]) not in done])
        written += 1
        die_if_due("chunk", written)  # the resume tests' fault injection (RETOOL_DIE_AFTER=chunk:N)
        pause_if_due("chunk", written)  # the stop tests' fixed point (RETOOL_PAUSE_AT=chunk:N)
        _advance(progress, len(chunk))
    return read_samples(path)


def _advance(progress: Any, n: int) -> None:
    if progress is not None:
        progress(n)


# ------------------------------------------------------------------ summary


def summarize(
    rows: list[dict[str, Any]], problems: list[MathExample], n: int, judge: Judge, bootstrap: int, seed: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Benchmark metrics and the per-problem table from the sample rows."""
    by_problem: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_problem.setdefault(row["problem_id"], []).append(row)
    missing = [p.id for p in problems if len(by_problem.get(p.id, [])) < n]
    if missing:
        raise DataError(f"samples.jsonl lacks samples of {len(missing)} problems (first: {missing[0]})")
    table, correct, flat = [], [], []
    maj_hits: dict[int, list[bool]] = {k: [] for k in k_values(n)}  # k_values ends with n
    for problem in problems:
        samples = sorted(by_problem[problem.id], key=lambda r: r["sample_index"])[:n]
        flat += samples
        flags = [bool(r["correct"]) for r in samples]
        correct.append(flags)
        answers = [r["answer"] for r in samples]
        for k in maj_hits:
            majority = majority_answer(answers[:k], judge.is_equivalent)
            maj_hits[k].append(majority is not None and judge.is_equivalent(problem.answer, majority))
        table.append(
            {
                "problem_id": problem.id,
                "correct": sum(flags),
                "n": n,
                "majority_answer": majority,
                "reference": problem.answer,
            }
        )  # majority_answer: the majority of all n samples
    acc = avg_at_k(correct, bootstrap=bootstrap, seed=seed)
    unreadable = [
        p.id for p, ok in zip(problems, judge.readable_many([p.answer for p in problems]), strict=True) if not ok
    ]
    if unreadable:
        log.warning(
            "%d of %d problems have a reference answer the judge cannot match even to itself (scored 0 whatever "
            "the answer; counted as unreadable_references): %s",
            len(unreadable),
            len(problems),
            ", ".join(unreadable[:5]) + (" ..." if len(unreadable) > 5 else ""),
        )
    calls = sum(r["code_calls"] for r in flat)
    metrics: dict[str, Any] = {
        f"avg@{n}": acc.mean,
        "se_sampling": acc.se_sampling,
        "se_problems": acc.se_problems,
        "ci95_bootstrap": list(acc.ci95),
        "problems": len(problems),
        "samples_per_problem": n,
        **{f"pass@{k}": mean([pass_at_k(n, sum(f), k) for f in correct]) for k in k_values(n)},
        **{f"maj@{k}": mean([float(h) for h in hits]) for k, hits in maj_hits.items()},
        "format_rate": mean([float(r["formatted"]) for r in flat]),
        "truncation_rate": mean([float(r["truncated"]) for r in flat]),
        "turns": mean([r["turns"] for r in flat]),
        "code_calls": mean([r["code_calls"] for r in flat]),
        "solved_with_code": mean([float(r["correct"] and r["code_calls"] > 0) for r in flat]),
        "code_error_rate": sum(r["code_errors"] for r in flat) / calls if calls else 0.0,
        "code_timeout_rate": sum(r["code_timeouts"] for r in flat) / calls if calls else 0.0,
        "response_tokens": mean([r["response_tokens"] for r in flat]),
        "judge_timeouts": sum(bool(r["judge_timed_out"]) for r in flat),
        "unreadable_references": len(unreadable),  # problems no answer can be right on (see the warning)
        # samples the infrastructure failed (a dead sandbox worker, a dropped request, a deadline, the judge's
        # time-out), counted as wrong in the accuracy above: a rerun of those problems settles them
        "void_samples": sum(bool(r.get("infra_failure")) for r in flat),
        **{f"stop_{reason}": mean([float(r["stop_reason"] == reason) for r in flat]) for reason in STOP_REASONS},
    }
    return metrics, table


def dev_eval(
    config: RetoolConfig,
    problems: list[MathExample],
    folder: Path,
    rt: Runtime,
) -> dict[str, float]:
    """Train's periodic eval: this module on a slice of the dev split, with the benchmark's sampling settings."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = SamplingPlan.of(config, eval_rollout(config), config.eval.questions_per_batch)
    rows = sample_problems(problems, folder, plan, rt)
    n = config.benchmark.n_samples
    metrics, _ = summarize(rows, problems, n, rt.judge, config.eval.bootstrap, config.seed)
    return {
        "eval/accuracy": metrics[f"avg@{n}"],
        "eval/se_problems": metrics["se_problems"],
        "eval/solved_with_code": metrics["solved_with_code"],
        "eval/code_calls": metrics["code_calls"],
    }
