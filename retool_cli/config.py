"""Typed configuration: the single source of keys, types, defaults and cross-field checks.

Every subcommand composes the same `RetoolConfig` (so one recipe applies to all of them) from
`conf/<command>.yaml`, the group options under `conf/` and an optional `recipe=NAME` (`compose.py`: the
schema's registration and the order of recipe and command line). Hydra checks keys and types while
composing; `compose.to_config` then builds these dataclasses with `OmegaConf.to_object`, which runs each
`__post_init__` so cross-field mistakes fail before any work starts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any

from omegaconf import II

from retool_cli.errors import ConfigError


def doc(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None) -> Any:
    """A config field with its documentation, declared together: `retool COMMAND --help` shows `help` (help.py).
    `factory` makes a mutable default (a list, a dict, a nested section) per instance."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


# --------------------------------------------------------------------------- data


class DataSource(enum.Enum):
    synthetic = "synthetic"  # built-in offline generator (retool_cli/data/synthetic.py)
    dapo_math_17k = "dapo_math_17k"  # BytedTsinghua-SIA/DAPO-Math-17k layout (prompt messages + reward_model)
    aime24 = "aime24"  # HuggingFaceH4/aime_2024
    aime25 = "aime25"  # yentinglin/aime_2025
    math500 = "math500"  # HuggingFaceH4/MATH-500
    file = "file"  # any local JSONL / JSON / parquet with a column mapping


@dataclass
class ColumnsConfig:
    """Where the fields of a MathExample live in a source row. Dotted paths reach into nested
    values (`reward_model.ground_truth`), integers index lists (`prompt.0.content`)."""

    question: str = doc("problem", "the column (or dotted path) holding the problem text")
    answer: str = doc("answer", "the column holding the reference answer")
    id: str | None = doc(
        None, "the column holding a row id; None: ids are made from the source name and the row number"
    )


@dataclass
class SyntheticConfig:
    """The built-in task: problems where running code beats mental arithmetic."""

    num_examples: int = doc(2000, "problems generated before dedupe and the dev split")
    difficulty: int = doc(1, "1 (4-digit x 3-digit products, small exponents) .. 5 (much larger numbers)")
    kinds: list[str] = doc(
        help="problem kinds to mix; see retool_cli/data/synthetic.py for the full list",
        factory=lambda: ["product", "modpow", "digit_sum_power", "divisor_count"],
    )


@dataclass
class DataConfig:
    """A dataset source and how `retool prepare` turns it into train.jsonl / dev.jsonl."""

    source: DataSource = doc(DataSource.synthetic, "which reader and cleaning rules (see DataSource)")
    name: str = doc("synthetic", "the data_source tag written on every example")
    path: str | None = doc(None, "local file or folder; for hub sources it replaces the download")
    hub_id: str | None = doc(None, "dataset id on the Hugging Face hub (hub sources only)")
    revision: str = doc("main", "hub revision (branch, tag or commit); pin a commit for reproducible runs")
    split: str = doc("train", "hub split to read")
    columns: ColumnsConfig = doc(help="where the fields live in a source row", factory=ColumnsConfig)
    strip_dapo_template: bool = doc(False, 'remove DAPO\'s "Solve ... Answer: $Answer" prefix and suffix')
    dev_size: int = doc(0, "examples split off into dev.jsonl (by seed) after dedupe")
    max_examples: int | None = doc(None, "keep at most this many training examples (after the split)")
    synthetic: SyntheticConfig = doc(help="the built-in task (source=synthetic)", factory=SyntheticConfig)
    allow_unreadable_answers: bool = doc(
        False,
        "`retool prepare`: keep examples whose reference answer the judge cannot match even to itself (an empty "
        "box, a bare \\text{}); they score 0 whatever the answer. Off: prepare refuses the data, naming them",
    )

    def __post_init__(self) -> None:
        _check(self.dev_size >= 0, "data.dev_size", f"must be >= 0, got {self.dev_size}")
        _check(self.max_examples is None or self.max_examples > 0, "data.max_examples", "must be > 0")
        if self.source is DataSource.file:
            _check(bool(self.path), "data.path", "is required when data.source=file")
        _check(1 <= self.synthetic.difficulty <= 5, "data.synthetic.difficulty", "must be in 1..5")
        _check(self.synthetic.num_examples > 0, "data.synthetic.num_examples", "must be > 0")


# --------------------------------------------------------------------------- model, rollout, protocol, training


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


class Schedule(str, enum.Enum):  # rl/optim.py:build_scheduler
    constant = "constant"
    cosine = "cosine"  # cosine decay to 0 after the warm-up


class KLEstimator(str, enum.Enum):  # rl/algorithms.py:kl_penalty
    k1 = "k1"
    k3 = "k3"


class FsdpSharding(enum.Enum):
    full = "full"  # shard over every process of every node
    hybrid = "hybrid"  # HSDP: shard within a node, replicate across nodes


class LossAgg(str, enum.Enum):
    token_mean = "token_mean"  # mean over all model tokens of the batch (DAPO)
    seq_mean_token_mean = "seq_mean_token_mean"  # mean per sequence, then over sequences (GRPO)
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"  # token sum / fixed length (Dr.GRPO)


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
        "async with rollout.engine=vllm, turns with hf (README, Rollout loops: what each costs where). Either "
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


class ProtocolName(enum.Enum):
    retool_tags = "retool_tags"  # <code>...</code> then <interpreter>...</interpreter>, in one assistant turn
    chat_tool = "chat_tool"  # native tool calls through the tokenizer's chat template
    none = "none"  # text only: the baseline without the interpreter


class TemplatePolicy(enum.Enum):
    """protocol=chat_tool with a chat template that is not append-only (rendering a tool result rewrites the
    turn before it, as Qwen3's does with <think> blocks)."""

    append = "append"  # continue from the sampled tokens, render only the new tool-result segment (warned once)
    refuse = "refuse"  # a start-up error


DEFAULT_SYSTEM_PROMPT = (
    "Solve the math problem. You may run Python by writing a block\n<code>\n```python\n...\n```\n</code>\n"
    "and you will see what it prints inside <interpreter>...</interpreter>. Each block runs in a fresh "
    "interpreter (nothing carries over between blocks) with a short time limit, and only printed output "
    "is shown, so print the values you need. Put the final answer in \\boxed{}."
)


@dataclass
class ProtocolConfig:
    """How model and interpreter exchange code and results (retool_cli/env/protocol.py)."""

    name: ProtocolName = doc(ProtocolName.retool_tags, "retool_tags | chat_tool | none (text only)")
    system_prompt: str = doc(
        DEFAULT_SYSTEM_PROMPT, "protocol=retool_tags: the system prompt (how to call the interpreter and answer)"
    )
    chat_tool_system_prompt: str = doc(
        "Solve the math problem. You can call the code_interpreter tool to run Python; each call runs in a fresh "
        "interpreter with a short time limit and returns only what the code prints. "
        "Put the final answer in \\boxed{}.",
        "protocol=chat_tool: the system prompt (the tool itself is described by the chat template's tools section)",
    )
    template_policy: TemplatePolicy = doc(
        TemplatePolicy.append,
        "chat_tool with a template that is not append-only (Qwen3): append | refuse (see TemplatePolicy)",
    )
    text_only_system_prompt: str = doc(
        "Solve the math problem step by step. Put the final answer in \\boxed{}.",
        "protocol=none: the system prompt of the text-only baseline",
    )
    override_checkpoint: bool = doc(
        False,
        "with ckpt / trainer.init_from: run under the protocol this config composes even where the checkpoint "
        "was trained with another (e.g. a text-only baseline of a tool-trained model). Off: a protocol typed on "
        "the command line that contradicts the checkpoint is refused, and an untyped one is the checkpoint's",
    )


class Advantage(str, enum.Enum):  # a str too: the tensor functions take the name or the member
    grpo = "grpo"  # (r - group mean) / (group std + 1e-4)
    dr_grpo = "dr_grpo"  # r - group mean
    rloo = "rloo"  # r - mean of the other samples of the group


class RolloutCorrection(str, enum.Enum):  # rl/algorithms.py:rollout_correction (weights pi_old / pi_sampler)
    none = "none"  # measure the sampler-trainer gap (train/mismatch_*), correct nothing
    token_tis = "token_tis"  # truncated importance sampling per token: min(rho_t, cap)
    seq_tis = "seq_tis"  # truncated importance sampling per sequence: min(prod rho_t, cap)
    token_mask = "token_mask"  # masked importance sampling: rho_t inside the bounds, 0 outside
    seq_mask = "seq_mask"  # a sequence whose geometric-mean ratio leaves the bounds gets no gradient


@dataclass
class TrainerConfig:
    """Optimisation of `retool train` (RL) and `retool sft`; what each step does is in retool_cli/rl/step.py."""

    lr: float = doc(1e-6, "AdamW learning rate (the paper's 1e-6 at 7B-32B; the tiny smoke model takes 1e-4)")
    weight_decay: float = doc(0.0, "AdamW weight decay")
    warmup_steps: int = doc(0, "linear warm-up steps of the learning rate")
    schedule: Schedule = doc(Schedule.constant, "constant | cosine (after warm-up)")
    grad_clip: float = doc(1.0, "max global gradient norm")
    total_steps: int = doc(100, "optimizer steps of the run (RL: one rollout batch each)")
    questions_per_step: int = doc(32, "distinct questions per RL step (x rollout.group_size trajectories)")
    epochs_per_batch: int = doc(1, "passes over each rollout batch (old logprobs recomputed once before them)")
    mini_batches: int = doc(1, "optimizer steps per epoch over the rollout batch")
    micro_batch_tokens: int = doc(
        16384,
        "token budget of one forward/backward: (longest) x (sequences) of a right-padded micro-batch (sorted by "
        "length), or the tokens of one packed row with pack_sequences",
    )
    pack_sequences: bool = doc(
        False,
        "RL passes without padding: each micro-batch's sequences end to end in one row, attention kept within "
        "each (rl/packing.py); the same log-probs and gradients to fp32 rounding. With several processes each "
        "mini-batch's samples are dealt out so that every process trains on about the same tokens",
    )
    advantage: Advantage = doc(Advantage.grpo, "grpo | dr_grpo | rloo (retool_cli/rl/algorithms.py)")
    clip_low: float = doc(0.2, "PPO ratio clip below 1")
    clip_high: float = doc(0.28, "PPO ratio clip above 1 (DAPO clip-higher)")
    dual_clip: float | None = doc(
        None, "bound the loss of negative advantages at dual_clip x |A| (e.g. 3.0); None = off"
    )
    loss_agg: LossAgg = doc(LossAgg.token_mean, "how token losses become the batch loss (see LossAgg)")
    kl_coef: float = doc(0.0, "KL to the frozen initial policy (0 = off, no reference model kept)")
    kl_estimator: KLEstimator = doc(KLEstimator.k3, "the KL penalty's estimator: k1 | k3 (rl/algorithms.py:kl_penalty)")
    entropy_coef: float = doc(0.0, "entropy bonus (0 = off)")
    rollout_correction: RolloutCorrection = doc(
        RolloutCorrection.none,
        "none | token_tis | seq_tis | token_mask | seq_mask: weigh each token's loss by the trainer's policy "
        "before the update over the sampler's (the engine's logprobs), truncated or masked (see "
        "RolloutCorrection; README, Sampler-trainer mismatch). The gap is measured either way (train/mismatch_*)",
    )
    rollout_correction_cap: float = doc(2.0, "token_tis / seq_tis: the largest weight (verl's threshold 2.0)")
    rollout_correction_bounds: list[float] = doc(
        help="token_mask / seq_mask: [low, high] of the ratio (token) or its geometric mean (sequence) a token "
        "keeps its gradient inside; also what train/mismatch_corrected_share counts with none",
        factory=lambda: [0.5, 2.0],
    )
    filter_void_turns: bool = doc(
        False,
        "SimpleTIR: no gradient from a trajectory with a void turn (a turn that neither makes a well-formed "
        "call nor answers in \\boxed{}); counted in train/void_turn_filtered either way",
    )
    roc_oversample: int = doc(
        1,
        "rStar2-Agent's GRPO-RoC: sample this many times rollout.group_size per question, keep group_size: wrong "
        "ones uniformly at random, the correct ones with the fewest tool errors and format problems (1 = off)",
    )
    mask_truncated: bool = doc(True, "DAPO overlong filtering: no gradient from length-truncated trajectories")
    dynamic_sampling: bool = doc(False, "DAPO: drop all-equal-reward groups and sample more questions")
    max_sampling_rounds: int = doc(3, "cap on extra rollout batches per step with dynamic sampling")
    max_staleness: int = doc(
        0,
        "k: sampling of later steps overlaps the update, and every token of a step was sampled by weights at most "
        "k updates old (step s by version max(0, s - 1 - k), fixed by the config alone: rl/overlap.py; README, "
        "Overlapped training); 0 = on-policy, sampling and update take turns. Pair with rollout_correction="
        "token_tis for AReaL's decoupled loss. Any number of trainer processes (each samples its share), full "
        "fine-tuning or LoRA",
    )
    save_every: int = doc(50, "checkpoint every N steps (and at the end)")
    keep_last: int = doc(2, "checkpoints kept on disk")
    save_on_signal: bool = doc(
        False,
        "on a stop signal (SIGTERM, Ctrl-C, SIGUSR1) also checkpoint the last complete step, so a preempted run "
        "loses nothing finished (train and sft; README, Signals and preemption)",
    )
    stop_timeout_s: float = doc(
        20.0,
        "after a stop signal, the time a command has to stop cleanly (finish or abandon its step, save with "
        "save_on_signal); then all its processes are killed (completed checkpoints are kept). Every command",
    )
    keep_rollouts: int = doc(
        4,
        "trajectories of each step written to rollouts.jsonl for `retool report` (half right, half wrong "
        "where the step has both; seeded); 0 keeps none. Bounded: steps x this many rows.",
    )
    resume: bool = doc(
        True, "continue the latest checkpoint of an unfinished run of this config; false: start over in the folder"
    )
    eval_every: int = doc(0, "evaluate on the dev split every N steps with the benchmark's sampling (0 = off)")
    eval_problems: int = doc(64, "dev problems of a periodic evaluation")
    nproc: int = doc(
        1,
        "processes per node (one per GPU); > 1 (or nnodes > 1) relaunches through torchrun, rank 0 writes the outputs",
    )
    fsdp: bool = doc(
        False,
        "with nproc > 1: shard parameters, gradients and optimizer state (FSDP2) instead of a whole copy per "
        "process; rollouts all-gather the weights once per step",
    )
    fsdp_sharding: FsdpSharding = doc(
        FsdpSharding.full,
        "trainer.fsdp over several nodes: full = shard over every process of every node | hybrid = HSDP, shard "
        "within a node and replicate across nodes (gradients cross nodes once per step; docs/scaling.md)",
    )
    nnodes: int = doc(
        1,
        "nodes of the run: each runs `retool train` with its trainer.node_rank (by hand, or `srun`, which "
        "fills in what the command line does not type), each starting trainer.nproc processes",
    )
    node_rank: int = doc(0, "this node's index, 0 .. nnodes - 1; node 0 hosts the rendezvous and writes the run folder")
    master_addr: str = doc("127.0.0.1", "address of node 0, which every node can reach (Slurm: the first node)")
    master_port: int = doc(29500, "port of the rendezvous on node 0 (Slurm: 20000 + job id mod 20000)")
    collective_timeout_s: float = doc(
        3600.0,
        "nodes joining the run, and every collective between the processes, must complete within this: a dead "
        "or stuck process stops the others with an error instead of a hang. Larger than the longest wait of "
        "a process for the others (a step's rollouts on the slowest process)",
    )
    gradient_checkpointing: bool = doc(False, "recompute activations in backward (less memory, ~30% more time)")
    bf16_autocast: bool = doc(
        False,
        "mixed precision: forward passes under torch.autocast(bfloat16) over fp32 weights (keep "
        "model.dtype=float32); CUDA, or CPUs with AVX512-BF16/AMX. Also used by `retool sft`. "
        "model.dtype=auto on CUDA turns it on (see ModelConfig.dtype).",
    )
    tensorboard: bool = doc(False, "also log to RUN/tensorboard (needs the tensorboard extra)")
    wandb_project: str | None = doc(None, "also log to this W&B project (needs the wandb extra)")
    train_file: str | None = doc(None, "a prepared train.jsonl; None = build from the `data` section in memory")
    init_from: str | None = doc(
        None,
        "start from this checkpoint (e.g. the SFT run folder): its weights, tokenizer, chat template and protocol "
        "(a typed model.name_or_path or protocol that contradicts it is refused); None = model.name_or_path",
    )
    allow_no_learning: bool = doc(
        False,
        "accept a run that cannot learn: rollout.group_size=1 or rollout.temperature=0 make every group's "
        "rewards equal, so every advantage is 0 (checks that compare engines on greedy rollouts use it)",
    )

    def __post_init__(self) -> None:
        _check(self.lr > 0, "trainer.lr", "must be > 0")
        for key in ("weight_decay", "warmup_steps", "kl_coef", "max_sampling_rounds", "eval_every", "max_staleness"):
            _check(getattr(self, key) >= 0, f"trainer.{key}", f"must be >= 0, got {getattr(self, key)}")
        _check(
            self.grad_clip > 0, "trainer.grad_clip", f"must be > 0 (the largest gradient norm), got {self.grad_clip}"
        )
        _check(
            0 <= self.clip_low < 1,
            "trainer.clip_low",
            f"must be in [0, 1) (the ratio's floor is 1 - clip_low), got {self.clip_low}",
        )
        _check(
            self.clip_high >= 0,
            "trainer.clip_high",
            f"must be >= 0 (the ratio's ceiling is 1 + clip_high), got {self.clip_high}",
        )
        _check(
            self.dual_clip is None or self.dual_clip > 1,
            "trainer.dual_clip",
            f"must be > 1 (or null), got {self.dual_clip}",
        )
        _check(self.eval_problems >= 1, "trainer.eval_problems", "must be >= 1")
        _check(self.total_steps >= 1, "trainer.total_steps", "must be >= 1")
        _check(self.questions_per_step >= 1, "trainer.questions_per_step", "must be >= 1")
        _check(self.stop_timeout_s > 0, "trainer.stop_timeout_s", "must be > 0")
        for key in ("epochs_per_batch", "mini_batches", "micro_batch_tokens", "save_every", "keep_last"):
            _check(getattr(self, key) >= 1, f"trainer.{key}", "must be >= 1")
        _check(self.keep_rollouts >= 0, "trainer.keep_rollouts", "must be >= 0")
        _check(self.rollout_correction_cap >= 1, "trainer.rollout_correction_cap", "must be >= 1")
        bounds = list(self.rollout_correction_bounds)
        _check(
            len(bounds) == 2 and 0 <= bounds[0] <= 1 <= bounds[1],
            "trainer.rollout_correction_bounds",
            f"must be [low, high] with 0 <= low <= 1 <= high, got {bounds}",
        )
        _check(self.roc_oversample >= 1, "trainer.roc_oversample", "must be >= 1 (1 = off)")
        _check(self.nproc >= 1, "trainer.nproc", "must be >= 1")
        _check(self.nnodes >= 1, "trainer.nnodes", "must be >= 1")
        _check(0 <= self.node_rank < self.nnodes, "trainer.node_rank", f"must be in [0, trainer.nnodes={self.nnodes})")
        _check(1 <= self.master_port <= 65535, "trainer.master_port", "must be a port (1-65535)")
        _check(self.collective_timeout_s > 0, "trainer.collective_timeout_s", "must be > 0")


@dataclass
class SFTConfig:
    """Cold-start fine-tuning on code-interleaved traces (`retool sft`)."""

    steps: int = doc(1000, "optimizer steps")
    lr: float = doc(
        2e-3,
        "AdamW learning rate. The default suits the tiny smoke model; a real model wants ~1e-5 (verl's ReTool "
        "cold start; the 7B recipe's sft section), and sft warns when a real model runs with this one",
    )
    batch_size: int = doc(64, "traces per optimizer step")
    max_length: int | None = doc(
        None,
        "traces longer than this many tokens are left out (counted in the log); None keeps all (verl's ReTool "
        "cold start: 16384)",
    )
    warmup_steps: int = doc(50, "linear warm-up steps")
    schedule: Schedule = doc(Schedule.cosine, "constant | cosine (after warm-up)")
    weight_decay: float = doc(0.0, "AdamW weight decay")
    pack_sequences: bool = doc(
        False,
        "SFT passes without padding: each micro-batch's traces end to end in one row of at most "
        "trainer.micro_batch_tokens tokens (rl/packing.py)",
    )
    code_fraction: float = doc(0.5, "synthesised traces: share that calls the interpreter (the rest answer directly)")
    traces_file: str | None = doc(
        None,
        "traces with a `messages` column: a local .jsonl / .json / .parquet file or `datasets` folder, or a "
        "hub dataset id (e.g. JoeYing/ReTool-SFT); chat messages with tool calls, or ReTool-SFT's tagged "
        "responses (data/traces.py). None = synthesise traces for the synthetic task",
    )
    traces_revision: str = doc("main", "hub revision of traces_file (branch, tag or commit); pin a commit to reproduce")
    traces_split: str = doc("train", "hub split of traces_file")
    log_every: int = doc(25, "steps between lines of metrics.jsonl and the log")
    save_every: int = doc(100, "checkpoint every N steps (and at the end; the latest kept): a killed run loses < N")
    resume: bool = doc(
        True, "continue the latest checkpoint of an unfinished run of this config; false: start over in the folder"
    )

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "sft.steps", "must be >= 1")
        _check(self.lr > 0, "sft.lr", f"must be > 0, got {self.lr}")
        _check(self.log_every >= 1, "sft.log_every", f"must be >= 1, got {self.log_every}")
        _check(self.max_length is None or self.max_length >= 1, "sft.max_length", "must be >= 1 (or null)")
        for key in ("warmup_steps", "weight_decay"):
            _check(getattr(self, key) >= 0, f"sft.{key}", f"must be >= 0, got {getattr(self, key)}")
        _check(self.save_every >= 1, "sft.save_every", "must be >= 1")
        _check(self.batch_size >= 1, "sft.batch_size", "must be >= 1")
        _check(0 <= self.code_fraction <= 1, "sft.code_fraction", "must be in [0, 1]")


# --------------------------------------------------------------------------- sandbox


class Isolation(enum.Enum):
    auto = "auto"  # bwrap when it works here, else rlimits (with a loud warning)
    bwrap = "bwrap"  # bubblewrap jail: no network, private /tmp, fresh /proc, read-only system, dropped uid
    rlimits = "rlimits"  # resource limits, scrubbed environment and scratch folder only (weaker)


@dataclass
class SandboxConfig:
    """The code interpreter (retool_cli/env/sandbox.py). Limits apply to each call."""

    isolation: Isolation = doc(Isolation.auto, "auto | bwrap | rlimits (see Isolation)")
    workers: int = doc(2, "warm worker processes = snippets run at the same time")
    timeout_s: float = doc(10.0, "wall-clock limit; the call's whole process tree is killed after it")
    cpu_time_s: int = doc(10, "CPU-seconds limit (RLIMIT_CPU)")
    memory_mb: int = doc(1024, "address space a snippet may add on top of the warm interpreter (RLIMIT_AS)")
    max_processes: int = doc(32, "processes and threads of the snippet's uid (RLIMIT_NPROC; needs root)")
    max_file_mb: int = doc(16, "largest file a snippet may write (RLIMIT_FSIZE)")
    scratch_mb: int = doc(64, "total size of the private /tmp (bwrap only)")
    max_open_files: int = doc(64, "open files a snippet may hold (RLIMIT_NOFILE)")
    max_output_bytes: int = doc(65536, "stdout + stderr kept; a call printing more is killed there")
    seed: int = doc(0, "random and numpy.random are seeded with this before every call")
    cache: bool = doc(
        True,
        "reuse the result of code already run in this run (the samples of a group often send the same code): "
        "keyed by the code and everything that can change its output (limits, seed, preloaded modules and "
        "their versions, the interpreter); README, The interpreter cache: what it guarantees",
    )
    cache_max_mib: int = doc(
        256,
        "memory the cache's results may take in the trainer process (each at most max_output_bytes of output); "
        "the least recently used are dropped beyond it",
    )
    preload: list[str] = doc(
        help="imported once per worker, so snippets import them for free (and, under rlimits as root, at all)",
        factory=lambda: [
            "math",
            "cmath",
            "fractions",
            "decimal",
            "itertools",
            "functools",
            "collections",
            "statistics",
            "random",
            "re",
            "string",
            "heapq",
            "bisect",
            "numpy",
            "sympy",
        ],
    )
    warmup: str = doc(
        "import sympy as sp\nx, y = sp.symbols('x y')\nsp.factor(x**4 - 1); sp.expand((x + y)**3)\n"
        "sp.solve([x + y - 2, x - y], [x, y]); sp.simplify(sp.sin(x)**2 + sp.cos(x)**2)\n"
        "sp.integrate(x * sp.exp(x), x); sp.Rational(1, 3) + 1; sp.isprime(97); sp.factorint(360)\n"
        "sp.nsimplify(0.5); sp.N(sp.pi, 20); sp.Matrix([[1, 2], [3, 4]]).det(); sp.binomial(10, 3)",
        "run once in each worker before it forks: fills sympy's lazy imports and caches for every child",
    )
    uid_base: int = doc(
        61000,
        "when run as root: snippets run as uids from uid_base up, never as root; each sandbox (each worker of "
        "each process of each run on the machine) claims uids no other holds (lock files in /run/lock)",
    )
    start_timeout_s: float = doc(120.0, "a worker that is not ready by then is an infrastructure error")

    def __post_init__(self) -> None:
        _check(self.workers >= 1, "sandbox.workers", "must be >= 1")
        _check(self.timeout_s > 0, "sandbox.timeout_s", "must be > 0")
        for key in (
            "cpu_time_s",
            "memory_mb",
            "max_processes",
            "max_file_mb",
            "scratch_mb",
            "max_open_files",
            "cache_max_mib",
        ):
            _check(getattr(self, key) >= 1, f"sandbox.{key}", "must be >= 1")
        _check(self.max_output_bytes >= 1024, "sandbox.max_output_bytes", "must be >= 1024")
        _check(self.start_timeout_s > 0, "sandbox.start_timeout_s", "must be > 0")


# --------------------------------------------------------------------------- reward


class RewardFunction(enum.Enum):
    correctness = "correctness"  # +1 if the final boxed answer is equivalent to the reference, else -1
    dapo_strict = "dapo_strict"  # verl's DAPO strict-box exact-string rule (for parity experiments)


class RewardControl(enum.Enum):
    """A control run: is the gain from the reward's link to correctness? (rl/algorithms.py:shuffled_rewards)"""

    none = "none"  # train on each trajectory's own reward
    shuffled = "shuffled"  # each trajectory's reward replaced by another's of the same batch (distribution kept)


@dataclass
class RewardConfig:
    """The reward of a trajectory (retool_cli/env/reward.py); eval uses the same judge."""

    function: RewardFunction = doc(RewardFunction.correctness, "correctness | dapo_strict (see RewardFunction)")
    answer_window_chars: int = doc(300, "the boxed answer must start within the final text's last N characters")
    judge_timeout_s: float = doc(5.0, "hard bound per math-verify check; a timed-out pair counts as wrong")
    judge_workers: int = doc(2, "math-verify worker processes")
    format_weight: float = doc(0.0, "added when a boxed answer is present (0 = off)")
    overlong_buffer_tokens: int = doc(0, "DAPO soft overlong penalty over the last N tokens (0 = off)")
    overlong_penalty_factor: float = doc(1.0, "the penalty at the full length")
    max_response_tokens: int = doc(II("rollout.max_response_tokens"), "where the overlong penalty is full")
    control: RewardControl = doc(
        RewardControl.none,
        "train: none | shuffled (a control: the rewards of each rollout round permuted before the advantages,"
        " so their distribution stays and their link to correctness goes; the logged accuracy is still the "
        "real one)",
    )

    def __post_init__(self) -> None:
        _check(self.answer_window_chars > 0, "reward.answer_window_chars", "must be > 0")
        _check(self.judge_timeout_s > 0, "reward.judge_timeout_s", "must be > 0")
        _check(self.judge_workers >= 1, "reward.judge_workers", "must be >= 1")
        _check(self.overlong_penalty_factor >= 0, "reward.overlong_penalty_factor", "must be >= 0")
        _check(
            # (the default factory builds this with the unresolved interpolation; checked once resolved)
            not isinstance(self.max_response_tokens, int)
            or 0 <= self.overlong_buffer_tokens < self.max_response_tokens,
            "reward.overlong_buffer_tokens",
            f"must be in [0, max_response_tokens={self.max_response_tokens})",
        )


# --------------------------------------------------------------------------- evaluation


class SplitPart(enum.Enum):
    all = "all"  # every problem of the source
    dev = "dev"  # only the dev split that `retool prepare` makes with the same data settings and seed


@dataclass
class BenchmarkConfig:
    """An evaluation set and its protocol: samples per problem and sampling settings (as in open-r1)."""

    name: str = doc("smoke", "the benchmark's name in reports (the option's file sets it)")
    data: DataConfig | None = doc(None, "where the problems come from; None = the run's own `data` section")
    part: SplitPart = doc(SplitPart.all, "all | dev (the dev split of the data, as `retool prepare` makes it)")
    n_samples: int = doc(4, "samples per problem (AIME 64, MATH-500 4)")
    temperature: float = doc(0.6, "sampling temperature (open-r1: 0.6)")
    top_p: float = doc(0.95, "nucleus sampling (open-r1: 0.95)")
    max_response_tokens: int = doc(8192, "the token budget of one trajectory, tool output included")
    max_problems: int | None = doc(None, "evaluate only the first N problems (quick checks)")

    def __post_init__(self) -> None:
        _check(self.n_samples >= 1, "benchmark.n_samples", "must be >= 1")
        _check(self.temperature >= 0, "benchmark.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, "benchmark.top_p", "must be in (0, 1]")
        _check(self.max_response_tokens >= 1, "benchmark.max_response_tokens", "must be >= 1")
        _check(self.max_problems is None or self.max_problems >= 1, "benchmark.max_problems", "must be >= 1")


@dataclass
class EvalConfig:
    """How `retool eval` runs (what it measures is `benchmark`)."""

    questions_per_batch: int = doc(8, "problems per rollout batch (x benchmark.n_samples trajectories)")
    resume: bool = doc(True, "continue an unfinished run of the identical config instead of starting over")
    bootstrap: int = doc(2000, "resamples for the 95% interval")

    def __post_init__(self) -> None:
        _check(self.questions_per_batch >= 1, "eval.questions_per_batch", "must be >= 1")
        _check(self.bootstrap >= 100, "eval.bootstrap", "must be >= 100")


# --------------------------------------------------------------------------- data hygiene


class OverlapRule(str, enum.Enum):  # data/decontam.py
    coverage = "coverage"  # share of the benchmark problem's n-grams found in the example (ignores boilerplate)
    any = "any"  # open-r1's rule: one shared n-gram


@dataclass
class DecontamConfig:
    """`retool decontaminate`: drop training rows that overlap evaluation benchmarks (retool_cli/data/decontam.py)."""

    input: str | None = doc(None, "a MathExample JSONL to clean; None = the train split of the `data` section")
    benchmarks: list[str] = doc(
        help="benchmarks to check against (options of conf/benchmark)",
        factory=lambda: ["aime24", "aime25", "math500"],
    )
    benchmark_paths: dict[str, str | None] = doc(
        help="NAME -> a local file used instead of the hub (None: the hub)",
        factory=lambda: {"aime24": None, "aime25": None, "math500": None},
    )
    rule: OverlapRule = doc(
        OverlapRule.coverage, "coverage (default: ignores shared boilerplate) | any (open-r1: one shared n-gram)"
    )
    n: int = doc(8, "word n-gram size of the `any` rule and of the shared-n-gram count in the report")
    coverage_n: int = doc(3, "word n-gram size of the coverage rule (small: edits break long n-grams)")
    threshold: float = doc(
        0.25,
        "coverage rule: a row is flagged when this share of a benchmark item's n-grams is found in it and the"
        " row's numbers are in the item (see text_only_threshold)",
    )
    text_only_threshold: float = doc(
        0.5, "coverage rule: the share of the item's n-grams that flags a row whatever the numbers"
    )
    min_shared: int = doc(3, "coverage rule: fewer shared n-grams never flag (one common phrase is not a copy)")
    word_threshold: float = doc(
        0.7,
        "coverage rule, a row or item without numbers: `threshold` of the item's n-grams flag when this "
        "(weighted) share of the item's distinct words is in the row too (a reworded copy keeps its words; "
        "see data/decontam.py)",
    )
    latex_folding: bool = doc(True, "drop LaTeX markup ($, braces, \\frac, \\left ...) before comparing")
    punctuation_folding: bool = doc(True, "drop punctuation before comparing")

    def __post_init__(self) -> None:
        _check(self.n >= 1, "decontam.n", "must be >= 1 (an n-gram size)")
        _check(self.coverage_n >= 1, "decontam.coverage_n", "must be >= 1 (an n-gram size)")
        _check(0 < self.threshold <= 1, "decontam.threshold", "must be in (0, 1]")
        _check(0 < self.word_threshold <= 1, "decontam.word_threshold", "must be in (0, 1]")
        _check(0 < self.text_only_threshold <= 1, "decontam.text_only_threshold", "must be in (0, 1]")
        _check(self.min_shared >= 1, "decontam.min_shared", "must be >= 1")
        _check(bool(self.benchmarks), "decontam.benchmarks", "needs at least one benchmark")


@dataclass
class ShardConfig:
    index: int = doc(0, "this job's shard")
    count: int = doc(1, "shards in all (e.g. -m shard.index=0,1,2,3 shard.count=4 with the Slurm launcher)")

    def __post_init__(self) -> None:
        _check(self.count >= 1, "shard.count", f"must be >= 1, got {self.count}")
        _check(
            0 <= self.index < self.count, "shard.index", f"must be in [0, shard.count={self.count}), got {self.index}"
        )


@dataclass
class PassRateConfig:
    """`retool filter-pass-rate`: keep problems the current policy solves sometimes (commands/filter_pass_rate.py)."""

    input: str | None = doc(None, "a MathExample JSONL; None = the train split of the `data` section")
    n_samples: int = doc(8, "samples per problem, through the training agent loop, protocol, tools and reward")
    low: float = doc(0.0, "keep problems with low < pass rate < high (open-r1's DAPO recipe: 0.1, 0.6)")
    high: float = doc(1.0, "keep problems with pass rate < high (see low)")

    def __post_init__(self) -> None:
        _check(self.n_samples >= 1, "filter.n_samples", "must be >= 1")
        _check(0 <= self.low <= 1, "filter.low", f"must be in [0, 1], got {self.low}")
        _check(0 <= self.high <= 1, "filter.high", f"must be in [0, 1], got {self.high}")
        _check(self.low < self.high, "filter.low", f"{self.low} must be below filter.high={self.high}")


# --------------------------------------------------------------------------- root


@dataclass
class RetoolConfig:
    """The composed config of every subcommand."""

    command: str = doc("prepare", "set by conf/<command>.yaml; names the output folder")
    seed: int = doc(0, "seeds shuffles, splits, generators and sampling")
    data: DataConfig = doc(
        help="the training data: its source, cleaning and dev split (`retool prepare`; conf/data)",
        factory=DataConfig,
    )
    model: ModelConfig = doc(help="the policy model: weights, tokenizer, dtype, device, LoRA", factory=ModelConfig)
    rollout: RolloutConfig = doc(
        help="sampling trajectories: the engine, budgets, turns and tool calls (conf/rollout)",
        factory=RolloutConfig,
    )
    trainer: TrainerConfig = doc(
        help="optimisation of `retool train` (RL; some keys also `retool sft`)",
        factory=TrainerConfig,
    )
    sft: SFTConfig = doc(help="cold-start fine-tuning (`retool sft`)", factory=SFTConfig)
    protocol: ProtocolConfig = doc(
        help="how the model calls the interpreter and sees its output (conf/protocol)",
        factory=ProtocolConfig,
    )
    sandbox: SandboxConfig = doc(help="the code interpreter's isolation and limits", factory=SandboxConfig)
    reward: RewardConfig = doc(help="the reward: the judge, format and overlong terms, controls", factory=RewardConfig)
    benchmark: BenchmarkConfig = doc(
        help="what `retool eval` measures on and how it samples (conf/benchmark)",
        factory=BenchmarkConfig,
    )
    eval: EvalConfig = doc(help="`retool eval`'s batching, resume and bootstrap", factory=EvalConfig)
    decontam: DecontamConfig = doc(
        help="`retool decontaminate`: the benchmarks and the overlap rule",
        factory=DecontamConfig,
    )
    filter: PassRateConfig = doc(
        help="`retool filter-pass-rate`: samples per problem and the pass-rate band kept",
        factory=PassRateConfig,
    )
    shard: ShardConfig = doc(
        help="this job's share of the problems in a sharded sweep (filter-pass-rate, eval)",
        factory=ShardConfig,
    )
    ckpt: str | None = doc(
        None,
        "a training checkpoint folder, or a training run folder (its latest complete checkpoint): its weights, "
        "tokenizer, chat template and protocol (a typed model.name_or_path or protocol that contradicts it is "
        "refused; see protocol.override_checkpoint)",
    )

    def __post_init__(self) -> None:
        self._check_budgets()
        self._check_learning_signal()
        self._check_overlap()
        # the hf engine's rollout.dtype is a second copy of the weights (vLLM's is vLLM's own)
        hf_copy = self.rollout.engine is RolloutEngine.hf and self.rollout.dtype != Dtype.auto
        _check(
            not (self.trainer.fsdp and (self.model.lora_rank or hf_copy)),
            "trainer.fsdp",
            "LoRA (model.lora_rank) and the hf engine's rollout.dtype copy are not supported with FSDP2 yet; "
            "use data parallel (trainer.fsdp=false) for them",
        )

    def _check_overlap(self) -> None:
        """What overlapped training (trainer.max_staleness > 0, rl/overlap.py) runs with so far."""
        t = self.trainer
        if self.command != "train":
            return
        if self.rollout.partial:
            _check(
                t.max_staleness >= 1,
                "rollout.partial",
                "partial rollouts continue a trajectory under newer weights than its batch's: they need "
                "trainer.max_staleness >= 1 (with 0 every batch is sampled by the newest weights already)",
            )
            _check(
                self.rollout.loop is not RolloutLoop["async"],  # auto: turns with the hf engine (checked below)
                "rollout.loop",
                f"{self.rollout.loop.value}: partial rollouts (rollout.partial) switch a batch's weights once its "
                "trajectories got that far, which the turns loop's rounds keep apart; use rollout.loop=turns (or auto "
                "with the hf engine)",
            )
        if self.rollout.placement is RolloutPlacement.separate:
            _check(
                t.max_staleness >= 1,
                "rollout.placement",
                "separate puts the overlapped sampler's engines in processes of their own: it needs "
                "trainer.max_staleness >= 1 (with 0, sampling and update take turns on the trainer's engine)",
            )
        if t.max_staleness == 0:
            return
        _check(
            self.rollout.vllm_tensor_parallel_size == 1 or self.rollout.placement is RolloutPlacement.colocated,
            "rollout.vllm_tensor_parallel_size",
            f"{self.rollout.vllm_tensor_parallel_size} with rollout.placement=separate: an engine process holds the "
            "whole model, so 1 for now; a vLLM engine spanning trainer processes samples ahead colocated "
            "(rollout.placement=colocated)",
        )

    def _check_learning_signal(self) -> None:
        """GRPO-family advantages compare the samples of one question: with one sample, or greedy samples that
        are all the same, every advantage is 0 and `train` would spend its steps learning nothing."""
        if self.command != "train" or self.trainer.allow_no_learning:
            return
        override = "(trainer.allow_no_learning=true runs it anyway)"
        _check(
            self.rollout.group_size >= 2,
            "rollout.group_size",
            f"{self.rollout.group_size}: a group of one sample has advantage 0, so training learns nothing; use >= 2 "
            + override,
        )
        _check(
            self.rollout.temperature > 0,
            "rollout.temperature",
            "0 (greedy) in train: a question's samples are all the same, so every advantage is 0 and training "
            "learns nothing; use > 0 (e.g. 1.0) " + override,
        )

    def _response_budgets(self) -> list[tuple[str, int]]:
        """(key, tokens) of each response budget this command samples with."""
        if self.command == "eval":
            return [("benchmark.max_response_tokens", self.benchmark.max_response_tokens)]
        budgets = [("rollout.max_response_tokens", self.rollout.max_response_tokens)]
        if self.command == "train" and self.trainer.eval_every > 0:
            budgets.append(("benchmark.max_response_tokens", self.benchmark.max_response_tokens))
        return budgets

    def context_tokens(self) -> int:
        """model.max_context_tokens, or when it is None the longest prompt plus the largest response budget."""
        if self.model.max_context_tokens is not None:
            return self.model.max_context_tokens
        return self.rollout.max_prompt_tokens + max(tokens for _, tokens in self._response_budgets())

    def _check_budgets(self) -> None:
        """The context must hold the longest prompt and the whole response budget of what this command samples:
        RL rollouts (train, filter-pass-rate) and benchmark samples (eval, and train's periodic eval)."""
        if self.command not in ("train", "eval", "filter-pass-rate"):
            return  # prepare, decontaminate and sft sample nothing
        context, prompt = self.context_tokens(), self.rollout.max_prompt_tokens
        per_turn, turns = self.rollout.max_tokens_per_turn, self.rollout.max_turns
        for key, response in self._response_budgets():
            _check(
                context >= prompt + response,
                "model.max_context_tokens",
                f"{context} is shorter than rollout.max_prompt_tokens={prompt} + {key}={response}; "
                f"raise it to {prompt + response} or lower one of the two",
            )
            _check(
                per_turn is None or per_turn * turns >= response,
                "rollout.max_tokens_per_turn",
                f"{per_turn} x rollout.max_turns={turns} cannot reach {key}={response}: a segment that reaches the "
                "per-turn cap ends its trajectory as truncated, so long reasoning would be cut; raise it or set it "
                "to null (the rest of the response budget)",
            )
