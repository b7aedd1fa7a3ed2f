// retool report: the trajectory browser and the checkpoint comparison, drawn from the JSON in #report-data.
// Everything is built with DOM calls and textContent (model output is never parsed as HTML).
"use strict";

const DATA = JSON.parse(document.getElementById("report-data").textContent);
const RUNS = Object.fromEntries(DATA.runs.map((r) => [r.id, r]));
const PAGE_SIZE = 20;
let page = 0;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// ---------------------------------------------------------------- text with code blocks highlighted

const PY_TOKENS = new RegExp(
  [
    /(#[^\n]*)/.source, // comment
    /("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')/.source, // string
    /\b(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\b/.source, // number
    /\b(and|as|assert|break|class|continue|def|del|elif|else|except|False|finally|for|from|global|if|import|in|is|lambda|None|nonlocal|not|or|pass|raise|return|True|try|while|with|yield)\b/
      .source, // keyword
  ].join("|"),
  "g",
);

function highlighted(code) {
  const pre = el("pre", "code");
  let at = 0;
  for (const m of code.matchAll(PY_TOKENS)) {
    pre.append(code.slice(at, m.index));
    const cls = m[1] ? "com" : m[2] ? "str" : m[3] ? "num" : "kw";
    pre.append(el("span", cls, m[0]));
    at = m.index + m[0].length;
  }
  pre.append(code.slice(at));
  return pre;
}

// A model segment: prose, with ```python fences (inside <code> tags or not) drawn as highlighted code.
function modelText(text) {
  const box = el("div", "model");
  const fence = /```(?:python|py)?\n([\s\S]*?)(?:```|$)/g;
  let at = 0;
  for (const m of text.matchAll(fence)) {
    box.append(text.slice(at, m.index));
    box.append(highlighted(m[1].replace(/\n$/, "")));
    at = m.index + m[0].length;
  }
  box.append(text.slice(at));
  return box;
}

function toolText(text) {
  return el("div", "tool", text.replace(/^\s*<interpreter>\n?|\n?<\/interpreter>\s*$/g, ""));
}

// ---------------------------------------------------------------- one trajectory

function trajectoryCard(t) {
  const problem = DATA.problems[t.problem_id] || {};
  const card = el("article", "trajectory");
  card.dataset.correct = t.correct ? "1" : "0";
  const head = el("div", "head");
  head.append(el("span", "badge " + (t.correct ? "right" : "wrong"), t.correct ? "right" : "wrong"));
  head.append(el("b", "", t.problem_id));
  head.append(el("span", "tag", (RUNS[t.run] || {}).name || t.run));
  if (t.step !== undefined) head.append(el("span", "tag", "training step " + t.step));
  head.append(el("span", "tag", "sample " + t.sample_index));
  head.append(el("span", "tag", "stop: " + t.stop_reason));
  if (t.truncated) head.append(el("span", "tag", "truncated"));
  card.append(head);
  const body = el("div", "body");
  body.append(el("div", "prompt", problem.question || ""));
  for (const [kind, text] of t.segments || []) body.append(kind === "tool" ? toolText(text) : modelText(text));
  card.append(body);
  const foot = el("div", "foot");
  const facts = [
    ["answer", t.answer === null || t.answer === undefined ? "(none)" : t.answer],
    ["reference", problem.reference],
    ["reward", t.reward],
    ["formatted", t.formatted],
    ["overlong penalty", t.overlong_penalty],
    ["judge timed out", t.judge_timed_out],
    ["void (infrastructure failed it)", t.infra_failure || undefined],
    ["code calls", t.code_calls],
    ["tool errors", (t.code_errors || 0) + (t.code_timeouts || 0)],
    ["turns", t.turns],
    ["tokens: prompt / response / model", [t.prompt_tokens, t.response_tokens, t.model_tokens].join(" / ")],
  ];
  for (const [name, value] of facts) {
    if (value === undefined) continue;
    const span = el("span");
    span.append(el("span", "tag", name + " "), el("b", "", value));
    foot.append(span);
  }
  card.append(foot);
  return card;
}

// ---------------------------------------------------------------- filters and pages

const FILTERS = ["filter-problem", "filter-run", "filter-outcome", "filter-code", "filter-tool-error", "filter-truncated", "filter-stop"];

function value(id) {
  return document.getElementById(id).value;
}

function matches(t) {
  const query = value("filter-problem").trim().toLowerCase();
  if (query) {
    const question = ((DATA.problems[t.problem_id] || {}).question || "").toLowerCase();
    if (!t.problem_id.toLowerCase().includes(query) && !question.includes(query)) return false;
  }
  const yes = (choice, flag) => choice === "" || (choice === "yes") === Boolean(flag);
  const toolError = (t.code_errors || 0) + (t.code_timeouts || 0) > 0;
  return (
    (value("filter-run") === "" || t.run === value("filter-run")) &&
    (value("filter-outcome") === "" || (value("filter-outcome") === "right") === Boolean(t.correct)) &&
    yes(value("filter-code"), t.code_calls > 0) &&
    yes(value("filter-tool-error"), toolError) &&
    yes(value("filter-truncated"), t.truncated) &&
    (value("filter-stop") === "" || t.stop_reason === value("filter-stop"))
  );
}

function render() {
  const found = DATA.trajectories.filter(matches);
  const pages = Math.max(1, Math.ceil(found.length / PAGE_SIZE));
  page = Math.min(page, pages - 1);
  const list = document.getElementById("trajectory-list");
  list.replaceChildren(...found.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE).map(trajectoryCard));
  const shown = Object.values(DATA.counts).reduce((a, c) => a + c.shown, 0);
  const total = Object.values(DATA.counts).reduce((a, c) => a + c.total, 0);
  const note = shown < total ? ` (the report holds ${shown} of the runs' ${total}: whole problems, drawn with seed 0)` : "";
  document.getElementById("match-count").textContent = `${found.length} trajectories match of ${shown} in this report${note}`;
  document.getElementById("page-label").textContent = `page ${page + 1} of ${pages}`;
  document.getElementById("prev-page").disabled = page === 0;
  document.getElementById("next-page").disabled = page >= pages - 1;
}

function setUpBrowser() {
  const runSelect = document.getElementById("filter-run");
  for (const run of DATA.runs) {
    const c = DATA.counts[run.id];
    if (!c || !c.total) continue;
    const what = run.command === "eval" ? "eval samples" : "training rollouts";
    runSelect.append(new Option(`${run.name}: ${what} (${c.shown} of ${c.total})`, run.id));
  }
  const stops = [...new Set(DATA.trajectories.map((t) => t.stop_reason))].sort();
  for (const stop of stops) document.getElementById("filter-stop").append(new Option(stop, stop));
  const refilter = () => {
    page = 0;
    render();
  };
  for (const id of FILTERS) {
    for (const kind of ["input", "change"]) document.getElementById(id).addEventListener(kind, refilter);
  }
  document.getElementById("prev-page").addEventListener("click", () => { page -= 1; render(); });
  document.getElementById("next-page").addEventListener("click", () => { page += 1; render(); });
  render();
}

// ---------------------------------------------------------------- two checkpoints on the same problems

function setUpComparison() {
  const view = document.getElementById("comparison-view");
  const c = DATA.comparison;
  if (!c) {
    view.append(el("p", "empty", "needs two eval runs on the same problems"));
    return;
  }
  const name = (id) => (RUNS[id] || {}).name || id;
  const mean = (key) => (100 * c.rows.reduce((a, r) => a + r[key], 0)) / Math.max(1, c.rows.length);
  const gained = c.rows.filter((r) => r.flip === "gained").length;
  const lost = c.rows.filter((r) => r.flip === "lost").length;
  view.append(
    el("p", "", `A = ${name(c.a)}, B = ${name(c.b)}: ${c.rows.length} problems in both; accuracy A ${mean("acc_a").toFixed(1)}%, ` +
      `B ${mean("acc_b").toFixed(1)}%; majority verdict wrong -> right on ${gained}, right -> wrong on ${lost}. ` +
      "Click a flipped problem to see one trajectory of each side by side."),
  );
  const d = c.paired;
  const pts = (x) => (100 * x).toFixed(1);
  view.append(
    el("p", "paired", `B - A = ${pts(d.difference)} points over ${d.problems} problems, paired: standard error ` +
      `${pts(d.se)}, 95% bootstrap interval [${pts(d.ci95[0])}, ${pts(d.ci95[1])}] (problems resampled together), ` +
      `p = ${d.p_value.toPrecision(2)} for "no difference" (sign-flip test).`),
  );
  const table = el("table", "data");
  table.id = "flip-table";
  const header = el("tr");
  for (const h of ["problem", "A right", "B right", "flip"]) header.append(el("th", "", h));
  table.append(header);
  const side = el("div", "side");
  side.id = "side-by-side";
  for (const r of c.rows.filter((r) => r.flip !== "same")) {
    const tr = el("tr", "flip");
    tr.append(el("td", "", r.problem_id), el("td", "", (100 * r.acc_a).toFixed(0) + "%"), el("td", "", (100 * r.acc_b).toFixed(0) + "%"));
    tr.append(el("td", r.flip, r.flip === "gained" ? "wrong -> right" : "right -> wrong"));
    tr.addEventListener("click", () => side.replaceChildren(...(c.pairs[r.problem_id] || []).filter(Boolean).map(trajectoryCard)));
    table.append(tr);
  }
  const scroller = el("div", "scroll");
  scroller.append(table);
  view.append(scroller, side);
}

setUpBrowser();
setUpComparison();
