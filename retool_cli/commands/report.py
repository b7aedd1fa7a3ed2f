"""retool report: run folders (prepare, sft, train, eval...) -> one self-contained report.html (report/page.py)."""

from __future__ import annotations

from pathlib import Path

from retool_cli.report.page import write_report


def run(paths: list[Path], out: Path | None, compare: list[Path] | None, max_trajectories: int, max_chars: int) -> Path:
    """Write out/report.html (default: in the first folder) and say what it holds; the file written."""
    pair = (compare[0], compare[1]) if compare else None  # cli.py checked that there are two
    path, summary = write_report(paths, out or paths[0], pair, max_trajectories, max_chars)
    print(f"wrote {path}: {summary}")
    return path
