"""Seconds per SFT step: `retool sft`'s step against TRL's SFTTrainer on the same traces, model and batch.

    python benchmarks/sft_bench.py --trl-python ~/trl-venv/bin/python [--rounds 2] [--steps 30]

The workload is the smoke pipeline's SFT (recipe=dapo_smoke): the tiny model (random init, fp32), the traces
`retool sft` writes for the synthetic task (half call the interpreter; the interpreter's output is not the
model's and carries no loss), 64 traces a step, AdamW at lr 2e-3 with 50 warm-up steps and a cosine decay,
gradients clipped at 1.0. TRL gets the same model folder and the same tokenized traces, with `labels` -100
wherever our loss mask is 0, so both minimise the same token-mean loss; each draws its own random batches of 64
from the same pool. Ours runs as `retool sft` does (model.accelerate on, as the recipe sets: the traces'
common system turn once and the LM head only at the model's tokens), packed (sft.pack_sequences: each
micro-batch one row, no padding; rl/packing.py) and, on its own line, with accelerate off (transformers' forward,
for the record). TRL runs padded and padding-free (SFTConfig.padding_free: the batch flattened into one row with
position ids restarting per trace, which transformers' SDPA attention turns into a block-diagonal mask on a
CPU; TRL's docs name flash-attention for it, which a CPU does not have). TRL runs in its own virtual
environment (../shared/bench/README.md); without --trl-python only ours runs. Each run is a fresh process;
rounds alternate; the first 3 steps of each run are warm-up and not counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write

WARMUP = 3
OURS = {  # name: (model.accelerate, sft.pack_sequences)
    "ours": (True, False),
    "ours, packed": (True, True),
    "ours, accelerate off": (False, False),
}
TRL = {"TRL SFTTrainer": False, "TRL SFTTrainer, padding-free": True}  # name: padding_free

TRL_SCRIPT = r"""
import json, statistics, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer

work, steps, warmup, padding_free = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "True"
rows = [json.loads(line) for line in open(f"{work}/traces.jsonl")]
tokenizer = AutoTokenizer.from_pretrained(f"{work}/model")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(f"{work}/model", dtype=torch.float32)


class Clock(TrainerCallback):
    def __init__(self):
        self.times, self.losses = [], []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.started)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


clock = Clock()
args = SFTConfig(
    output_dir=f"{work}/trl_out", per_device_train_batch_size=64, gradient_accumulation_steps=1, max_steps=steps,
    learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=50, weight_decay=0.0, max_grad_norm=1.0,
    optim="adamw_torch", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0, bf16=False,
    fp16=False, max_length=None, dataloader_num_workers=0, dataset_num_proc=None, padding_free=padding_free,
)
trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                     callbacks=[clock])
trainer.train()
print(json.dumps({"median_s_per_step": statistics.median(clock.times[warmup:]), "losses": clock.losses}))
"""


def smoke_sft_config(*overrides: str):
    """`retool sft recipe=dapo_smoke` composed as the command composes it, with `overrides` on top."""
    from hydra import compose, initialize_config_dir

    from retool_cli.compose import CONF_DIR, register_configs, to_config

    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return to_config(compose("sft", overrides=["recipe=dapo_smoke", *overrides]))


def write_workload(work: Path, problems: int) -> None:
    """The smoke recipe's SFT traces (tokenized, `labels` -100 off the loss mask) and the tiny model folder."""
    import shutil

    from retool_cli.commands.sft import sft_traces
    from retool_cli.model.loading import load_tokenizer
    from retool_cli.model.tiny import tiny_model_path

    config = smoke_sft_config(f"data.synthetic.num_examples={problems}")
    traces = sft_traces(config, load_tokenizer(config.model))
    (work / "prompt_lengths.json").write_text(json.dumps([len(t.prompt_ids) for t in traces]))
    with open(work / "traces.jsonl", "w") as f:
        for t in traces:
            start = len(t.prompt_ids)
            labels = [-100] * len(t.input_ids)
            for j, counted in enumerate(t.response_mask):
                if counted:
                    labels[start + j] = t.input_ids[start + j]
            f.write(json.dumps({"input_ids": t.input_ids, "labels": labels}) + "\n")
    shutil.copytree(tiny_model_path(), work / "model")


def ours(work: Path, steps: int, accelerate: bool, pack: bool) -> dict:
    """`retool sft`'s step (commands/sft.py: batch_loss, clipping, AdamW, the schedule) on the workload."""
    import random

    import torch

    from retool_cli.commands.sft import batch_loss
    from retool_cli.data.traces import Trace
    from retool_cli.model.loading import load_policy, load_tokenizer
    from retool_cli.model.precision import resolve_precision
    from retool_cli.rl.optim import build_optimizer, build_scheduler

    config = smoke_sft_config(
        f"model.name_or_path={work}/model", f"model.accelerate={accelerate}", f"sft.pack_sequences={pack}"
    )
    traces = []
    starts = json.loads((work / "prompt_lengths.json").read_text())
    for line, start in zip((work / "traces.jsonl").read_text().splitlines(), starts, strict=True):
        row = json.loads(line)
        mask = [int(label != -100) for label in row["labels"][start:]]
        traces.append(Trace(row["input_ids"][:start], row["input_ids"][start:], mask))
    torch.manual_seed(0)
    precision = resolve_precision(config, training=True)
    model = load_policy(config.model, precision, config.model.name_or_path, False, None)
    pad_id = load_tokenizer(config.model).pad_token_id
    optimizer = build_optimizer(model, config.sft.lr, config.sft.weight_decay)
    scheduler = build_scheduler(optimizer, config.sft.warmup_steps, config.sft.steps, config.sft.schedule)
    rng, times, losses = random.Random(0), [], []
    for _ in range(steps):
        started = time.perf_counter()
        loss, _, _ = batch_loss(
            config, model, rng.sample(traces, config.sft.batch_size), pad_id, precision.bf16_autocast
        )
        losses.append(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.trainer.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return {"median_s_per_step": statistics.median(times[WARMUP:]), "losses": losses}


def run(command: list[str]) -> dict:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:2])} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", default=None)
    parser.add_argument("--rounds", type=int, default=3, help="each round runs ours, then TRL: a ratio per round")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--problems", type=int, default=2000, help="the smoke recipe's problems the traces come from")
    add_json_out(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sft-bench-"))
    write_workload(work, args.problems)
    (work / "trl_sft.py").write_text(TRL_SCRIPT)
    results: dict[str, list[dict]] = {name: [] for name in (*OURS, *TRL)}
    for round_index in range(args.rounds):
        for name, (accelerate, pack) in OURS.items():
            command = [sys.executable, __file__, "--_ours", str(work), str(args.steps), str(accelerate), str(pack)]
            results[name].append(run(command))
        for name, padding_free in TRL.items() if args.trl_python else ():
            script = [args.trl_python, str(work / "trl_sft.py"), str(work), str(args.steps), str(WARMUP)]
            results[name].append(run([*script, str(padding_free)]))
        line = ", ".join(f"{n} {r[-1]['median_s_per_step']:.3f}" for n, r in results.items() if r)
        print(f"round {round_index}: s/step {line}")
    medians = {n: statistics.median(r["median_s_per_step"] for r in runs) for n, runs in results.items() if runs}
    for name, seconds in medians.items():
        last = statistics.mean(statistics.mean(r["losses"][-5:]) for r in results[name])
        print(f"{name}: median {seconds:.3f} s/step; mean loss of the last 5 steps {last:.3f}")
    per_step = {n: [r["median_s_per_step"] for r in runs] for n, runs in results.items() if runs}
    quantities = {f"{n}/s_per_step": spread(v) for n, v in per_step.items()}
    quantities |= {
        f"{n}/last_5_loss": statistics.mean(statistics.mean(r["losses"][-5:]) for r in runs)
        for n, runs in results.items()
        if runs
    }
    ratios = {}
    if "TRL SFTTrainer" in per_step:
        ratios["s_per_step_ours_over_trl"] = paired_ratios(per_step["ours"], per_step["TRL SFTTrainer"])
        ratios["s_per_step_ours_packed_over_trl_padding_free"] = paired_ratios(
            per_step["ours, packed"], per_step["TRL SFTTrainer, padding-free"]
        )
        for name, r in ratios.items():
            print(f"{name} = {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}, {r['n']} rounds)")
    write(args.json_out, "sft", quantities, ratios, {"peer": "TRL SFTTrainer" if "TRL SFTTrainer" in per_step else ""})


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--_ours":
        print(json.dumps(ours(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "True", sys.argv[5] == "True")))
    else:
        main()
