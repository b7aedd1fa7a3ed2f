"""What a real vocabulary costs the CPU test models: the same small Qwen2 body (hidden 64, 2 layers) over the
tiny tokenizer's 410 entries and over Qwen2.5's 151,665 (../shared/tokenizers), side by side: a training
forward + backward of the project's logprob pass (8 sequences of --length tokens), and the hf engine's sampling
(8 rows of a quarter of that after a prompt of as many).

    python benchmarks/vocab_cost.py [--repeats 5]   # needs ../shared/tokenizers beside the checkout
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def workload(model_dir: Path, tokenizer, length: int) -> tuple[float, dict]:
    """The model's parameter count (millions) and its two timed passes, each run once to warm up."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    sequences = [[int(i) for i in torch.randint(0, len(tokenizer) - 1, (length,))] for _ in range(8)]  # (8, length)

    def train_pass() -> None:
        logp, _, _ = sequence_logprobs(model, sequences, tokenizer.pad_token_id, torch.device("cpu"))
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    engine = HFEngine(model, tokenizer)
    prompts = [sequences[0][: length // 4]] * 8

    def sample() -> None:
        engine.generate(prompts, [length // 4] * 8, [], Sampling(1.0, seed=0))

    passes = {"train_pass_s": train_pass, "sampling_s": sample}
    for fn in passes.values():
        fn()
    return sum(p.numel() for p in model.parameters()) / 1e6, passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="each repeat times both models, one after the other")
    parser.add_argument("--length", type=int, default=256, help="tokens per training sequence (8); sampling: a quarter")
    add_json_out(parser)
    args = parser.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoTokenizer

    tiny = tiny_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        qwen = build_model_folder("qwen2.5-instruct", Path(tmp) / "model")
        models = {
            "tiny": workload(tiny, AutoTokenizer.from_pretrained(tiny), args.length),
            "qwen2.5": workload(qwen, load_real_tokenizer("qwen2.5-instruct"), args.length),
        }
        times: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for name, (_, passes) in models.items():
                for key, fn in passes.items():
                    times.setdefault(f"{name}/{key}", []).append(timed(fn))
    quantities: dict[str, object] = {f"{name}/parameters_m": params for name, (params, _) in models.items()}
    quantities |= {key: spread(values) for key, values in times.items()}
    ratios = {f"{key}_qwen2.5_over_tiny": paired_ratios(times[f"qwen2.5/{key}"], times[f"tiny/{key}"]) for key in KEYS}
    print(f"| model | parameters | train pass, 8 x {args.length} tokens | sampling 8 x {args.length // 4} tokens |")
    print("|---|---:|---:|---:|")
    for name, (params, _) in models.items():
        cells = " | ".join(f"{statistics.median(times[f'{name}/{key}']):.3f} s" for key in KEYS)
        print(f"| {name} | {params:.2f}M | {cells} |")
    shown = [f"{k} {r['median']:.1f}x ({r['min']:.1f}-{r['max']:.1f})" for k, r in ratios.items()]
    print("ratio real/tiny: " + ", ".join(shown))
    write(args.json_out, "vocab_cost", quantities, ratios)


KEYS = ("train_pass_s", "sampling_s")

if __name__ == "__main__":
    main()
