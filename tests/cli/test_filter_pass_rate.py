"""`retool filter-pass-rate`: end to end with the tiny model, resume after SIGKILL, shards merge to one run."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import die_after, read_jsonl, run_retool

ARGS = [
    "recipe=dapo_smoke",
    "data.synthetic.num_examples=24",
    "data.dev_size=4",
    "filter.n_samples=3",
    "rollout.max_response_tokens=48",
    "rollout.max_tokens_per_turn=48",
]


def test_filter_resume_and_shards(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    whole.mkdir()
    run_retool("filter-pass-rate", *ARGS, "hydra.run.dir=run", cwd=whole, check=True)
    rates = read_jsonl(whole / "run" / "pass_rates.jsonl")
    assert [r["position"] for r in rates] == list(range(20)) and all(r["n"] == 3 for r in rates)
    kept = {r["problem_id"] for r in rates if 0 < r["pass_rate"] < 1}
    assert {r["id"] for r in read_jsonl(whole / "run" / "filtered.jsonl")} == kept
    assert (whole / "run" / "pass_rates.png").exists()

    # killed and run again: continues, ends with the same pass rates
    broken = tmp_path / "broken"
    broken.mkdir()
    die_after(["filter-pass-rate", *ARGS], cwd=broken, when="chunk:5")  # after 5 of 20 problems (one per chunk)
    assert len(next(broken.rglob("samples.jsonl")).read_text().splitlines()) == 15
    assert not list(broken.rglob("pass_rates.jsonl"))
    again = run_retool("filter-pass-rate", *ARGS, cwd=broken, check=True)
    assert "resuming" in again.stdout + again.stderr  # it says so, with how many samples were there
    [resumed] = list(broken.rglob("pass_rates.jsonl"))
    assert read_jsonl(resumed) == rates

    # two shards in a sweep, merged: the same file as one run
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    run_retool("filter-pass-rate", *ARGS, "shard.count=2", "-m", "shard.index=0,1", cwd=sharded, check=True)
    sweep = next((sharded / "outputs" / "filter-pass-rate" / "multirun").glob("*/*"))
    run_retool(
        "filter-merge",
        str(sweep),
        "--out",
        str(sharded / "merged"),
        "--low",
        "0",
        "--high",
        "1",
        cwd=sharded,
        check=True,
    )
    assert read_jsonl(sharded / "merged" / "pass_rates.jsonl") == rates
    assert read_jsonl(sharded / "merged" / "filtered.jsonl") == read_jsonl(whole / "run" / "filtered.jsonl")
