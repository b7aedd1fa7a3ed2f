"""retool prepare: a data source -> train.jsonl, dev.jsonl and manifest.json in the run folder."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from retool_cli import __version__
from retool_cli.config import RetoolConfig
from retool_cli.data.dataset import PrepareStats, prepare_dataset
from retool_cli.files import sha256_file, write_json, write_jsonl

log = logging.getLogger(__name__)


def run(config: RetoolConfig, run_dir: Path) -> None:
    data = config.data
    log.info("preparing %s (source=%s) into %s", data.name, data.source.value, run_dir)
    started = time.perf_counter()
    train, dev, stats = prepare_dataset(data, config.seed)

    # Write each file to a temporary name, rename only when all are complete: a crash leaves
    # either every output or none.
    outputs = {"train.jsonl": train, "dev.jsonl": dev}
    for name, examples in outputs.items():
        write_jsonl(run_dir / name, [e.to_dict() for e in examples])
    manifest = {
        "retool_version": __version__,
        "source": data.source.value,
        "name": data.name,
        "hub_id": None if data.path else data.hub_id,
        "revision": None if data.path else data.revision,
        "resolved_revision": stats.resolved_revision,  # the commit read; pass it as data.revision to pin
        "path": data.path,
        "seed": config.seed,
        "counts": {
            "read": stats.read,
            "kept": stats.kept_train + stats.kept_dev,
            "train": stats.kept_train,
            "dev": stats.kept_dev,
            "dropped": dict(stats.dropped),
            "repaired": dict(stats.repaired),
        },
        "files": {name: {"rows": len(ex), "sha256": sha256_file(run_dir / name)} for name, ex in outputs.items()},
        "config": OmegaConf.to_container(OmegaConf.structured(config), resolve=True, enum_to_str=True),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_json(run_dir / "manifest.json", manifest)
    _print_summary(data.name, stats, run_dir)


def _print_summary(name: str, stats: PrepareStats, run_dir: Path) -> None:
    table = Table(title=f"retool prepare: {name}", show_header=True)
    table.add_column("count")
    table.add_column("rows", justify="right")
    table.add_row("read", str(stats.read))
    for reason, rows in sorted(stats.dropped.items()):
        table.add_row(f"dropped: {reason}", str(rows))
    for repair, rows in sorted(stats.repaired.items()):
        table.add_row(f"repaired: {repair}", str(rows))
    table.add_row("train.jsonl", str(stats.kept_train), style="bold")
    table.add_row("dev.jsonl", str(stats.kept_dev), style="bold")
    Console().print(table)
    log.info("wrote %s", run_dir)
