"""What a real vocabulary costs the CPU test models: the same small Qwen2 body (hidden 64, 2 layers) over the
tiny tokenizer's 410 entries and over Qwen2.5's 151,665 (../shared/tokenizers), side by side: a training
forward + backward of the project's logprob pass, and the hf engine's sampling.

    python benchmarks/vocab_cost.py            # needs ../shared/tokenizers beside the checkout
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from retool_cli.interfaces import Sampling
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rl.logprobs import sequence_logprobs
from retool_cli.rollout.hf_engine import HFEngine
from tests.real_models import build_model_folder, load_real_tokenizer


def timed(fn, repeats: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(model_dir: Path, tokenizer) -> dict[str, float]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    sequences = [[int(i) for i in torch.randint(0, len(tokenizer) - 1, (256,))] for _ in range(8)]  # 2,048 tokens

    def train_pass() -> None:
        logp, _, _ = sequence_logprobs(model, sequences, tokenizer.pad_token_id, torch.device("cpu"))
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    engine = HFEngine(model, tokenizer)
    prompts = [sequences[0][:64]] * 8

    def sample() -> None:
        engine.generate(prompts, [64] * 8, [], Sampling(1.0, seed=0))

    return {
        "parameters (M)": sum(p.numel() for p in model.parameters()) / 1e6,
        "train pass, 2,048 tokens (s)": timed(train_pass),
        "sampling 8 x 64 tokens (s)": timed(sample, repeats=3),
    }


def main() -> None:
    torch.set_num_threads(2)
    from transformers import AutoTokenizer

    tiny = tiny_model_path()
    rows = {"tiny (410)": measure(tiny, AutoTokenizer.from_pretrained(tiny))}
    with tempfile.TemporaryDirectory() as tmp:
        qwen = build_model_folder("qwen2.5-instruct", Path(tmp) / "model")
        rows["Qwen2.5 (151,665)"] = measure(qwen, load_real_tokenizer("qwen2.5-instruct"))
    keys = list(next(iter(rows.values())))
    print("| model (vocabulary) | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in keys) + " |")
    a, b = rows.values()
    print(f"ratio real/tiny: train pass {b[keys[1]] / a[keys[1]]:.1f}x, sampling {b[keys[2]] / a[keys[2]]:.1f}x")


if __name__ == "__main__":
    main()
