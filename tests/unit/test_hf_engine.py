"""The HF engine's decoders and sampler against the model's own forward pass, on tiny random models of each
supported architecture (no tokenizer needed: the engine is driven with token ids)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config, Qwen3Config

from retool_cli.interfaces import Sampling
from retool_cli.model import llama_family
from retool_cli.rollout import cpu_kernels, kv_decoder
from retool_cli.rollout.hf_engine import HFEngine, _sample, request_uniforms

CONFIGS = {
    "qwen2": Qwen2Config,  # q/k/v biases
    "qwen3": Qwen3Config,  # per-head q/k norms
    "llama": LlamaConfig,  # no biases
    "gpt2": GPT2Config,  # not Llama-family: the model's own forward and DynamicCache (HFCacheDecoder)
}
VOCAB, EOS, PAD = 97, 96, 95


def tiny_model(kind: str, vocab_size: int = VOCAB) -> torch.nn.Module:
    torch.manual_seed(0)
    config = CONFIGS[kind](
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def engine_for(model: torch.nn.Module, accelerate: bool = True) -> HFEngine:
    tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD, decode=lambda ids: "", encode=lambda t, **k: [])
    return HFEngine(model, tokenizer, accelerate=accelerate)


A, B, C = [5, 17, 3, 44, 9], [8, 2], [60, 61, 62]
PROMPTS = [A, B, A, C]  # a repeated prompt, different lengths: each row copies its prompt's cache
# GRPO groups, interleaved: each prompt's cache kept once (KVDecoder.share); rows finish at different steps,
# B's rows first (its whole group then leaves the batch), then some of A's and C's
GROUPED = [A, B, C, B, A, C, A, B, C]
GROUPED_BUDGETS = [12, 2, 9, 3, 4, 12, 12, 2, 5]


@pytest.mark.parametrize(
    ("kind", "packed"), [(k, p) for k in sorted(CONFIGS) for p in (True, False) if k != "gpt2" or not p]
)
@pytest.mark.parametrize("grouped", [False, True])
def test_decoder_matches_the_models_forward(kind: str, packed: bool, grouped: bool, monkeypatch) -> None:
    """Greedy tokens equal those of a full forward pass over each row alone, and the sampled logprobs are
    that forward's, for the oneDNN-packed CPU path and for the model's own modules, with each row's copy of
    its prompt's cache and with the cache shared by a prompt's rows."""
    model = tiny_model(kind)
    fast_path = llama_family.supports(model)
    if not packed:
        monkeypatch.setattr(kv_decoder, "_packable", lambda m: False)
    elif not kv_decoder._packable(model):
        pytest.skip("no oneDNN linear on this build of torch")
    shared, fused = [], []
    share, fused_step = kv_decoder.KVDecoder.share, kv_decoder.KVDecoder._fused_step
    monkeypatch.setattr(kv_decoder.KVDecoder, "share", lambda self, n: (shared.append(n), share(self, n)))
    monkeypatch.setattr(
        kv_decoder.KVDecoder, "_fused_step", lambda self, *a: (fused.append(1), fused_step(self, *a))[1]
    )
    prompts, budgets = (GROUPED, GROUPED_BUDGETS) if grouped else (PROMPTS, [12, 7, 12, 3])
    gens = engine_for(model).generate(prompts, budgets, [], Sampling(temperature=0.0))
    assert shared == ([3] if grouped and fast_path else [])
    assert bool(fused) == (packed and fast_path)  # the packed path decodes with the numba kernels
    for prompt, budget, gen in zip(prompts, budgets, gens, strict=True):
        if gen.finish_reason == "eos":
            assert gen.token_ids[-1] == EOS and len(gen.token_ids) <= budget
        else:
            assert gen.finish_reason == "length" and len(gen.token_ids) == budget
        ids = list(prompt)
        for token, logp in zip(gen.token_ids, gen.logprobs, strict=True):
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            assert token == int(logprobs.argmax())
            assert math.isclose(logp, float(logprobs[token]), abs_tol=1e-4)
            ids.append(token)


@pytest.mark.parametrize("through_data", [False, True])
def test_packed_weights_follow_a_weight_change(through_data: bool) -> None:
    """The packed copies are cached while the weights stay as they were. An in-place update (an optimizer
    step) moves the parameters' version counters and is seen at the next call; a write through `.data` (as
    FSDP2's all-gather into unsharded parameters) keeps the counters, and the update_weights call the trainer
    makes after every optimizer step is what refreshes the copies then."""
    model = tiny_model("qwen2")
    engine = engine_for(model)
    greedy = Sampling(temperature=0.0)
    before = engine.generate([A], [10], [], greedy)[0]
    with torch.no_grad():
        for p in model.parameters():
            (p.data if through_data else p).add_(torch.randn_like(p))
    if through_data:
        engine.update_weights(model)
    after = engine.generate([A], [10], [], greedy)[0]
    expected = tiny_model("qwen2")
    expected.load_state_dict(model.state_dict())
    assert after.token_ids == engine_for(expected).generate([A], [10], [], greedy)[0].token_ids
    assert after.token_ids != before.token_ids


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_rotate_is_the_models_own_rotary_embedding_bit_for_bit(kind: str) -> None:
    """llama_family.rotate stands in for the model module's apply_rotary_pos_emb in the decoder and in the
    shared-prefix training pass; the training logprobs must not move by a bit when it does."""
    import importlib

    apply = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}").apply_rotary_pos_emb
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 4, 7, 16, generator=generator), torch.randn(3, 2, 7, 16, generator=generator)
    cos, sin = torch.randn(3, 7, 16, generator=generator), torch.randn(3, 7, 16, generator=generator)
    q_model, k_model = apply(q, k, cos, sin)
    assert torch.equal(llama_family.rotate(q, cos[:, None], sin[:, None]), q_model)
    assert torch.equal(llama_family.rotate(k, cos[:, None], sin[:, None]), k_model)


def test_cpu_kernels_exp_and_rms_norm() -> None:
    """The numba kernels' pieces against numpy/torch: exp of softmax inputs (<= 0; -inf and anything below -87
    exactly 0), residual add + RMSNorm in place."""
    rng = np.random.default_rng(0)
    x = np.concatenate([-np.logspace(-8, np.log10(86.9), 2000), [0.0, -87.5, -1e4, -np.inf]]).astype(np.float32)
    got = x.copy()
    cpu_kernels._exp_inplace(got, len(got), np.empty(len(got), np.int32))
    want = np.exp(x.astype(np.float64))
    assert np.all(np.abs(got[:-3] - want[:-3]) <= 3e-7 * want[:-3])
    assert got[-3:].tolist() == [0.0, 0.0, 0.0]
    hidden, delta = (rng.standard_normal((5, 48)).astype(np.float32) for _ in range(2))
    weight = rng.standard_normal(48).astype(np.float32)
    want = F.rms_norm(torch.from_numpy(hidden + delta), (48,), torch.from_numpy(weight), 1e-6).numpy()
    summed, out = hidden + delta, np.empty_like(hidden)
    cpu_kernels.add_rms_norm(hidden, delta, weight, 1e-6, out)
    assert np.array_equal(hidden, summed) and np.allclose(out, want, rtol=1e-5, atol=1e-6)
    cpu_kernels.add_rms_norm(hidden, np.zeros((0, 0), np.float32), weight, 1e-6, out)  # no residual to add
    assert np.array_equal(hidden, summed) and np.allclose(out, want, rtol=1e-5, atol=1e-6)


def test_sampler_draws_from_the_filtered_distribution() -> None:
    """Inverse-CDF sampling: frequencies match the softmax, a zero-probability token is never drawn, top-k and
    top-p keep only their tokens, and the same uniforms give the same draws."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf"), 0.5]] * 4)
    probs = torch.softmax(logits[0], -1)
    seeds = np.array([11, 12, 13, 14], dtype=np.uint64)

    def uniforms(k: int) -> torch.Tensor:
        return torch.from_numpy(request_uniforms(seeds, np.full(4, k, dtype=np.uint64)))

    counts = torch.zeros(6)
    draws = 5000
    for k in range(draws):
        ids, logps = _sample(logits, Sampling(), uniforms(k))
        counts += torch.bincount(ids, minlength=6)
    freq = counts / (4 * draws)
    assert counts[4] == 0
    assert torch.allclose(freq, probs, atol=0.015), (freq, probs)  # 4 standard errors at 20,000 draws
    assert torch.allclose(logps, torch.log(probs)[ids])
    top2 = torch.cat([_sample(logits, Sampling(top_k=2), uniforms(k))[0] for k in range(200)])
    assert set(top2.tolist()) == {0, 1}
    top_p = torch.cat([_sample(logits, Sampling(top_p=0.5), uniforms(k))[0] for k in range(200)])
    assert set(top_p.tolist()) == {0}  # p(0) = 0.52 already reaches 0.5
    assert torch.equal(_sample(logits, Sampling(), uniforms(3))[0], _sample(logits, Sampling(), uniforms(3))[0])


def test_request_streams_are_uniform_and_their_own() -> None:
    """Each request's k-th draw depends on its seed and k alone (not on the rows beside it), lies in (0, 1],
    and the draws are uniform and uncorrelated across neighbouring seeds and positions."""
    seeds = np.arange(1000, dtype=np.uint64)
    k = np.arange(1000, dtype=np.uint64)
    grid = request_uniforms(np.repeat(seeds, 1000), np.tile(k, 1000)).reshape(1000, 1000)  # (seed, k)
    assert grid.min() > 0 and grid.max() <= 1
    assert abs(grid.mean() - 0.5) < 2e-3 and abs(grid.var() - 1 / 12) < 2e-3
    histogram = np.histogram(grid, bins=20, range=(0, 1))[0] / grid.size
    assert np.abs(histogram - 0.05).max() < 2e-3
    assert abs(np.corrcoef(grid[:-1].ravel(), grid[1:].ravel())[0, 1]) < 5e-3  # seed s against s + 1
    assert abs(np.corrcoef(grid[:, :-1].ravel(), grid[:, 1:].ravel())[0, 1]) < 5e-3  # draw k against k + 1
    alone = request_uniforms(np.array([7], dtype=np.uint64), np.array([5], dtype=np.uint64))
    among = request_uniforms(np.array([3, 7, 9], dtype=np.uint64), np.array([0, 5, 2], dtype=np.uint64))
    assert alone[0] == among[1]


def test_a_request_samples_the_same_tokens_in_any_batch() -> None:
    """The hf engine: a request's tokens depend on its prompt and seed, not on the batch around it."""
    model = tiny_model("qwen2")
    engine = engine_for(model, accelerate=True)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [1, 2, 3, 4], [9, 8]]
    seeds = [5, 6, 7, 8]
    alone = [engine.generate([p], [12], [], Sampling(), [seed])[0] for p, seed in zip(prompts, seeds, strict=True)]
    together = engine.generate(prompts, [12] * 4, [], Sampling(), [5, 6, 7, 8])
    reordered = engine.generate(prompts[::-1], [12] * 4, [], Sampling(), [8, 7, 6, 5])[::-1]
    for a, b, c in zip(alone, together, reordered, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        assert np.allclose(a.logprobs, b.logprobs, atol=1e-5) and np.allclose(b.logprobs, c.logprobs, atol=1e-5)
    assert together[0].token_ids != together[2].token_ids  # the same prompt, another seed


def test_the_cast_copy_never_duplicates_a_parameter_in_its_own_dtype(monkeypatch) -> None:
    """rollout.dtype=bfloat16 next to an fp32 policy: the copy is made in bf16 directly (a deepcopy first
    would hold a second fp32 model: 28 GB more at 7B)."""
    from retool_cli.rollout.hf_engine import _cast_copy

    model = tiny_model("qwen2")

    def refuse(self, memo):
        raise AssertionError("a parameter was deep-copied in its own dtype")

    monkeypatch.setattr(torch.nn.Parameter, "__deepcopy__", refuse)
    copied = _cast_copy(model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in copied.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("grouped", [False, True])
def test_the_fast_path_is_an_opt_in_that_the_plain_path_checks(grouped: bool, monkeypatch) -> None:
    """model.accelerate off: every step is the model's own forward with transformers' cache (no KVDecoder);
    on: KVDecoder's packed numba path. Both give the same greedy tokens and logprobs."""
    model = tiny_model("qwen2")
    built = []
    init = kv_decoder.KVDecoder.__init__
    monkeypatch.setattr(kv_decoder.KVDecoder, "__init__", lambda self, *a: (built.append(1), init(self, *a))[1])
    prompts, budgets = (GROUPED, GROUPED_BUDGETS) if grouped else (PROMPTS, [12, 7, 12, 3])
    plain = engine_for(model, accelerate=False).generate(prompts, budgets, [], Sampling(temperature=0.0))
    assert not built
    fast = engine_for(model, accelerate=True).generate(prompts, budgets, [], Sampling(temperature=0.0))
    assert built
    for a, b in zip(plain, fast, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a.logprobs, b.logprobs, strict=True))
