"""eval-report over a seed sweep: runs grouped by setting and step, spread over seeds, sampling error apart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from retool_cli.commands import eval_report


def fake_run(root: Path, setting: str, step: int | None, seed: int, accuracy: float, se: float = 0.02) -> None:
    folder = root / f"{setting}_step{step}_seed{seed}"
    folder.mkdir(parents=True)
    results = {
        "metrics": {
            "samples_per_problem": 4,
            "avg@4": accuracy,
            "se_sampling": se,
            "se_problems": 2 * se,
            "ci95_bootstrap": [max(0.0, accuracy - 0.1), min(1.0, accuracy + 0.1)],
            "maj@4": accuracy,
            "format_rate": 0.9,
            "code_calls": 1.0,
        },
        "protocol": {
            "model": f"runs/{setting}/seed_{seed}/checkpoints/step_{step}",
            "ckpt": f"runs/{setting}/seed_{seed}",
            "training_step": step,
            "benchmark": "smoke",
            "seed": seed,
            "setting": setting,
            "training": {"run": f"runs/{setting}/seed_{seed}", "seed": seed, "setting": setting},
        },
    }
    (folder / "results.json").write_text(json.dumps(results))


def test_a_seed_sweep_becomes_results_with_a_spread(tmp_path: Path) -> None:
    accuracy = {(10, 1): 0.30, (10, 2): 0.40, (10, 3): 0.35, (20, 1): 0.98, (20, 2): 0.99, (20, 3): 1.0}
    for (step, seed), acc in accuracy.items():
        fake_run(tmp_path / "sweep", "a", step, seed, acc)
    fake_run(tmp_path / "sweep", "b", 10, 1, 0.01)  # another setting, one seed
    out = eval_report.run([tmp_path / "sweep"], tmp_path / "report")
    report = json.loads((out / "report.json").read_text())
    a10, a20, b10 = report["results"]
    assert (a10["setting"], a10["step"], sorted(a10["seeds"])) == ("a", 10, [1, 2, 3])
    assert a10["mean"] == pytest.approx(0.35) and a10["std_seeds"] == pytest.approx(0.05)
    assert a10["se_seeds"] == pytest.approx(0.05 / math.sqrt(3))
    assert a10["se_sampling"] == pytest.approx(math.sqrt(3 * 0.02**2) / 3)  # kept apart from the seeds' spread
    assert a10["label"] == "runs/a/seed_*"
    assert (a20["step"], b10["setting"], b10["n_seeds"], b10["std_seeds"]) == (20, "b", 1, None)
    assert len(report["runs"]) == 7 and {r["seed"] for r in report["runs"]} == {1, 2, 3}
    text = (out / "report.md").read_text()
    assert "| runs/a/seed_* | 10 | smoke | 3 | 35.0 | 5.0 |" in text
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_old_results_without_a_setting_are_one_run_each(tmp_path: Path) -> None:
    fake_run(tmp_path, "x", 5, 0, 0.5)
    results = json.loads((tmp_path / "x_step5_seed0" / "results.json").read_text())
    del results["protocol"]["setting"], results["protocol"]["training"]
    (tmp_path / "x_step5_seed0" / "results.json").write_text(json.dumps(results))
    report = json.loads((eval_report.run([tmp_path]) / "report.json").read_text())
    assert report["results"][0]["n_seeds"] == 1 and report["results"][0]["seeds"] == [0]
