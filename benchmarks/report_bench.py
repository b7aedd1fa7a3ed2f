"""`retool report` on runs of real size: how long it takes, how big the page is, how fast it opens and filters.

Two eval runs of 500 problems x 32 samples (32,000 trajectories; ~6 KB of text each, the length of a
~1,500-token response with code and interpreter output) are written as samples.jsonl, then `retool report`
builds the page and headless Chromium opens it. The peer is the raw data a researcher would otherwise open:
the page's size is reported against the samples files'. Needs chromium + chromium-driver (make test installs
them).

    python benchmarks/report_bench.py [--problems 500] [--samples 32]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retool_cli.report.page import write_report
from tests.browser import open_browser

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, write

PROSE = "Let me think about the structure of this problem before computing anything. " * 12
CODE = "<code>\n```python\nfrom sympy import *\nx = symbols('x')\nprint(solve(x**2 - 5*x + 6, x))\n```\n</code>"


def fake_rows(problems: int, samples: int, seed: int) -> Iterator[dict]:
    """Realistic eval sample rows, one at a time (the benchmark's own memory stays small)."""
    rng = random.Random(seed)
    for p in range(problems):
        for s in range(samples):
            correct = rng.random() < 0.4 + 0.2 * seed
            segments = [["model", PROSE + CODE], ["tool", "\n<interpreter>\n[2, 3]\n</interpreter>\n"]] * 3
            segments.append(["model", PROSE + f"So the answer is \\boxed{{{p if correct else p + 1}}}."])
            yield {
                "problem_id": f"p{p}", "sample_index": s, "seed": seed, "question": f"Problem {p}: " + PROSE[:300],
                "reference": str(p), "answer": str(p if correct else p + 1), "correct": correct,
                "reward": 1.0 if correct else 0.0, "formatted": True, "overlong_penalty": 0.0,
                "truncated": rng.random() < 0.05, "judge_timed_out": False, "turns": 4, "code_calls": 3,
                "code_errors": int(rng.random() < 0.1), "code_timeouts": 0, "prompt_tokens": 120,
                "response_tokens": 1500, "model_tokens": 1400, "stop_reason": "answered", "segments": segments,
            }  # fmt: skip


def fake_run(folder: Path, problems: int, samples: int, seed: int) -> int:
    """An eval run folder: samples.jsonl with realistic rows, results.json as the eval command writes it."""
    folder.mkdir(parents=True)
    with open(folder / "samples.jsonl", "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in fake_rows(problems, samples, seed))
    n = samples
    metrics = {f"avg@{n}": 0.5, "se_sampling": 0.01, "se_problems": 0.02, "ci95_bootstrap": [0.46, 0.54]}
    metrics.update({f"maj@{n}": 0.6, "samples_per_problem": n, "format_rate": 1.0, "code_calls": 3.0})
    protocol = {"benchmark": "bench", "model": f"ckpt{seed}", "seed": seed, "setting": f"s{seed}"}
    (folder / "results.json").write_text(json.dumps({"metrics": metrics, "protocol": protocol}))
    return (folder / "samples.jsonl").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=500)
    parser.add_argument("--samples", type=int, default=32)
    add_json_out(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        raw = sum(fake_run(root / f"eval_{i}", args.problems, args.samples, i) for i in range(2))
        before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        started = time.perf_counter()
        html, _ = write_report([root / "eval_0", root / "eval_1"], root / "report")
        build_s = time.perf_counter() - started
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the browser (another process)
        driver = open_browser()
        try:
            started = time.perf_counter()
            driver.get(html.as_uri())
            load_s = time.perf_counter() - started
            timing = driver.execute_script(
                "const t0 = performance.now(); document.getElementById('filter-outcome').value = 'wrong';"
                "document.getElementById('filter-outcome').dispatchEvent(new Event('change'));"
                "return [performance.now() - t0, document.getElementById('match-count').textContent];"
            )
        finally:
            driver.quit()
        data = json.loads(html.read_text().split('id="report-data">', 1)[1].split("</script>", 1)[0])
    total = 2 * args.problems * args.samples
    print(f"runs: 2 eval runs, {total:,} trajectories, samples.jsonl {raw / 1e6:.0f} MB in all")
    print(f"report build: {build_s:.1f} s; peak memory {peak_mb:.0f} MB ({before_mb:.0f} MB before the build)")
    print(f"page {html_size(data, raw)}")
    print(f"browser: opened and drawn in {load_s:.2f} s; a filter over the page's trajectories {timing[0]:.0f} ms")
    print(f"the page says: {timing[1]}")
    quantities = {
        "trajectories": total,
        "samples_mb": raw / 1e6,
        "build_s": build_s,
        "peak_mb": peak_mb,
        "page_data_over_samples": len(json.dumps(data)) / raw,
        "page_trajectories": len(data["trajectories"]),
        "browser_load_s": load_s,
        "filter_ms": timing[0],
    }
    write(args.json_out, "report", quantities, checks={"page_says": timing[1]})


def html_size(data: dict, raw: int) -> str:
    size = len(json.dumps(data))
    return f"data {size / 1e6:.1f} MB = {size / raw:.3f} x the samples files; {len(data['trajectories'])} trajectories"


if __name__ == "__main__":
    main()
