"""Padding-free training passes: a micro-batch's sequences concatenated into one row, no padded position computed.

A right-padded micro-batch computes (longest) x (sequences) positions, forward and backward; on a multi-turn RL
batch whose lengths spread over 10x most of them are padding. Here the sequences sit end to end in one row
(1, T), T = their total length, each with its own position ids (rotary embeddings restart at 0), and an
attention function that never lets a query see another sequence's keys: causal SDPA over each segment of the
row. With shared prompts (model.accelerate) a GRPO group's prompt is one segment and each response a segment
that attends to that prompt and, causally, to itself: each prompt runs once, as in prefix_sharing.py, but
inside the model's own forward. The LM head runs only at the positions whose next-token log-prob is read
(`logits_to_keep`), so a prompt's logits are never computed either.

The attention function is registered with transformers' AttentionInterface under "retool_packed:<impl>" and
installed on the model (`enable`); a forward without `packed_segments` (generation, the plain pass) falls back
to the model's own implementation <impl>, unchanged bit for bit. Only attention learns where the segments are,
so `enable` first checks, on a probe, that the model mixes positions nowhere else: a convolution, a state-space
or linear-attention layer, or an attention that is not transformers' (Bloom, Falcon, GPT-J, MPT, ...) would
carry one sequence into the next, and such a model is refused by name rather than trained on wrong numbers.
Because the model's forward runs as usual, LoRA adapters, FSDP2's per-layer hooks, gradient checkpointing (the
recompute sees the same keyword arguments) and bf16 autocast compose with it unchanged.

The same idea as verl's `use_remove_padding` (unpadded tokens, flash-attention varlen over cu_seqlens) and TRL's
padding-free collator (position ids restarting per sequence); those need flash-attention kernels, this runs
wherever SDPA does (CPU included) and also covers the shared-prompt layout.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from retool_cli.errors import ConfigError

NAME = "retool_packed"
_VARLEN: Any = None  # flash-attention over cumulative sequence lengths (CUDA builds of PyTorch >= 2.10)
with contextlib.suppress(ImportError):  # an older PyTorch: SDPA per segment everywhere
    from torch.nn.attention.varlen import varlen_attn as _VARLEN
_forward = threading.local()  # .packed: this thread is in a packed forward (engines run in other threads)
TURN_OFF = "set trainer.pack_sequences=false (sft.pack_sequences=false)"
# What a model may pass its attention that the attention here does not compute: such a model is refused by name
# (the probe would catch most, but a soft-cap barely changes a random model's small logits)
NOT_PACKED = {
    "sliding_window": "sliding-window attention layers",
    "softcap": "attention logit soft-capping",
    "s_aux": "attention sinks",
    "position_bias": "a position bias in its attention",
    "indices": "sparse attention",
    "block_indices": "sparse attention",
}
# The probe's largest difference, over the spread of the logits, that is rounding: in fp32 at most 1.3e-6 on the 22
# transformers architectures that pack, the smallest leak 3.4e-3 (a tiny random LFM2 with a convolution layer;
# tests/unit/test_packing.py); half precision (and TF32) rounds to ~1e-2, so there only gross leaks show (as a
# trained model's are)
FP32_PROBE_TOLERANCE, HALF_PROBE_TOLERANCE = 1e-4, 5e-2


@dataclass(frozen=True)
class Segment:
    """Positions [start, end) of a packed row that attend causally to themselves and to every position of
    [prefix_start, prefix_end) (a shared prompt; empty for a whole sequence)."""

    start: int
    end: int
    prefix_start: int = 0
    prefix_end: int = 0


@dataclass(frozen=True)
class PackedRow:
    """One row of concatenated sequences and where each sequence's tokens sit in it."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T): each token's position in its own sequence
    segments: tuple[Segment, ...]  # contiguous, in row order, covering [0, T)
    where: list[torch.Tensor]  # per sequence (len,): the row position of each of its tokens


def pack(sequences: list[list[int]], prompt_lens: list[int] | None = None) -> PackedRow:
    """The sequences end to end; with `prompt_lens`, each distinct prompt once (its first occurrence) and every
    sequence's rest after it as a segment that attends to it. Position ids count within each sequence, so a
    response continues its prompt's positions."""
    ids: list[int] = []
    positions: list[int] = []
    segments: list[Segment] = []
    where: list[torch.Tensor] = []
    prompts: dict[tuple[int, ...], int] = {}  # prompt -> its start in the row

    def append(tokens: list[int], first_position: int, prefix: tuple[int, int] = (0, 0)) -> int:
        start = len(ids)
        ids.extend(tokens)
        positions.extend(range(first_position, first_position + len(tokens)))
        if tokens:  # an empty response is no segment
            segments.append(Segment(start, len(ids), *prefix))
        return start

    for i, seq in enumerate(sequences):
        if prompt_lens is None:
            start = append(seq, 0)
            where.append(torch.arange(start, start + len(seq)))
            continue
        n = prompt_lens[i]
        key = tuple(seq[:n])
        if key not in prompts:
            prompts[key] = append(seq[:n], 0)
        prompt_start = prompts[key]
        rest = append(seq[n:], n, (prompt_start, prompt_start + n))
        where.append(torch.cat([torch.arange(prompt_start, prompt_start + n), torch.arange(rest, rest + len(seq) - n)]))
    return PackedRow(torch.tensor([ids]), torch.tensor([positions]), tuple(segments), where)


def packed_length(sequences: list[list[int]], prompt_lens: list[int] | None = None) -> int:
    """T of `pack(sequences, prompt_lens)`: the positions its forward computes, every one a real token."""
    if prompt_lens is None:
        return sum(map(len, sequences))
    prompts = {tuple(s[:n]) for s, n in zip(sequences, prompt_lens, strict=True)}
    return sum(map(len, prompts)) + sum(len(s) - n for s, n in zip(sequences, prompt_lens, strict=True))


def rows(sequences: list[list[int]], prompt_lens: list[int] | None, token_budget: int) -> list[list[int]]:
    """Sample indices grouped into packed rows of at most `token_budget` tokens (a shared prompt counted once per
    row), in batch order so that a GRPO group shares a row; a longer sample gets a row of its own."""
    out: list[list[int]] = []
    for i in range(len(sequences)):
        candidate = [*out[-1], i] if out else [i]
        chosen = [sequences[j] for j in candidate]
        lens = None if prompt_lens is None else [prompt_lens[j] for j in candidate]
        if out and packed_length(chosen, lens) <= token_budget:
            out[-1] = candidate
        else:
            out.append([i])
    return out


def enable(model: Any) -> None:
    """Install the packed attention on the model (idempotent), once the probe (`check_packs_exactly`) found its
    packed forward exact; its forward without `packed_segments` stays the model's own implementation."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    own = base.config._attn_implementation
    if own.startswith(NAME):
        return
    name = f"{NAME}:{own}"
    AttentionInterface.register(name, packed_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[own])  # the unpacked forward's mask
    base.set_attn_implementation(name)
    try:
        check_packs_exactly(model)
    except BaseException:
        base.set_attn_implementation(own)  # refused: the model is left as it was
        raise


def check_packs_exactly(model: Any) -> None:
    """Refuse (ConfigError) a model whose packed forward is not its own forward sequence by sequence. The probe:
    a short sequence packed behind two different ones (of one length) must get the logits it gets alone, in the
    model's own precision (autocast off), in eval mode without gradients (every process of a sharded model runs
    it alike: a collective); a random sequence from a generator of its own, so no run's random stream moves."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embeddings = base.get_input_embeddings()
    weight, generator = embeddings.weight, torch.Generator().manual_seed(0)
    before, other, probe = (
        torch.randint(0, embeddings.num_embeddings, (n,), generator=generator).tolist() for n in (5, 5, 9)
    )
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(weight.device.type, enabled=False):
            ids = torch.tensor([probe], device=weight.device)
            alone = model(input_ids=ids, use_cache=False).logits[0].float()  # (9, V)
            packed = []
            for first in (before, other):
                row = pack([first, probe])
                packed.append(_packed_logits(model, row, row.where[1], weight.device)[0].float())  # (9, V)
    finally:
        for module, training in modes.items():
            module.training = training
    spread = alone.std().clamp_min(1e-6)
    value = float((packed[0] - alone).abs().max() / spread)  # what the packing changed
    leak = float((packed[0] - packed[1]).abs().max() / spread)  # what the sequence before changed
    full = weight.dtype in (torch.float32, torch.float64)
    tf32 = weight.device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"
    tolerance = FP32_PROBE_TOLERANCE if full and not tf32 else HALF_PROBE_TOLERANCE
    if max(value, leak) > tolerance:
        raise ConfigError(
            f"{type(base).__name__} cannot train on packed rows: a sequence packed behind another got other logits "
            f"than alone (largest difference {max(value, leak):.1e} of the logits' spread, rounding is below "
            f"{tolerance:.0e}): a layer other than transformers' attention (a convolution, a state-space or linear-"
            f"attention layer, its own attention code, an attention bias) mixes positions across sequences; "
            f"{TURN_OFF}"
        )


def packed_attention(
    module: Any,
    query: torch.Tensor,  # (1, H, T, D)
    key: torch.Tensor,  # (1, Hkv, T, D)
    value: torch.Tensor,  # (1, Hkv, T, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_segments: tuple[Segment, ...] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each segment of a packed row (B = 1); (1, T, H, D) like transformers' functions."""
    if packed_segments is None:  # not a packed forward: the model's own attention
        if getattr(_forward, "packed", False):  # a packed forward whose model dropped the segments on the way
            raise ConfigError(
                f"{type(module).__name__} does not pass attention keyword arguments through its forward, so its "
                f"sequences cannot be packed; {TURN_OFF}"
            )
        own = str(module.config._attn_implementation).removeprefix(f"{NAME}:")
        eager = sys.modules[type(module).__module__].eager_attention_forward  # the modeling file's own
        function = ALL_ATTENTION_FUNCTIONS.get_interface(own, eager)
        unpacked: tuple[torch.Tensor, None] = function(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return unpacked
    unsupported = [what for key, what in NOT_PACKED.items() if kwargs.get(key) is not None]
    unsupported += ["non-causal attention"] if kwargs.get("is_causal") is False else []
    unsupported += ["an attention mask of its own"] if attention_mask is not None else []
    if unsupported:
        raise ConfigError(
            f"{type(module).__name__} has {unsupported[0]}, which packed rows do not support yet; {TURN_OFF}"
        )
    if query.shape[0] != 1:
        raise RuntimeError("a packed forward takes one row (rl/packing.py)")
    gqa = query.shape[1] != key.shape[1]
    if _VARLEN is not None and _varlen_fits(query, dropout, packed_segments):
        return _varlen_attention(query, key, value, scaling, packed_segments, gqa), None
    # split, not sliced: the backward of a split is one concatenation, where each slice's would add a
    # full-length zero tensor
    sizes = [s.end - s.start for s in packed_segments]
    queries, keys, values = (x.split(sizes, dim=2) for x in (query, key, value))
    chunk_at = {s.start: i for i, s in enumerate(packed_segments)}  # a shared prompt is a segment of its own
    outs: list[torch.Tensor] = []
    for i, s in enumerate(packed_segments):
        q, k, v = queries[i], keys[i], values[i]
        if s.prefix_end == s.prefix_start:
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa
            )
        else:  # a response over its shared prompt: all of the prompt, then causal over itself
            prompt = chunk_at[s.prefix_start]
            k, v = torch.cat([keys[prompt], k], dim=2), torch.cat([values[prompt], v], dim=2)
            n, p = s.end - s.start, s.prefix_end - s.prefix_start
            causal = torch.ones((n, n), dtype=torch.bool, device=q.device).tril()
            allowed = torch.cat([torch.ones((n, p), dtype=torch.bool, device=q.device), causal], dim=1)  # (n, p + n)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=dropout, scale=scaling, enable_gqa=gqa
            )
        outs.append(out)
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None  # (1, T, H, D)


def _varlen_fits(query: torch.Tensor, dropout: float, segments: tuple[Segment, ...]) -> bool:
    """Whether flash-attention's varlen kernel computes this row: CUDA, half precision, no dropout, and no
    shared prompt (a response over its prompt would rely on where the kernel aligns a causal mask whose query
    and key lengths differ; those rows keep SDPA per segment)."""
    half = query.dtype in (torch.float16, torch.bfloat16)
    return query.is_cuda and half and dropout == 0.0 and all(s.prefix_end == s.prefix_start for s in segments)


def _varlen_attention(
    query: torch.Tensor,  # (1, H, T, D)
    key: torch.Tensor,  # (1, Hkv, T, D)
    value: torch.Tensor,  # (1, Hkv, T, D)
    scaling: float | None,
    segments: tuple[Segment, ...],
    gqa: bool,
) -> torch.Tensor:
    """Causal attention within each segment in one call of flash-attention's varlen kernel (verl's
    use_remove_padding, TRL's padding-free collator): the segments' boundaries as cumulative lengths. (1, T, H, D)."""
    bounds = [0, *(s.end for s in segments)]
    cumulative = torch.tensor(bounds, dtype=torch.int32, device=query.device)  # (N + 1,)
    longest = max(s.end - s.start for s in segments)
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # (T, H, D)
    out: torch.Tensor = _VARLEN(
        q, k, v, cumulative, cumulative, longest, longest, scale=scaling, window_size=(-1, 0), enable_gqa=gqa
    )  # (T, H, D); window (-1, 0): causal
    return out.unsqueeze(0)  # (1, T, H, D)


def next_token_logits(model: Any, row: PackedRow, keep: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The model's logits at row positions `keep` (N,) of the packed forward: (1, N, V). A position may repeat (a
    shared prompt's last one predicts the first token of each of its responses): the model computes it once."""
    enable(model)
    unique, copies = torch.unique(keep, return_inverse=True)  # (U,) sorted, (N,): keep = unique[copies]
    logits = _packed_logits(model, row, unique, device)  # (1, U, V)
    if torch.equal(unique, keep):
        return logits
    return repeat_positions(logits, copies.to(logits.device))


def repeat_positions(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[:, index] for an index that repeats positions, with a backward whose sums are the same bit for bit in every
    run. The backward of x[:, index] on CPU adds the copies' gradients with atomic adds from several threads, in an
    order that depends on their timing (torch.use_deterministic_algorithms' list: `__getitem__` differentiated on
    CPU), so two runs of one config could train apart by rounding; index_select adds them in index order there.
    On CUDA it is the other way round (index_select's backward is the nondeterministic one)."""
    if x.device.type == "cpu":
        return x.index_select(1, index)
    return x[:, index]


def _packed_logits(model: Any, row: PackedRow, keep: torch.Tensor, device: torch.device) -> torch.Tensor:
    ids = row.input_ids.to(device)
    _forward.packed = True
    try:
        out = model(
            input_ids=ids,
            position_ids=row.position_ids.to(device),
            attention_mask=torch.ones_like(ids),  # no padding: transformers builds no mask, the segments decide
            packed_segments=row.segments,
            logits_to_keep=keep.to(device),
            use_cache=False,
        )
    finally:
        _forward.packed = False
    logits: torch.Tensor = out.logits
    return logits


def balanced_ranks(costs: list[int], groups: list[int], world: int) -> list[int]:
    """The process each sample trains on so that every process gets about the same tokens: whole groups (a GRPO
    group shares its prompt), largest first, each to the least loaded process (ties: the lower group and rank),
    the longest-processing-time rule. A function of its arguments alone, so every process computes the same."""
    group_cost: dict[int, int] = {}
    for cost, group in zip(costs, groups, strict=True):
        group_cost[group] = group_cost.get(group, 0) + cost
    load = [0] * world
    rank_of: dict[int, int] = {}
    for group in sorted(group_cost, key=lambda g: (-group_cost[g], g)):
        rank = min(range(world), key=lambda r: (load[r], r))
        rank_of[group] = rank
        load[rank] += group_cost[group]
    return [rank_of[g] for g in groups]
