"""rl/packing.py: padding-free passes against the padded pass, log-probs and gradients to fp32 rounding, on
Qwen2, Qwen3 and Llama models with tiny and real (Qwen2.5's 151,665-token) vocabularies; with shared prompts,
LoRA, gradient checkpointing, bf16 autocast; the whole RL update; the unpacked forward left unchanged."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

from retool_cli.config import LossAgg, RetoolConfig
from retool_cli.data.dataset import MathExample
from retool_cli.errors import ConfigError
from retool_cli.model.precision import resolve_precision
from retool_cli.model.tiny import tiny_model_path
from retool_cli.rl import packing
from retool_cli.rl.logprobs import counted_token_logprobs, rl_positions, sequence_logprobs, sft_positions
from retool_cli.rl.optim import build_scheduler
from retool_cli.rl.step import StepPlan, rollout_batch
from retool_cli.rl.update import update
from retool_cli.rollout.agent import Trajectory
from tests.unit.test_hf_engine import tiny_model
from tests.unit.test_trainer import _grouped_sequences, _loss_and_grads, _sft_traces

CPU = torch.device("cpu")
REAL_VOCAB = 151_665  # len(Qwen2.5's tokenizer): ../shared/tokenizers/README.md


def assert_same_pass(padded, packed, atol: float = 1e-5) -> None:
    assert torch.allclose(padded[0], packed[0], atol=atol) and torch.allclose(padded[1], packed[1], atol=atol)
    assert padded[2].keys() == packed[2].keys() and padded[2]
    for name, grad in padded[2].items():
        assert torch.allclose(grad, packed[2][name], atol=1e-4, rtol=1e-4), name


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("shared", [False, True])
def test_packed_pass_equals_the_padded_pass(kind: str, shared: bool) -> None:
    """GRPO groups of unequal lengths in one row: the padded pass's response log-probs, entropies and gradients,
    with each prompt once when shared (model.accelerate) or whole sequences end to end."""
    model = tiny_model(kind).train()
    sequences, prompt_lens = _grouped_sequences(0)
    padded = _loss_and_grads(model, sequences, prompt_lens, shared=False, pack=False)
    packed = _loss_and_grads(model, sequences, prompt_lens, shared=shared, pack=True)
    assert len(padded[2]) == len(list(model.parameters()))
    assert_same_pass(padded, packed)
    assert model.config._attn_implementation == "retool_packed:sdpa"


class RepeatedIndexSums(TorchDispatchMode):
    """Notes every CPU op that adds values into an index that repeats (index_put_ / put_ with accumulate=True,
    which the backward of x[index] is): on CPU those add with atomics from several threads, in whatever order the
    threads run (torch.use_deterministic_algorithms' documentation), so the sums round differently from run to run
    when other threads share the cores (a sampler beside the trainer: trainer.max_staleness)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        accumulate = kwargs.get("accumulate", args[3] if len(args) > 3 else False)
        if ("index_put" in name or name.startswith("put")) and accumulate and args[0].device.type == "cpu":
            index = []  # one tensor of coordinates per indexed dimension
            for i in args[1] if "index_put" in name else [args[1]]:
                if i is not None:
                    index.extend(i.nonzero().unbind(1) if i.dtype == torch.bool else [i])  # a mask: its positions
            coordinates = torch.stack([i.flatten() for i in torch.broadcast_tensors(*index)], dim=1)  # (K, dims)
            if len(coordinates.unique(dim=0)) < len(coordinates):
                self.found.append(f"{name} {tuple(args[0].shape)}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("shared", [False, True])
def test_the_packed_backward_sums_in_one_order_whatever_the_threads_timing(shared: bool) -> None:
    """With shared prompts a prompt's last position predicts the first token of each of its responses, so that
    position's logits are read several times. Taken by indexing, their gradients were summed by atomic adds (two
    identical overlapped runs on 2 threads trained apart by rounding from their first update); the position now
    runs once and its copies' gradients are summed in index order. The audit itself sees the old way."""
    model = tiny_model("qwen2").train()
    sequences, prompt_lens = _grouped_sequences(0)
    with RepeatedIndexSums() as audit:
        packed = _loss_and_grads(model, sequences, prompt_lens, shared=shared, pack=True)
    assert audit.found == []
    assert_same_pass(_loss_and_grads(model, sequences, prompt_lens, shared=False, pack=False), packed)

    x = torch.randn(1, 5, 4, requires_grad=True)
    index = torch.tensor([0, 3, 0, 0, 1])
    with RepeatedIndexSums() as audit:
        x[:, index].sum().backward()
    assert audit.found  # what the packed pass did before
    repeated = torch.randn(1, 5, 4, requires_grad=True)
    packing.repeat_positions(repeated, index).square().sum().backward()
    assert torch.equal(repeated.grad[0, 0], 6 * repeated[0, 0].detach())  # three copies: 2x each
    assert torch.equal(repeated.grad[0, 2], torch.zeros(4))


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
    """flash-attention's varlen kernel (torch.nn.attention.varlen, CUDA only) written out with SDPA, sequence by
    sequence: (T, H, D) inputs, causal with window_size (-1, 0), as the packed path calls it."""
    assert window_size == (-1, 0) and torch.equal(cu_q, cu_k) and cu_q.dtype == torch.int32
    bounds = cu_q.tolist()
    assert max_q == max_k == max(b - a for a, b in itertools.pairwise(bounds))
    outs = []
    for a, b in itertools.pairwise(bounds):
        x = [t[a:b].transpose(0, 1) for t in (q, k, v)]  # (H, n, D)
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(*x, is_causal=True, scale=scale, enable_gqa=enable_gqa)
        )
    return torch.cat(outs, dim=1).transpose(0, 1)  # (T, H, D)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_varlen_kernel_path_lays_out_the_row_as_the_kernel_reads_it(kind: str, monkeypatch) -> None:
    """On CUDA a row without shared prompts goes to flash-attention's varlen kernel in one call. Here the kernel
    is written out with SDPA (the CPU has none), so what is tested is our side: the (T, H, D) layout, the
    cumulative lengths, the causal window, GQA and the output's shape; log-probs and gradients equal the padded
    pass's. (benchmarks/gpu_check.sh runs the real kernel.)"""
    calls = []

    def kernel(*args, **kwargs):
        calls.append(args[3].tolist())
        return reference_varlen(*args, **kwargs)

    monkeypatch.setattr(packing, "_VARLEN", kernel)
    monkeypatch.setattr(
        packing, "_varlen_fits", lambda query, dropout, segments: not any(s.prefix_end for s in segments)
    )
    model = tiny_model(kind).train()
    sequences, prompt_lens = _grouped_sequences(0)
    padded = _loss_and_grads(model, sequences, prompt_lens, shared=False, pack=False)
    packed = _loss_and_grads(model, sequences, prompt_lens, shared=False, pack=True)
    assert calls and calls[0][0] == 0 and len(calls) % model.config.num_hidden_layers == 0  # one call per layer
    assert_same_pass(padded, packed)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_packed_pass_with_a_real_vocabulary(kind: str) -> None:
    model = tiny_model(kind, vocab_size=REAL_VOCAB).train()
    generator = torch.Generator().manual_seed(1)
    sequences = [torch.randint(0, REAL_VOCAB, (n,), generator=generator).tolist() for n in (23, 4, 11, 9)]
    sequences[1] = sequences[0][:3] + sequences[1]  # a prompt shared with the first
    prompt_lens = [3, 3, 5, 2]
    assert_same_pass(
        _loss_and_grads(model, sequences, prompt_lens, shared=False, pack=False),
        _loss_and_grads(model, sequences, prompt_lens, shared=True, pack=True),
    )


@pytest.mark.parametrize("shared_start", [True, False])
def test_packed_sft_pass_equals_the_padded_pass(shared_start: bool) -> None:
    """SFT's counted tokens (masks with holes), with the batch's common prefix once or not."""
    model = tiny_model("qwen3").train()
    sequences, starts, masks = _sft_traces(3, shared_start)
    results = []
    for pack, shared in ((False, False), (True, False), (True, True)):
        model.zero_grad()
        with RepeatedIndexSums() as audit:  # no sum whose order depends on the threads' timing
            logp = counted_token_logprobs(model, sequences, starts, masks, 95, CPU, shared_prefix=shared, pack=pack)
            (-logp.sum()).backward()
        assert audit.found == []
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (padded, padded_grads), *packed = results
    assert padded.shape == (sum(map(sum, masks)),)
    for logp, grads in packed:
        assert torch.allclose(padded, logp, atol=1e-5)
        assert all(torch.allclose(g, grads[n], atol=1e-4, rtol=1e-4) for n, g in padded_grads.items())


def test_packed_pass_through_lora_with_gradient_checkpointing_and_bf16() -> None:
    """LoRA adapters get the padded pass's gradients, also when the backward recomputes each layer (the
    recompute sees the segments too); under bf16 autocast packed and padded agree as closely as bf16 allows."""
    from retool_cli.config import ModelConfig
    from retool_cli.model.loading import apply_lora

    sequences, prompt_lens = _grouped_sequences(1)
    sequences = [[t % 200 for t in s] for s in sequences]
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    base.gradient_checkpointing_enable()
    policy = apply_lora(base, ModelConfig(name_or_path="tiny", lora_rank=4, lora_alpha=8.0)).train()
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # non-zero adapters, so that they change the logits
    padded = _loss_and_grads(policy, sequences, prompt_lens, shared=False, pack=False)
    packed = _loss_and_grads(policy, sequences, prompt_lens, shared=True, pack=True)
    assert padded[2] and all("lora_" in n for n in padded[2])
    assert_same_pass(padded, packed)
    mixed = [
        sequence_logprobs(policy, sequences, 0, CPU, bf16_autocast=True, prompt_lens=prompt_lens, pack=pack)[0]
        for pack in (False, True)
    ]
    response = packed[0] != 0
    assert not torch.equal(mixed[1][response], packed[0][response])  # bf16 matmuls really ran
    assert torch.allclose(mixed[0][response], mixed[1][response], atol=0.05)


def test_the_unpacked_forward_and_the_saved_config_are_unchanged(tmp_path) -> None:
    """`enable` leaves every other forward (generation, the padded pass) to the model's own attention, bit for
    bit, and a checkpoint saved after it loads anywhere (no packed attention in its config)."""
    model = tiny_model("qwen2")
    ids = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 95, 95, 95]])
    mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0]])
    before = model(input_ids=ids, attention_mask=mask).logits
    generated = model.generate(ids[:1], max_new_tokens=6, do_sample=False, pad_token_id=95)
    packing.enable(model)
    packing.enable(model)  # idempotent
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)
    assert torch.equal(model.generate(ids[:1], max_new_tokens=6, do_sample=False, pad_token_id=95), generated)
    model.save_pretrained(tmp_path)
    assert "retool_packed" not in (tmp_path / "config.json").read_text()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"


def test_rows_and_positions() -> None:
    """Rows stay within the budget in batch order (a group shares its row); a longer sample gets a row of its
    own; every position of a packed pass is a real token, a shared prompt counted once."""
    sequences = [[1, 2, 3, 7, 7, 7, 7], [1, 2, 3, 7], [4, 5, 8, 8], [9] * 12, [4, 5, 6]]
    prompt_lens = [3, 3, 2, 1, 2]
    assert packing.packed_length(sequences[:2], prompt_lens[:2]) == 3 + 4 + 1
    assert packing.rows(sequences, None, 11) == [[0, 1], [2], [3], [4]]
    assert packing.rows(sequences, prompt_lens, 12) == [[0, 1, 2], [3], [4]]
    model = tiny_model("llama")
    assert rl_positions(model, sequences[:3], prompt_lens[:3], shared_prefix=True, pack=True) == (12, 12)
    assert rl_positions(model, sequences[:3], prompt_lens[:3], shared_prefix=False, pack=True) == (15, 15)
    assert sft_positions(model, sequences[:2], [3, 3], shared_prefix=True, pack=True) == (3 + 4 + 1, 8)
    row = packing.pack(sequences[:3], prompt_lens[:3])
    assert row.input_ids.tolist() == [[1, 2, 3, 7, 7, 7, 7, 7, 4, 5, 8, 8]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 3, 0, 1, 2, 3]]
    assert [row.where[1].tolist()] == [[0, 1, 2, 7]]


def _trajectories() -> tuple[list[Trajectory], torch.Tensor]:
    """3 questions x 4 samples, lengths spread over ~10x, tool tokens (mask 0), varied rewards."""
    generator = torch.Generator().manual_seed(4)
    trajectories, rewards = [], []
    for q, prompt in enumerate(([5, 17, 3, 44, 9], [8, 2], [60, 61, 62, 63])):
        for j in range(4):
            length = int(torch.randint(3, 40, (1,), generator=generator))
            response = torch.randint(0, 90, (length,), generator=generator).tolist()
            mask = [0 if 1 <= k < 3 else 1 for k in range(length)]
            logprobs = (-torch.rand(length, generator=generator)).tolist()
            x = Trajectory(MathExample(f"q{q}", "x", "1", "t"), j, prompt, response, mask, response_logprobs=logprobs)
            trajectories.append(x)
            rewards.append(float(torch.randint(0, 2, (1,), generator=generator)))
    return trajectories, torch.tensor(rewards)


@pytest.mark.parametrize(
    "overrides",
    [
        {"trainer.loss_agg": LossAgg.token_mean, "trainer.entropy_coef": 0.01},
        {"trainer.loss_agg": LossAgg.token_mean, "model.accelerate": True},  # each prompt once (shared)
        {
            "trainer.loss_agg": LossAgg.seq_mean_token_mean,
            "trainer.epochs_per_batch": 2,
            "trainer.mini_batches": 2,
            "trainer.kl_coef": 0.1,
            "model.accelerate": True,
        },
    ],
)
def test_packed_update_equals_the_padded_update(overrides: dict) -> None:
    """The whole RL update (old, reference and sampler log-probs, entropy bonus, KL, both aggregations, several
    mini-batches and epochs): the same metrics and weights to fp32 rounding, padding share 0; no sum in either
    whose order depends on the threads' timing."""
    trajectories, rewards = _trajectories()
    results = []
    for pack in (False, True):
        model, ref = tiny_model("qwen2").train(), tiny_model("qwen2").eval()
        cfg = RetoolConfig()
        for key, value in overrides.items():
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, value)
        cfg.trainer.micro_batch_tokens, cfg.trainer.pack_sequences = 90, pack
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        plan = StepPlan.of(cfg, resolve_precision(cfg, training=True))
        with RepeatedIndexSums() as audit:  # every sum in an order of its own, none in the threads' timing
            metrics = update(
                plan,
                model,
                rollout_batch(trajectories, rewards),
                optimizer,
                build_scheduler(optimizer, 0, 1, "constant"),
                95,
                ref,
            )
        assert audit.found == []
        results.append((metrics, model.state_dict()))
    (padded, padded_weights), (packed, packed_weights) = results
    assert padded["train/padding_share"] > 0.05 and packed["train/padding_share"] == 0.0
    # clip fraction, approx. KL and KL to the reference are means over micro-batches, which packing regroups
    per_micro_batch = ("train/clip_fraction", "train/approx_kl", "train/kl_ref")
    for key, value in padded.items():
        if not key.startswith(("time/", "train/padding_share", *per_micro_batch)):
            assert packed[key] == pytest.approx(value, abs=1e-5, rel=1e-4), key
    moved = [k for k in padded_weights if not torch.equal(padded_weights[k], tiny_model("qwen2").state_dict()[k])]
    assert len(moved) > len(padded_weights) // 2
    assert all(torch.allclose(padded_weights[k], packed_weights[k], atol=1e-5) for k in padded_weights)


def test_balanced_ranks_deal_whole_groups_by_tokens() -> None:
    """Longest-processing-time dealing: whole groups, loads within one group of each other, the same answer on
    every call (every process computes it on its own)."""
    generator = torch.Generator().manual_seed(2)
    costs = torch.randint(60, 600, (24,), generator=generator).tolist()
    groups = [i // 4 for i in range(24)]  # 6 GRPO groups of 4
    ranks = packing.balanced_ranks(costs, groups, 2)
    assert ranks == packing.balanced_ranks(costs, groups, 2)
    assert all(len({ranks[i] for i in range(24) if groups[i] == g}) == 1 for g in range(6))
    loads = [sum(c for c, r in zip(costs, ranks, strict=True) if r == rank) for rank in range(2)]
    largest_group = max(sum(costs[g * 4 : g * 4 + 4]) for g in range(6))
    assert abs(loads[0] - loads[1]) <= largest_group
    by_question_order = [sum(costs[:12]), sum(costs[12:])]  # what splitting by question index gives
    assert abs(loads[0] - loads[1]) <= abs(by_question_order[0] - by_question_order[1])
    singles = packing.balanced_ranks([10, 9, 8, 1], [0, 1, 2, 3], 2)
    assert singles == [0, 1, 1, 0]  # 10 -> 0, 9 -> 1, 8 -> 1 (9 < 10), 1 -> 0 (10 < 17)


def test_a_model_that_drops_the_segments_is_refused_not_trained_wrongly() -> None:
    """A decoder whose attention does not receive the forward's keyword arguments would attend across the
    whole row: the packed forward raises instead, naming the setting to turn off."""
    model = tiny_model("llama")
    for layer in model.model.layers:
        own = layer.self_attn.forward
        layer.self_attn.forward = lambda *a, _own=own, **k: _own(
            *a, **{n: v for n, v in k.items() if n != "packed_segments"}
        )
    with pytest.raises(ConfigError, match=r"trainer.pack_sequences=false"):
        sequence_logprobs(model, [[1, 2, 3], [4, 5]], 0, CPU, pack=True)
    sequence_logprobs(model, [[1, 2, 3], [4, 5]], 0, CPU)  # the padded pass still runs


def test_sliding_window_layers_are_refused() -> None:
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=0,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ConfigError, match=r"sliding-window .* trainer.pack_sequences=false"):
        sequence_logprobs(model, [[1, 2, 3, 4, 5, 6], [4, 5]], 0, CPU, pack=True)


# Attention that the packed attention does not compute, passed to transformers' attention function: refused by
# name whatever the probe finds (a soft-cap of 1 changes a tiny random model's logits by less than rounding, so
# only the refusal keeps the packed pass from ignoring it)
NOT_COMPUTED = {
    "soft-capping": ("gemma2", {"layer_types": ["full_attention"] * 2, "attn_logit_softcapping": 1.0}),
    "attention sinks": (
        "gpt_oss",
        {"layer_types": ["full_attention"] * 2, "num_local_experts": 2, "num_experts_per_tok": 1},
    ),
}


@pytest.mark.parametrize("what", list(NOT_COMPUTED))
def test_attention_the_packed_pass_does_not_compute_is_refused_by_name(what: str) -> None:
    model_type, extra = NOT_COMPUTED[what]
    model = small_model(model_type, **extra)
    with pytest.raises(ConfigError, match=rf"{what}, which packed rows do not support yet.*pack_sequences=false"):
        sequence_logprobs(model, [[1, 2, 3, 4, 5, 6], [4, 5]], 0, CPU, pack=True)
    sequence_logprobs(model, [[1, 2, 3, 4, 5, 6], [4, 5]], 0, CPU)  # the padded pass still runs


SMALL = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "head_dim": 16}
SMALL |= {"num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# Decoders whose positions meet outside transformers' attention interface, so a packed row would carry one
# sequence into the next: a convolution layer (LFM2), a state-space model (Mamba), an attention of their own
# with ALiBi (Bloom)
MIXING = {
    "lfm2 with a convolution layer": ("lfm2", {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]}),
    "mamba": ("mamba", {}),
    "bloom": ("bloom", {"n_layer": 2, "n_head": 4}),
}


def small_model(model_type: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SMALL, **extra)).train()


@pytest.mark.parametrize("name", list(MIXING))
def test_a_model_that_mixes_positions_outside_attention_is_refused(name: str, monkeypatch) -> None:
    """The probe refuses, naming the setting, a model whose packed pass would be wrong, and leaves it as it was
    (its own attention, train mode); the padded pass still runs. Without the probe the packed pass's log-probs
    would differ from the padded pass's: the refusal is what stands between such a model and wrong updates."""
    model_type, extra = MIXING[name]
    model = small_model(model_type, **extra)
    own = model.config._attn_implementation
    sequences, prompt_lens = _grouped_sequences(0)
    with pytest.raises(ConfigError, match=r"cannot train on packed rows.*trainer.pack_sequences=false"):
        sequence_logprobs(model, sequences, 0, CPU, prompt_lens=prompt_lens, pack=True)
    assert model.config._attn_implementation == own and model.training
    padded = _loss_and_grads(model, sequences, prompt_lens, shared=False, pack=False)
    monkeypatch.setattr(packing, "check_packs_exactly", lambda model: None)
    packed = _loss_and_grads(model, sequences, prompt_lens, shared=False, pack=True)
    assert (padded[0] - packed[0]).abs().max() > 1e-4


def test_the_probe_leaves_modes_and_the_random_stream_as_they_were() -> None:
    """The probe runs in eval mode without gradients on a generator of its own: every module's mode comes back
    (a frozen part stays in eval mode), the run's random stream does not move, and no gradient is left."""
    model = tiny_model("qwen2").train()
    model.model.layers[0].eval()
    state = torch.get_rng_state()
    packing.enable(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training and not model.model.layers[0].training and model.model.layers[1].training
    assert all(p.grad is None for p in model.parameters())
    assert model.config._attn_implementation == "retool_packed:sdpa"


# transformers' decoders at tiny sizes (what each needs beyond SMALL): whatever a user points model.name_or_path at
AS_THEY_ARE = ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phimoe", "granitemoe", "jetmoe", "gemma", "phi"]
AS_THEY_ARE += ["phi3", "olmo2", "cohere", "starcoder2", "gpt_neox", "smollm3", "glm", "persimmon", "biogpt", "opt"]
AS_THEY_ARE += ["llama4_text", "mistral", "gemma2", "recurrent_gemma", "mamba", "xglm", "gpt_oss"]
ARCHITECTURES: dict[str, dict] = {
    **{model_type: {} for model_type in AS_THEY_ARE},
    "gpt2": {"n_layer": 2, "n_head": 4, "n_embd": 64},
    "gptj": {"n_layer": 2, "n_head": 4, "n_embd": 64, "rotary_dim": 8},
    "codegen": {"n_layer": 2, "n_head": 4, "n_embd": 64, "rotary_dim": 8},
    "bloom": {"n_layer": 2, "n_head": 4},
    "falcon": {"head_dim": None},  # hidden_size / heads, not a setting
    "mpt": {"n_layers": 2, "n_heads": 4, "d_model": 64},
    "lfm2": MIXING["lfm2 with a convolution layer"][1],
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "num_experts": 2},
    "falcon_h1": {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_ssm": 64},
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"]},
    "minimax": {"layer_types": ["linear_attention", "full_attention"]},
}


# sliding-window layers (Mistral, Gemma 2), or positions that meet outside transformers' attention in transformers 5
# (a later version may move one to the attention interface, and then it may pack)
REFUSED = {"mistral", "gemma2", "recurrent_gemma", "mamba", "xglm", "gptj", "codegen", "bloom", "falcon", "mpt"}
REFUSED |= {"gpt_oss"}  # sliding-window layers, and attention sinks
REFUSED |= {"lfm2", "jamba", "falcon_h1", "qwen3_next", "minimax"}


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_every_decoder_packs_exactly_or_is_refused(model_type: str) -> None:
    """The kind, not the cases: on each architecture a packed pass either gives the padded pass's log-probs,
    entropies and gradients, with and without shared prompts, or is refused by name (sliding windows, positions
    that meet outside transformers' attention); never other numbers, and no decoder that packs is refused."""
    extra = ARCHITECTURES[model_type]
    settings = {key: value for key, value in {**SMALL, **extra}.items() if value is not None}
    config = AutoConfig.for_model(model_type, **settings)
    for key, value in list(vars(config).items()):  # no dropout or router noise: their draws differ between passes
        if any(word in key for word in ("dropout", "pdrop", "jitter")) and isinstance(value, float):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    sequences, prompt_lens = _grouped_sequences(0)
    padded = _loss_and_grads(model, sequences, prompt_lens, shared=False, pack=False)
    try:
        packed = [_loss_and_grads(model, sequences, prompt_lens, shared=s, pack=True) for s in (False, True)]
    except ConfigError as refused:
        assert model_type in REFUSED and "trainer.pack_sequences=false" in str(refused), str(refused)
        return
    for one in packed:
        assert_same_pass(padded, one)
