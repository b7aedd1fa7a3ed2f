"""Math problems: the MathExample record, strict JSONL loading, source readers, cleaning, dedupe, splits.

source rows --read_source_rows--> RawRow(where, fields)
  --to_examples (clean, strip template)--> MathExample
  --dedupe (normalised question; drop conflicting answers)--> unique examples
  --split_dev (seeded)--> train, dev
"""

from __future__ import annotations

import functools
import json
import random
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from retool_cli.config import DataConfig, DataSource, RetoolConfig
from retool_cli.data.synthetic import generate_rows
from retool_cli.errors import DataError
from retool_cli.files import read_parquet, read_text, text_lines


@dataclass(frozen=True)
class MathExample:
    """One problem. The answer is the reference for the reward and never enters the prompt."""

    id: str
    question: str
    answer: str
    data_source: str
    # A program that prints the answer, where the source has one (the synthetic task): the code half of the
    # synthesised SFT traces. Optional in the JSONL, and left out of it when empty.
    solution_code: str = ""

    def to_dict(self) -> dict[str, str]:
        row = asdict(self)
        if not self.solution_code:
            del row["solution_code"]
        return row


_FIELDS = ("id", "question", "answer", "data_source")


# --------------------------------------------------------------------------- MathExample JSONL


STAGING_FOLDER = ".prepare-staging"  # where `retool prepare` writes its outputs before it moves them into place


def load_examples(path: str, key: str) -> list[MathExample]:
    """The examples of a MathExample JSONL named by the config key `key`; an empty file is an error (a run on
    no problems would train or measure nothing and still exit 0)."""
    examples = load_jsonl(path)
    if not examples:
        raise DataError(f"{key}={path}: the file holds no examples")
    return examples


def load_jsonl(path: str | Path) -> list[MathExample]:
    """Load MathExample rows strictly: any malformed line, missing/empty field or repeated id raises, and so does
    a file of a `retool prepare` that did not finish (its staging folder beside it)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if (path.parent / STAGING_FOLDER).is_dir():
        raise DataError(
            f"{path}: a `retool prepare` into {path.parent} did not finish (its {STAGING_FOLDER} folder is there), "
            "so this file may not match the others; run that prepare again"
        )
    examples: list[MathExample] = []
    first_line_of: dict[str, int] = {}
    for line_no, line in text_lines(path):
        if not line.strip():
            continue
        row = _parse_json_line(line, path, line_no)
        values = {}
        for key in _FIELDS:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key == "answer":
                value = str(value)
            if not isinstance(value, str) or not value.strip():
                problem = "missing" if value is None else "empty or not a string"
                raise DataError(f"{path}:{line_no}: field {key!r} is {problem}")
            values[key] = value
        code = row.get("solution_code", "")
        if not isinstance(code, str):
            raise DataError(f"{path}:{line_no}: field 'solution_code' is not a string")
        values["solution_code"] = code
        if values["id"] in first_line_of:
            raise DataError(
                f"{path}:{line_no}: duplicate id {values['id']!r} (first seen on line {first_line_of[values['id']]})"
            )
        first_line_of[values["id"]] = line_no
        examples.append(MathExample(**values))
    return examples


def _parse_json_line(line: str, path: Path, line_no: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{line_no}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
    return row


def shuffled_examples(path: str | Path, seed: int) -> list[MathExample]:
    """All examples of a file in one seeded order (one shuffle per run; batches then cycle over it)."""
    examples = load_jsonl(path)
    random.Random(seed).shuffle(examples)
    return examples


def take_batch(examples: list[MathExample], start: int, size: int) -> list[MathExample]:
    """`size` examples from position `start`, wrapping around the end (step k uses start = k * size)."""
    if not examples:
        raise DataError("take_batch: the example list is empty")
    if size <= 0:
        raise DataError(f"take_batch: size must be positive, got {size}")
    return [examples[(start + i) % len(examples)] for i in range(size)]


# --------------------------------------------------------------------------- cleaning


# DAPO-Math-17k wraps every problem in this instruction, which conflicts with a \boxed{} protocol.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

# Control characters that appear when LaTeX went through a string un-escaped: "\frac" -> form feed + "rac".
_CONTROL_REPAIRS = {"\x0c": "\\f", "\x08": "\\b", "\x07": "\\a", "\x0b": "\\v"}


def strip_dapo_template(text: str) -> str:
    """Remove DAPO's prompt prefix and suffix; text without them is returned unchanged."""
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX) :]
    if text.endswith(DAPO_SUFFIX):
        text = text[: -len(DAPO_SUFFIX)]
    return text


def clean_text(text: str) -> tuple[str, bool]:
    """Normalise line ends, repair control characters from un-escaped LaTeX, strip. Returns (text, repaired)."""
    text = text.replace("\r\n", "\n")
    repaired = any(char in text for char in _CONTROL_REPAIRS)
    for char, replacement in _CONTROL_REPAIRS.items():
        text = text.replace(char, replacement)
    return text.strip(), repaired


def normalize_question(text: str) -> str:
    """Key for dedupe: Unicode-compatible form, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _normalize_answer(text: str) -> str:
    return "".join(text.strip().strip("$").split())


# --------------------------------------------------------------------------- reading sources


@dataclass
class RawRow:
    where: str  # "file.jsonl:12" or "hub_id[split] row 12": used in every error message
    fields: dict[str, Any]


def read_local_rows(path: str | Path) -> Iterator[RawRow]:
    """Rows of a local JSONL / JSON / parquet file, or of a folder written by `datasets`."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        yield from _dataset_rows(_load_local_dataset(path), str(path))
    elif path.suffix == ".jsonl":
        for line_no, line in text_lines(path):
            if line.strip():
                yield RawRow(f"{path}:{line_no}", _parse_json_line(line, path, line_no))
    elif path.suffix == ".json":
        try:
            data = json.loads(read_text(path))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
        rows = data.get("data") if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a list of objects (or {{'data': [...]}})")
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataError(f"{path}: item {index} is not an object")
            yield RawRow(f"{path} item {index}", row)
    elif path.suffix == ".parquet":
        for index, row in enumerate(read_parquet(path)):
            yield RawRow(f"{path} row {index}", row)
    else:
        raise DataError(f"{path}: unsupported file type {path.suffix!r} (use .jsonl, .json, .parquet or a folder)")


def _load_local_dataset(path: Path) -> Any:
    import datasets

    try:
        if (path / "dataset_info.json").exists() or (path / "state.json").exists():
            loaded = datasets.load_from_disk(str(path))
            return loaded["train"] if isinstance(loaded, datasets.DatasetDict) else loaded
        return datasets.load_dataset(str(path), split="train")
    except Exception as exc:  # arrow, json or a missing split: datasets' own errors name neither file nor fix
        first_line = (str(exc).splitlines() or [""])[0]
        raise DataError(
            f"{path}: not a readable dataset folder ({type(exc).__name__}: {first_line}); "
            "expected a folder written by `datasets` save_to_disk or data files `datasets` can load"
        ) from None


def read_hub_rows(hub_id: str, revision: str, split: str, path_key: str = "data.path") -> Iterator[RawRow]:
    """Rows of a hub dataset (downloads on first use; honours HF_HUB_OFFLINE and the local cache). `path_key`
    is the config key that takes a local copy instead, named in the error when the hub cannot be reached."""
    import datasets

    try:
        dataset = datasets.load_dataset(hub_id, revision=revision, split=split)
    except Exception as exc:  # network, auth, missing split: say which dataset and how to avoid the hub
        raise DataError(
            f"could not load hub dataset {hub_id!r} (revision {revision!r}, split {split!r}): {exc}. "
            f"Offline? Pass a local copy with {path_key}=FILE_OR_FOLDER."
        ) from exc
    yield from _dataset_rows(dataset, f"{hub_id}[{split}]")


@functools.lru_cache(maxsize=64)  # asked by the data loader and by the provenance record of the same run
def resolve_hub_revision(hub_id: str, revision: str) -> str | None:
    """The commit a branch or tag points to now, recorded so that a run can be pinned afterwards (None offline)."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(hub_id, revision=revision).sha
    except Exception:  # offline, a local folder as hub_id, or no such repo: nothing to record
        return None


def _dataset_rows(dataset: Any, name: str) -> Iterator[RawRow]:
    for index, row in enumerate(dataset):
        yield RawRow(f"{name} row {index}", dict(row))


def read_source_rows(cfg: DataConfig, path_key: str = "data.path") -> Iterator[RawRow]:
    """Rows of a data section; `path_key` is the config key of its local copy (data.path, benchmark.data.path,
    decontam.benchmark_paths.NAME), named in errors."""
    if cfg.path:
        return read_local_rows(cfg.path)
    if not cfg.hub_id:
        raise DataError(f"source {cfg.source.value} needs a hub_id or a local copy ({path_key}=FILE_OR_FOLDER)")
    return read_hub_rows(cfg.hub_id, cfg.revision, cfg.split, path_key)


def get_path(row: dict[str, Any], dotted: str, where: str) -> Any:
    """`row["a"]["b"][0]` for "a.b.0"; a missing step raises naming the row and the column."""
    value: Any = row
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            available = ", ".join(sorted(row)) if isinstance(row, dict) else "?"
            raise DataError(f"{where}: column {dotted!r} not found (row has: {available})")
    return value


def _as_text(value: Any, where: str, column: str) -> str:
    """A cell as text: strings and numbers as they are; a chat message list as its last user message."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        user = [m["content"] for m in value if m.get("role", "user") == "user"]
        if user and isinstance(user[-1], str):
            return user[-1]
    if value is None:
        return ""
    raise DataError(f"{where}: column {column!r} holds {type(value).__name__}, expected text")


# --------------------------------------------------------------------------- examples, dedupe, split


@dataclass
class PrepareStats:
    read: int = 0
    kept_train: int = 0
    kept_dev: int = 0
    dropped: Counter[str] = field(default_factory=Counter[str])  # reason -> rows
    repaired: Counter[str] = field(default_factory=Counter[str])  # repair -> rows
    resolved_revision: str | None = None  # the hub commit that was read, when known


def to_examples(rows: Iterable[RawRow], cfg: DataConfig, stats: PrepareStats) -> list[MathExample]:
    """Map, clean and validate source rows. Empty rows are dropped and counted, bad columns raise."""
    examples: list[MathExample] = []
    for index, raw in enumerate(rows):
        stats.read += 1
        question = _as_text(get_path(raw.fields, cfg.columns.question, raw.where), raw.where, cfg.columns.question)
        answer = _as_text(get_path(raw.fields, cfg.columns.answer, raw.where), raw.where, cfg.columns.answer)
        if cfg.strip_dapo_template:
            stripped = strip_dapo_template(question)
            if stripped != question:
                stats.repaired["dapo_template_stripped"] += 1
            question = stripped
        question, repaired_q = clean_text(question)
        answer, repaired_a = clean_text(answer)
        if repaired_q or repaired_a:
            stats.repaired["control_chars"] += 1
        if not question or not answer:
            stats.dropped["empty_question_or_answer"] += 1
            continue
        if cfg.columns.id:
            example_id = str(get_path(raw.fields, cfg.columns.id, raw.where)).strip()
            if not example_id:
                raise DataError(f"{raw.where}: column {cfg.columns.id!r} (id) is empty")
        else:
            example_id = f"{cfg.name}-{index}"
        code = raw.fields.get("solution_code")
        examples.append(MathExample(example_id, question, answer, cfg.name, code if isinstance(code, str) else ""))
    return examples


def dedupe(examples: list[MathExample], stats: PrepareStats) -> list[MathExample]:
    """Keep the first copy of each normalised question; drop every copy of a question whose copies
    disagree on the answer (we cannot tell which reference is right). Ids are made unique."""
    groups: dict[str, list[MathExample]] = defaultdict(list)
    for example in examples:
        groups[normalize_question(example.question)].append(example)
    kept: list[MathExample] = []
    used_ids: set[str] = set()
    for copies in groups.values():  # dicts keep first-seen order: output order follows the input
        if len({_normalize_answer(c.answer) for c in copies}) > 1:
            stats.dropped["conflicting_answers"] += len(copies)
            continue
        if len(copies) > 1:
            stats.dropped["duplicate_question"] += len(copies) - 1
        first = copies[0]
        example_id, n = first.id, 1
        while example_id in used_ids:
            n += 1
            example_id = f"{first.id}#{n}"
        used_ids.add(example_id)
        kept.append(first if example_id == first.id else replace(first, id=example_id))
    return kept


def split_dev(examples: list[MathExample], dev_size: int, seed: int) -> tuple[list[MathExample], list[MathExample]]:
    """Seeded split into (train, dev); both keep the input order."""
    if dev_size == 0:
        return list(examples), []
    if dev_size >= len(examples):
        raise DataError(f"data.dev_size={dev_size} leaves no training examples ({len(examples)} examples after dedupe)")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    dev_index = set(order[:dev_size])
    train = [e for i, e in enumerate(examples) if i not in dev_index]
    dev = [e for i, e in enumerate(examples) if i in dev_index]
    return train, dev


def prepare_dataset(
    cfg: DataConfig, seed: int, path_key: str = "data.path"
) -> tuple[list[MathExample], list[MathExample], PrepareStats]:
    """Source -> cleaned, deduplicated (train, dev) examples and the counts behind them. `path_key`: the config
    key of a local copy of this source, for error messages."""
    stats = PrepareStats()
    if cfg.source is DataSource.synthetic and not cfg.path:
        rows: Iterable[RawRow] = (RawRow(where, row) for where, row in generate_rows(cfg.synthetic, seed, cfg.name))
    else:
        rows = read_source_rows(cfg, path_key)
        if cfg.hub_id and not cfg.path:
            stats.resolved_revision = resolve_hub_revision(cfg.hub_id, cfg.revision)
    examples = dedupe(to_examples(rows, cfg, stats), stats)
    if not examples:
        raise DataError(f"no usable examples in data source {cfg.name!r} ({stats.read} rows read)")
    train, dev = split_dev(examples, cfg.dev_size, seed)
    if cfg.max_examples is not None and len(train) > cfg.max_examples:
        stats.dropped["over_max_examples"] += len(train) - cfg.max_examples
        train = train[: cfg.max_examples]
    stats.kept_train, stats.kept_dev = len(train), len(dev)
    return train, dev, stats


def training_examples(config: RetoolConfig) -> tuple[list[MathExample], list[MathExample]]:
    """The training questions in this run's one seeded order (steps take consecutive slices), and the dev split
    of the `data` section for periodic evals. A bad or empty file fails here, naming its key."""
    t = config.trainer
    if t.train_file:  # the `data` section is read only for the dev split of periodic evals, when none lies beside
        examples = load_examples(t.train_file, "trainer.train_file")
        dev_file = Path(t.train_file).with_name("dev.jsonl")
        if not t.eval_every:
            dev_split = []
        elif dev_file.is_file():
            dev_split = load_examples(str(dev_file), "trainer.train_file's dev.jsonl")
        else:
            dev_split = prepare_dataset(config.data, config.seed)[1]
    else:
        examples, dev_split, _ = prepare_dataset(config.data, config.seed)
    random.Random(config.seed).shuffle(examples)
    return examples, dev_split
