"""Decode step on a GPU: our `hf` engine against `model.generate` as TRL calls it, on a Qwen2.5-0.5B-shaped
decoder built from random weights (no download), bf16, 4 prompts x 8 rows, every row run to full length;
then the kernel launches per decode step of ours (a step of a small batch on a GPU is launch-bound).

    python benchmarks/gpu_decode_bench.py [--new-tokens 128] [--layers 24] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from retool_cli.interfaces import Sampling
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rollout.hf_engine import HFEngine

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=4)
    add_json_out(parser)
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=args.layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=1e6,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16).eval()
    engine = HFEngine(model, tok, None, accelerate=True)
    engine.eos_ids = set()  # every row runs the full length, as min_new_tokens makes generate do
    prompts = [tok.encode(f"What is {a} * {b}? Use code.") for a, b in [(12, 34), (56, 78), (91, 23), (45, 67)]]
    rows = [p for p in prompts for _ in range(8)]
    new = args.new_tokens

    def ours() -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        engine.generate(rows, [new] * len(rows), [], Sampling(temperature=1.0, seed=0))
        torch.cuda.synchronize()
        return time.perf_counter() - started

    def generate() -> float:
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :], mask[i, width - len(row) :] = torch.tensor(row), 1
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                input_ids=ids.cuda(),
                attention_mask=mask.cuda(),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
            )
        torch.cuda.synchronize()
        return time.perf_counter() - started

    times: dict[str, list[float]] = {"ours (HFEngine)": [], "model.generate": []}
    for _ in range(args.rounds):  # alternating; the first round is warm-up
        times["ours (HFEngine)"].append(ours())
        times["model.generate"].append(generate())
    for name, values in times.items():
        median = statistics.median(values[1:] or values)
        print(f"{name}: {median / new * 1e3:.1f} ms per step, {len(rows) * new / median:.0f} tokens/s")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.generate(rows, [32] * len(rows), [], Sampling(temperature=1.0, seed=0))
    names = ("cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel")
    launches = sum(e.count for e in prof.key_averages() if e.key in names)
    print(f"ours: {launches / 32:.0f} kernel launches per decode step")
    write_results(args.json_out, times["ours (HFEngine)"][1:], times["model.generate"][1:], new, launches / 32)


def write_results(path: Path | None, ours_s: list[float], theirs_s: list[float], new: int, launches: float) -> None:
    quantities = {
        "ours_ms_per_step": spread([1e3 * s / new for s in ours_s]),
        "generate_ms_per_step": spread([1e3 * s / new for s in theirs_s]),
        "ours_launches_per_step": launches,
    }
    ratios = {"s_per_step_ours_over_generate": paired_ratios(ours_s, theirs_s)}
    write(path, "gpu_decode", quantities, ratios, {"device": torch.cuda.get_device_name()})


if __name__ == "__main__":
    main()
