"""retool report: run folders (prepare, sft, train, eval...) -> one self-contained report.html (report/page.py)."""

from __future__ import annotations

from pathlib import Path

from retool_cli.report.page import write_report


def run(paths: list[Path], out: Path | None, compare: list[Path] | None, max_trajectories: int, max_chars: int) -> Path:
    """Write out/report.html (default: in the first folder) and say what it holds; the file written."""
    path, summary = write_report(
        paths, out or paths[0], tuple(compare) if compare else None, max_trajectories, max_chars
    )
    print(f"wrote {path}: {summary}")
    return path
