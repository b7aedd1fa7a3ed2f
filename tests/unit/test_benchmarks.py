"""Every benchmark still runs, through `make bench`'s runner at tiny sizes, and reports the quantities and ratios
that benchmarks/results.json (the last full `make bench`, whose table benchmarks/README.md shows) names; what it
checks of itself holds (the sandbox's execution rows ran every snippet, not the cache). A change that makes a
benchmark measure something else, or stop reporting a figure the README shows, fails here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "benchmarks" / "results.json").read_text())


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


results = load("results")
run_all = load("run_all")
PEERS = ("trl", "vllm")  # figures of peers a quick run leaves out


def quick_run(name: str, tmp_path: Path, checkpoint: Path) -> dict:
    out = tmp_path / "bench"
    command = [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--only", name]
    command += ["--out", str(out), "--checkpoint", str(checkpoint)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text())["benchmarks"][name]


def sandbox_measured_execution(result: dict) -> None:
    assert result["checks"]["execution_cache_lookups"] == 0  # every snippet of the execution rows ran
    hit_rate, share = result["quantities"]["cache/hit_rate"], result["quantities"]["cache/repeat_share"]
    assert 0 < hit_rate["median"] < 1 and 0 < share < 1  # the cache row answers some snippets and runs others


def decontam_flags_agree(result: dict) -> None:
    assert result["checks"]["flags_identical"]  # ours and open-r1's method flag the same rows


SELF_CHECKS = {"sandbox": sandbox_measured_execution, "decontam": decontam_flags_agree}


@pytest.mark.parametrize("name", [b.name for b in run_all.BENCHMARKS if b.name != "rollout_loops_vllm"])
def test_each_benchmark_reports_what_its_readme_table_shows(name: str, sft_checkpoint: Path, tmp_path: Path) -> None:
    """(rollout_loops_vllm is rollout_loops_hf's script with --engine vllm, whose engine the vLLM tests start.)"""
    result = quick_run(name, tmp_path, sft_checkpoint)
    if "skipped" in result:
        assert name == "gpu_decode" or not os.environ.get("CI"), result  # CI has the data, browser and tokenizers
        pytest.skip(result["skipped"])
    SELF_CHECKS.get(name, lambda _: None)(result)
    recorded = RECORDED["benchmarks"][name]
    if "skipped" in recorded:
        pytest.skip(f"benchmarks/results.json has no figures of {name}: {recorded['skipped']}")
    for kind in ("quantities", "ratios"):
        reported, shown = set(result[kind]), set(recorded[kind])
        assert reported <= shown, f"{name} reports {kind} the README does not show: {sorted(reported - shown)}"
        left_out = {k for k in shown - reported if not any(p in k.lower() for p in PEERS)}
        assert not left_out, f"{name} no longer reports {kind} the README shows: {sorted(left_out)}"
    for value in [*result["quantities"].values(), *result["ratios"].values()]:
        if isinstance(value, dict):  # a spread over repeats
            assert value["min"] <= value["median"] <= value["max"] and value["n"] == len(value["values"]) >= 1


def test_a_ratio_is_taken_within_each_repeat() -> None:
    ratio = results.paired_ratios([1.0, 4.0, 3.0], [2.0, 2.0, 1.0])
    assert ratio["values"] == [0.5, 2.0, 3.0] and ratio["median"] == 2.0 and (ratio["min"], ratio["max"]) == (0.5, 3.0)
    with pytest.raises(ValueError, match="pair up"):
        results.paired_ratios([1.0], [1.0, 2.0])
    assert results.shown(ratio) == "2 (0.5-3, n=3)"


def test_the_readme_table_is_the_recorded_results() -> None:
    """benchmarks/README.md's generated block is benchmarks/results.json as run_all.py renders it."""
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    block = readme.split(run_all.BEGIN, 1)[1].split(run_all.END, 1)[0]
    assert block.strip() == run_all.table(RECORDED).strip()
