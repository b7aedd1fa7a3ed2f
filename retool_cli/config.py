"""Typed configuration: the single source of keys, types, defaults and cross-field checks.

Every subcommand composes the same `RetoolConfig` (so one recipe applies to all of them) from
`conf/<command>.yaml`, the group options under `conf/` and an optional `recipe=NAME` (`compose.py`: the
schema's registration and the order of recipe and command line). Hydra checks keys and types while
composing; `compose.to_config` then builds these dataclasses with `OmegaConf.to_object`, which runs each
`__post_init__` so cross-field mistakes fail before any work starts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from omegaconf import II

from retool_cli.errors import ConfigError


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

    question: str = "problem"  # the column (or dotted path) holding the problem text
    answer: str = "answer"  # the column holding the reference answer
    id: str | None = None  # None: ids are made from the source name and the row number


@dataclass
class SyntheticConfig:
    """The built-in task: problems where running code beats mental arithmetic."""

    num_examples: int = 2000  # problems generated before dedupe and the dev split
    difficulty: int = 1  # 1 (4-digit x 3-digit products, small exponents) .. 5 (much larger numbers)
    # problem kinds to mix; see retool_cli/data/synthetic.py for the full list
    kinds: list[str] = field(default_factory=lambda: ["product", "modpow", "digit_sum_power", "divisor_count"])


@dataclass
class DataConfig:
    """A dataset source and how `retool prepare` turns it into train.jsonl / dev.jsonl."""

    source: DataSource = DataSource.synthetic  # which reader and cleaning rules (see DataSource)
    name: str = "synthetic"  # the data_source tag written on every example
    path: str | None = None  # local file or folder; for hub sources it replaces the download
    hub_id: str | None = None  # dataset id on the Hugging Face hub (hub sources only)
    revision: str = "main"  # hub revision (branch, tag or commit); pin a commit for reproducible runs
    split: str = "train"  # hub split to read
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)  # where the fields live in a source row
    strip_dapo_template: bool = False  # remove DAPO's "Solve ... Answer: $Answer" prefix and suffix
    dev_size: int = 0  # examples split off into dev.jsonl (by seed) after dedupe
    max_examples: int | None = None  # keep at most this many training examples (after the split)
    # the built-in task (source=synthetic)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def __post_init__(self) -> None:
        _check(self.dev_size >= 0, "data.dev_size", f"must be >= 0, got {self.dev_size}")
        _check(self.max_examples is None or self.max_examples > 0, "data.max_examples", "must be > 0")
        if self.source is DataSource.file:
            _check(bool(self.path), "data.path", "is required when data.source=file")
        _check(1 <= self.synthetic.difficulty <= 5, "data.synthetic.difficulty", "must be in 1..5")
        _check(self.synthetic.num_examples > 0, "data.synthetic.num_examples", "must be > 0")


# --------------------------------------------------------------------------- model, rollout, protocol, training


@dataclass
class ModelConfig:
    """The policy model."""

    name_or_path: str = "tiny"  # HF id, local folder, or "tiny" (random-init model built offline)
    # auto | float32 | bfloat16 | float16; auto = bf16 on CUDA, fp32 on CPU; except that `sft` and `train` on CUDA
    # turn auto into fp32 weights under bf16 autocast (mixed precision: AdamW must update fp32 weights)
    dtype: str = "auto"
    device: str = "auto"  # auto | cpu | cuda; auto = cuda when available
    # prompt + response budget of one trajectory (vLLM's max_model_len); None = rollout.max_prompt_tokens + the
    # largest response budget the command samples with (rollout's in train, the benchmark's in eval)
    max_context_tokens: int | None = None
    # the hand-written fast paths for Llama-family decoders: the hf engine's KV-cache decode loop (prepacked
    # GEMMs and numba kernels on CPU, few large ops on CUDA; rollout/kv_decoder.py) and the training forward that
    # computes each GRPO prompt once (rl/prefix_sharing.py; in `sft`, the traces' common system turn once and the
    # LM head only at the model's tokens). Off: transformers' own forward everywhere (the plain path the fast ones
    # are checked against). The smoke recipe turns it on.
    accelerate: bool = False
    # a transformers tokenizer class to load the tokenizer with instead of the one its files name (None: AutoTokenizer);
    # PreTrainedTokenizerFast reads tokenizer.json as it is (a fix the tokenizer check at load suggests)
    tokenizer_class: str | None = None
    # a Jinja chat template file used instead of the tokenizer's own (e.g. Qwen3-Coder's XML tool calls, or a
    # template for a tokenizer without one); None = the tokenizer's
    chat_template: str | None = None
    # LoRA (needs the `lora` extra, peft): train low-rank adapters instead of all weights (sft and train).
    # Checkpoints hold the merged weights (from_pretrained / vLLM load them) and the adapter (for resume).
    lora_rank: int = 0  # 0 = off (full fine-tuning)
    lora_alpha: float = 32.0  # adapter scale = lora_alpha / lora_rank
    lora_dropout: float = 0.0  # dropout on the adapters' input
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )  # module names that get adapters (Llama-family names)

    def __post_init__(self) -> None:
        _check(self.lora_rank >= 0, "model.lora_rank", "must be >= 0 (0 = off)")
        _check(0 <= self.lora_dropout < 1, "model.lora_dropout", "must be in [0, 1)")
        _check(
            not self.lora_rank or bool(self.lora_target_modules),
            "model.lora_target_modules",
            "needs at least one module name when model.lora_rank > 0",
        )


class Engine(enum.Enum):
    hf = "hf"  # transformers generate loop (CPU or CUDA)
    vllm = "vllm"  # vLLM offline engine (optional extra)


class LossAgg(str, enum.Enum):
    token_mean = "token_mean"  # mean over all model tokens of the batch (DAPO)
    seq_mean_token_mean = "seq_mean_token_mean"  # mean per sequence, then over sequences (GRPO)
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"  # token sum / fixed length (Dr.GRPO)


@dataclass
class RolloutConfig:
    """Sampling of trajectories with the agent loop (train, eval, filter-pass-rate)."""

    engine: Engine = Engine.hf  # hf (transformers, CPU or CUDA) | vllm (vLLM's engine, CUDA or its CPU build)
    # Weights the engine generates with: auto = the policy's own (hf: shared with the trainer, nothing to
    # copy); float32 | bfloat16 | float16 = a copy in that dtype, refreshed after each optimizer step
    # (e.g. bfloat16 sampling next to an fp32 trainer, as vLLM-based recipes do; the trainer recomputes
    # the logprobs it trains on in its own precision). vLLM: its dtype; auto = model.dtype, bfloat16 for auto.
    dtype: str = "auto"
    group_size: int = 8  # samples per question (GRPO group)
    temperature: float = 1.0  # sampling temperature of training rollouts
    top_p: float = 1.0  # nucleus sampling of training rollouts (1 = off)
    top_k: int = 0  # 0 = off
    max_response_tokens: int = 1024  # all tokens after the prompt, tool output included
    # the longest prompt (system prompt + question, templated) the budgets are sized for: model.max_context_tokens
    # must hold it plus the response budget; `train` drops longer prompts (counted in the log, as verl's
    # filter_overlong_prompts), `eval` refuses them
    max_prompt_tokens: int = 1024
    max_turns: int = 6  # generation segments (assistant turns) per trajectory
    max_code_calls: int = 4  # interpreter calls per trajectory
    # new tokens of one generation segment; a segment that reaches it ends the trajectory as truncated.
    # None = what is left of max_response_tokens (verl's multi-turn rollout), so one long reasoning segment fits
    max_tokens_per_turn: int | None = None
    max_tool_result_tokens: int = 512  # tokens of one interpreter result (head and tail kept)
    overlap_sandbox: bool = True  # run half the batch's code while the other half generates
    max_sandbox_infra_error_rate: float = 0.2  # above this share of failed sandbox calls a batch stops with an error
    # vLLM only (rollout.engine=vllm): share of GPU memory for weights + KV cache (on CPU: of the machine's
    # memory, unless vllm_kv_cache_gib sizes the KV cache)
    vllm_gpu_memory_utilization: float = 0.5
    vllm_kv_cache_gib: float = 0.0  # vLLM only: KV cache size in GiB; 0 = from vllm_gpu_memory_utilization
    # vLLM only: free its GPU memory while the trainer runs, where the platform has sleep mode (CUDA; not
    # vLLM's CPU build, where this is ignored with a note)
    vllm_enable_sleep_mode: bool = True

    def __post_init__(self) -> None:
        _check(self.group_size >= 1, "rollout.group_size", "must be >= 1")
        _check(self.temperature >= 0, "rollout.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        _check(self.top_k >= 0, "rollout.top_k", "must be >= 0")
        for key in ("max_response_tokens", "max_prompt_tokens", "max_turns", "max_tool_result_tokens"):
            _check(getattr(self, key) >= 1, f"rollout.{key}", "must be >= 1")
        per_turn = self.max_tokens_per_turn
        _check(per_turn is None or per_turn >= 1, "rollout.max_tokens_per_turn", "must be >= 1 (or null)")
        _check(self.max_code_calls >= 0, "rollout.max_code_calls", "must be >= 0")
        dtypes = ("auto", "float32", "bfloat16", "float16")
        _check(self.dtype in dtypes, "rollout.dtype", f"{self.dtype!r} is not one of {', '.join(dtypes)}")
        _check(0 < self.vllm_gpu_memory_utilization <= 1, "rollout.vllm_gpu_memory_utilization", "must be in (0, 1]")
        _check(
            self.vllm_kv_cache_gib >= 0,
            "rollout.vllm_kv_cache_gib",
            "must be >= 0 (0 = from the utilization)",
        )
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
    """How model and interpreter exchange code and results (retool_cli/protocol.py)."""

    name: ProtocolName = ProtocolName.retool_tags  # retool_tags | chat_tool | none (text only)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT  # retool_tags: how to call the interpreter and answer
    # chat_tool: the tool itself is described by the chat template's tools section
    chat_tool_system_prompt: str = (
        "Solve the math problem. You can call the code_interpreter tool to run Python; each call runs in a fresh "
        "interpreter with a short time limit and returns only what the code prints. "
        "Put the final answer in \\boxed{}."
    )
    # chat_tool with a template that is not append-only (Qwen3): append | refuse (see TemplatePolicy)
    template_policy: TemplatePolicy = TemplatePolicy.append
    # protocol=none: the text-only baseline
    text_only_system_prompt: str = "Solve the math problem step by step. Put the final answer in \\boxed{}."


class Advantage(str, enum.Enum):  # a str too: the tensor functions take the name or the member
    grpo = "grpo"  # (r - group mean) / (group std + 1e-4)
    dr_grpo = "dr_grpo"  # r - group mean
    rloo = "rloo"  # r - mean of the other samples of the group


@dataclass
class TrainerConfig:
    """Optimisation of `retool train` (RL) and `retool sft`; what each step does is in retool_cli/rl/step.py."""

    lr: float = 1e-6  # AdamW learning rate (the paper's 1e-6 at 7B-32B; the tiny smoke model takes 1e-4)
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warm-up steps of the learning rate
    schedule: str = "constant"  # constant | cosine (after warm-up)
    grad_clip: float = 1.0  # max global gradient norm
    total_steps: int = 100  # optimizer steps of the run (RL: one rollout batch each)
    questions_per_step: int = 32  # distinct questions per RL step (x rollout.group_size trajectories)
    epochs_per_batch: int = 1  # passes over each rollout batch (old logprobs recomputed once before them)
    mini_batches: int = 1  # optimizer steps per epoch over the rollout batch
    micro_batch_tokens: int = 16384  # token budget of one forward/backward (sorted by length, no padding waste)
    advantage: Advantage = Advantage.grpo  # grpo | dr_grpo | rloo (retool_cli/rl/algorithms.py)
    clip_low: float = 0.2  # PPO ratio clip below 1
    clip_high: float = 0.28  # PPO ratio clip above 1 (DAPO clip-higher)
    dual_clip: float | None = None  # bound the loss of negative advantages at dual_clip x |A| (e.g. 3.0); None = off
    loss_agg: LossAgg = LossAgg.token_mean  # how token losses become the batch loss (see LossAgg)
    kl_coef: float = 0.0  # KL to the frozen initial policy (0 = off, no reference model kept)
    kl_estimator: str = "k3"  # k1 | k3
    entropy_coef: float = 0.0  # entropy bonus (0 = off)
    mask_truncated: bool = True  # DAPO overlong filtering: no gradient from length-truncated trajectories
    dynamic_sampling: bool = False  # DAPO: drop all-equal-reward groups and sample more questions
    max_sampling_rounds: int = 3  # cap on extra rollout batches per step with dynamic sampling
    save_every: int = 50  # checkpoint every N steps (and at the end)
    keep_last: int = 2  # checkpoints kept on disk
    # trajectories of each step written to rollouts.jsonl for `retool report` (half right, half wrong where the
    # step has both; seeded); 0 keeps none. Bounded: steps x this many rows.
    keep_rollouts: int = 4
    resume: str = "auto"  # auto: continue the latest checkpoint of an unfinished run of this config | never
    eval_every: int = 0  # evaluate on the dev split every N steps with the benchmark's sampling (0 = off)
    eval_problems: int = 64  # dev problems of a periodic evaluation
    nproc: int = 1  # processes (one per GPU); > 1 relaunches through torchrun, rank 0 writes the outputs
    fsdp: bool = False  # with nproc > 1: shard parameters, gradients and optimizer state (FSDP2) instead of
    # a whole copy per process; rollouts all-gather the weights once per step
    gradient_checkpointing: bool = False  # recompute activations in backward (less memory, ~30% more time)
    bf16_autocast: bool = False  # mixed precision: forward passes under torch.autocast(bfloat16) over fp32
    # weights (keep model.dtype=float32); CUDA, or CPUs with AVX512-BF16/AMX. Also used by `retool sft`.
    # model.dtype=auto on CUDA turns it on (see ModelConfig.dtype).
    tensorboard: bool = False  # also log to RUN/tensorboard (needs the tensorboard extra)
    wandb_project: str | None = None  # also log to this W&B project (needs the wandb extra)
    train_file: str | None = None  # a prepared train.jsonl; None = build from the `data` section in memory
    init_from: str | None = None  # start from this checkpoint (e.g. the SFT run folder); None = model.name_or_path

    def __post_init__(self) -> None:
        _check(self.lr > 0, "trainer.lr", "must be > 0")
        _check(self.total_steps >= 1, "trainer.total_steps", "must be >= 1")
        _check(self.questions_per_step >= 1, "trainer.questions_per_step", "must be >= 1")
        _check(self.schedule in ("constant", "cosine"), "trainer.schedule", "must be constant or cosine")
        _check(self.resume in ("auto", "never"), "trainer.resume", "must be auto or never")
        _check(self.kl_estimator in ("k1", "k3"), "trainer.kl_estimator", "must be k1 or k3")
        for key in ("epochs_per_batch", "mini_batches", "micro_batch_tokens", "save_every", "keep_last"):
            _check(getattr(self, key) >= 1, f"trainer.{key}", "must be >= 1")
        _check(self.keep_rollouts >= 0, "trainer.keep_rollouts", "must be >= 0")


@dataclass
class SFTConfig:
    """Cold-start fine-tuning on code-interleaved traces (`retool sft`)."""

    steps: int = 1000  # optimizer steps
    lr: float = 2e-3  # AdamW learning rate
    batch_size: int = 64  # traces per optimizer step
    warmup_steps: int = 50  # linear warm-up steps
    schedule: str = "cosine"  # constant | cosine (after warm-up)
    weight_decay: float = 0.0  # AdamW weight decay
    code_fraction: float = 0.5  # synthesised traces: share that calls the interpreter (the rest answer directly)
    # traces with a `messages` column: a local .jsonl / .json / .parquet file or `datasets` folder, or a hub dataset
    # id (e.g. JoeYing/ReTool-SFT); chat messages with tool calls, or ReTool-SFT's tagged responses (data/traces.py).
    # None = synthesise traces for the synthetic task
    traces_file: str | None = None
    traces_revision: str = "main"  # hub revision of traces_file (branch, tag or commit); pin a commit to reproduce
    traces_split: str = "train"  # hub split of traces_file
    log_every: int = 25  # steps between lines of metrics.jsonl and the log
    save_every: int = 100  # checkpoint every N steps (and at the end; the latest kept): a killed run loses < N
    resume: str = "auto"  # auto: continue the latest checkpoint of an unfinished run of this config | never

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "sft.steps", "must be >= 1")
        _check(self.save_every >= 1, "sft.save_every", "must be >= 1")
        _check(self.resume in ("auto", "never"), "sft.resume", "must be auto or never")
        _check(self.batch_size >= 1, "sft.batch_size", "must be >= 1")
        _check(0 <= self.code_fraction <= 1, "sft.code_fraction", "must be in [0, 1]")
        _check(self.schedule in ("constant", "cosine"), "sft.schedule", "must be constant or cosine")


# --------------------------------------------------------------------------- sandbox


class Isolation(enum.Enum):
    auto = "auto"  # bwrap when it works here, else rlimits (with a loud warning)
    bwrap = "bwrap"  # bubblewrap jail: no network, private /tmp, fresh /proc, read-only system, dropped uid
    rlimits = "rlimits"  # resource limits, scrubbed environment and scratch folder only (weaker)


@dataclass
class SandboxConfig:
    """The code interpreter (retool_cli/env/sandbox.py). Limits apply to each call."""

    isolation: Isolation = Isolation.auto  # auto | bwrap | rlimits (see Isolation)
    workers: int = 2  # warm worker processes = snippets run at the same time
    timeout_s: float = 10.0  # wall-clock limit; the call's whole process tree is killed after it
    cpu_time_s: int = 10  # CPU-seconds limit (RLIMIT_CPU)
    memory_mb: int = 1024  # address space a snippet may add on top of the warm interpreter (RLIMIT_AS)
    max_processes: int = 32  # processes and threads of the snippet's uid (RLIMIT_NPROC; needs root)
    max_file_mb: int = 16  # largest file a snippet may write (RLIMIT_FSIZE)
    scratch_mb: int = 64  # total size of the private /tmp (bwrap only)
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 65536  # stdout + stderr kept; a call printing more is killed there
    seed: int = 0  # random and numpy.random are seeded with this before every call
    # imported once per worker, so snippets import them for free (and, under rlimits as root, at all)
    preload: list[str] = field(
        default_factory=lambda: [
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
        ]
    )
    # run once in each worker before it forks: fills sympy's lazy imports and caches for every child
    warmup: str = (
        "import sympy as sp\nx, y = sp.symbols('x y')\nsp.factor(x**4 - 1); sp.expand((x + y)**3)\n"
        "sp.solve([x + y - 2, x - y], [x, y]); sp.simplify(sp.sin(x)**2 + sp.cos(x)**2)\n"
        "sp.integrate(x * sp.exp(x), x); sp.Rational(1, 3) + 1; sp.isprime(97); sp.factorint(360)\n"
        "sp.nsimplify(0.5); sp.N(sp.pi, 20); sp.Matrix([[1, 2], [3, 4]]).det(); sp.binomial(10, 3)"
    )
    uid_base: int = 61000  # when run as root: snippets run as uid_base + k, never as root
    start_timeout_s: float = 120.0  # a worker that is not ready by then is an infrastructure error

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
        ):
            _check(getattr(self, key) >= 1, f"sandbox.{key}", "must be >= 1")
        _check(self.max_output_bytes >= 1024, "sandbox.max_output_bytes", "must be >= 1024")


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

    function: RewardFunction = RewardFunction.correctness  # correctness | dapo_strict (see RewardFunction)
    answer_window_chars: int = 300  # the boxed answer must start within the final text's last N characters
    judge_timeout_s: float = 5.0  # hard bound per math-verify check; a timed-out pair counts as wrong
    judge_workers: int = 2  # math-verify worker processes
    format_weight: float = 0.0  # added when a boxed answer is present (0 = off)
    overlong_buffer_tokens: int = 0  # DAPO soft overlong penalty over the last N tokens (0 = off)
    overlong_penalty_factor: float = 1.0  # the penalty at the full length
    max_response_tokens: int = II("rollout.max_response_tokens")  # where the overlong penalty is full
    # train: none | shuffled (a control: the rewards of each rollout round permuted before the advantages, so their
    # distribution stays and their link to correctness goes; the logged accuracy is still the real one)
    control: RewardControl = RewardControl.none

    def __post_init__(self) -> None:
        _check(self.answer_window_chars > 0, "reward.answer_window_chars", "must be > 0")
        _check(self.judge_timeout_s > 0, "reward.judge_timeout_s", "must be > 0")
        _check(self.judge_workers >= 1, "reward.judge_workers", "must be >= 1")
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

    name: str = "smoke"  # the benchmark's name in reports (the option's file sets it)
    data: DataConfig | None = None  # where the problems come from; None = the run's own `data` section
    part: SplitPart = SplitPart.all  # all | dev (the dev split of the data, as `retool prepare` makes it)
    n_samples: int = 4  # samples per problem (AIME 64, MATH-500 4)
    temperature: float = 0.6  # sampling temperature (open-r1: 0.6)
    top_p: float = 0.95  # nucleus sampling (open-r1: 0.95)
    max_response_tokens: int = 8192  # the token budget of one trajectory, tool output included
    max_problems: int | None = None  # evaluate only the first N problems (quick checks)

    def __post_init__(self) -> None:
        _check(self.n_samples >= 1, "benchmark.n_samples", "must be >= 1")
        _check(self.temperature >= 0, "benchmark.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, "benchmark.top_p", "must be in (0, 1]")
        _check(self.max_response_tokens >= 1, "benchmark.max_response_tokens", "must be >= 1")
        _check(self.max_problems is None or self.max_problems >= 1, "benchmark.max_problems", "must be >= 1")


@dataclass
class EvalConfig:
    """How `retool eval` runs (what it measures is `benchmark`)."""

    questions_per_batch: int = 8  # problems per rollout batch (x benchmark.n_samples trajectories)
    resume: bool = True  # continue an unfinished run of the identical config instead of starting over
    bootstrap: int = 2000  # resamples for the 95% interval

    def __post_init__(self) -> None:
        _check(self.questions_per_batch >= 1, "eval.questions_per_batch", "must be >= 1")
        _check(self.bootstrap >= 100, "eval.bootstrap", "must be >= 100")


# --------------------------------------------------------------------------- data hygiene


@dataclass
class DecontamConfig:
    """`retool decontaminate`: drop training rows that overlap evaluation benchmarks (retool_cli/data/decontam.py)."""

    input: str | None = None  # a MathExample JSONL to clean; None = the train split of the `data` section
    benchmarks: list[str] = field(default_factory=lambda: ["aime24", "aime25", "math500"])  # conf/benchmark options
    # NAME -> a local file used instead of the hub (None: the hub)
    benchmark_paths: dict[str, str | None] = field(
        default_factory=lambda: {"aime24": None, "aime25": None, "math500": None}
    )
    rule: str = "coverage"  # coverage (default: ignores shared boilerplate) | any (open-r1: one shared n-gram)
    n: int = 8  # word n-gram size of the `any` rule and of the shared-n-gram count in the report
    coverage_n: int = 3  # word n-gram size of the coverage rule (small: edits break long n-grams)
    threshold: float = 0.25  # coverage rule: share of the benchmark item's n-grams found in the row...
    text_only_threshold: float = 0.5  # ...with the row's numbers in the item, or this share whatever the numbers
    min_shared: int = 3  # coverage rule: fewer shared n-grams never flag (one common phrase is not a copy)
    # coverage rule, a row or item without numbers: `threshold` of the item's n-grams flag when this (weighted) share
    # of the item's distinct words is in the row too (a reworded copy keeps its words; see data/decontam.py)
    word_threshold: float = 0.7
    latex_folding: bool = True  # drop LaTeX markup ($, braces, \frac, \left ...) before comparing
    punctuation_folding: bool = True  # drop punctuation before comparing

    def __post_init__(self) -> None:
        _check(self.rule in ("coverage", "any"), "decontam.rule", "must be coverage or any")
        _check(self.n >= 1 and self.coverage_n >= 1, "decontam.n", "n-gram sizes must be >= 1")
        _check(0 < self.threshold <= 1, "decontam.threshold", "must be in (0, 1]")
        _check(0 < self.word_threshold <= 1, "decontam.word_threshold", "must be in (0, 1]")
        _check(bool(self.benchmarks), "decontam.benchmarks", "needs at least one benchmark")


@dataclass
class ShardConfig:
    index: int = 0  # this job's shard
    count: int = 1  # shards in all (e.g. -m shard.index=0,1,2,3 shard.count=4 with the Slurm launcher)

    def __post_init__(self) -> None:
        _check(self.count >= 1 and 0 <= self.index < self.count, "shard.index", "must be in [0, shard.count)")


@dataclass
class PassRateConfig:
    """`retool filter-pass-rate`: keep problems the current policy solves sometimes (commands/filter_pass_rate.py)."""

    input: str | None = None  # a MathExample JSONL; None = the train split of the `data` section
    n_samples: int = 8  # samples per problem, through the training agent loop, protocol, tools and reward
    low: float = 0.0  # keep problems with low < pass rate < high (open-r1's DAPO recipe: 0.1, 0.6)
    high: float = 1.0  # see low

    def __post_init__(self) -> None:
        _check(self.n_samples >= 1, "filter.n_samples", "must be >= 1")
        _check(0 <= self.low < self.high <= 1, "filter.low", "needs 0 <= low < high <= 1")


# --------------------------------------------------------------------------- root


@dataclass
class RetoolConfig:
    """The composed config of every subcommand."""

    command: str = "prepare"  # set by conf/<command>.yaml; names the output folder
    seed: int = 0  # seeds shuffles, splits, generators and sampling
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    filter: PassRateConfig = field(default_factory=PassRateConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)
    # a training checkpoint folder, or a training run folder (its latest checkpoint); overrides model.name_or_path
    ckpt: str | None = None

    def __post_init__(self) -> None:
        self._check_budgets()
        # the hf engine's rollout.dtype is a second copy of the weights (vLLM's is vLLM's own)
        hf_copy = self.rollout.engine is Engine.hf and self.rollout.dtype != "auto"
        _check(
            not (self.trainer.fsdp and (self.model.lora_rank or hf_copy)),
            "trainer.fsdp",
            "LoRA (model.lora_rank) and the hf engine's rollout.dtype copy are not supported with FSDP2 yet; "
            "use data parallel (trainer.fsdp=false) for them",
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
