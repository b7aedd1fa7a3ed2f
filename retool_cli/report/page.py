"""`retool report`: run folders -> one self-contained report.html (no network: styles, script, charts and data
are all inside the file, so it opens from a cluster's file system or a mail attachment).

    paths --runs.find_runs / read_run--> runs --analysis--> cards, curves (SVG), eval tables, comparison
    samples.jsonl / rollouts.jsonl --runs.index_trajectories, bounded--> the trajectory browser's data (JSON)

The page's script (assets/report.js) only filters, pages and draws trajectories from that JSON.
"""

from __future__ import annotations

import datetime
import json
from html import escape
from pathlib import Path
from typing import Any

from retool_cli.errors import DataError
from retool_cli.eval.metrics import paired_difference
from retool_cli.files import atomic_open
from retool_cli.report import analysis
from retool_cli.report.reading import bounded, find_runs, index_trajectories, load_rows, read_run, trajectory_file, trim
from retool_cli.report.svg import line_chart

ASSETS = Path(__file__).parent / "assets"
SECTIONS = ("runs", "training", "evaluation", "comparison", "trajectories")
MAX_FLIPS_SHOWN = 200  # flipped problems whose trajectories are embedded side by side
RUNS_NOTE = (
    '<p class="muted">Each run\'s provenance (provenance.json: command, commit, versions, data and their hashes, '
    "seed) and its key config values (.hydra/config.yaml). Open a run to see them.</p>"
)


def write_report(
    paths: list[Path],
    out: Path,
    compare: tuple[Path, Path] | None = None,
    max_trajectories: int = 2000,
    max_chars: int = 8000,
) -> tuple[Path, str]:
    """Write out/report.html for the runs under `paths`; the file and a line saying what it holds. At most
    `max_trajectories` trajectories go into the browser, shared equally by the runs that have some (whole
    problems, drawn with a fixed seed), each cut to about `max_chars` characters: a page of a few to tens of MB
    however large the runs."""
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out}: a file, not a folder")
    runs = [read_run(folder, i) for i, folder in enumerate(find_runs(paths))]
    # each run's samples or rollouts, indexed once (problem, verdict, offset): for the browser and the comparison
    files = {run["id"]: trajectory_file(run) for run in runs if trajectory_file(run).exists()}
    index_of = {run_id: index_trajectories(path) for run_id, path in files.items()}
    per_run = max(1, max_trajectories // max(1, len(index_of)))
    trajectories, counts = [], {}
    for run_id, index in index_of.items():
        shown, counts[run_id] = bounded(index, files[run_id], run_id, per_run, max_chars)
        trajectories += shown
    comparison = _comparison(runs, index_of, files, compare, max_chars)
    problems: dict[str, dict[str, str]] = {}
    for row in trajectories + [t for pair in (comparison or {}).get("pairs", {}).values() for t in pair if t]:
        question, reference = row.pop("question", ""), row.pop("reference", "")  # once per problem in the page
        problems.setdefault(row["problem_id"], {"question": question, "reference": reference})
    data = {
        "runs": [{k: run[k] for k in ("id", "name", "command", "folder")} for run in runs],
        "counts": counts,
        "problems": problems,
        "trajectories": trajectories,
        "comparison": comparison,
    }
    html = _page(runs, data, paths)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    with atomic_open(path) as handle:
        handle.write(html)
    in_page = sum(c["shown"] for c in counts.values())
    total = sum(c["total"] for c in counts.values())
    return path, f"{len(runs)} runs, {in_page} of {total} trajectories in the page, {len(html) / 1e6:.1f} MB"


def _comparison(
    runs: list[dict],
    index_of: dict[str, list[dict]],
    files: dict[str, Path],
    chosen: tuple[Path, Path] | None,
    max_chars: int,
) -> dict[str, Any] | None:
    """Two eval runs on the same problems: the chosen folders, else the first two eval runs sharing problems."""
    evals = [r for r in runs if r["command"] == "eval"]
    samples = {r["id"]: index_of.get(r["id"], []) for r in evals}
    if chosen is not None:
        pair = []
        for folder in chosen:
            match = [r for r in evals if Path(r["folder"]).resolve() == folder.resolve()]
            if not match:
                raise DataError(f"--compare {folder}: not an eval run folder among the report's runs")
            pair.append(match[0])
    else:
        pair = next(
            (
                [a, b]
                for i, a in enumerate(evals)
                for b in evals[i + 1 :]
                if {s["problem_id"] for s in samples[a["id"]]} & {s["problem_id"] for s in samples[b["id"]]}
            ),
            [],
        )
        if not pair:
            return None
    a, b = pair
    rows = analysis.compare(samples[a["id"]], samples[b["id"]])
    pairs = {}
    for row in [r for r in rows if r["flip"] != "same"][:MAX_FLIPS_SHOWN]:
        problem = row["problem_id"]
        picks = [
            analysis.representative(samples[run["id"]], problem, row[acc] >= 0.5)
            for run, acc in ((a, "acc_a"), (b, "acc_b"))
        ]
        pairs[problem] = [
            trim(dict(load_rows(files[run["id"]], [pick])[0], run=run["id"]), max_chars) if pick else None
            for pick, run in zip(picks, (a, b), strict=True)
        ]
    d = paired_difference({r["problem_id"]: r["acc_a"] for r in rows}, {r["problem_id"]: r["acc_b"] for r in rows})
    paired = {"difference": d.mean, "se": d.se, "ci95": list(d.ci95), "p_value": d.p_value, "problems": d.problems}
    return {"a": a["id"], "b": b["id"], "rows": rows, "pairs": pairs, "paired": paired}


def _page(runs: list[dict], data: dict, paths: list[Path]) -> str:
    eval_rows, eval_groups, eval_chart, eval_names = analysis.eval_series(runs)
    train_runs = [r for r in runs if r["metrics"]]
    charts = [
        line_chart(title, analysis.training_series(train_runs, key))
        for key, title in analysis.CURVES
        if any(analysis.metric_value(row, key) is not None for run in train_runs for row in run["metrics"])
    ]
    sections = [
        _section("runs", "Runs", RUNS_NOTE + "".join(_card(run) for run in runs)),
        _section("training", "Training", f'<div class="charts">{"".join(charts)}</div>' if charts else _none("runs")),
        _section("evaluation", "Evaluation", _eval_section(eval_rows, eval_groups, eval_chart, eval_names)),
        _section("comparison", "Comparison", '<div id="comparison-view"></div>'),
        _section("trajectories", "Trajectories", _browser()),
    ]
    payload = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")  # no "</script>" inside the data
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>retool report</title>
<style>{(ASSETS / "report.css").read_text()}</style>
</head><body>
<header><h1>retool report</h1><p>{len(runs)} runs from {escape(", ".join(map(str, paths)))} &middot; {generated}</p>
<nav>{"".join(f'<a href="#{s}">{s}</a>' for s in SECTIONS)}</nav>
</header>
<main>{"".join(sections)}</main>
<script type="application/json" id="report-data">{payload}</script>
<script>{(ASSETS / "report.js").read_text()}</script>
</body></html>
"""


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{title}</h2>{body}</section>'


def _none(what: str) -> str:
    return f'<p class="empty">no {what} with these data among the report\'s folders</p>'


def _card(run: dict) -> str:
    """A run's provenance: command, commit, versions, data and its hashes, seed, key config values."""
    p = run["provenance"]
    git = p.get("git") or {}
    commit = f"{git.get('commit', '?')[:12]}{' (uncommitted changes)' if git.get('dirty') else ''}" if git else "-"
    facts = {
        "folder": run["folder"],
        "command": p.get("command_line", "-"),
        "started": p.get("started", "-"),
        "commit": commit,
        "seed": p.get("seed", "-"),
        **{key: value for key, value in run["config"].items() if key != "seed"},
    }
    data_rows = []
    for key, source in (p.get("data") or {}).items():
        what = source.get("path") or source.get("hub_id") or source.get("source") or ""
        digest = (
            source.get("sha256") or source.get("resolved_commit") or ("generated" if source.get("generated") else "")
        )
        data_rows.append((key, f"{what} {digest}".strip()))
    versions = ", ".join(f"{k} {v}" for k, v in (p.get("versions") or {}).items() if v != "not installed")
    return (
        f'<details class="card"><summary><b>{escape(run["name"])}</b> <span class="muted">{escape(run["folder"])}'
        f"</span></summary>{_table(list(facts.items()) + data_rows + [('versions', versions)])}</details>"
    )


def _table(pairs: list[tuple[str, Any]]) -> str:
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in pairs)
    return f'<table class="facts">{rows}</table>'


def _eval_section(rows: list[dict], groups: list[dict], chart: list, names: list[str] | None) -> str:
    if not rows:
        return _none("eval runs")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    head = "<tr><th>run</th><th>step</th><th>seed</th><th>benchmark</th><th>n</th><th>avg@n</th><th>95% CI</th>"
    head += "<th>maj@n</th><th>format</th><th>code calls</th></tr>"
    body = "".join(
        f"<tr><td>{escape(str(r['model']))}</td><td>{r['step'] if r['step'] is not None else '-'}</td>"
        f"<td>{r['training_seed'] if r['training_seed'] is not None else r['seed']}</td>"
        f"<td>{escape(str(r['benchmark']))}</td><td>{r['n']}</td><td>{pct(r['accuracy'])}</td>"
        f"<td>[{pct(r['ci95'][0])}, {pct(r['ci95'][1])}]</td><td>{pct(r['majority'])}</td>"
        f"<td>{pct(r['format_rate'])}</td><td>{r['code_calls']:.2f}</td></tr>"
        for r in rows
    )
    over_seeds = "".join(
        f"<tr><td>{escape(g['label'])}</td><td>{g['step'] if g['step'] is not None else '-'}</td>"
        f"<td>{g['n_seeds']}</td><td>{pct(g['mean'])}</td><td>{pct(g['std_seeds'])}</td>"
        f"<td>{pct(g['se_seeds'])}</td><td>{pct(g['se_sampling'])}</td></tr>"
        for g in groups
    )
    seeds_table = (
        '<h3>Over seeds</h3><table class="data"><tr><th>setting</th><th>step</th><th>seeds</th><th>mean avg@n</th>'
        f"<th>std (seeds)</th><th>se (seeds)</th><th>se (sampling)</th></tr>{over_seeds}</table>"
    )
    title = "eval accuracy avg@n (%), +-1.96 se"
    chart_html = line_chart(title, chart, "setting" if names else "training step", (0, 100), names)
    return f'<div class="charts">{chart_html}</div><table class="data">{head}{body}</table>{seeds_table}'


def _browser() -> str:
    """The trajectory browser's controls; report.js fills the list."""
    selects = {
        "filter-run": [("", "all runs")],
        "filter-outcome": [("", "right or wrong"), ("right", "right"), ("wrong", "wrong")],
        "filter-code": [("", "with or without code"), ("yes", "used code"), ("no", "no code")],
        "filter-tool-error": [("", "any tool result"), ("yes", "a tool error or timeout"), ("no", "no tool error")],
        "filter-truncated": [("", "truncated or not"), ("yes", "truncated"), ("no", "not truncated")],
        "filter-stop": [("", "any stop reason")],
    }
    controls = "".join(
        f'<select id="{name}">{"".join(f"<option value={json.dumps(v)}>{escape(t)}</option>" for v, t in o)}</select>'
        for name, o in selects.items()
    )
    search = '<input id="filter-problem" type="search" placeholder="problem id or text">'
    return (
        f'<div class="filters">{search}{controls}</div>'
        '<p id="match-count" class="muted"></p><div id="trajectory-list"></div>'
        '<div class="pager"><button id="prev-page">previous</button><span id="page-label"></span>'
        '<button id="next-page">next</button></div>'
    )
