"""Optimisation: `retool train`'s RL trainer (`trainer`: algorithm, loss, schedule, staleness, processes and
nodes) and `retool sft`'s cold start (`sft`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from retool_cli.config.fields import _check, doc


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
        True,
        "continue the latest checkpoint of an unfinished run of this config (what only lays out, bounds or logs "
        "the run may differ: run_keys.NOT_THE_EXPERIMENT); false: start over in the folder",
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
        True,
        "continue the latest checkpoint of an unfinished run of this config (what only lays out, bounds or logs "
        "the run may differ: run_keys.NOT_THE_EXPERIMENT); false: start over in the folder",
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
