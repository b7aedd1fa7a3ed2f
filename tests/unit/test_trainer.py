"""rl/logprobs.py and rl/prefix_sharing.py: mixed precision (bf16 autocast over fp32 weights), micro-batching, the
shared-prefix passes (RL and SFT) against the plain pass, LoRA."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from retool_cli.model.precision import Precision
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rl.logprobs import counted_token_logprobs, micro_batches, sequence_logprobs

FP32_CPU = Precision(torch.device("cpu"), torch.float32, False, torch.float32)  # model.dtype=auto on a CPU


def test_bf16_autocast_logprobs_close_to_fp32_and_gradients_stay_fp32() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    sequences = [torch.randint(0, 200, (n,)).tolist() for n in (12, 9, 5)]
    cpu = torch.device("cpu")
    full, mask, _ = sequence_logprobs(model, sequences, 0, cpu)
    mixed, mask_mixed, _ = sequence_logprobs(model, sequences, 0, cpu, bf16_autocast=True)
    assert torch.equal(mask, mask_mixed) and mixed.dtype == torch.float32
    valid = mask.bool()
    assert not torch.equal(full[valid], mixed[valid])  # the matmuls really ran in bf16...
    assert torch.allclose(full[valid], mixed[valid], atol=0.1)  # ...and bf16 is close
    (-(mixed * mask).sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_micro_batches_respect_the_token_budget() -> None:
    lengths = [10, 3, 7, 7, 2, 9]
    groups = micro_batches(lengths, 20)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in g) * len(g) <= 20 or len(g) == 1 for g in groups)


def test_lora_trains_adapters_only_and_checkpoints_merged_weights(tmp_path) -> None:
    """model.lora_rank > 0: only adapters train; the checkpoint's weights (adapters merged in, computed without
    touching the live model) load with from_pretrained and give the LoRA policy's logits; the HF engine
    decodes through the adapters."""
    from transformers import AutoTokenizer

    from retool_cli.config import ModelConfig
    from retool_cli.interfaces import Sampling
    from retool_cli.model.loading import load_policy, merged_state_dict
    from retool_cli.rl.checkpoints import save_checkpoint
    from retool_cli.rl.optim import build_optimizer, build_scheduler
    from retool_cli.rl.overlap import plain_policy
    from retool_cli.rollout.hf_engine import HFEngine

    torch.manual_seed(0)
    cfg = ModelConfig(name_or_path="tiny", device="cpu", lora_rank=4, lora_alpha=8.0)
    policy = load_policy(cfg, FP32_CPU, str(tiny_model_path()))
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {k: v.clone() for k, v in policy.get_base_model().state_dict().items() if "lora_" not in k}
    optimizer = build_optimizer(policy, 1e-2, 0.0)
    ids = [torch.randint(0, 200, (10,)).tolist() for _ in range(3)]
    for _ in range(3):
        logp, mask, _ = sequence_logprobs(policy, ids, 0, torch.device("cpu"))
        (-(logp * mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    merged = merged_state_dict(policy)
    assert all(torch.equal(v, policy.get_base_model().state_dict()[k]) for k, v in base_before.items())
    clean = {k.replace(".base_layer.", "."): v for k, v in base_before.items()}
    assert merged.keys() == clean.keys()
    changed = [k for k in merged if not torch.equal(merged[k], clean[k])]
    assert any("q_proj" in k for k in changed)  # the adapters' deltas are in the merged weights

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    folder = save_checkpoint(
        tmp_path,
        3,
        policy,
        tokenizer,
        optimizer,
        build_scheduler(optimizer, 0, 3, "constant"),
        {"cursor": 0},
        keep_last=1,
        record={"command": "sft", "base_model": "tiny"},
    )
    assert (folder / "adapter" / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(folder).eval()
    policy.eval()
    x = torch.tensor([ids[0]])
    sampler = plain_policy(policy)  # overlapped training's sampler copy (rl/overlap.py): a plain model, merged
    assert not hasattr(sampler, "peft_config") and not any(p.requires_grad for p in sampler.parameters())
    with torch.no_grad():
        assert torch.allclose(plain(x).logits, policy(x).logits, atol=1e-4)
        assert torch.allclose(sampler(x).logits, policy(x).logits, atol=1e-4)
    prompt, greedy = tokenizer.encode("What is 2+3?"), Sampling(temperature=0.0)
    assert (
        HFEngine(policy, tokenizer).generate([prompt], [16], [], greedy)[0].token_ids
        == HFEngine(plain, tokenizer).generate([prompt], [16], [], greedy)[0].token_ids
    )


def test_lora_target_modules_that_match_nothing_is_a_config_error() -> None:
    import pytest

    from retool_cli.config import ModelConfig
    from retool_cli.errors import ConfigError
    from retool_cli.model.loading import load_policy

    cfg = ModelConfig(name_or_path="tiny", device="cpu", lora_rank=4, lora_target_modules=["no_such_proj"])
    with pytest.raises(ConfigError, match=r"model.lora_target_modules=\['no_such_proj'\]"):
        load_policy(cfg, FP32_CPU, str(tiny_model_path()))


def _grouped_sequences(seed: int) -> tuple[list[list[int]], list[int]]:
    """Three prompts of different lengths, three samples each, responses of different lengths."""
    generator = torch.Generator().manual_seed(seed)
    sequences, prompt_lens = [], []
    for prompt in ([5, 17, 3, 44, 9], [8, 2], [60, 61, 62, 63, 64, 65, 66]):
        for _ in range(3):
            length = int(torch.randint(1, 12, (1,), generator=generator))
            sequences.append(prompt + torch.randint(0, 90, (length,), generator=generator).tolist())
            prompt_lens.append(len(prompt))
    return sequences, prompt_lens


def _loss_and_grads(model, sequences, prompt_lens, shared: bool, pack: bool = False):
    """Response log-probs and entropies of one pass, and the gradients of a loss of both."""
    model.zero_grad()
    logp, _, entropy = sequence_logprobs(
        model,
        sequences,
        95,
        torch.device("cpu"),
        temperature=0.8,
        entropy="loss",
        prompt_lens=prompt_lens,
        shared_prefix=shared,
        pack=pack,
    )
    response = torch.zeros_like(logp)
    for i, (seq, start) in enumerate(zip(sequences, prompt_lens, strict=True)):
        response[i, start - 1 : len(seq) - 1] = 1
    ((logp * response).sum() + 0.1 * (entropy * response).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return (logp * response).detach(), (entropy * response).detach(), grads


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_shared_prefix_pass_equals_the_plain_pass(kind: str) -> None:
    """Each prompt once (prefix_sharing): the same response logprobs, entropies and gradients as a plain
    forward over the full sequences, and zeros over the prompt."""
    from retool_cli.rl import prefix_sharing
    from tests.unit.test_hf_engine import tiny_model

    model = tiny_model(kind).train()
    assert prefix_sharing.usable(model)
    sequences, prompt_lens = _grouped_sequences(0)
    plain = _loss_and_grads(model, sequences, prompt_lens, shared=False)
    shared = _loss_and_grads(model, sequences, prompt_lens, shared=True)
    assert torch.allclose(plain[0], shared[0], atol=1e-5) and torch.allclose(plain[1], shared[1], atol=1e-5)
    assert plain[2].keys() == shared[2].keys() and len(plain[2]) == len(list(model.parameters()))
    for name, grad in plain[2].items():
        assert torch.allclose(grad, shared[2][name], atol=1e-4, rtol=1e-4), name
    logp, _, _ = sequence_logprobs(
        model, sequences, 95, torch.device("cpu"), prompt_lens=prompt_lens, shared_prefix=True
    )
    assert all((logp[i, : start - 1] == 0).all() for i, start in enumerate(prompt_lens))
    plain_logp, _, _ = sequence_logprobs(model, sequences, 95, torch.device("cpu"), prompt_lens=prompt_lens)
    assert all((plain_logp[i, : start - 1] != 0).any() for i, start in enumerate(prompt_lens))  # opt-in only


def _sft_traces(seed: int, shared_start: bool) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """Traces as SFT sees them: a system turn all share (or first tokens that differ), a prompt of its own,
    then a response whose mask has holes (tool output the model did not write)."""
    generator = torch.Generator().manual_seed(seed)
    system = [7, 7, 30, 31, 2, 40] if shared_start else []
    sequences, starts, masks = [], [], []
    for _ in range(5):
        prompt = (
            system
            + torch.randint(0, 90, (int(torch.randint(1, 6, (1,), generator=generator)),), generator=generator).tolist()
        )
        response = torch.randint(0, 90, (int(torch.randint(2, 14, (1,), generator=generator)),), generator=generator)
        mask = [int(j < 2 or j % 4 != 1) for j in range(len(response))]
        sequences.append(prompt + response.tolist())
        starts.append(len(prompt))
        masks.append(mask)
    return sequences, starts, masks


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("shared_start", [True, False])
def test_counted_token_logprobs_fast_path_equals_the_plain_pass(kind: str, shared_start: bool) -> None:
    """SFT's fast path (the common prefix once, the LM head only at counted tokens) gives the plain forward's
    logprobs of exactly the counted tokens, and the same gradients."""
    from tests.unit.test_hf_engine import tiny_model

    model = tiny_model(kind).train()
    sequences, starts, masks = _sft_traces(3, shared_start)
    results = []
    for fast in (False, True):
        model.zero_grad()
        logp = counted_token_logprobs(model, sequences, starts, masks, 95, torch.device("cpu"), shared_prefix=fast)
        (-logp.sum()).backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain, plain_grads), (fast, fast_grads) = results
    assert plain.shape == (sum(map(sum, masks)),) and torch.allclose(plain, fast, atol=1e-5)
    assert plain_grads.keys() == fast_grads.keys() and len(plain_grads) == len(list(model.parameters()))
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, fast_grads[name], atol=1e-4, rtol=1e-4), name
    # and they are the logprobs of the counted tokens: token 0 of the first response, read from the full pass
    full, _, _ = sequence_logprobs(model, sequences, 95, torch.device("cpu"))
    assert torch.allclose(fast[0], full[0, starts[0] - 1], atol=1e-5)


def test_shared_prefix_pass_with_lora_and_not_with_checkpointing() -> None:
    """Through peft's LoRA layers the adapters get the same gradients; gradient checkpointing keeps the
    plain pass (its memory saving is per layer call)."""
    from retool_cli.config import ModelConfig
    from retool_cli.model.loading import apply_lora
    from retool_cli.rl import prefix_sharing

    sequences, prompt_lens = _grouped_sequences(1)
    sequences = [[t % 200 for t in s] for s in sequences]
    torch.manual_seed(0)
    policy = apply_lora(
        AutoModelForCausalLM.from_pretrained(tiny_model_path()),
        ModelConfig(name_or_path="tiny", lora_rank=4, lora_alpha=8.0),
    )
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # non-zero adapters, so that they change the logits
    assert prefix_sharing.usable(policy)
    plain = _loss_and_grads(policy, sequences, prompt_lens, shared=False)
    shared = _loss_and_grads(policy, sequences, prompt_lens, shared=True)
    assert torch.allclose(plain[0], shared[0], atol=1e-5)
    assert plain[2] and all("lora_" in n for n in plain[2])
    assert all(torch.allclose(g, shared[2][n], atol=1e-4, rtol=1e-4) for n, g in plain[2].items())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    model.gradient_checkpointing_enable()
    assert not prefix_sharing.usable(model)


def test_padding_share_counts_what_each_pass_computes() -> None:
    """rl_positions and sft_positions: the positions the plain pass (B x longest) and the shared-prefix passes
    compute, and the real tokens among them (a prompt computed once counts once)."""
    from retool_cli.rl.logprobs import rl_positions, sft_positions
    from tests.unit.test_hf_engine import tiny_model

    model = tiny_model("llama")
    prompt_a, prompt_b = [1, 2, 3], [4, 5]
    sequences = [[*prompt_a, 7, 7, 7, 7], [*prompt_a, 7], [*prompt_b, 8, 8]]  # lengths 7, 4, 4
    prompt_lens = [3, 3, 2]
    assert rl_positions(model, sequences, prompt_lens, shared_prefix=False) == (3 * 7, 15)
    # prompts once (2 x 3, left-padded), responses right-padded (3 x 4)
    assert rl_positions(model, sequences, prompt_lens, shared_prefix=True) == (2 * 3 + 3 * 4, 5 + 7)
    # no prompt repeats: the plain pass
    assert rl_positions(model, sequences[1:], prompt_lens[1:], shared_prefix=True) == (2 * 4, 8)
    # SFT: the batch's common prefix (tokens 1, 2, 3 of the first two) once, the rest right-padded
    assert sft_positions(model, sequences[:2], [3, 3], shared_prefix=True) == (3 + 2 * 4, 3 + 5)
    assert sft_positions(model, sequences[:2], [3, 3], shared_prefix=False) == (2 * 7, 11)
