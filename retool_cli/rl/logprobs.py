"""Per-token log-probabilities of batches of sequences, the forward passes SFT and RL train through:
token-budget micro-batches, the plain pass over right-padded sequences, and the fast passes of model.accelerate
(each GRPO prompt once; for SFT the traces' common prefix once and the LM head only at the counted tokens;
prefix_sharing.py)."""

from __future__ import annotations

from typing import Any

import torch

from retool_cli.rl import packing, prefix_sharing
from retool_cli.rl.algorithms import token_logprobs


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group sample indices so that (longest in group) x (group size) stays within the budget; sorting by
    length first keeps the padding small."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def micro_batch_indices(
    sequences: list[list[int]], prompt_lens: list[int] | None, token_budget: int, pack: bool, shared_prefix: bool
) -> list[list[int]]:
    """The micro-batches of the trainer's passes: packed rows of at most `token_budget` tokens (each shared prompt
    counted once), or padded micro-batches within it (`micro_batches`)."""
    if pack:
        return packing.rows(sequences, prompt_lens if shared_prefix else None, token_budget)
    return micro_batches([len(s) for s in sequences], token_budget)


def rl_positions(
    model: Any, sequences: list[list[int]], prompt_lens: list[int], shared_prefix: bool, pack: bool = False
) -> tuple[int, int]:
    """(positions computed, real tokens among them) of `sequence_logprobs` on one micro-batch: B x L right-padded,
    or with each GRPO prompt once (prefix_sharing: U prompts x their longest, B responses x the longest), or
    packed (every position real)."""
    if pack:
        computed = packing.packed_length(sequences, prompt_lens if shared_prefix else None)
        return computed, computed
    if _shares_prompts(model, sequences, prompt_lens, shared_prefix):
        prompts = {tuple(s[:n]) for s, n in zip(sequences, prompt_lens, strict=True)}
        responses = [len(s) - n for s, n in zip(sequences, prompt_lens, strict=True)]
        computed = len(prompts) * max(map(len, prompts)) + len(responses) * max(responses)
        return computed, sum(map(len, prompts)) + sum(responses)
    return len(sequences) * max(map(len, sequences)), sum(map(len, sequences))


def sft_positions(
    model: Any, sequences: list[list[int]], loss_starts: list[int], shared_prefix: bool, pack: bool = False
) -> tuple[int, int]:
    """(positions computed, real tokens among them) of `counted_token_logprobs` on one micro-batch: B x L
    right-padded, or the batch's common prefix once and the rest right-padded (prefix_sharing), or packed."""
    if pack:
        prefixes = [_common_prefix_length(sequences, min(loss_starts))] * len(sequences) if shared_prefix else None
        computed = packing.packed_length(sequences, prefixes)
        return computed, computed
    if shared_prefix and prefix_sharing.usable(model):
        shared = _common_prefix_length(sequences, limit=min(loss_starts))
        rest = [len(s) - shared for s in sequences]
        return shared + len(rest) * max(rest), shared + sum(rest)
    return len(sequences) * max(map(len, sequences)), sum(map(len, sequences))


def pad_right(seqs: list[list[int]], value: int, device: torch.device) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out.to(device)


def sequence_logprobs(
    model: Any,
    sequences: list[list[int]],
    pad_id: int,
    device: torch.device,
    temperature: float = 1.0,
    bf16_autocast: bool = False,
    entropy: str = "off",
    prompt_lens: list[int] | None = None,
    shared_prefix: bool = False,
    pack: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Logprobs of every next token of right-padded sequences (B, L-1), its validity mask (B, L-1), and the
    policy's entropy at each position (B, L-1) or None (`entropy`: see algorithms.token_logprobs).
    With `bf16_autocast`, matmuls run in bfloat16 over the fp32 weights (mixed precision); the log-softmax
    is always taken in fp32. With `shared_prefix` (model.accelerate), `prompt_lens` and sequences that repeat a
    prompt (GRPO groups), each prompt runs once (prefix_sharing) and only positions predicting response tokens
    are filled (0 elsewhere). With `pack` the sequences run as one packed row (rl/packing.py; prompts shared
    with `shared_prefix`), and with `prompt_lens` only the positions predicting response tokens are filled."""
    if pack:
        return _packed_sequence_logprobs(
            model, sequences, prompt_lens, shared_prefix, device, temperature, bf16_autocast, entropy
        )
    attention = pad_right([[1] * len(s) for s in sequences], 0, device)
    ids = pad_right(sequences, pad_id, device)  # (B, L)
    if prompt_lens is not None and _shares_prompts(model, sequences, prompt_lens, shared_prefix):
        logp, entropy_per_token = _grouped_logprobs(
            model, sequences, prompt_lens, pad_id, device, temperature, bf16_autocast, entropy, ids.shape[1] - 1
        )
        return logp, attention[:, 1:], entropy_per_token
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # (B, L-1, V)
    logp, entropy_per_token = token_logprobs(logits, ids[:, 1:], temperature, entropy)
    return logp, attention[:, 1:], entropy_per_token


def _packed_sequence_logprobs(
    model: Any,
    sequences: list[list[int]],
    prompt_lens: list[int] | None,
    shared_prefix: bool,
    device: torch.device,
    temperature: float,
    bf16_autocast: bool,
    entropy: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` through one packed row, in the same (B, L-1) layout: every position filled, or with
    `prompt_lens` those predicting response tokens (0 elsewhere)."""
    starts = [0] * len(sequences) if prompt_lens is None else [n - 1 for n in prompt_lens]
    reads = [torch.arange(start, len(s) - 1) for s, start in zip(sequences, starts, strict=True)]
    shared = prompt_lens if shared_prefix else None
    logp, entropy_per_token = _packed_logprobs(
        model, sequences, shared, reads, device, temperature, bf16_autocast, entropy
    )
    width = max(map(len, sequences)) - 1
    rows = torch.cat([torch.full((len(r),), i) for i, r in enumerate(reads)]).to(device)
    columns = torch.cat(reads).to(device)
    valid = pad_right([[1] * len(s) for s in sequences], 0, device)[:, 1:]  # (B, L-1)

    def scatter(values: torch.Tensor) -> torch.Tensor:  # (N,) -> (B, L-1)
        return values.new_zeros((len(sequences), width)).index_put((rows, columns), values)

    return scatter(logp), valid, None if entropy_per_token is None else scatter(entropy_per_token)


def _packed_logprobs(
    model: Any,
    sequences: list[list[int]],
    shared_prompt_lens: list[int] | None,
    reads: list[torch.Tensor],
    device: torch.device,
    temperature: float,
    bf16_autocast: bool,
    entropy: str = "off",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p of token t + 1 of sequence i for every t in reads[i], flattened (N,) in (i, t) order, from one
    packed row (prompts shared with `shared_prompt_lens`); the entropy there too, or None."""
    row = packing.pack(sequences, shared_prompt_lens)
    keep = torch.cat([row.where[i][r] for i, r in enumerate(reads)])  # (N,) row positions predicting the targets
    targets = torch.cat([torch.tensor(s)[r + 1] for s, r in zip(sequences, reads, strict=True)]).to(device)  # (N,)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
        logits = packing.next_token_logits(model, row, keep, device)  # (1, N, V)
    logp, entropy_per_token = token_logprobs(logits, targets[None], temperature, entropy)  # (1, N)
    return logp[0], None if entropy_per_token is None else entropy_per_token[0]


def _shares_prompts(model: Any, sequences: list[list[int]], prompt_lens: list[int], shared_prefix: bool) -> bool:
    """Whether `sequence_logprobs` computes each prompt once (model.accelerate, a model prefix_sharing runs, a
    prompt repeated in the micro-batch) rather than the plain padded pass."""
    if not (shared_prefix and prefix_sharing.usable(model)):
        return False
    return len({tuple(s[:n]) for s, n in zip(sequences, prompt_lens, strict=True)}) < len(sequences)


def _grouped_logprobs(
    model: Any,
    sequences: list[list[int]],
    prompt_lens: list[int],
    pad_id: int,
    device: torch.device,
    temperature: float,
    bf16_autocast: bool,
    entropy: str,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` through prefix_sharing: response positions filled, in the same (B, width) layout."""
    prompts = [s[:n] for s, n in zip(sequences, prompt_lens, strict=True)]
    responses = [s[n:] for s, n in zip(sequences, prompt_lens, strict=True)]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
        logits = prefix_sharing.response_logits(model, prompts, responses, pad_id, device)  # (B, R, V)
    targets = pad_right(responses, pad_id, device)  # (B, R)
    logp, entropy_per_token = token_logprobs(logits, targets, temperature, entropy)  # (B, R)
    # Response token j of row b sits at sequence index n_b + j, so it is predicted at position n_b - 1 + j.
    starts = torch.tensor(prompt_lens, device=device)[:, None] - 1
    offset = torch.arange(width, device=device)[None] - starts  # (B, width): j at each position
    inside = (offset >= 0) & (offset < torch.tensor([len(r) for r in responses], device=device)[:, None])
    index = offset.clamp(0, targets.shape[1] - 1)
    logp = logp.gather(1, index) * inside
    if entropy_per_token is not None:
        entropy_per_token = entropy_per_token.gather(1, index) * inside
    return logp, entropy_per_token


def counted_token_logprobs(
    model: Any,
    sequences: list[list[int]],
    loss_starts: list[int],
    loss_masks: list[list[int]],
    pad_id: int,
    device: torch.device,
    bf16_autocast: bool = False,
    shared_prefix: bool = False,
    pack: bool = False,
) -> torch.Tensor:
    """log p of the tokens a loss counts, flattened (N,), N = the masks' sum: token `loss_starts[i] + j` of
    sequence i counts where `loss_masks[i][j]` (SFT's model tokens). With `shared_prefix` (model.accelerate) and
    a model prefix_sharing runs, the batch's common prefix (the system turn of every trace) runs once and the LM
    head and log-softmax run only at the counted tokens; otherwise the plain forward over whole sequences. With
    `pack`, one packed row (rl/packing.py; the common prefix once with `shared_prefix`), the LM head only at the
    counted tokens."""
    if pack:
        prefixes = [_common_prefix_length(sequences, min(loss_starts))] * len(sequences) if shared_prefix else None
        reads = [
            torch.tensor([start + j - 1 for j, counted in enumerate(mask) if counted], dtype=torch.long)
            for start, mask in zip(loss_starts, loss_masks, strict=True)
        ]
        logp, _ = _packed_logprobs(model, sequences, prefixes, reads, device, 1.0, bf16_autocast)
        return logp
    if not (shared_prefix and prefix_sharing.usable(model)):
        logp, _, _ = sequence_logprobs(model, sequences, pad_id, device, bf16_autocast=bf16_autocast)
        return logp[response_mask_matrix(loss_starts, loss_masks, logp.shape[1], device).bool()]
    shared = _common_prefix_length(sequences, limit=min(loss_starts))
    rows, columns, targets = [], [], []
    for i, (seq, start, mask) in enumerate(zip(sequences, loss_starts, loss_masks, strict=True)):
        for j, counted in enumerate(mask):
            if counted:  # token start + j, predicted at response position start + j - shared
                rows.append(i)
                columns.append(start + j - shared)
                targets.append(seq[start + j])
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
        hidden = prefix_sharing.response_hidden(
            model, [s[:shared] for s in sequences], [s[shared:] for s in sequences], pad_id, device
        )  # (B, R, C)
        logits = base.lm_head(hidden[torch.tensor(rows, device=device), torch.tensor(columns, device=device)])  # (N, V)
    logp, _ = token_logprobs(logits[None], torch.tensor(targets, device=device)[None])  # (1, N)
    return logp[0]


def _common_prefix_length(sequences: list[list[int]], limit: int) -> int:
    """Length of the prefix all sequences share, at least 1 (then the first tokens may differ: one prompt each)
    and at most `limit` (the first counted token must be predicted from inside the shared part or after it)."""
    first = sequences[0]
    n = 0
    while n < limit and all(len(s) > n and s[n] == first[n] for s in sequences):
        n += 1
    return max(1, n)


def response_mask_matrix(
    prompt_lens: list[int], response_masks: list[list[int]], width: int, device: torch.device
) -> torch.Tensor:
    """(B, width) mask aligned with `sequence_logprobs`: position t predicts token t+1."""
    out = torch.zeros((len(prompt_lens), width), dtype=torch.float32)
    for i, (start, mask) in enumerate(zip(prompt_lens, response_masks, strict=True)):
        out[i, start - 1 : start - 1 + len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return out.to(device)
