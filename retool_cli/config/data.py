"""The problems: where the training data comes from and how it is cleaned and split (`retool prepare`), its
hygiene (`retool decontaminate`, `retool filter-pass-rate`, a sweep's shards), and the benchmarks `retool eval`
measures on."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from retool_cli.config.fields import _check, doc


class DataSource(enum.Enum):
    synthetic = "synthetic"  # built-in offline generator (retool_cli/data/synthetic.py)
    dapo_math_17k = "dapo_math_17k"  # BytedTsinghua-SIA/DAPO-Math-17k layout (prompt messages + reward_model)
    aime24 = "aime24"  # HuggingFaceH4/aime_2024
    aime25 = "aime25"  # yentinglin/aime_2025
    math500 = "math500"  # HuggingFaceH4/MATH-500
    file = "file"  # any local JSONL / JSON / parquet with a column mapping


@dataclass
class ColumnsConfig:
    """Where the fields of a MathExample live in a source row. Dotted paths reach into nested
    values (`reward_model.ground_truth`), integers index lists (`prompt.0.content`)."""

    question: str = doc("problem", "the column (or dotted path) holding the problem text")
    answer: str = doc("answer", "the column holding the reference answer")
    id: str | None = doc(
        None, "the column holding a row id; None: ids are made from the source name and the row number"
    )


@dataclass
class SyntheticConfig:
    """The built-in task: problems where running code beats mental arithmetic."""

    num_examples: int = doc(2000, "problems generated before dedupe and the dev split")
    difficulty: int = doc(1, "1 (4-digit x 3-digit products, small exponents) .. 5 (much larger numbers)")
    kinds: list[str] = doc(
        help="problem kinds to mix; see retool_cli/data/synthetic.py for the full list",
        factory=lambda: ["product", "modpow", "digit_sum_power", "divisor_count"],
    )


@dataclass
class DataConfig:
    """A dataset source and how `retool prepare` turns it into train.jsonl / dev.jsonl."""

    source: DataSource = doc(DataSource.synthetic, "which reader and cleaning rules (see DataSource)")
    name: str = doc("synthetic", "the data_source tag written on every example")
    path: str | None = doc(None, "local file or folder; for hub sources it replaces the download")
    hub_id: str | None = doc(None, "dataset id on the Hugging Face hub (hub sources only)")
    revision: str = doc("main", "hub revision (branch, tag or commit); pin a commit for reproducible runs")
    split: str = doc("train", "hub split to read")
    columns: ColumnsConfig = doc(help="where the fields live in a source row", factory=ColumnsConfig)
    strip_dapo_template: bool = doc(False, 'remove DAPO\'s "Solve ... Answer: $Answer" prefix and suffix')
    dev_size: int = doc(0, "examples split off into dev.jsonl (by seed) after dedupe")
    max_examples: int | None = doc(None, "keep at most this many training examples (after the split)")
    synthetic: SyntheticConfig = doc(help="the built-in task (source=synthetic)", factory=SyntheticConfig)
    allow_unreadable_answers: bool = doc(
        False,
        "`retool prepare`: keep examples whose reference answer the judge cannot match even to itself (an empty "
        "box, a bare \\text{}); they score 0 whatever the answer. Off: prepare refuses the data, naming them",
    )

    def __post_init__(self) -> None:
        _check(self.dev_size >= 0, "data.dev_size", f"must be >= 0, got {self.dev_size}")
        _check(self.max_examples is None or self.max_examples > 0, "data.max_examples", "must be > 0")
        if self.source is DataSource.file:
            _check(bool(self.path), "data.path", "is required when data.source=file")
        _check(1 <= self.synthetic.difficulty <= 5, "data.synthetic.difficulty", "must be in 1..5")
        _check(self.synthetic.num_examples > 0, "data.synthetic.num_examples", "must be > 0")


class SplitPart(enum.Enum):
    all = "all"  # every problem of the source
    dev = "dev"  # only the dev split that `retool prepare` makes with the same data settings and seed


@dataclass
class BenchmarkConfig:
    """An evaluation set and its protocol: samples per problem and sampling settings (as in open-r1)."""

    name: str = doc("smoke", "the benchmark's name in reports (the option's file sets it)")
    data: DataConfig | None = doc(None, "where the problems come from; None = the run's own `data` section")
    part: SplitPart = doc(SplitPart.all, "all | dev (the dev split of the data, as `retool prepare` makes it)")
    n_samples: int = doc(4, "samples per problem (AIME 64, MATH-500 4)")
    temperature: float = doc(0.6, "sampling temperature (open-r1: 0.6)")
    top_p: float = doc(0.95, "nucleus sampling (open-r1: 0.95)")
    max_response_tokens: int = doc(8192, "the token budget of one trajectory, tool output included")
    max_problems: int | None = doc(None, "evaluate only the first N problems (quick checks)")

    def __post_init__(self) -> None:
        _check(self.n_samples >= 1, "benchmark.n_samples", "must be >= 1")
        _check(self.temperature >= 0, "benchmark.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, "benchmark.top_p", "must be in (0, 1]")
        _check(self.max_response_tokens >= 1, "benchmark.max_response_tokens", "must be >= 1")
        _check(self.max_problems is None or self.max_problems >= 1, "benchmark.max_problems", "must be >= 1")


@dataclass
class EvalConfig:
    """How `retool eval` runs (what it measures is `benchmark`)."""

    questions_per_batch: int = doc(8, "problems per rollout batch (x benchmark.n_samples trajectories)")
    resume: bool = doc(
        True,
        "continue an unfinished run of the identical config (what only lays out, bounds or logs the run aside: "
        "run_keys.NOT_THE_EXPERIMENT) instead of starting over",
    )
    bootstrap: int = doc(2000, "resamples for the 95% interval")

    def __post_init__(self) -> None:
        _check(self.questions_per_batch >= 1, "eval.questions_per_batch", "must be >= 1")
        _check(self.bootstrap >= 100, "eval.bootstrap", "must be >= 100")


class OverlapRule(str, enum.Enum):  # data/decontam.py
    coverage = "coverage"  # share of the benchmark problem's n-grams found in the example (ignores boilerplate)
    any = "any"  # open-r1's rule: one shared n-gram


@dataclass
class DecontamConfig:
    """`retool decontaminate`: drop training rows that overlap evaluation benchmarks (retool_cli/data/decontam.py)."""

    input: str | None = doc(None, "a MathExample JSONL to clean; None = the train split of the `data` section")
    benchmarks: list[str] = doc(
        help="benchmarks to check against (options of conf/benchmark)",
        factory=lambda: ["aime24", "aime25", "math500"],
    )
    benchmark_paths: dict[str, str | None] = doc(
        help="NAME -> a local file used instead of the hub (None: the hub)",
        factory=lambda: {"aime24": None, "aime25": None, "math500": None},
    )
    rule: OverlapRule = doc(
        OverlapRule.coverage, "coverage (default: ignores shared boilerplate) | any (open-r1: one shared n-gram)"
    )
    n: int = doc(8, "word n-gram size of the `any` rule and of the shared-n-gram count in the report")
    coverage_n: int = doc(3, "word n-gram size of the coverage rule (small: edits break long n-grams)")
    threshold: float = doc(
        0.25,
        "coverage rule: a row is flagged when this share of a benchmark item's n-grams is found in it and the"
        " row's numbers are in the item (see text_only_threshold)",
    )
    text_only_threshold: float = doc(
        0.5, "coverage rule: the share of the item's n-grams that flags a row whatever the numbers"
    )
    min_shared: int = doc(3, "coverage rule: fewer shared n-grams never flag (one common phrase is not a copy)")
    word_threshold: float = doc(
        0.7,
        "coverage rule, a row or item without numbers: `threshold` of the item's n-grams flag when this "
        "(weighted) share of the item's distinct words is in the row too (a reworded copy keeps its words; "
        "see data/decontam.py)",
    )
    latex_folding: bool = doc(True, "drop LaTeX markup ($, braces, \\frac, \\left ...) before comparing")
    punctuation_folding: bool = doc(True, "drop punctuation before comparing")

    def __post_init__(self) -> None:
        _check(self.n >= 1, "decontam.n", "must be >= 1 (an n-gram size)")
        _check(self.coverage_n >= 1, "decontam.coverage_n", "must be >= 1 (an n-gram size)")
        _check(0 < self.threshold <= 1, "decontam.threshold", "must be in (0, 1]")
        _check(0 < self.word_threshold <= 1, "decontam.word_threshold", "must be in (0, 1]")
        _check(0 < self.text_only_threshold <= 1, "decontam.text_only_threshold", "must be in (0, 1]")
        _check(self.min_shared >= 1, "decontam.min_shared", "must be >= 1")
        _check(bool(self.benchmarks), "decontam.benchmarks", "needs at least one benchmark")


@dataclass
class ShardConfig:
    index: int = doc(0, "this job's shard")
    count: int = doc(1, "shards in all (e.g. -m shard.index=0,1,2,3 shard.count=4 with the Slurm launcher)")

    def __post_init__(self) -> None:
        _check(self.count >= 1, "shard.count", f"must be >= 1, got {self.count}")
        _check(
            0 <= self.index < self.count, "shard.index", f"must be in [0, shard.count={self.count}), got {self.index}"
        )


@dataclass
class PassRateConfig:
    """`retool filter-pass-rate`: keep problems the current policy solves sometimes (commands/filter_pass_rate.py)."""

    input: str | None = doc(None, "a MathExample JSONL; None = the train split of the `data` section")
    n_samples: int = doc(8, "samples per problem, through the training agent loop, protocol, tools and reward")
    low: float = doc(0.0, "keep problems with low < pass rate < high (open-r1's DAPO recipe: 0.1, 0.6)")
    high: float = doc(1.0, "keep problems with pass rate < high (see low)")

    def __post_init__(self) -> None:
        _check(self.n_samples >= 1, "filter.n_samples", "must be >= 1")
        _check(0 <= self.low <= 1, "filter.low", f"must be in [0, 1], got {self.low}")
        _check(0 <= self.high <= 1, "filter.high", f"must be in [0, 1], got {self.high}")
        _check(self.low < self.high, "filter.low", f"{self.low} must be below filter.high={self.high}")
