"""Seconds per RL step: our trainer against TRL's GRPOTrainer on the workload of
../shared/bench/trl_grpo_baseline.py (same tiny model, tokenizer, prompts; 4 x 8 samples, 64 new tokens,
fp32, no KL, token-mean "dapo" loss, lr 1e-5), alternating runs, medians and the ratio, and peak memory.

    python benchmarks/train_bench.py [--trl-python ~/trl-venv/bin/python] [--rounds 2] [--steps 10] [--bf16]

TRL runs in its own virtual environment (see ../shared/bench/README.md); without --trl-python only ours runs.
--bf16 also runs ours with bfloat16 sampling (rollout.dtype) and bf16 autocast in the update, reported on its
own line: that is not the fp32 workload the comparison is defined on.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write
from rollout_bench import load_baseline_builders


def ours(bench_dir: Path, steps: int, bf16: bool = False) -> dict:
    from transformers import AutoModelForCausalLM

    from retool_cli.config import LossAgg, RetoolConfig
    from retool_cli.data.dataset import MathExample
    from retool_cli.interfaces import Sampling
    from retool_cli.model.precision import resolve_precision
    from retool_cli.rl.optim import build_optimizer, build_scheduler
    from retool_cli.rl.step import StepPlan, rollout_batch
    from retool_cli.rl.update import update
    from retool_cli.rollout.agent import Trajectory
    from retool_cli.rollout.hf_engine import HFEngine

    base = load_baseline_builders(bench_dir)
    work = tempfile.mkdtemp(prefix="train-bench-")
    tokenizer = base.build_tokenizer(work, vocab_size=512, seed=0)
    base.build_model(work, tokenizer, hidden=256, layers=4, heads=4, seed=0)
    model = AutoModelForCausalLM.from_pretrained(work).train()
    dataset = base.build_dataset(200, seed=0)
    cfg = RetoolConfig()
    cfg.trainer.loss_agg, cfg.trainer.lr, cfg.trainer.micro_batch_tokens = LossAgg.token_mean, 1e-5, 1 << 20
    cfg.rollout.max_response_tokens = 64
    cfg.trainer.bf16_autocast = bf16
    cfg.model.accelerate = True  # ours: the fast decode loop and the shared-prompt training forward
    optimizer = build_optimizer(model, cfg.trainer.lr, 0.0)
    scheduler = build_scheduler(optimizer, 0, steps, "constant")
    engine = HFEngine(model, tokenizer, torch.bfloat16 if bf16 else None, accelerate=True)
    times, tokens = [], []
    for step in range(steps):
        started = time.perf_counter()
        rows = [dataset[(4 * step + i) % len(dataset)] for i in range(4)]
        prompts = []
        for row in rows:
            encoded = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
            prompts.append(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
        grouped = [p for p in prompts for _ in range(8)]
        gens = engine.generate(grouped, [64] * len(grouped), [], Sampling(temperature=1.0, seed=step))
        trajectories, rewards = [], []
        for i, (prompt, gen) in enumerate(zip(grouped, gens, strict=True)):
            row = rows[i // 8]
            text = tokenizer.decode(gen.token_ids)
            numbers = re.findall(r"-?\d+", text)
            rewards.append(1.0 if numbers and numbers[-1] == row["answer"] else 0.0)
            example = MathExample(str(i // 8), "q", row["answer"], "bench")
            trajectories.append(Trajectory(example, i % 8, prompt, gen.token_ids, [1] * len(gen.token_ids)))
        batch = rollout_batch(trajectories, torch.tensor(rewards))
        update(
            StepPlan.of(cfg, resolve_precision(cfg, training=True)),
            model,
            batch,
            optimizer,
            scheduler,
            tokenizer.pad_token_id,
        )
        engine.update_weights(model)  # a no-op when the engine shares the fp32 model
        times.append(time.perf_counter() - started)
        tokens.append(sum(len(g.token_ids) for g in gens))
    return {
        "median_s_per_step": statistics.median(times[1:]),
        "tokens_per_s": sum(tokens[1:]) / sum(times[1:]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def trl(python: str, bench_dir: Path, steps: int) -> dict:
    out = Path(tempfile.mkdtemp()) / "trl.json"
    proc = subprocess.run(
        [
            python,
            str(bench_dir / "trl_grpo_baseline.py"),
            "--steps",
            str(steps),
            "--loss-type",
            "dapo",
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"TRL baseline failed:\n{proc.stderr[-2000:]}")
    data = json.loads(out.read_text())
    median = data.get("median_s_per_step") or data.get("MEDIAN_S_PER_STEP")
    if median is None:
        match = re.search(r"MEDIAN_S_PER_STEP[=: ]+([\d.]+)", proc.stdout)
        median = float(match.group(1))
    return {
        "median_s_per_step": float(median),
        "raw": {k: v for k, v in data.items() if not isinstance(v, list)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "bench")
    parser.add_argument("--trl-python", default=None)
    parser.add_argument("--rounds", type=int, default=3, help="each round runs ours, then TRL: a ratio per round")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bf16", action="store_true")
    add_json_out(parser)
    args = parser.parse_args()
    mine, theirs, mine_bf16 = [], [], []
    for round_index in range(args.rounds):
        mine.append(run_ours(args.bench_dir, args.steps, bf16=False))
        print(
            f"round {round_index}: ours {mine[-1]['median_s_per_step']:.3f} s/step, "
            f"peak RSS {mine[-1]['peak_rss_mb']:.0f} MB"
        )
        if args.trl_python:
            theirs.append(trl(args.trl_python, args.bench_dir, args.steps))
            print(f"round {round_index}: TRL  {theirs[-1]['median_s_per_step']:.3f} s/step")
        if args.bf16:
            mine_bf16.append(run_ours(args.bench_dir, args.steps, bf16=True))
            print(f"round {round_index}: ours bf16 {mine_bf16[-1]['median_s_per_step']:.3f} s/step")
    o = statistics.median(m["median_s_per_step"] for m in mine)
    print(f"ours: median {o:.3f} s/step, {statistics.median(m['tokens_per_s'] for m in mine):.0f} completion tokens/s")
    quantities = {
        "ours_s_per_step": spread([m["median_s_per_step"] for m in mine]),
        "ours_completion_tokens_per_s": spread([m["tokens_per_s"] for m in mine]),
        "ours_peak_rss_mb": spread([m["peak_rss_mb"] for m in mine]),
    }
    ratios = {}
    if theirs:
        t = statistics.median(m["median_s_per_step"] for m in theirs)
        quantities["trl_s_per_step"] = spread([m["median_s_per_step"] for m in theirs])
        ratios["s_per_step_ours_over_trl"] = paired_ratios(
            [m["median_s_per_step"] for m in mine], [m["median_s_per_step"] for m in theirs]
        )
        r = ratios["s_per_step_ours_over_trl"]
        print(f"TRL:  median {t:.3f} s/step   ratio ours/TRL = {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    if mine_bf16:
        b = statistics.median(m["median_s_per_step"] for m in mine_bf16)
        print(
            f"ours, bf16 sampling + bf16 autocast (not the fp32 workload): median {b:.3f} s/step"
            + (f"   ratio to TRL fp32 = {b / t:.2f}" if theirs else "")
        )
        quantities["ours_bf16_s_per_step"] = spread([m["median_s_per_step"] for m in mine_bf16])
    write(args.json_out, "train", quantities, ratios, {"peer": "TRL GRPOTrainer" if theirs else "not run"})


def run_ours(bench_dir: Path, steps: int, bf16: bool) -> dict:
    """In a fresh process, so that peak memory is its own."""
    proc = subprocess.run(
        [sys.executable, __file__, "--_ours", str(bench_dir), str(steps), str(int(bf16))],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--_ours":
        print(json.dumps(ours(Path(sys.argv[2]), int(sys.argv[3]), bf16=sys.argv[4] == "1")))
    else:
        main()
