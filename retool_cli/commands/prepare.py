"""retool prepare: a data source -> train.jsonl, dev.jsonl and manifest.json in the run folder.

All three are written complete into a staging folder first (`.prepare-staging`), then renamed into the run folder,
the manifest last, and the staging folder removed: a crash while writing leaves none of them in place. A crash
in the instant between the renames leaves the staging folder behind; every reader of a problems file refuses a
file beside one (data.dataset.load_jsonl) and the next `prepare` into the folder starts over."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from retool_cli import __version__
from retool_cli.config import RetoolConfig, plain_values
from retool_cli.data.dataset import STAGING_FOLDER, MathExample, PrepareStats, prepare_dataset
from retool_cli.env.reward import unreadable_answers
from retool_cli.errors import DataError
from retool_cli.faults import die_if_due
from retool_cli.files import sha256_file, write_json, write_jsonl

log = logging.getLogger(__name__)


def run(config: RetoolConfig, run_dir: Path) -> None:
    data = config.data
    log.info("preparing %s (source=%s) into %s", data.name, data.source.value, run_dir)
    started = time.perf_counter()
    staging = run_dir / STAGING_FOLDER
    shutil.rmtree(staging, ignore_errors=True)  # an earlier prepare into this folder that did not finish
    train, dev, stats = prepare_dataset(data, config.seed)
    unreadable = check_answers(config, train + dev)
    outputs = {"train.jsonl": train, "dev.jsonl": dev}
    try:
        for written, (name, examples) in enumerate(outputs.items(), start=1):
            write_jsonl(staging / name, [e.to_dict() for e in examples])
            die_if_due("file", written)  # the all-or-none test's fault injection (RETOOL_DIE_AFTER=file:N)
        write_json(staging / "manifest.json", _manifest(config, stats, unreadable, staging, outputs, started))
    except Exception:  # a full disk, say: nothing was placed yet, so nothing of this run stays
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for placed, name in enumerate([*outputs, "manifest.json"], start=1):
        (staging / name).replace(run_dir / name)
        die_if_due("placed", placed)
    staging.rmdir()
    _print_summary(data.name, stats, run_dir)


def check_answers(config: RetoolConfig, examples: list[MathExample]) -> int:
    """How many reference answers no answer can match; refused unless data.allow_unreadable_answers."""
    bad = [examples[i] for i in unreadable_answers([e.answer for e in examples], config.reward)]
    if not bad:
        return 0
    shown = "; ".join(f"{e.id}: {e.answer!r}" for e in bad[:3]) + (" ..." if len(bad) > 3 else "")
    if not config.data.allow_unreadable_answers:
        raise DataError(
            f"{len(bad)} of {len(examples)} examples have a reference answer the judge cannot match even to itself "
            f"({shown}): every answer would score 0 on them. Fix or drop them, or keep them with "
            "data.allow_unreadable_answers=true"
        )
    log.warning("%d examples kept with a reference answer no answer can match (%s)", len(bad), shown)
    return len(bad)


def _manifest(
    config: RetoolConfig, stats: PrepareStats, unreadable: int, staging: Path, outputs: dict[str, list], started: float
) -> dict[str, Any]:
    """manifest.json: what was read, kept and dropped, each file's rows and sha256, the config."""
    data = config.data
    return {
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
            "unreadable_answers": unreadable,
        },
        "files": {name: {"rows": len(ex), "sha256": sha256_file(staging / name)} for name, ex in outputs.items()},
        "config": plain_values(config),
        "seconds": round(time.perf_counter() - started, 3),
    }


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
