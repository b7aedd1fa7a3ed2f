"""trainer.py: mixed precision (bf16 autocast over fp32 weights) and micro-batching."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from retool_cli.tiny import tiny_model_path
from retool_cli.trainer import micro_batches, sequence_logprobs


def test_bf16_autocast_logprobs_close_to_fp32_and_gradients_stay_fp32() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    sequences = [torch.randint(0, 200, (n,)).tolist() for n in (12, 9, 5)]
    cpu = torch.device("cpu")
    full, mask = sequence_logprobs(model, sequences, 0, cpu)
    mixed, mask_mixed = sequence_logprobs(model, sequences, 0, cpu, bf16_autocast=True)
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
