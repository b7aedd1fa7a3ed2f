"""`retool decontaminate` end to end on local benchmark files in the hub layout."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import read_jsonl, run_retool, write_jsonl

AIME = [
    {
        "id": 60,
        "problem": "Every morning Aya goes for a 9-kilometer-long walk and stops at a coffee shop afterwards. "
        "When she walks at a constant speed of s kilometers per hour, the walk takes her 4 hours.",
        "answer": "204",
    },
    {
        "id": 61,
        "problem": "Find the number of triangles with vertices on a 5 by 5 grid whose area is exactly 3 and whose "
        "sides avoid the grid's center point entirely.",
        "answer": "017",
    },
    {"id": 62, "problem": "Simplify $\\sqrt{242}$.", "answer": "11\\sqrt{2}"},  # one 3-gram: a short problem
]


def test_decontaminate_outputs_are_consistent(tmp_path: Path) -> None:
    bench = write_jsonl(tmp_path / "aime.jsonl", AIME)
    train = [
        {"id": "copy", "question": "Problem: " + AIME[0]["problem"], "answer": "204", "data_source": "t"},
        {
            "id": "edited",
            "question": AIME[1]["problem"].replace("entirely", "completely").replace("exactly", "precisely"),
            "answer": "17",
            "data_source": "t",
        },
        {
            "id": "short-inside",
            "question": "Warm-up first. Simplify $\\sqrt{242}$. Then explain each step.",
            "answer": "11\\sqrt{2}",
            "data_source": "t",
        },
        {
            "id": "clean",
            "question": "What is 12 * 34? Use the table of products to check your work carefully.",
            "answer": "408",
            "data_source": "t",
        },
        {
            "id": "boiler",
            "question": "A bag holds 3 red balls; find the number of ways to draw 2 of them, where m and "
            "n are relatively prime positive integers and whose area is exactly 3.",
            "answer": "3",
            "data_source": "t",
        },
    ]
    source = write_jsonl(tmp_path / "train.jsonl", train)
    proc = run_retool(
        "decontaminate",
        f"decontam.input={source}",
        "decontam.benchmarks=[aime24]",
        f"decontam.benchmark_paths.aime24={bench}",
        "hydra.run.dir=out",
        cwd=tmp_path,
        check=True,
    )
    clean, removed = (
        read_jsonl(tmp_path / "out" / "clean.jsonl"),
        read_jsonl(tmp_path / "out" / "removed.jsonl"),
    )
    assert sorted(r["id"] for r in removed) == ["copy", "edited", "short-inside"]
    assert sorted(r["id"] for r in clean) == ["boiler", "clean"]
    assert {r["id"] for r in clean} | {r["id"] for r in removed} == {r["id"] for r in train}  # every row accounted for
    assert removed[0]["benchmark"] == "aime24" and removed[0]["item_id"] in ("60", "61", "62")
    assert removed[0]["coverage"] > 0.25
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (report["rows"], report["kept"], report["removed"]) == (5, 2, 3)
    assert report["benchmarks"]["aime24"]["flagged_rows"] == 3
    assert "aime24" in proc.stdout
    bad = run_retool("decontaminate", f"decontam.input={source}", "decontam.benchmarks=[nope]", cwd=tmp_path)
    assert bad.returncode == 1 and "unknown benchmark 'nope'" in bad.stdout + bad.stderr
