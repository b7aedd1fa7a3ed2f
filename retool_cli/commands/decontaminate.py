"""retool decontaminate: a training file -> clean.jsonl, removed.jsonl, report.json (per benchmark)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from retool_cli.compose import CONF_DIR
from retool_cli.config import BenchmarkConfig, OverlapRule, RetoolConfig
from retool_cli.data.dataset import MathExample, load_examples, prepare_dataset
from retool_cli.data.decontam import BenchmarkIndex, flagged, number_precision, verdicts
from retool_cli.errors import ConfigError
from retool_cli.files import write_json, write_jsonl

log = logging.getLogger(__name__)


def load_benchmark_problems(name: str, paths: dict[str, str | None], seed: int) -> list[MathExample]:
    """The problems of a `benchmark=NAME` option, from the hub or the local file given for it."""
    option = CONF_DIR / "benchmark" / f"{name}.yaml"
    if not option.exists() or name == "smoke":
        available = sorted(p.stem for p in option.parent.glob("*.yaml") if p.stem != "smoke")
        raise ConfigError(f"decontam.benchmarks: unknown benchmark {name!r}; available: {', '.join(available)}")
    bench: BenchmarkConfig = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), OmegaConf.load(option))
    )  # type: ignore[assignment]
    data = bench.data
    if data is None:
        raise ConfigError(f"{option}: the benchmark option has no data section")
    if paths.get(name):
        data = replace(data, path=paths[name])
    # offline, the hub error names decontam.benchmark_paths.NAME: that is where a local copy goes here
    train, dev, _ = prepare_dataset(data, seed, path_key=f"decontam.benchmark_paths.{name}")
    return train + dev


def run(config: RetoolConfig, run_dir: Path) -> None:
    cfg = config.decontam
    rows = load_examples(cfg.input, "decontam.input") if cfg.input else prepare_dataset(config.data, config.seed)[0]
    texts = [r.question for r in rows]
    best: dict[int, dict] = {}
    per_benchmark = {}
    for name in cfg.benchmarks:
        problems = load_benchmark_problems(name, cfg.benchmark_paths, config.seed)
        items = [p.question for p in problems]
        folding = (cfg.latex_folding, cfg.punctuation_folding)
        shared = BenchmarkIndex(items, cfg.n, *folding).overlaps(texts)
        cover = verdicts(
            BenchmarkIndex(items, cfg.coverage_n, *folding, contained=True), texts, items, "coverage", cfg.threshold,
            cfg.min_shared, cfg.text_only_threshold, cfg.word_threshold,
        )  # fmt: skip
        hits = 0
        for i, (s, c) in enumerate(zip(shared, cover, strict=True)):
            any_rule = cfg.rule is OverlapRule.any
            o = s if any_rule else c.overlap
            if flagged(s, "any", cfg.threshold) if any_rule else c.flagged:
                hits += 1
                numbers = c.numbers if c.overlap.item == o.item else number_precision(texts[i], items[o.item])
                match = {
                    "benchmark": name,
                    "item_id": problems[o.item].id,
                    "coverage": round(c.overlap.coverage, 4),
                    "shared_ngrams": s.shared,
                    "number_precision": None if numbers is None else round(numbers, 4),
                    "word_coverage": round(c.words, 4),
                    "exact": o.exact,
                }
                if i not in best or match["coverage"] > best[i]["coverage"]:
                    best[i] = match
        per_benchmark[name] = {
            "problems": len(problems),
            "flagged_rows": hits,
            "any_rule_rows": sum(s.shared > 0 for s in shared),
        }
    clean = [r.to_dict() for i, r in enumerate(rows) if i not in best]
    removed = [{**rows[i].to_dict(), **match} for i, match in sorted(best.items())]
    write_jsonl(run_dir / "clean.jsonl", clean)
    write_jsonl(run_dir / "removed.jsonl", removed)
    write_json(
        run_dir / "report.json",
        {
            "input": cfg.input or f"data={config.data.name}",
            "rows": len(rows),
            "kept": len(clean),
            "removed": len(removed),
            "rule": cfg.rule.value,
            "threshold": cfg.threshold,
            "n": cfg.n,
            "coverage_n": cfg.coverage_n,
            "benchmarks": per_benchmark,
        },
    )
    table = Table(title=f"retool decontaminate ({cfg.rule.value}): {len(rows)} rows, {len(removed)} removed")
    for column in ("benchmark", "problems", "flagged rows", f"rows sharing an {cfg.n}-gram (any rule)"):
        table.add_column(column, justify="right")
    for name, stats in per_benchmark.items():
        table.add_row(name, str(stats["problems"]), str(stats["flagged_rows"]), str(stats["any_rule_rows"]))
    Console().print(table)
    log.info("wrote %s", run_dir)
