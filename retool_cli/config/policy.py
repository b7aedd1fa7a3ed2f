"""The policy: its model (weights, tokenizer, dtype, device, LoRA) and how it samples trajectories (`rollout`:
the engine, budgets, turns, tool calls, and the overlapped sampler's placement)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from retool_cli.config.fields import _check, doc


class Dtype(str, enum.Enum):  # a str too: loaders and vLLM take the name
    auto = "auto"  # model.dtype: bf16 on CUDA, fp32 on CPU; rollout.dtype: the policy's own (see the fields)
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class ModelConfig:
    """The policy model."""

    name_or_path: str = doc("tiny", 'HF id, local folder, or "tiny" (random-init model built offline)')
    dtype: Dtype = doc(
        Dtype.auto,
        "auto | float32 | bfloat16 | float16; auto = bf16 on CUDA, fp32 on CPU; except that `sft` and `train`"
        " on CUDA turn auto into fp32 weights under bf16 autocast (mixed precision: AdamW must update fp32 "
        "weights)",
    )
    device: str = doc("auto", "auto | cpu | cuda; auto = cuda when available")
    max_context_tokens: int | None = doc(
        None,
        "prompt + response budget of one trajectory (vLLM's max_model_len); None = rollout.max_prompt_tokens "
        "+ the largest response budget the command samples with (rollout's in train, the benchmark's in eval)",
    )
    accelerate: bool = doc(
        False,
        "the hand-written fast paths for Llama-family decoders: the hf engine's KV-cache decode loop "
        "(prepacked GEMMs and numba kernels on CPU, few large ops on CUDA; rollout/kv_decoder.py) and the "
        "training forward that computes each GRPO prompt once (rl/prefix_sharing.py; in `sft`, the traces' "
        "common system turn once and the LM head only at the model's tokens). Off: transformers' own forward "
        "everywhere (the plain path the fast ones are checked against). The smoke recipe turns it on.",
    )
    tokenizer_class: str | None = doc(
        None,
        "a transformers tokenizer class to load the tokenizer with instead of the one its files name (None: "
        "AutoTokenizer); PreTrainedTokenizerFast reads tokenizer.json as it is (a fix the tokenizer check at "
        "load suggests)",
    )
    chat_template: str | None = doc(
        None,
        "a Jinja chat template file used instead of the tokenizer's own (e.g. Qwen3-Coder's XML tool calls, "
        "or a template for a tokenizer without one); None = the tokenizer's",
    )
    lora_rank: int = doc(
        0,
        "LoRA rank (needs the `lora` extra, peft): train low-rank adapters instead of all weights (sft and "
        "train); checkpoints hold the merged weights (from_pretrained / vLLM load them) and the adapter (for "
        "resume). 0 = off (full fine-tuning)",
    )
    lora_alpha: float = doc(32.0, "adapter scale = lora_alpha / lora_rank")
    lora_dropout: float = doc(0.0, "dropout on the adapters' input")
    lora_target_modules: list[str] = doc(
        help="module names that get adapters (Llama-family names)",
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )

    def __post_init__(self) -> None:
        _check(self.lora_rank >= 0, "model.lora_rank", "must be >= 0 (0 = off)")
        _check(self.lora_alpha > 0, "model.lora_alpha", "must be > 0")
        _check(
            self.max_context_tokens is None or self.max_context_tokens >= 1,
            "model.max_context_tokens",
            "must be >= 1 (or null)",
        )
        _check(0 <= self.lora_dropout < 1, "model.lora_dropout", "must be in [0, 1)")
        _check(
            not self.lora_rank or bool(self.lora_target_modules),
            "model.lora_target_modules",
            "needs at least one module name when model.lora_rank > 0",
        )


class RolloutEngine(enum.Enum):
    hf = "hf"  # transformers generate loop (CPU or CUDA)
    vllm = "vllm"  # vLLM offline engine (optional extra)


class RolloutPlacement(enum.Enum):  # trainer.max_staleness > 0: where the sampler's engines run
    colocated = "colocated"  # threads of the trainer's process, on its devices and cores (rl/overlap.py)
    separate = "separate"  # processes of their own, weights sent by broadcast (rollout/engine_process.py)


# `async` is a Python keyword: the functional form gives the member that name (Hydra converts by name).
RolloutLoop = enum.Enum("RolloutLoop", [("auto", "auto"), ("async", "async"), ("turns", "turns")])


@dataclass
class RolloutConfig:
    """Sampling of trajectories with the agent loop (train, eval, filter-pass-rate)."""

    engine: RolloutEngine = doc(
        RolloutEngine.hf, "hf (transformers, CPU or CUDA) | vllm (vLLM's engine, CUDA or its CPU build)"
    )
    dtype: Dtype = doc(
        Dtype.auto,
        "Weights the engine generates with: auto = the policy's own (hf: shared with the trainer, nothing to "
        "copy); float32 | bfloat16 | float16 = a copy in that dtype, refreshed after each optimizer step "
        "(e.g. bfloat16 sampling next to an fp32 trainer, as vLLM-based recipes do; the trainer recomputes "
        "the logprobs it trains on in its own precision). vLLM: its dtype; auto = model.dtype, bfloat16 for "
        "auto.",
    )
    group_size: int = doc(8, "samples per question (GRPO group)")
    temperature: float = doc(1.0, "sampling temperature of training rollouts")
    top_p: float = doc(1.0, "nucleus sampling of training rollouts (1 = off)")
    top_k: int = doc(0, "top-k sampling of training rollouts (0 = off)")
    max_response_tokens: int = doc(1024, "all tokens after the prompt, tool output included")
    max_prompt_tokens: int = doc(
        1024,
        "the longest prompt (system prompt + question, templated) the budgets are sized for: "
        "model.max_context_tokens must hold it plus the response budget; `train` drops longer prompts "
        "(counted in the log, as verl's filter_overlong_prompts), `eval` refuses them",
    )
    max_turns: int = doc(6, "generation segments (assistant turns) per trajectory")
    max_code_calls: int = doc(4, "interpreter calls per trajectory")
    max_tokens_per_turn: int | None = doc(
        None,
        "new tokens of one generation segment; a segment that reaches it ends the trajectory as truncated. "
        "None = what is left of max_response_tokens (verl's multi-turn rollout), so one long reasoning "
        "segment fits",
    )
    max_tool_result_tokens: int = doc(512, "tokens of one interpreter result (head and tail kept)")
    error_tail_lines: int = doc(
        12, "of a failed call's error output (the traceback), the last lines the model reads (ToRL keeps 1)"
    )
    loop: RolloutLoop = doc(
        RolloutLoop.auto,
        "how trajectories are scheduled: async = each trajectory on its own (a turn is submitted when the "
        "trajectory is ready, its code runs as soon as the turn ends, the engine batches whatever is in flight); "
        "turns = every running trajectory generates a turn, then their code runs, then the next turn; auto = "
        "async with rollout.engine=vllm, turns with hf, with rollout.partial or with an engine spanning processes "
        "(README, Rollout loops: what each costs where). Either "
        "samples the same trajectories: a request's seed follows from (seed, step, question, sample, turn)",
    )
    overlap_sandbox: bool = doc(True, "rollout.loop=turns: run half the batch's code while the other half generates")
    partial: bool = doc(
        False,
        "partial rollouts, with trainer.max_staleness >= 1 (train): a trajectory samples its first "
        "rollout.partial_turns turns (and at most rollout.partial_tokens model tokens) with its batch's weights "
        "(version v(s) = s - 1 - k) and continues under the next version (at most the trainer's own) once it is "
        "published and the batch's other trajectories got that far; a tool call in flight finishes first, a turn cut "
        "at the token budget keeps its tokens. Which version samples which token is fixed by the config; each token "
        "records its version (rollout/staleness_*, rollout/partial_share). Fresher tokens for long trajectories, for "
        "a wait: a batch's tail starts only after that update (README, Overlapped training)",
    )
    partial_turns: int = doc(1, "rollout.partial: the turns each trajectory samples with its batch's own weights")
    partial_tokens: int | None = doc(
        None,
        "rollout.partial: also switch within a turn: the model tokens each trajectory samples with its batch's own "
        "weights at most (null: the turns alone decide). A turn cut there continues, its tokens kept, under the next "
        "version: for long single turns (a 16k-token reasoning turn)",
    )
    placement: RolloutPlacement = doc(
        RolloutPlacement.colocated,
        "with trainer.max_staleness >= 1, where the sampler's engines run: colocated = threads of the trainer's "
        "process, sharing its cores (vLLM: the process's one engine, each batch's weights loaded for its calls); "
        "separate = rollout.engine_processes processes of their own, each on "
        "rollout.engine_threads cores (the trainer keeps the rest), the weights sent to them by gloo broadcasts in "
        "buckets (time/weight_transfer_s). The same tokens either way (README, Overlapped training)",
    )
    engine_processes: int = doc(1, "rollout.placement=separate: engine processes; the batches in flight are dealt out")
    engine_threads: int = doc(
        1, "rollout.placement=separate: torch's CPU threads in each engine process (taken from the trainer's)"
    )
    engine_restarts: int = doc(
        2,
        "rollout.placement=separate: how many times a run restarts an engine process that died (its weights sent "
        "again, its request repeated: the same tokens) before it stops with an error",
    )
    weight_bucket_mb: float = doc(
        64.0, "rollout.placement=separate: the weights go to an engine process in broadcasts of about this size"
    )
    trajectory_timeout_s: float = doc(
        1800.0,
        "a trajectory still running this long after its batch started stops (stop reason `deadline`) and is "
        "left out of the loss as an infrastructure failure; 0 = no deadline. A run that hits it is no longer "
        "reproducible (which trajectories stop depends on the machine's speed)",
    )
    engine_timeout_s: float = doc(
        1800.0,
        "every engine call (a turn's batch, one step of the async loop) and weight sync must return within "
        "this, else the run stops with an error naming it (resume by rerunning); 0 = no limit",
    )
    max_sandbox_infra_error_rate: float = doc(
        0.2, "above this share of failed sandbox calls a batch stops with an error"
    )
    vllm_gpu_memory_utilization: float = doc(
        0.5,
        "vLLM only (rollout.engine=vllm): share of GPU memory for weights + KV cache (on CPU: of the "
        "machine's memory, unless vllm_kv_cache_gib sizes the KV cache)",
    )
    vllm_kv_cache_gib: float = doc(0.0, "vLLM only: KV cache size in GiB; 0 = from vllm_gpu_memory_utilization")
    vllm_tensor_parallel_size: int = doc(
        1,
        "vLLM only: GPUs one engine spans (a model one device cannot hold). In `train` the engine is colocated "
        "with the trainer (as verl's hybrid engine): each group of this many consecutive processes of a node "
        "runs one engine and rolls out one share of the questions, then trains on its own part of it; "
        "trainer.nproc must be a multiple of it. With trainer.max_staleness >= 1, colocated only (the span's "
        "calls in its first process's order: rollout/weight_slots.py, CallOrder)",
    )
    vllm_batch_invariant: bool = doc(
        False,
        "vLLM only: its batch-invariant kernels (VLLM_BATCH_INVARIANT=1, set before vLLM loads), so that a "
        "request's numbers do not depend on what else is in the batch: on GPUs the condition for rollout.loop="
        "async and turns to sample the same tokens, at some speed; without it they agree in distribution only",
    )
    vllm_enforce_eager: bool = doc(
        False,
        "vLLM only: run the model eagerly (no torch.compile, no CUDA graphs). Off by default: on GPUs both pay "
        "for themselves. vLLM 0.32's CPU build fails to reload its compile cache, so every engine start there "
        "compiles again (10-20 s for the tiny model) for 10-30% faster decoding: eager pays on short CPU runs",
    )
    vllm_enable_sleep_mode: bool = doc(
        True,
        "vLLM only: free its GPU memory while the trainer runs, where the platform has sleep mode (CUDA; not "
        "vLLM's CPU build, where this is ignored with a note)",
    )

    def __post_init__(self) -> None:
        _check(self.group_size >= 1, "rollout.group_size", "must be >= 1")
        _check(self.temperature >= 0, "rollout.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        _check(self.top_k >= 0, "rollout.top_k", "must be >= 0")
        for key in (
            "max_response_tokens",
            "max_prompt_tokens",
            "max_turns",
            "max_tool_result_tokens",
            "error_tail_lines",
            "partial_turns",
            "engine_processes",
            "engine_threads",
        ):
            _check(getattr(self, key) >= 1, f"rollout.{key}", "must be >= 1")
        for key in ("max_tokens_per_turn", "partial_tokens"):
            _check(getattr(self, key) is None or getattr(self, key) >= 1, f"rollout.{key}", "must be >= 1 (or null)")
        _check(self.partial or self.partial_tokens is None, "rollout.partial_tokens", "needs rollout.partial=true")
        _check(self.max_code_calls >= 0, "rollout.max_code_calls", "must be >= 0")
        _check(self.engine_restarts >= 0, "rollout.engine_restarts", "must be >= 0")
        _check(self.weight_bucket_mb > 0, "rollout.weight_bucket_mb", "must be > 0")
        _check(0 < self.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization", "must be in (0, 1]")
        _check(self.vllm_tensor_parallel_size >= 1, "rollout.vllm_tensor_parallel_size", "must be >= 1")
        _check(
            self.vllm_tensor_parallel_size == 1 or self.loop is not RolloutLoop["async"],
            "rollout.loop",
            "async cannot drive an engine spanning processes (rollout.vllm_tensor_parallel_size > 1): its processes "
            "must see the same batches; use turns or auto",
        )
        _check(
            self.vllm_kv_cache_gib >= 0,
            "rollout.vllm_kv_cache_gib",
            "must be >= 0 (0 = from the utilization)",
        )
        for key in ("trajectory_timeout_s", "engine_timeout_s"):
            _check(getattr(self, key) >= 0, f"rollout.{key}", "must be >= 0 (0 = no limit)")
        _check(
            0 <= self.max_sandbox_infra_error_rate <= 1,
            "rollout.max_sandbox_infra_error_rate",
            "must be in [0, 1]",
        )
