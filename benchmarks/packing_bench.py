"""Seconds per RL update: packed rows (trainer.pack_sequences) against right-padded micro-batches, side by side.

    python benchmarks/packing_bench.py [--rounds 3] [--questions 8] [--group 8]

The workload is one GRPO batch with the long tail of multi-turn RL: `--questions` prompts of 64-160 tokens,
`--group` responses each, response lengths drawn log-normal and clipped to [60, 600] (10x), a tool segment
(mask 0) in each. The model is the TRL baseline's shape (../shared/bench/README.md: Qwen2, hidden 256,
intermediate 1024, 4 layers, 4 heads, 2 KV heads here, vocabulary 512; random init, fp32). Each arm runs
`rl/update.py:update` as `retool train` does (on-policy, token-mean loss, AdamW, micro-batches of at most
`--budget` tokens) from the same initial weights on the same batch, with model.accelerate (each GRPO prompt
once) on and off. Rounds alternate the arms in one process after one warm-up update each; ratios are taken
within each round. Checks: the packed update's loss equals the padded one's (fp32 rounding) and it computed no
padded position.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write

ARMS = {  # name: (pack_sequences, model.accelerate)
    "padded": (False, False),
    "packed": (True, False),
    "padded, shared prompts": (False, True),
    "packed, shared prompts": (True, True),
}


def model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(config).train()


def long_tail_batch(questions: int, group: int, seed: int = 0):
    """GRPO groups with log-normal response lengths over [60, 600], rewards 0/1 and sampler log-probs."""
    from retool_cli.data.dataset import MathExample
    from retool_cli.rl.step import rollout_batch
    from retool_cli.rollout.agent import Trajectory

    generator = torch.Generator().manual_seed(seed)
    trajectories, rewards = [], []
    for q in range(questions):
        prompt = torch.randint(4, 512, (int(torch.randint(64, 161, (1,), generator=generator)),), generator=generator)
        for j in range(group):
            length = int(torch.empty(1).log_normal_(5.2, 0.6, generator=generator).clamp(60, 600))
            response = torch.randint(4, 512, (length,), generator=generator).tolist()
            mask = [0 if length // 3 <= k < length // 3 + 20 else 1 for k in range(length)]  # a tool result
            logprobs = (-torch.rand(length, generator=generator)).tolist()
            example = MathExample(f"q{q}", "x", "1", "t")
            trajectories.append(Trajectory(example, j, prompt.tolist(), response, mask, response_logprobs=logprobs))
            rewards.append(float(torch.randint(0, 2, (1,), generator=generator)))
    return rollout_batch(trajectories, torch.tensor(rewards))


def timed_update(initial: torch.nn.Module, batch, pack: bool, accelerate: bool, budget: int) -> tuple[float, dict]:
    """One update from the initial weights: (seconds, the step's train/* metrics)."""
    from retool_cli.config import RetoolConfig
    from retool_cli.model.precision import resolve_precision
    from retool_cli.rl.optim import build_scheduler
    from retool_cli.rl.step import StepPlan
    from retool_cli.rl.update import update

    cfg = RetoolConfig()
    cfg.trainer.pack_sequences, cfg.model.accelerate, cfg.trainer.micro_batch_tokens = pack, accelerate, budget
    policy = copy.deepcopy(initial)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    plan = StepPlan.of(cfg, resolve_precision(cfg, training=True))
    started = time.perf_counter()
    metrics = update(plan, policy, batch, optimizer, build_scheduler(optimizer, 0, 1, "constant"), 0)
    return time.perf_counter() - started, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--budget", type=int, default=8192, help="trainer.micro_batch_tokens")
    add_json_out(parser)
    args = parser.parse_args()
    initial, batch = model(), long_tail_batch(args.questions, args.group)
    lengths = [len(x.token_ids) for x in batch.objects["trajectory"]]
    print(f"{len(lengths)} sequences, {sum(lengths)} tokens, lengths {min(lengths)}-{max(lengths)}", flush=True)
    for pack, accelerate in ARMS.values():  # warm-up
        timed_update(initial, batch, pack, accelerate, args.budget)
    seconds: dict[str, list[float]] = {name: [] for name in ARMS}
    metrics: dict[str, dict] = {}
    for round_index in range(args.rounds):
        for name, (pack, accelerate) in ARMS.items():
            elapsed, metrics[name] = timed_update(initial, batch, pack, accelerate, args.budget)
            seconds[name].append(elapsed)
        print(f"round {round_index}: " + ", ".join(f"{n} {s[-1]:.2f} s" for n, s in seconds.items()), flush=True)
    quantities = {f"{name}/s_per_update": spread(values) for name, values in seconds.items()}
    quantities |= {f"{name}/padding_share": metrics[name]["train/padding_share"] for name in ARMS}
    ratios = {
        "packed_over_padded": paired_ratios(seconds["packed"], seconds["padded"]),
        "packed_over_padded_shared_prompts": paired_ratios(
            seconds["packed, shared prompts"], seconds["padded, shared prompts"]
        ),
    }
    for name, r in ratios.items():
        print(f"{name}: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    same = all(
        abs(metrics[p]["train/loss"] - metrics[q]["train/loss"]) < 1e-4
        for p, q in (("packed", "padded"), ("packed, shared prompts", "padded, shared prompts"))
    )
    no_padding = (
        metrics["packed"]["train/padding_share"] == 0 == metrics["packed, shared prompts"]["train/padding_share"]
    )
    write(args.json_out, "packing", quantities, ratios, {"same_loss": same, "packed_computes_no_padding": no_padding})


if __name__ == "__main__":
    main()
