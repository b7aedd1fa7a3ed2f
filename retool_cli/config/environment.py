"""What the policy acts in: the protocol between model and interpreter, the interpreter's sandbox, and the
reward."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from omegaconf import II

from retool_cli.config.fields import _check, doc


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
