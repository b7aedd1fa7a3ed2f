"""Generation with plain transformers: batched decoding with a KV cache, written for small batches of
many samples of few prompts (GRPO groups), on CPU or CUDA.

Why not `model.generate`: identical prompts of a group are prefilled once and their cache rows copied,
finished rows leave the batch (their cache rows are dropped), there is no logits-processor machinery
per step, and a token costs one uniform draw instead of one per vocabulary entry. Per-row stop strings, EOS,
budgets, temperature / top-p / top-k sampling, the sampled tokens' logprobs, and one random stream per
request: its k-th token's uniform draw is a hash of (its seed, k), so a request samples the same tokens in any
batch (the agent loop's two schedules rely on it) and the same seed gives the same tokens on CPU.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import numpy as np
import torch

from retool_cli.interfaces import Generation, Sampling
from retool_cli.model.llama_family import supports
from retool_cli.rollout.kv_decoder import HFCacheDecoder, KVDecoder


class HFEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        dtype: torch.dtype | None = None,
        accelerate: bool = False,
        own_copy: bool = False,
    ) -> None:
        """Generates with `model` itself, or with a copy that `update_weights` refreshes: when `dtype` differs
        from the model's (e.g. bfloat16 next to an fp32 trainer), or with `own_copy` (a sampler that runs while
        the trainer updates the model: rl/overlap.py). `accelerate` (model.accelerate) decodes Llama-family
        models with kv_decoder.KVDecoder; otherwise, and for other models, each step is the model's own forward
        with transformers' cache."""
        self.accelerate = accelerate
        own_dtype = next(model.parameters()).dtype
        self.copied = own_copy or (dtype is not None and dtype != own_dtype)
        if self.copied:
            model = _cast_copy(model, dtype or own_dtype)
        self.model = model
        self.pack_cache: dict[str, Any] = {}  # KVDecoder's prepacked weights, kept while the weights are unchanged
        self.tokenizer = tokenizer
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos_ids = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {i for i in [*eos_ids, tokenizer.eos_token_id] if i is not None}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))

    def update_weights(self, policy: Any) -> None:
        """After an optimizer step: forget the prepacked weights (version counters alone miss writes such as
        FSDP2's all-gather into the unsharded parameters); cast-copy into our own model when we have one."""
        self.pack_cache.clear()
        if self.copied:
            self.model.load_state_dict(policy.state_dict())

    def sleep(self) -> None:
        """Nothing to release between rollouts: the cache lives only inside `generate` (vLLM's engine frees
        its memory here)."""

    def wake_up(self) -> None:
        """See `sleep`."""

    @property
    def device(self) -> torch.device:
        device: torch.device = next(self.model.parameters()).device
        return device

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_strings: list[str],
        sampling: Sampling,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        """One continuation per prompt; rows stop at EOS, a stop string, or their own token budget."""
        if not prompts:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            seeds = seeds if seeds is not None else [sampling.seed + i for i in range(len(prompts))]
            return self._generate(prompts, max_new_tokens, stop_strings, sampling, seeds)
        finally:
            self.model.train(was_training)

    def _generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_strings: list[str],
        sampling: Sampling,
        seeds: list[int],
    ) -> list[Generation]:
        device = self.device
        stopper = _StopChecker(self.tokenizer, stop_strings)
        # A LoRA (peft) policy: decode through its base model, whose layers carry the adapters.
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        fast = self.accelerate and supports(base)
        decoder = KVDecoder(base, self.pack_cache) if fast else HFCacheDecoder(self.model)
        # Prefill each distinct prompt once. Rows are ordered by prompt; when every prompt has the same number
        # of rows (GRPO groups), the decoder keeps each prompt's cache once (share), else every row copies it.
        unique: dict[tuple[int, ...], int] = {}
        row_of = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        order = sorted(range(len(prompts)), key=row_of.__getitem__)  # batch row -> request
        ids, mask = _left_pad([list(p) for p in unique], self.pad_id, device)  # (U, W)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = decoder.prefill(ids, mask, positions, ids.shape[1] + max(max_new_tokens))  # (U, V)
        rows = torch.tensor([row_of[i] for i in order], device=device)
        group_size = len(prompts) // len(unique)
        counts = Counter(row_of).values()
        if isinstance(decoder, KVDecoder) and group_size > 1 and all(c == group_size for c in counts):
            decoder.share(group_size)
        else:
            decoder.select(rows)
        logits, positions = logits[rows], positions[rows, -1]  # (B, V), (B,)

        n = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        finish = ["length"] * n
        active = order  # batch row -> request index; -1 once the row's request is finished
        live = n
        row_seeds = np.array([seeds[i] % (1 << 64) for i in order], dtype=np.uint64)  # (B,) each row's request's seed
        while True:
            drawn = np.array([len(tokens[request]) if request >= 0 else 0 for request in active], dtype=np.uint64)
            uniforms = torch.from_numpy(request_uniforms(row_seeds, drawn)).to(device)  # (B,) in (0, 1]
            next_ids, next_logps = _sample(logits, sampling, uniforms)  # (B,), (B,)
            for row, (request, token, logp) in enumerate(
                zip(active, next_ids.tolist(), next_logps.tolist(), strict=True)
            ):
                if request < 0:
                    continue
                tokens[request].append(token)
                logps[request].append(logp)
                if token in self.eos_ids:
                    finish[request] = "eos"
                elif stopper.hit(tokens[request]):
                    finish[request] = "stop"
                elif len(tokens[request]) < max_new_tokens[request]:
                    continue
                active[row], live = -1, live - 1
            if live == 0:
                break
            # Finished rows leave the batch and the cache once they are a quarter of it: a few idle rows
            # cost less than copying every layer's cache at each finish (after `share`: whole prompts only).
            if (len(active) - live) * 4 >= len(active):
                keep = decoder.rows_to_keep([request >= 0 for request in active])
                if len(keep) < len(active):
                    index = torch.tensor(keep, device=device)
                    decoder.select(index)
                    next_ids, positions = next_ids[index], positions[index]
                    active = [active[row] for row in keep]
                    row_seeds = row_seeds[keep]
            positions = positions + 1
            logits = decoder.step(next_ids, positions)
        return [Generation(tokens[i], logps[i], finish[i]) for i in range(n)]


def _cast_copy(model: Any, dtype: torch.dtype) -> Any:
    """A frozen copy of `model` in `dtype`, cast parameter by parameter: a plain deepcopy would first hold a
    second copy in the model's own dtype (28 GB more for a 7B fp32 policy). Tied weights stay tied."""
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=False) for p in model.parameters()}
    return copy.deepcopy(model, memo).to(dtype).eval()


def _left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def request_uniforms(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """(B,) uniform draws in (0, 1], the `counters[i]`-th of request i's stream: splitmix64 (Steele et al. 2014)
    of (seed, counter), a counter-based generator, so a draw depends on nothing but its request and position."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        x = seeds * np.uint64(0x9E3779B97F4A7C15) + counters * np.uint64(0xD1B54A32D192ED03) + np.uint64(1)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    uniforms: np.ndarray = ((x >> np.uint64(11)).astype(np.float64) + 1.0) / float(1 << 53)  # 53 bits, never 0
    return uniforms


def _sample(logits: torch.Tensor, sampling: Sampling, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with its uniform draw (B,); return it and its logprob under the
    temperature-scaled distribution."""
    if sampling.temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        ids = logits.argmax(dim=-1)
        return ids, logprobs.gather(-1, ids[:, None])[:, 0]
    logprobs = torch.log_softmax(logits / sampling.temperature, dim=-1)  # (B, V)
    filtered = logprobs
    if sampling.top_k > 0:
        kth = filtered.topk(min(sampling.top_k, filtered.shape[-1]), dim=-1).values[:, -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_lp, order = filtered.sort(dim=-1, descending=True)
        cumulative = sorted_lp.exp().cumsum(dim=-1)
        drop = cumulative - sorted_lp.exp() >= sampling.top_p  # keep the smallest set reaching top_p
        filtered = filtered.scatter(-1, order, sorted_lp.masked_fill(drop, float("-inf")))
    # Inverse-CDF sampling: one uniform draw per row (torch.multinomial draws one per vocabulary entry,
    # which cost more than a decode step's attention on CPU). float64 keeps the CDF exact enough at any
    # vocabulary size; u in (0, 1] never selects a token of probability zero.
    cdf = filtered.exp().cumsum(dim=-1, dtype=torch.float64)  # (B, V)
    ids = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:])[:, 0].clamp(max=cdf.shape[-1] - 1)  # (B,)
    return ids, logprobs.gather(-1, ids[:, None])[:, 0]


class _StopChecker:
    """Does a row's output end with a stop string? Single-token stop strings are an id lookup; others
    decode only the last few tokens."""

    def __init__(self, tokenizer: Any, stop_strings: list[str]) -> None:
        self.tokenizer = tokenizer
        self.strings = stop_strings
        self.ids: set[int] = set()
        self.tail = 0
        for text in stop_strings:
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) == 1 and tokenizer.decode(ids) == text:
                self.ids.add(ids[0])
            self.tail = max(self.tail, len(text) + 2)  # a token is at least one character

    def hit(self, tokens: list[int]) -> bool:
        if not self.strings:
            return False
        if tokens[-1] in self.ids:
            return True
        if len(self.ids) == len(self.strings):
            return False
        text = self.tokenizer.decode(tokens[-self.tail :])
        return any(s in text for s in self.strings)  # a token may carry characters past the stop string
