"""The training forward pass of GRPO groups with each prompt computed once.

The samples of a group share their prompt token for token. A plain forward pass over right-padded full
sequences computes that prompt group-size times, forward and backward. Here each distinct prompt runs once
(left-padded, U rows) and every response (right-padded, B rows) attends to its prompt's keys and values
through an index, whose backward sums the group's gradients into the shared prompt. The model's own modules
and weights (LoRA adapters included), the same logits to float rounding: tested against the plain pass,
values and gradients. The idea is that of shared-prefix GRPO training (Prefix Grouper, arXiv 2506.05433).

Llama-family decoders only (model/llama_family.py:supports); not under FSDP2, whose hooks wrap whole decoder layers, nor
with gradient checkpointing. `rl/logprobs.py:sequence_logprobs` and `counted_token_logprobs` decide when to use it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from retool_cli.model.llama_family import rotate, supports
from retool_cli.rl.distributed import is_sharded


def usable(model: Any) -> bool:
    """A Llama-family decoder this pass can run layer by layer (a LoRA model through its base model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return supports(base) and not is_sharded(model) and not getattr(base.model, "gradient_checkpointing", False)


def response_logits(
    model: Any, prompts: list[list[int]], responses: list[list[int]], pad_id: int, device: torch.device
) -> torch.Tensor:
    """Logits predicting each response token (B, R, V), R the longest response; row b's positions past its
    length are padding."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    logits: torch.Tensor = base.lm_head(response_hidden(model, prompts, responses, pad_id, device))
    return logits


def response_hidden(
    model: Any, prompts: list[list[int]], responses: list[list[int]], pad_id: int, device: torch.device
) -> torch.Tensor:
    """The final hidden states (normed, before the LM head) that predict each response token (B, R, C)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    unique: dict[tuple[int, ...], int] = {}
    group = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prompts], device=device)  # (B,)
    prompt_ids, prompt_mask = _pad([list(p) for p in unique], pad_id, device, left=True)  # (U, P)
    response_ids, _ = _pad(responses, pad_id, device, left=False)  # (B, R)
    width, length = prompt_ids.shape[1], response_ids.shape[1]
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (U, P)
    response_positions = prompt_mask.sum(-1)[group][:, None] + torch.arange(length, device=device)  # (B, R)

    eye = torch.eye(width, dtype=torch.bool, device=device)
    # Prompt queries see earlier real prompt tokens (a pad query sees itself, so no row is all-masked).
    prompt_attend = (torch.ones_like(eye).tril() & prompt_mask.bool()[:, None, :]) | eye  # (U, P, P)
    # Response queries see their prompt's real tokens and earlier response tokens.
    causal = torch.ones((length, length), dtype=torch.bool, device=device).tril()
    response_attend = torch.cat(
        [prompt_mask.bool()[group][:, None, :].expand(-1, length, -1), causal.expand(len(group), -1, -1)], dim=-1
    )  # (B, R, P + R)

    hidden_p = inner.embed_tokens(prompt_ids)  # (U, P, C)
    hidden_r = inner.embed_tokens(response_ids)  # (B, R, C)
    rope_p = inner.rotary_emb(hidden_p, prompt_positions)
    rope_r = inner.rotary_emb(hidden_r, response_positions)
    for layer in inner.layers:
        attn = layer.self_attn
        q_p, k_p, v_p = _projected(attn, layer.input_layernorm(hidden_p), rope_p)  # (U, H(kv), P, D)
        q_r, k_r, v_r = _projected(attn, layer.input_layernorm(hidden_r), rope_r)  # (B, H(kv), R, D)
        out_p = _attend(attn, q_p, k_p, v_p, prompt_attend)
        keys = torch.cat([k_p.index_select(0, group), k_r], dim=2)  # (B, Hkv, P + R, D)
        values = torch.cat([v_p.index_select(0, group), v_r], dim=2)
        out_r = _attend(attn, q_r, keys, values, response_attend)
        hidden_p = hidden_p + attn.o_proj(out_p)
        hidden_r = hidden_r + attn.o_proj(out_r)
        hidden_p = hidden_p + layer.mlp(layer.post_attention_layernorm(hidden_p))
        hidden_r = hidden_r + layer.mlp(layer.post_attention_layernorm(hidden_r))
    # The first response token is predicted at the prompt's last position (left padding puts it last).
    last = torch.cat([hidden_p[:, -1].index_select(0, group)[:, None], hidden_r[:, :-1]], dim=1)  # (B, R, C)
    hidden: torch.Tensor = inner.norm(last)
    return hidden


def _projected(attn: Any, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Queries, keys, values of x (N, T, C) as (N, heads, T, D), rotary embedding applied."""
    shape = (*x.shape[:2], -1, attn.head_dim)
    q, k, v = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)
    if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head
        q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = rope[0][:, None], rope[1][:, None]  # (N, 1, T, D): the same for every head
    return rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin), v.transpose(1, 2)


def _attend(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Attention of q (N, H, T, D) over k, v (N, Hkv, L, D) where allowed (N, T, L); returns (N, T, H * D)."""
    dropout = attn.attention_dropout if attn.training else 0.0
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed[:, None], dropout_p=dropout, scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.transpose(1, 2).flatten(2)


def _pad(seqs: list[list[int]], pad_id: int, device: torch.device, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        span = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[i, span] = torch.tensor(seq, dtype=torch.long)
        mask[i, span] = 1
    return ids.to(device), mask.to(device)
