"""retool eval-report: eval run folders -> report.md, report.json and report.png (results over seeds, each result
compared with the one before it problem by problem; eval/over_seeds.py)."""

from __future__ import annotations

from pathlib import Path

from retool_cli.eval.over_seeds import collect, group_rows, paired_comparisons, run_row
from retool_cli.eval.tables import markdown, plot
from retool_cli.files import atomic_open, write_json


def run(folders: list[Path], out: Path | None = None) -> Path:
    """Write the three files into `out` (default: the first folder), print the table; the folder written."""
    rows = [run_row(results) for results in collect(folders)]
    groups = group_rows(rows)
    pairs = paired_comparisons(groups)
    out = out or folders[0]
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, groups, pairs)
    with atomic_open(out / "report.md") as handle:
        handle.write(text)
    write_json(out / "report.json", {"results": groups, "paired_comparisons": pairs, "runs": rows})
    plot(rows, groups, out / "report.png")
    print(text)
    print(f"wrote {out / 'report.md'}, {out / 'report.json'} and {out / 'report.png'}")
    return out
