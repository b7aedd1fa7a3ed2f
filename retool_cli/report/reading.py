"""What `retool report` reads: the run folders under the paths it is given, each as one record.

    paths --find_runs--> run folders (provenance.json, metrics.jsonl or results.json in them)
      --read_run--> {name, command, provenance, key config values, training curves, eval results}
    samples.jsonl (eval) and rollouts.jsonl (train) --index_trajectories--> per row: problem, verdict, offset
      --bounded--> the rows the browser shows, read back by offset (whole problems sampled with a fixed seed;
      long texts cut in the middle), with the counts of what was left out

Every file is read as the commands write it; a file that is not theirs is an error that names it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml

from retool_cli.errors import DataError
from retool_cli.files import iter_jsonl_log, read_jsonl_log

# Config values shown on a run's card: what a reader needs to tell runs apart (all of it is in
# .hydra/config.yaml in the run folder).
CARD_KEYS = {
    "train": [
        "seed", "model.name_or_path", "trainer.init_from", "rollout.engine", "trainer.total_steps",
        "trainer.questions_per_step", "rollout.group_size", "trainer.lr", "trainer.advantage", "trainer.loss_agg",
        "trainer.clip_low", "trainer.clip_high", "trainer.kl_coef", "reward.function", "rollout.max_turns",
        "rollout.max_response_tokens", "rollout.temperature", "protocol.name",
    ],
    "eval": [
        "seed", "model.name_or_path", "ckpt", "rollout.engine", "benchmark.name", "benchmark.n_samples",
        "benchmark.temperature", "benchmark.top_p", "benchmark.max_response_tokens", "rollout.max_turns",
        "protocol.name",
    ],
    "other": ["seed", "model.name_or_path", "data.source", "data.name"],
}  # fmt: skip
RUN_FILES = ("provenance.json", "metrics.jsonl", "results.json")
# the system prompt each tool protocol puts before the question (config.ProtocolConfig)
SYSTEM_PROMPT_KEY = {
    "retool_tags": "system_prompt",
    "chat_tool": "chat_tool_system_prompt",
    "none": "text_only_system_prompt",
}


def find_runs(paths: list[Path]) -> list[Path]:
    """Run folders at or under each path, in the order the paths are given (sorted within one path)."""
    found: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise DataError(f"{path}: no such folder")
        folders = sorted({f.parent for name in RUN_FILES for f in path.rglob(name) if "checkpoints" not in f.parts})
        found += [f for f in folders if f not in found]
    if not found:
        raise DataError(f"no run folders (with {', '.join(RUN_FILES)}) under {', '.join(map(str, paths))}")
    return found


def read_run(folder: Path, index: int) -> dict[str, Any]:
    """One run: what the report's cards, curves and tables show (no trajectories: see bounded)."""
    provenance = _read_json(folder / "provenance.json") if (folder / "provenance.json").exists() else {}
    results = _read_json(folder / "results.json") if (folder / "results.json").exists() else None
    config = _read_yaml(folder / ".hydra" / "config.yaml")
    words = provenance.get("command_line", "").split()
    command = config.get("command") or (words[1] if len(words) > 1 else "?")
    if results is not None:
        command = "eval"
    keys = CARD_KEYS.get(command, CARD_KEYS["other"])
    card = {key: value for key in keys if (value := _lookup(config, key)) is not None}
    if "protocol.name" in card:  # what the model saw before each question
        card["system prompt"] = _lookup(config, f"protocol.{SYSTEM_PROMPT_KEY.get(card['protocol.name'], '')}")
    return {
        "id": f"run{index}",
        "folder": str(folder),
        "name": command if folder.name == command else f"{command} {folder.name}",
        "command": command,
        "provenance": provenance,
        "config": card,
        "metrics": read_jsonl_log(folder / "metrics.jsonl"),
        "results": results,
    }


def index_trajectories(path: Path) -> list[dict[str, Any]]:
    """A run's samples.jsonl or rollouts.jsonl as an index: per trajectory its problem, training step, verdict
    and where its row starts in the file. The draw and the comparison need no more, and the rows the page shows
    are read back by `load_rows`: a log of any size is read in little memory."""
    index = []
    for start, _, row in iter_jsonl_log(path):
        if "problem_id" not in row:
            with open(path, "rb") as handle:
                line = 1 + handle.read(start).count(b"\n")
            raise DataError(f"{path}:{line}: a row without problem_id (not a samples or rollouts file)")
        index.append(
            {"problem_id": row["problem_id"], "step": row.get("step"), "correct": bool(row.get("correct")), "at": start}
        )
    return index


def load_rows(path: Path, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole rows behind index entries (from `index_trajectories(path)`), in the entries' order."""
    rows = []
    with open(path, "rb") as handle:
        for entry in entries:
            handle.seek(entry["at"])
            rows.append(json.loads(handle.readline()))
    return rows


def bounded(
    index: list[dict[str, Any]], path: Path, run_id: str, max_rows: int, max_chars: int, seed: int = 0
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A run's eval samples or training rollouts for the page, tagged with the run, at most `max_rows` of them:
    whole problems (all their samples; a training step's problems apart) drawn with `seed` when there are more,
    read back from `path` and each cut to `max_chars`. Returns the rows and the counts {total, shown, problems,
    problems_shown}."""
    by_problem: dict[str, list[dict]] = {}
    for entry in index:
        step = "" if entry["step"] is None else entry["step"]
        by_problem.setdefault(f"{step}/{entry['problem_id']}", []).append(entry)
    keys = list(by_problem)
    if len(index) > max_rows:
        random.Random(seed).shuffle(keys)
        chosen, count = set(), 0
        for key in keys:
            if count + len(by_problem[key]) <= max_rows:
                chosen.add(key)
                count += len(by_problem[key])
        keys = [key for key in by_problem if key in chosen]  # in file order
    rows = load_rows(path, [entry for key in keys for entry in by_problem[key]])
    shown = [trim(dict(row, run=run_id), max_chars) for row in rows]
    counts = {"total": len(index), "shown": len(shown), "problems": len(by_problem), "problems_shown": len(keys)}
    return shown, counts


def trajectory_file(run: dict[str, Any]) -> Path:
    """Where a run keeps its trajectories: an eval's samples, a training run's kept rollouts."""
    return Path(run["folder"]) / ("samples.jsonl" if run["command"] == "eval" else "rollouts.jsonl")


def trim(row: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """A trajectory with its text cut to about `max_chars` characters: each segment keeps its share from both
    ends (the start shows the approach, the end the answer), the cut marked with how much was left out."""
    segments = row.get("segments") or [["model", row.get("text", "")]]
    total = sum(len(text) for _, text in segments)
    if total > max_chars:
        cut = []
        for kind, text in segments:
            keep = max(200, max_chars * len(text) // total)
            if len(text) > keep:
                note = f"\n[... {len(text) - keep} characters cut by the report ...]\n"
                text = text[: keep // 2] + note + text[-keep // 2 :]
            cut.append([kind, text])
        segments = cut
    row["segments"] = segments
    row.pop("text", None)
    return row


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: expected a JSON object")
    return value


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        value = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: malformed YAML ({exc})") from None
    return value if isinstance(value, dict) else {}


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value
