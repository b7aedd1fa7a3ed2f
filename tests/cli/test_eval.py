"""`retool eval` and `retool eval-report` end to end with the tiny model, through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool_cli.eval.metrics import paired_difference
from tests.helpers import SMALL_TRAIN, die_after, read_jsonl, run_retool, write_jsonl

SMALL = [
    "recipe=dapo_smoke",
    "benchmark.max_problems=6",
    "benchmark.n_samples=4",
    "eval.questions_per_batch=1",
    "benchmark.max_response_tokens=96",
    "eval.bootstrap=200",
]


def results_of(folder: Path) -> dict:
    [path] = list(folder.rglob("results.json"))
    return json.loads(path.read_text())


def test_eval_smoke_end_to_end(tmp_path: Path) -> None:
    proc = run_retool("eval", *SMALL, "hydra.run.dir=run", cwd=tmp_path, check=True)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    metrics = results["metrics"]
    assert metrics["problems"] == 6 and metrics["samples_per_problem"] == 4
    assert {
        "avg@4",
        "pass@1",
        "pass@2",
        "pass@4",
        "maj@4",
        "se_sampling",
        "se_problems",
        "ci95_bootstrap",
    } <= set(metrics)
    assert metrics["pass@1"] == metrics["avg@4"]
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert len(samples) == 24 and len({(s["problem_id"], s["sample_index"]) for s in samples}) == 24
    assert {"segments", "answer", "correct", "turns", "code_calls", "stop_reason", "seed", "question"} <= set(
        samples[0]
    )
    assert len(results["problems"]) == 6 and results["protocol"]["n_samples"] == 4
    assert "avg@4 (pass@1)" in proc.stdout and "se, over problems" in proc.stdout


def test_killed_eval_resumes_to_the_same_results(tmp_path: Path) -> None:
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    run_retool("eval", *SMALL, cwd=whole, check=True)
    die_after(["eval", *SMALL], cwd=broken, when="chunk:2")  # killed after two of six problems
    samples = list(broken.rglob("samples.jsonl"))
    lines = samples[0].read_text().splitlines(keepends=True)
    assert len(lines) == 8  # 2 problems x 4 samples, no more
    # and torn inside the second problem's append: two whole rows of it, then half a row
    samples[0].write_text("".join(lines[:6]) + lines[6][:40])
    run_retool("eval", *SMALL, cwd=broken, check=True)  # the same command again
    resumed = results_of(broken)
    assert resumed["metrics"] == results_of(whole)["metrics"]
    folder = Path(next(broken.rglob("results.json")).parent)
    assert folder == samples[0].parent  # finished in the interrupted run's folder

    def texts(folder: Path) -> list:
        rows = read_jsonl(next(folder.rglob("samples.jsonl")))
        return sorted((r["problem_id"], r["sample_index"], str(r["segments"])) for r in rows)

    assert texts(broken) == texts(whole)


def test_a_folder_is_continued_only_by_its_own_run_and_started_over_with_resume_off(tmp_path: Path) -> None:
    """The same folder (hydra.run.dir) with another config: resuming would mix two runs' samples, so it is an
    error naming the folder and the keys that differ, which leaves the folder's records of its run (Hydra's
    config, provenance.json) as they were; `eval.resume=false` starts over there (the previous samples removed,
    not continued); a checkpoint retrained at the same path is other weights (the key sees its files)."""
    six = [*SMALL, "hydra.run.dir=run"]
    run_retool("eval", *six, cwd=tmp_path, check=True)
    first = read_jsonl(tmp_path / "run" / "samples.jsonl")
    (tmp_path / "run" / "results.json").unlink()  # an unfinished run of the first config, as after a crash
    records = [tmp_path / "run" / name for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "provenance.json")]
    before = [path.read_bytes() for path in records]
    other = run_retool("eval", *six, "benchmark.n_samples=2", "benchmark.temperature=0.7", cwd=tmp_path)
    said = " ".join((other.stdout + other.stderr).split())  # the error, as the terminal wrapped it
    assert other.returncode != 0 and "holds an unfinished run of another config" in said
    assert "(benchmark.n_samples: 4 there, 2 here; benchmark.temperature: 1.0 there, 0.7 here)" in said, said
    assert read_jsonl(tmp_path / "run" / "samples.jsonl") == first  # untouched
    assert [path.read_bytes() for path in records] == before  # still the run the folder holds
    run_retool("eval", *six, "benchmark.n_samples=2", "eval.resume=false", cwd=tmp_path, check=True)
    again = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert len(again) == 12 and all(r["sample_index"] < 2 for r in again)  # 6 x 2, nothing of the first run


def test_resume_notices_retrained_weights(tmp_path: Path) -> None:
    from retool_cli.config import RetoolConfig
    from retool_cli.run_keys import config_key

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    cfg = RetoolConfig()
    cfg.model.name_or_path = str(folder)
    before = config_key(cfg)
    assert config_key(cfg) == before
    (folder / "model.safetensors").write_bytes(b"retrained")
    assert config_key(cfg) != before


def test_malformed_benchmark_file_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bench.jsonl", [{"problem": "What is 1+1?", "answer": "2"}, "{broken"])
    proc = run_retool(
        "eval",
        "benchmark=file",
        f"benchmark.data.path={path}",
        "model.name_or_path=tiny",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert f"{path}:2: malformed JSON" in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "results.json").exists()


def test_aime24_from_a_local_file_in_the_hub_layout(tmp_path: Path) -> None:
    rows = [
        {
            "id": 60 + i,
            "problem": f"What is {i} * 7?",
            "solution": "...",
            "answer": f"{7 * i:03d}",
            "url": "u",
            "year": "2024",
        }
        for i in range(3)
    ]
    path = write_jsonl(tmp_path / "aime_2024.jsonl", rows)
    run_retool(
        "eval",
        "benchmark=aime24",
        f"benchmark.data.path={path}",
        "benchmark.n_samples=2",
        "benchmark.max_response_tokens=48",
        "model.name_or_path=tiny",
        "eval.bootstrap=200",
        "hydra.run.dir=run",
        cwd=tmp_path,
        check=True,
    )
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [p["problem_id"] for p in results["problems"]] == ["60", "61", "62"]
    assert [p["reference"] for p in results["problems"]] == ["000", "007", "014"]
    assert results["protocol"]["benchmark"] == "aime24" and results["metrics"]["samples_per_problem"] == 2


def test_multirun_and_report(tmp_path: Path) -> None:
    run_retool("eval", *SMALL, "benchmark.max_problems=2", "-m", "seed=0,1", cwd=tmp_path, check=True)
    [sweep] = list((tmp_path / "outputs" / "eval" / "multirun").glob("*/*"))
    proc = run_retool("eval-report", str(sweep), cwd=tmp_path, check=True)
    report = json.loads((sweep / "report.json").read_text())
    [result] = report["results"]  # two eval seeds of one setting: one result over 2 seeds
    assert result["label"] == "tiny" and sorted(result["seeds"]) == [0, 1] and result["std_seeds"] is not None
    assert "avg@n" in (sweep / "report.md").read_text()
    assert (sweep / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert "report.md" in proc.stdout
    missing = run_retool("eval-report", str(tmp_path / "nothing"), cwd=tmp_path)
    assert missing.returncode != 0 and "no such folder" in missing.stdout + missing.stderr


def test_the_documented_seed_sweep_ends_with_a_result_over_seeds(tmp_path: Path) -> None:
    """README's one-liner, shrunk: train seeds 1,2 -> evaluate each seed's checkpoint -> one result over seeds."""
    run_retool(
        "train",
        "-m",
        "seed=1,2",
        *SMALL_TRAIN,
        "data.dev_size=4",
        "hydra.sweep.dir=sweep/train",
        "hydra.sweep.subdir=seed_${seed}",
        cwd=tmp_path,
        check=True,
    )
    run_retool(
        "eval",
        "-m",
        *SMALL,
        "seed=1,2",
        "ckpt=sweep/train/seed_${seed}",
        "data.synthetic.num_examples=60",
        "data.dev_size=4",
        "hydra.sweep.dir=sweep/eval",
        "hydra.sweep.subdir=seed_${seed}",
        cwd=tmp_path,
        check=True,
    )
    run_retool("eval-report", "sweep/eval", cwd=tmp_path, check=True)
    report = json.loads((tmp_path / "sweep" / "eval" / "report.json").read_text())
    [result] = report["results"]
    assert sorted(result["seeds"]) == [1, 2] and result["step"] == 2 and result["label"].endswith("seed_*")
    assert sorted(r["training_seed"] for r in report["runs"]) == [1, 2]


def test_eval_report_compares_two_settings_problem_by_problem(tmp_path: Path) -> None:
    """Two settings on the same problems (here: two sampling temperatures): eval-report gives B - A paired over
    the problems, as eval/metrics.py computes it from the two runs' samples."""
    for name, temperature in (("a", 1.0), ("b", 0.3)):
        args = [*SMALL, "benchmark.max_problems=4", f"benchmark.temperature={temperature}", f"hydra.run.dir={name}"]
        run_retool("eval", *args, cwd=tmp_path, check=True)
    proc = run_retool("eval-report", "a", "b", "--out", "cmp", cwd=tmp_path, check=True)
    report = json.loads((tmp_path / "cmp" / "report.json").read_text())
    [pair] = report["paired_comparisons"]
    accuracy = {}
    for name in ("a", "b"):
        rows = read_jsonl(tmp_path / name / "samples.jsonl")
        accuracy[name] = {
            p: sum(r["correct"] for r in rows if r["problem_id"] == p) / sum(r["problem_id"] == p for r in rows)
            for p in {r["problem_id"] for r in rows}
        }
    expected = paired_difference(accuracy["a"], accuracy["b"])
    assert pair["problems"] == 4 and pair["difference"] == pytest.approx(expected.mean)
    assert pair["se_paired"] == pytest.approx(expected.se) and pair["p_value"] == expected.p_value
    assert "Paired comparisons" in (tmp_path / "cmp" / "report.md").read_text() and "Paired comparisons" in proc.stdout
