"""Overlapped training (trainer.max_staleness=1, rl/overlap.py), without and with partial rollouts
(rollout.partial), with the sampler's engine in threads of the trainer (colocated) or in a process of its own
(rollout.placement=separate), against the synchronous trainer (0), side by side: the real `retool train` loop,
in a fresh process per run, on the same checkpoint, questions and seeds, the runs in a rotating order within
each repeat (a ratio per repeat).

    python benchmarks/overlap_bench.py [--checkpoint outputs/smoke/sft] [--repeats 3] [--steps 6] [--engine vllm]

Two workloads, as benchmarks/rollout_bench.py's `--loops` draws them: the smoke training step (its SFT
checkpoint, 4 questions x 8, the real sandbox), and a long tail: a policy that calls the interpreter --calls
times (rollout_bench's multi-call SFT, built once), --questions questions x 8, a Pareto latency added to every
interpreter call (rollout_bench.LongTail: drawn from a hash of the code, so both runs meet the same latencies
for the same calls). Reported per run: wall seconds per step over steps 2.. (step 1 cannot overlap), the
trainer's and the sampler's idle shares, the seconds per step spent loading weights into the sampler's engines
(separate: the gloo broadcasts), and each arm / k=0 per repeat.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write
from rollout_bench import LongTail, multi_call_checkpoint, smoke_config


def one_run(spec: dict) -> dict:
    """One `retool train` run in this process (spec: checkpoint, overrides, tail latency or None, steps):
    the wall time at each logged step and the run's idle shares."""
    import retool_cli.commands.train as command
    from retool_cli.run_keys import config_key

    config = command.from_checkpoint(
        smoke_config(spec["engine"], [f"trainer.init_from={spec['checkpoint']}", *spec["overrides"]])
    )
    logged: list[float] = []
    rows: list[dict] = []
    write_row = command.MetricsLog.write

    def timed_write(self, row, *args, **kwargs):
        logged.append(time.perf_counter())
        rows.append(row)
        return write_row(self, row, *args, **kwargs)

    open_runtime = command.open_runtime

    @contextlib.contextmanager
    def with_tail(*args, **kwargs):
        with open_runtime(*args, **kwargs) as rt:
            tail = spec["tail"]
            yield replace(rt, tools=[LongTail(t, *tail) for t in rt.tools]) if tail else rt

    command.MetricsLog.write, command.open_runtime = timed_write, with_tail
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            command.train(config, Path(run_dir), config_key(config), 0, 1)
    finally:  # (--in-process: the next run patches the originals again)
        command.MetricsLog.write, command.open_runtime = write_row, open_runtime
    per_step = [b - a for a, b in itertools.pairwise(logged)]  # steps 2..: what overlap can change
    timed = ("trainer_idle_share", "sampler_idle_share", "weight_transfer_s")  # k = 0 logs none of them
    shares = {k: statistics.mean(r.get(f"time/{k}", 0.0) for r in rows[1:]) for k in timed}
    return {"s_per_step": statistics.mean(per_step), **shares, "rows": len(rows)}


ARMS = {  # the runs compared, by the overrides that make them
    "k0": ["trainer.max_staleness=0"],
    "k1": ["trainer.max_staleness=1"],
    "k1_partial": ["trainer.max_staleness=1", "rollout.partial=true"],
    # an engine process on one core, the trainer on the other (rollout.engine_threads=1 of this machine's 2)
    "k1_separate": ["trainer.max_staleness=1", "rollout.placement=separate"],
    "k1_partial_separate": ["trainer.max_staleness=1", "rollout.partial=true", "rollout.placement=separate"],
}
PARTIAL2 = ["rollout.partial_turns=2"]  # (with --arms) the first two turns with the batch's own weights
# (with --arms) the first 48 model tokens with the batch's own weights, a turn cut there continued (the turn count
# set past the policy's turns, so that the tokens alone decide)
TOKENS48 = ["rollout.partial_turns=8", "rollout.partial_tokens=48"]
MORE_ARMS = {f"{arm}_turns2": [*ARMS[arm], *PARTIAL2] for arm in ("k1_partial", "k1_partial_separate")}
MORE_ARMS |= {f"{arm}_tokens48": [*ARMS[arm], *TOKENS48] for arm in ("k1_partial", "k1_partial_separate")}
# (with --arms) k = 2: the tails of partial rollouts sample with the version of the update before the last one, so
# beside the last update rather than after it
MORE_ARMS |= {arm.replace("k1", "k2"): ["trainer.max_staleness=2", *ARMS[arm][1:]] for arm in [*ARMS][1:]}


def run_isolated(spec: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--_run", json.dumps(spec)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    args = arguments()
    from retool_cli.checkpoint_paths import latest_checkpoint

    smoke = latest_checkpoint(args.checkpoint)
    if smoke is None:
        sys.exit(f"{args.checkpoint} has no checkpoint: run `make smoke` first (its SFT checkpoint is the default)")
    multi = latest_checkpoint(multi_call_checkpoint(args.calls, args.multi_call_dir))
    steps = [f"trainer.total_steps={args.steps}", f"trainer.save_every={args.steps}", "trainer.resume=false"]
    budgets = [f"rollout.max_code_calls={args.calls}", f"rollout.max_turns={args.calls + 1}"]
    workloads = {
        "smoke": (smoke, steps, None),
        "long_tail": (multi, [*steps, *budgets, f"trainer.questions_per_step={args.questions}"], args.tail),
    }
    quantities: dict = {}
    ratios: dict = {}
    arms = {arm: {**ARMS, **MORE_ARMS}[arm] for arm in ["k0", *args.arms]}
    for name, (checkpoint, overrides, tail) in workloads.items():
        if name not in args.workloads:
            continue
        runs: dict[str, list[dict]] = {arm: [] for arm in arms}
        for r in range(args.repeats):
            for arm in [*arms][r % len(arms) :] + [*arms][: r % len(arms)]:  # each arm first in turn
                # (vLLM: rollout.loop=auto is async, and turns with partial rollouts, which switch between turns)
                spec = {
                    "checkpoint": str(checkpoint),
                    "overrides": [*overrides, *arms[arm]],
                    "tail": tail,
                    "engine": args.engine,
                }
                runs[arm].append(one_run(spec) if args.in_process else run_isolated(spec))
                print(f"{name} repeat {r} {arm}: {runs[arm][-1]['s_per_step']:.2f} s/step", flush=True)
        for arm, got in runs.items():
            quantities[f"{name}/{arm}_s_per_step"] = spread([g["s_per_step"] for g in got])
            for share in ("trainer_idle_share", "sampler_idle_share", "weight_transfer_s"):
                if arm != "k0":
                    quantities[f"{name}/{arm}_{share}"] = spread([g[share] for g in got])
        for arm in [*arms][1:]:
            r = ratios[f"{name}/s_per_step_{arm}_over_k0"] = paired_ratios(
                [g["s_per_step"] for g in runs[arm]], [g["s_per_step"] for g in runs["k0"]]
            )
            print(f"{name}: {arm} / k0 wall per step {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}, n={r['n']})")
    write(args.json_out, "overlap", quantities, ratios, {"peer": "the synchronous trainer (max_staleness=0)"})


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("outputs/smoke/sft"), help="the smoke SFT run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="steps per run (step 1 is not timed)")
    parser.add_argument("--questions", type=int, default=8, help="questions per long-tail step")
    parser.add_argument("--calls", type=int, default=3, help="interpreter calls of the long-tail policy")
    parser.add_argument(
        "--tail", type=float, nargs=3, default=[0.05, 1.0, 5.0], help="Pareto latency: scale (s), alpha, cap (s)"
    )
    parser.add_argument(
        "--multi-call-dir", type=Path, default=Path("outputs/bench_multi_call_sft"), help="the long-tail policy"
    )
    parser.add_argument(
        "--arms", nargs="+", default=[*ARMS][1:], choices=[*ARMS, *MORE_ARMS][1:], help="beside k0 (always run)"
    )
    parser.add_argument("--workloads", nargs="+", default=["smoke", "long_tail"], choices=["smoke", "long_tail"])
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout=ENGINE (vllm: its CPU build)")
    parser.add_argument(
        "--in-process", action="store_true", help="every run in this process (no figures: the quick check of keys)"
    )
    add_json_out(parser)
    return parser.parse_args()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_run":
        print(json.dumps(one_run(json.loads(sys.argv[2]))))
    else:
        main()
