"""`retool report` on real runs (a two-seed training sweep and the evaluation of both checkpoints), read as a file
and driven in headless Chromium: offline, filters that agree with the data, the comparison, no injected HTML."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from retool_cli.eval.metrics import paired_difference
from tests.browser import open_browser, requested_urls, require_browser
from tests.helpers import SMALL_TRAIN, read_jsonl, run_retool

SMALL_EVAL = [
    "recipe=dapo_smoke",
    "benchmark.max_problems=6",
    "benchmark.n_samples=4",
    "benchmark.max_response_tokens=96",
    "eval.bootstrap=100",
    "data.synthetic.num_examples=60",
    "data.dev_size=6",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sweep/train/seed_{1,2} and sweep/eval/ckpt_{0,1}: each seed's checkpoint on the same six problems."""
    root = tmp_path_factory.mktemp("report")
    sweep = ["hydra.sweep.subdir=seed_${seed}", "seed=1,2", "hydra.sweep.dir=sweep/train"]
    run_retool("train", "-m", *SMALL_TRAIN, "data.dev_size=6", *sweep, cwd=root, check=True)
    evals = [
        "ckpt=sweep/train/seed_1,sweep/train/seed_2",
        "hydra.sweep.dir=sweep/eval",
        "hydra.sweep.subdir=ckpt_${hydra.job.num}",
    ]
    run_retool("eval", "-m", *SMALL_EVAL, *evals, cwd=root, check=True)
    return root


def build(root: Path, *args: str, out: str = "report") -> tuple[Path, dict]:
    proc = run_retool("report", *args, "--out", out, cwd=root, check=True)
    html = root / out / "report.html"
    data = page_data(html)
    shown, total = (sum(c[k] for c in data["counts"].values()) for k in ("shown", "total"))
    assert f"wrote {out}/report.html: {len(data['runs'])} runs, {shown} of {total} trajectories" in proc.stdout
    return html, data


def page_data(html: Path) -> dict:
    text = html.read_text()
    payload = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S).group(1)
    return json.loads(payload)


def samples(root: Path) -> list[dict]:
    return [row for path in sorted((root / "sweep").rglob("samples.jsonl")) for row in read_jsonl(path)]


def test_one_self_contained_file_with_every_run(runs: Path) -> None:
    html, data = build(runs, "sweep/train", "sweep/eval")
    text = html.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?!data:|#)[a-z]+:""", text)  # nothing loaded from outside
    assert "<script src" not in text and "@import" not in text
    assert [r["command"] for r in data["runs"]] == ["train", "train", "eval", "eval"]
    for name in ("provenance", "commit", "versions", "trainer.lr", "benchmark.n_samples", "system prompt"):
        assert name in text
    # every eval sample and every kept training rollout is in the browser (well under the bound here)
    rollouts = [row for path in (runs / "sweep" / "train").rglob("rollouts.jsonl") for row in read_jsonl(path)]
    assert len(data["trajectories"]) == len(samples(runs)) + len(rollouts) == 48 + len(rollouts)
    assert 0 < len(rollouts) <= 2 * 2 * 4  # 2 seeds x 2 steps x trainer.keep_rollouts
    # the two checkpoints compared on the same six problems; flips agree with the samples
    comparison = data["comparison"]
    assert len(comparison["rows"]) == 6
    for row in comparison["rows"]:
        for side, run_id in (("acc_a", comparison["a"]), ("acc_b", comparison["b"])):
            folder = next(r["folder"] for r in data["runs"] if r["id"] == run_id)
            rows = read_jsonl(runs / folder / "samples.jsonl")
            mine = [s["correct"] for s in rows if s["problem_id"] == row["problem_id"]]
            assert row[side] == sum(mine) / len(mine)
        assert (row["flip"] == "same") == ((row["acc_a"] >= 0.5) == (row["acc_b"] >= 0.5))
    # the difference, paired over the six problems: as eval/metrics.py computes it from those accuracies
    by_problem = {side: {r["problem_id"]: r[side] for r in comparison["rows"]} for side in ("acc_a", "acc_b")}
    expected = paired_difference(by_problem["acc_a"], by_problem["acc_b"])
    paired = comparison["paired"]
    assert paired["problems"] == 6 and paired["difference"] == pytest.approx(expected.mean)
    assert paired["se"] == pytest.approx(expected.se) and paired["p_value"] == expected.p_value
    assert paired["ci95"] == pytest.approx(list(expected.ci95))
    # training curves per seed and their mean
    assert text.count("(mean of 2 seeds)") >= 5


def test_the_page_is_bounded_by_whole_problems_and_says_so(runs: Path) -> None:
    _, data = build(runs, "sweep/eval", "--max-trajectories", "10", "--max-chars", "1000", out="small")
    by_run = Counter(t["run"] for t in data["trajectories"])
    assert all(count <= 5 for count in by_run.values())  # 10 shared by the two runs
    for run_id, counts in data["counts"].items():
        assert counts["total"] == 24 and counts["shown"] == by_run[run_id] == 4 * counts["problems_shown"]
    for t in data["trajectories"]:
        assert sum(len(text) for _, text in t["segments"]) < 1000 + 400  # the cut's own note aside


def test_bad_input_is_named_and_writes_nothing(runs: Path) -> None:
    proc = run_retool("report", "no/such/folder", "--out", "bad", cwd=runs)
    assert proc.returncode == 1 and "no/such/folder: no such folder" in proc.stderr
    proc = run_retool("report", "sweep/eval", "--compare", "sweep/eval/ckpt_0", "--out", "bad", cwd=runs)
    assert proc.returncode == 2 and "give --compare twice" in proc.stderr
    pair = ["--compare", "sweep/train/seed_1", "--compare", "sweep/eval/ckpt_0"]
    proc = run_retool("report", "sweep", *pair, "--out", "bad", cwd=runs)
    assert proc.returncode == 1 and "sweep/train/seed_1: not an eval run folder" in proc.stderr
    pair = ["--compare", "sweep/eval/ckpt_0", "--compare", "sweep/eval/ckpt_0/"]
    proc = run_retool("report", "sweep", *pair, "--out", "bad", cwd=runs)
    assert proc.returncode == 2 and "given twice" in proc.stderr
    proc = run_retool("report", "sweep", "--max-chars", "10", "--out", "bad", cwd=runs)
    assert proc.returncode == 2 and "--max-chars" in proc.stderr
    assert not (runs / "bad").exists()
    (runs / "a_file").write_text("mine\n")
    proc = run_retool("report", "sweep", "--out", "a_file", cwd=runs)
    assert proc.returncode == 1 and "--out a_file: a file, not a folder" in proc.stderr
    assert (runs / "a_file").read_text() == "mine\n"


def test_in_a_browser_offline_with_filters_that_agree_with_the_data(runs: Path, tmp_path: Path) -> None:
    require_browser()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    # a third eval run whose majority verdict differs from ckpt_0's on every problem, so that the comparison
    # has flips to click whatever two tiny checkpoints did
    flipped = runs / "flipped"
    shutil.copytree(runs / "sweep" / "eval" / "ckpt_0", flipped, dirs_exist_ok=True)
    rows = read_jsonl(flipped / "samples.jsonl")
    right = {p: sum(r["correct"] for r in rows if r["problem_id"] == p) >= 2 for p in {r["problem_id"] for r in rows}}
    (flipped / "samples.jsonl").write_text(
        "".join(json.dumps({**r, "correct": not right[r["problem_id"]]}) + "\n" for r in rows)
    )
    pair = ["--compare", "sweep/eval/ckpt_0", "--compare", "flipped"]
    html, data = build(runs, "sweep/train", "sweep/eval", "flipped", *pair, out="browse")
    shown = data["trajectories"]
    driver = open_browser()
    try:
        driver.get(html.as_uri())
        assert driver.title == "retool report"
        driver.save_screenshot(str(tmp_path / "report.png"))
        assert (tmp_path / "report.png").stat().st_size > 20_000  # a drawn page, not a blank one

        def count() -> int:
            return int(driver.find_element(By.ID, "match-count").text.split()[0])

        def choose(select: str, value: str) -> None:
            Select(driver.find_element(By.ID, select)).select_by_value(value)

        assert count() == len(shown)
        assert len(driver.find_elements(By.CSS_SELECTOR, "#trajectory-list .trajectory")) == 20  # one page
        choose("filter-outcome", "right")
        assert count() == sum(bool(t["correct"]) for t in shown)
        cards = driver.find_elements(By.CSS_SELECTOR, "#trajectory-list .trajectory")
        assert all(card.get_attribute("data-correct") == "1" for card in cards)
        choose("filter-outcome", "wrong")
        choose("filter-code", "yes")
        assert count() == sum(not t["correct"] and t["code_calls"] > 0 for t in shown)
        choose("filter-outcome", "")
        choose("filter-code", "")
        eval_run = next(r["id"] for r in data["runs"] if r["command"] == "eval")
        choose("filter-run", eval_run)
        assert count() == 24
        problem = shown[-1]["problem_id"]
        driver.find_element(By.ID, "filter-problem").send_keys(problem)
        assert count() == sum(t["problem_id"] == problem and t["run"] == eval_run for t in shown) == 4
        first = driver.find_element(By.CSS_SELECTOR, "#trajectory-list .trajectory")
        assert problem in first.text and "reference" in first.text and "tokens: prompt / response / model" in first.text
        if any(t["code_calls"] for t in shown if t["problem_id"] == problem and t["run"] == eval_run):
            assert driver.find_elements(By.CSS_SELECTOR, "#trajectory-list pre.code")  # code drawn as code
        # the comparison: a flipped problem opens one trajectory of each checkpoint side by side
        flips = driver.find_elements(By.CSS_SELECTOR, "#flip-table tr.flip")
        summary = re.search(
            r"wrong -> right on (\d+), right -> wrong on (\d+)", driver.find_element(By.ID, "comparison-view").text
        )
        assert len(flips) == 6 == int(summary.group(1)) + int(summary.group(2))
        paired = data["comparison"]["paired"]  # every verdict flipped: the paired difference is drawn as computed
        drawn = driver.find_element(By.CSS_SELECTOR, "#comparison-view p.paired").text
        assert drawn.startswith(f"B - A = {100 * paired['difference']:.1f} points over 6 problems, paired")
        problem = flips[0].text.split()[0]
        flips[0].click()
        side = driver.find_elements(By.CSS_SELECTOR, "#side-by-side .trajectory")
        assert len(side) == 2 and all(problem in card.text for card in side)
        verdicts = [card.get_attribute("data-correct") for card in side]
        assert verdicts == ["1", "0"] if right[problem] else verdicts == ["0", "1"]
        assert all(url.startswith(("file:", "data:")) for url in requested_urls(driver))
        assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


def test_model_output_is_shown_as_text_never_run_as_html(runs: Path) -> None:
    require_browser()
    from selenium.webdriver.common.by import By

    folder = runs / "hostile"
    shutil.copytree(runs / "sweep" / "eval" / "ckpt_0", folder)
    rows = read_jsonl(folder / "samples.jsonl")
    attack = '</script><img id="pwned" src="x" onerror="document.title=\'pwned\'"><b>bold</b>'
    rows[0]["segments"] = [["model", f"I think {attack}"], ["tool", attack]]
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html, _ = build(runs, "hostile", out="hostile_report")
    driver = open_browser()
    try:
        driver.get(html.as_uri())
        assert driver.title == "retool report"
        assert not driver.find_elements(By.ID, "pwned")
        assert attack in driver.find_element(By.ID, "trajectory-list").text
    finally:
        driver.quit()
