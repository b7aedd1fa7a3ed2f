"""Where a run's checkpoints live, which of them are complete, and what each was trained with. Torch-free:
evaluation, run keys and provenance read checkpoints without importing the trainer (rl/checkpoints.py writes
and loads them).

A checkpoint is `RUN/checkpoints/step_N/`: the model in HF format with its tokenizer files and chat template,
trainer_state.pt, and `retool_checkpoint.json`, written last, which records what it was trained with (the
model it descends from, the tool protocol, the tokenizer class, the whole config) and the size of every file
beside it. A folder whose files do not match that record (a copy cut short, a file deleted) is not complete:
resume passes over it to the previous complete one, and `ckpt=` / `trainer.init_from` refuse it, naming the
file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from retool_cli.config import ProtocolConfig, RetoolConfig, plain_values
from retool_cli.errors import ConfigError

RECORD = "retool_checkpoint.json"


def step_of(folder: Path) -> int:
    return int(folder.name.split("_")[1])


def write_record(folder: Path, record: dict[str, Any]) -> None:
    """The record, with the size of every file in `folder` (written before it), as its last file."""
    files = {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != RECORD
    }
    (folder / RECORD).write_text(json.dumps({**record, "files": files}, indent=2, ensure_ascii=False) + "\n")


def record_of(config: RetoolConfig) -> dict[str, Any]:
    """What a checkpoint of this run is trained with (its tokenizer files and chat template are saved beside)."""
    from omegaconf import OmegaConf

    protocol = OmegaConf.to_container(OmegaConf.structured(config.protocol), enum_to_str=True)
    return {
        "command": config.command,
        "base_model": base_model(config.model.name_or_path),
        "tokenizer_class": config.model.tokenizer_class,
        "protocol": protocol,
        # the whole config: a checkpoint copied out of its run folder still knows its setting and seed
        # (run_keys.training_record)
        "config": plain_values(config),
    }


def protocol_of(record: dict[str, Any]) -> ProtocolConfig | None:
    """The protocol section a checkpoint was trained with (keys a later version added keep their defaults)."""
    from omegaconf import OmegaConf

    saved = record.get("protocol")
    if not isinstance(saved, dict):
        return None
    known = {k: v for k, v in saved.items() if k in ProtocolConfig.__dataclass_fields__}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ProtocolConfig), known))  # type: ignore[return-value]


def read_record(folder: Path) -> dict[str, Any] | None:
    """What the checkpoint was trained with; None for a folder without a record (a model from elsewhere)."""
    path = folder / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable checkpoint record ({exc}); the checkpoint is damaged") from None
    return record if isinstance(record, dict) else None


def problem_with(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint (a missing or cut-short file, named), or None when it is. A
    folder without a record (written elsewhere) needs config.json and, as a training checkpoint, trainer_state.pt."""
    try:
        record = read_record(folder)
    except ConfigError as exc:
        return str(exc)
    if record is None:
        missing = [name for name in ("config.json", "trainer_state.pt") if not (folder / name).is_file()]
        return f"{folder / missing[0]} is missing" if missing else None
    for name, size in record.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{path} has {actual} bytes, the checkpoint wrote {size} (cut short or replaced)"
    return None


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders, oldest first (complete or not)."""
    found = [p for p in (run_dir / "checkpoints").glob("step_*") if p.name.split("_")[1].isdigit()]
    return sorted(found, key=step_of)


def latest_checkpoint(run_dir: Path, warn: Any = None) -> Path | None:
    """The run's latest complete checkpoint, or None: what `sft`/`train` resume from and what `ckpt=RUN_FOLDER`
    evaluates. A later incomplete one is passed over (and reported through `warn`, a logging function)."""
    for folder in reversed(checkpoints(run_dir)):
        problem = problem_with(folder)
        if problem is None:
            return folder
        if warn is not None:
            warn("passing over the incomplete checkpoint %s: %s", folder.name, problem)
    return None


def resolve_checkpoint(path: str, key: str) -> Path:
    """The checkpoint `key` (ckpt, trainer.init_from) names: a checkpoint or model folder as is, a training run
    folder -> its latest complete checkpoint. An error naming the key and the file when there is none."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ConfigError(f"{key}={path}: no such folder")
    if not folder.is_dir():
        raise ConfigError(f"{key}={path}: a file, not a checkpoint or run folder")
    if (folder / "config.json").exists() or (folder / RECORD).exists():
        problem = problem_with(folder) if (folder / RECORD).exists() else None
        if problem is not None:
            raise ConfigError(f"{key}={path}: an incomplete checkpoint: {problem}")
        return folder
    latest = latest_checkpoint(folder)
    if latest is None:
        found = checkpoints(folder)
        detail = f"; {found[-1].name}: {problem_with(found[-1])}" if found else ""
        raise ConfigError(
            f"{key}={path}: neither a model folder (no config.json) nor a run folder with a complete "
            f"checkpoints/step_N{detail}"
        )
    return latest


def base_model(path: str) -> str:
    """The model a checkpoint descends from (its record's), or `path` itself for anything else."""
    folder = Path(path)
    record = read_record(folder) if folder.is_dir() else None
    return str(record["base_model"]) if record and record.get("base_model") else path


def same_model(a: str, b: str) -> bool:
    """Two model names or paths that name the same thing (paths compared resolved)."""
    if a == b:
        return True
    return os.path.exists(a) and os.path.exists(b) and Path(a).resolve() == Path(b).resolve()
