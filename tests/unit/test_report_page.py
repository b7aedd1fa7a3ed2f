"""The pieces of `retool report`: bounding, cutting, settings, comparison, charts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool_cli.errors import DataError
from retool_cli.files import append_jsonl, iter_jsonl_log, read_jsonl_log, write_jsonl
from retool_cli.report.analysis import compare, metric_value, representative, setting_of, training_series
from retool_cli.report.reading import bounded, index_trajectories, load_rows, trim
from retool_cli.report.svg import Series, _ticks, line_chart


def sample(problem: str, index: int, correct: bool, **extra) -> dict:
    return {"problem_id": problem, "sample_index": index, "correct": correct, "segments": [["model", "x"]], **extra}


def test_trim_keeps_both_ends_of_each_segment_and_says_how_much_was_cut() -> None:
    row = {"segments": [["model", "A" * 5000 + "B" * 5000], ["tool", "out"], ["model", "end \\boxed{7}"]]}
    cut = trim(dict(row), 2000)
    text = cut["segments"][0][1]
    assert text.startswith("A" * 400) and text.endswith("B" * 400) and "characters cut by the report" in text
    assert cut["segments"][1] == ["tool", "out"] and cut["segments"][2][1] == "end \\boxed{7}"  # short ones kept
    assert sum(len(t) for _, t in cut["segments"]) < 2000 + 600
    assert trim({"segments": [["model", "short"]]}, 2000)["segments"] == [["model", "short"]]
    assert trim({"text": "an old row"}, 2000)["segments"] == [["model", "an old row"]]  # samples from before segments


def test_bounded_draws_whole_problems_with_a_fixed_seed(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    write_jsonl(path, [sample(f"p{p}", i, i == 0) for p in range(10) for i in range(4)])
    index = index_trajectories(path)
    assert set(index[0]) == {"problem_id", "step", "correct", "at"}  # the index holds no text
    shown, counts = bounded(index, path, "run0", max_rows=13, max_chars=1000)
    assert counts == {"total": 40, "shown": 12, "problems": 10, "problems_shown": 3}
    problems = {t["problem_id"] for t in shown}
    assert all(sum(t["problem_id"] == p for t in shown) == 4 for p in problems)  # whole problems only
    assert [t["problem_id"] for t in shown] == sorted((t["problem_id"] for t in shown), key=lambda p: int(p[1:]))
    assert [t["segments"] for t in shown] == [[["model", "x"]]] * 12  # read back from the file whole
    assert bounded(index, path, "run0", 13, 1000)[0] == shown  # the same draw every time
    assert all(t["run"] == "run0" for t in shown)
    everything, counts = bounded(index, path, "run0", max_rows=100, max_chars=1000)
    assert len(everything) == 40 and counts["shown"] == 40
    assert [(t["problem_id"], t["sample_index"]) for t in everything] == [
        (f"p{p}", i) for p in range(10) for i in range(4)
    ]


def test_the_index_reads_rows_back_by_offset_and_names_a_row_that_is_not_a_sample(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    rows = [sample("p1", 0, True, step=1, text="\u00e9" * 50), sample("p1", 0, False, step=2)]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n")  # multi-byte, a blank line
    index = index_trajectories(path)
    assert [(e["step"], e["correct"]) for e in index] == [(1, True), (2, False)]
    assert load_rows(path, index[::-1]) == rows[::-1]
    with open(path, "a") as handle:
        handle.write('{"step": 3}\n')
    with pytest.raises(DataError, match=r"rollouts.jsonl:4: a row without problem_id"):
        index_trajectories(path)


def test_a_torn_last_line_is_skipped_but_a_bad_line_inside_is_named(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_jsonl_log(path) == [{"a": 1}, {"a": 2}]
    assert [(start, end) for start, end, _ in iter_jsonl_log(path)] == [(0, 9), (9, 18)]
    assert path.read_text().endswith('{"a": ')  # a reader (the report) leaves the file as it is
    assert read_jsonl_log(path, cut_torn_tail=True) == [{"a": 1}, {"a": 2}]
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'  # a resuming run appends after whole lines
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(DataError, match=r"samples.jsonl:2: malformed JSON"):
        read_jsonl_log(path, cut_torn_tail=True)
    assert path.read_text() == '{"a": 1}\nnot json\n{"a": 3}\n'  # nothing cut after a bad line inside
    assert read_jsonl_log(tmp_path / "absent.jsonl") == []


def test_a_last_row_cut_before_its_newline_is_cut_when_resuming(tmp_path: Path) -> None:
    """A kill between a row's text and its newline: the row reads, but an append would join the next row to
    it; a resuming run cuts it (and redoes it), a reader keeps it."""
    path = tmp_path / "samples.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    assert read_jsonl_log(path) == [{"a": 1}, {"a": 2}]
    assert read_jsonl_log(path, cut_torn_tail=True) == [{"a": 1}]
    append_jsonl(path, [{"a": 3}])
    assert read_jsonl_log(path) == [{"a": 1}, {"a": 3}]
    path.write_text('{"a": 1}')
    assert read_jsonl_log(path, cut_torn_tail=True) == [] and path.read_text() == ""


def test_compare_counts_majority_flips_and_sorts_the_changes_first() -> None:
    a = [sample("p1", i, i < 1) for i in range(4)] + [sample("p2", i, True) for i in range(4)]
    a += [sample("p3", i, i < 2) for i in range(4)] + [sample("only_a", 0, True)]
    b = [sample("p1", i, i < 3) for i in range(4)] + [sample("p2", i, i < 1) for i in range(4)]
    b += [sample("p3", i, i < 3) for i in range(4)]
    rows = {r["problem_id"]: r for r in compare(a, b)}
    assert set(rows) == {"p1", "p2", "p3"}
    assert rows["p1"] == {"problem_id": "p1", "acc_a": 0.25, "acc_b": 0.75, "flip": "gained"}
    assert rows["p2"]["flip"] == "lost" and rows["p3"]["flip"] == "same"  # 0.5 -> 0.75: right both times
    assert [r["problem_id"] for r in compare(a, b)][-1] == "p3"
    assert representative(a, "p1", right=False)["sample_index"] == 1
    assert representative(a, "p2", right=False)["sample_index"] == 0  # none wrong: the first


def test_seeds_of_one_sweep_are_one_setting_with_a_mean_line() -> None:
    def run(seed: int, steps: list[float], extra: str = "") -> dict:
        overrides = ["recipe=dapo_smoke", f"seed={seed}", "hydra.job.num=1"] + ([extra] if extra else [])
        metrics = [
            {"step": i + 1, "reward/mean": v, "time/rollout_s": 1.0, "time/update_s": 2.0} for i, v in enumerate(steps)
        ]
        provenance = {"seed": seed, "overrides": overrides}
        return {"command": "train", "folder": f"r{seed}", "provenance": provenance, "metrics": metrics}

    runs = [run(1, [0.0, 0.5]), run(2, [1.0, 0.5, 0.9]), run(3, [0.2], extra="trainer.lr=1e-5")]
    assert setting_of(runs[0]) == setting_of(runs[1]) != setting_of(runs[2])
    series = training_series(runs, "reward/mean")
    faint = [s for s in series if s.faint]
    bold = [s for s in series if not s.faint]
    assert len(faint) == 2 and len(bold) == 2
    assert bold[0].points == [(1, 0.5), (2, 0.5)] and "mean of 2 seeds" in bold[0].label  # steps both seeds have
    assert metric_value(runs[0]["metrics"][0], "time") == 3.0
    shares = {"time/trainer_idle_share": 0.5, "time/sampler_idle_share": 0.25}  # shares are not seconds
    assert metric_value({**runs[0]["metrics"][0], **shares}, "time") == 3.0
    assert metric_value({**runs[0]["metrics"][0], "time/train_tokens_per_s": 900.0}, "time") == 3.0  # a rate
    overlapped = {"time/rollout_s": 2.0, "time/update_s": 1.0, "time/step_wall_s": 2.2}  # phases at once
    assert metric_value(overlapped, "time") == 2.2
    assert metric_value({"train/approx_kl": 0.1}, "kl") == 0.1 and metric_value({"train/kl_ref": 0.2}, "kl") == 0.2


def test_charts_escape_labels_and_pick_round_ticks() -> None:
    svg = line_chart("<b>t</b>", [Series("<script>x</script>", [(0, 0.1), (10, 0.9)], "#000")])
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&lt;b&gt;" in svg
    assert _ticks(0, 1) == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    assert _ticks(3, 61) == pytest.approx([20, 40, 60])
    assert "no data" in line_chart("empty", [Series("a", [], "#000")])
