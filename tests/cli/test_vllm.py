"""`retool eval` and `retool train` with `rollout=vllm` (vLLM's CPU build) through the real command line:
greedy parity with the hf engine from the first step, exact resume after SIGKILL, the two rollout loops
(two processes, each with its engine: tests/cli/test_nodes.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from retool_cli.model.precision import Precision
from tests.cli.test_train import TRAIN, comparable, metrics_of
from tests.helpers import TINY, die_after, read_jsonl, run_retool

FP32_CPU = Precision(torch.device("cpu"), torch.float32, False, torch.float32)  # model.dtype=auto on a CPU

# vLLM as users run it (compiled): the greedy parity test; the others skip compilation, which vLLM 0.32's CPU
# build redoes at every engine start (10-20 s; rollout.vllm_enforce_eager)
VLLM_COMPILED = ["rollout=vllm", "rollout.vllm_kv_cache_gib=0.25"]
VLLM = [*VLLM_COMPILED, "rollout.vllm_enforce_eager=true"]
GREEDY_EVAL = [
    *TINY,
    "benchmark.max_problems=8",
    "benchmark.n_samples=1",
    "benchmark.temperature=0",
    "benchmark.max_response_tokens=96",
    "eval.bootstrap=100",
]
ROLLOUT_METRICS = (
    "reward/",
    "rollout/code_calls",
    "rollout/response_tokens",
    "rollout/turns",
    "rollout/stop_",
)


def test_greedy_eval_through_vllm_equals_the_hf_engines(sft_checkpoint: Path, tmp_path: Path) -> None:
    """The whole eval (agent loop, interpreter, judge) on an SFT checkpoint: vLLM and hf write the same samples
    when decoding greedily, and the command line's `rollout=vllm` beats the recipe's `rollout.engine: hf`."""
    results = {}
    for engine, extra in (("hf", ["rollout=hf"]), ("vllm", VLLM_COMPILED)):
        args = ["eval", *GREEDY_EVAL, *extra, f"ckpt={sft_checkpoint}", f"hydra.run.dir={engine}"]
        fresh = {"RETOOL_TEST_ZYGOTE": "0"} if engine == "vllm" else {}  # vLLM's import notes in this log too
        proc = run_retool(*args, cwd=tmp_path, env=fresh, check=True)
        results[engine] = json.loads((tmp_path / engine / "results.json").read_text())
    # vLLM's start-up notes that name nothing a user can change are filtered out of the log (and no C++ notes)
    out = proc.stdout + proc.stderr
    notes = ("LD_PRELOAD", "global random seed", "torch.set_num_threads", "Triton", "raw prompts", "[W")
    assert not [note for note in notes if note in out], out
    assert results["vllm"]["protocol"]["engine"] == "vllm" and results["hf"]["protocol"]["engine"] == "hf"
    samples = {e: read_jsonl(tmp_path / e / "samples.jsonl") for e in results}
    assert len(samples["vllm"]) == 8
    assert [s["segments"] for s in samples["vllm"]] == [s["segments"] for s in samples["hf"]]
    assert results["vllm"]["metrics"] == results["hf"]["metrics"]


def test_train_with_vllm_samples_from_init_from_at_step_one(sft_checkpoint: Path, tmp_path: Path) -> None:
    """vLLM starts from the weights the policy starts from (here `trainer.init_from`), not the base model:
    greedy rollouts of step 1 are the hf engine's."""
    rows = {}
    for engine, extra in (("hf", ["rollout=hf"]), ("vllm", VLLM)):
        run_retool(
            "train",
            *TRAIN,
            *extra,
            "trainer.total_steps=1",
            "rollout.temperature=0",
            "trainer.allow_no_learning=true",
            f"trainer.init_from={sft_checkpoint}",
            f"hydra.run.dir={engine}",
            cwd=tmp_path,
            check=True,
        )
        [row] = metrics_of(tmp_path / engine)
        rows[engine] = {k: v for k, v in row.items() if k.startswith(ROLLOUT_METRICS)}
    assert rows["vllm"] == rows["hf"]
    assert rows["hf"]["rollout/response_tokens"] > 0


def test_train_with_vllm_resumes_exactly_after_sigkill(sft_checkpoint: Path, tmp_path: Path) -> None:
    """vLLM's per-request seeds make its CPU sampling reproducible across processes: a run killed after its
    step-2 checkpoint and started again ends with the metrics of an uninterrupted run (the resumed engine
    samples from the checkpoint's weights). Through the async loop (rollout.loop=auto with vLLM)."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    args = ["train", *TRAIN, *VLLM, "rollout.loop=async", f"trainer.init_from={sft_checkpoint}"]
    run_retool(*args, cwd=whole, check=True)
    reference = metrics_of(whole)
    assert [r["step"] for r in reference] == [1, 2, 3]
    die_after(args, cwd=broken, when="step:2")  # killed right after step 2
    run_retool(*args, cwd=broken, check=True)
    assert comparable(metrics_of(broken)) == comparable(reference)


def test_async_and_turns_sample_the_same_through_vllm(sft_checkpoint: Path, request: pytest.FixtureRequest) -> None:
    """vLLM's stream (rollout.loop=async: one request per trajectory turn, the engine stepping whatever is in
    flight) against its batch calls (turns) on the SFT checkpoint at temperature 1, through the real sandbox and
    the recipe's protocol: the same trajectories token for token, also when tool calls finish in a random order;
    later turns are served from the prefix cache. A deadline (reached for sure: every tool call takes 1 s) ends
    the late trajectories, aborts their requests in flight, and the engine is left with none (a weight sync then
    goes through)."""
    from transformers import AutoTokenizer

    from retool_cli.checkpoint_paths import latest_checkpoint
    from retool_cli.config import (
        Isolation,
        ModelConfig,
        ProtocolConfig,
        RolloutConfig,
        RolloutLoop,
        SandboxConfig,
        SyntheticConfig,
    )
    from retool_cli.data.dataset import MathExample
    from retool_cli.data.synthetic import generate
    from retool_cli.env.protocol import build_protocol
    from retool_cli.env.sandbox import Sandbox
    from retool_cli.env.tools import CodeInterpreter
    from retool_cli.model.loading import load_model
    from retool_cli.rollout.agent import run_rollouts
    from retool_cli.rollout.vllm_engine import VLLMEngine
    from tests.unit.test_schedules import Delayed, jittered

    checkpoint = latest_checkpoint(sft_checkpoint)
    assert checkpoint is not None
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    engine = VLLMEngine(str(checkpoint), torch.float32, 0, 1024, 0.5, False, kv_cache_gib=0.25, tokenizer=tokenizer)
    request.addfinalizer(engine.close)  # not left to the collector (VLLMEngine.close)
    recipe_prompt = "Solve it. Use <code> for hard arithmetic. Answer in \\boxed{}."  # conf/recipe/dapo_smoke.yaml
    protocol = build_protocol(ProtocolConfig(system_prompt=recipe_prompt), tokenizer)
    examples = [MathExample(i, q, a, "synthetic") for i, q, a, _ in generate(SyntheticConfig(num_examples=8), 3)]
    cfg = RolloutConfig(group_size=4, max_response_tokens=160, max_tokens_per_turn=96)
    runs = {}
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=2, timeout_s=5)) as sandbox:
        interpreter = CodeInterpreter(sandbox, tokenizer, cfg)
        for name, loop, tools in (
            ("turns", RolloutLoop.turns, [interpreter]),
            ("async", RolloutLoop["async"], [interpreter]),
            ("jittered", RolloutLoop["async"], [jittered(interpreter, 0.1)]),
        ):
            runs[name] = run_rollouts(
                examples, engine, protocol, tools, replace(cfg, loop=loop), seed=11, max_context_tokens=1024
            )
        late, _ = run_rollouts(
            examples,
            engine,
            protocol,
            [Delayed(interpreter, lambda calls: 1.0)],
            replace(cfg, loop=RolloutLoop["async"], trajectory_timeout_s=0.5),
            seed=11,
            max_context_tokens=1024,
        )
    reference, _ = runs["turns"]
    # multi-turn (a call, well-formed or not, answered before the next turn) and the real sandbox ran
    assert sum(t.turns > 1 for t in reference) >= 8 and sum(len(t.tool_calls) for t in reference) >= 1
    for name, (trajectories, run_metrics) in runs.items():
        assert [t.response_ids for t in trajectories] == [t.response_ids for t in reference], name
        assert [t.stop_reason for t in trajectories] == [t.stop_reason for t in reference], name
        for a, b in zip(trajectories, reference, strict=True):
            assert torch.allclose(torch.tensor(a.response_logprobs), torch.tensor(b.response_logprobs), atol=1e-4)
        assert run_metrics["rollout/prefix_cache_hit_rate"] > 0.3, (name, run_metrics)
    # the same seeds: the trajectories that called a tool reach that (now slow) call again and cannot finish; the
    # others may finish (as before) or not, on a slow machine
    assert any(r.tool_calls for r in reference)
    for t, r in zip(late, reference, strict=True):
        assert t.stop_reason == "deadline" if r.tool_calls else t.stop_reason in ("deadline", r.stop_reason)
        assert t.stop_reason == "deadline" or t.response_ids == r.response_ids
    assert not engine.llm.llm_engine.has_unfinished_requests()
    engine.update_weights(load_model(ModelConfig(name_or_path=str(checkpoint)), FP32_CPU))
