"""Typed configuration: the single source of keys, types, defaults and cross-field checks.

Every subcommand composes the same `RetoolConfig` (so one recipe applies to all of them) from
`conf/<command>.yaml`, the group options under `conf/` and an optional `recipe=NAME` (`compose.py`: the
schema's registration and the order of recipe and command line). Hydra checks keys and types while
composing; `compose.to_config` then builds these dataclasses with `OmegaConf.to_object`, which runs each
`__post_init__` so cross-field mistakes fail before any work starts.

The sections, by what they configure (every name is imported from `retool_cli.config`):
    data.py         the problems: training data, its hygiene (decontam, pass-rate filter, shards), benchmarks
    policy.py       the model and how it samples (rollout)
    training.py     the RL trainer and SFT
    environment.py  the protocol between model and interpreter, the sandbox, the reward
    fields.py       how a field is declared (`doc`, with its documentation) and checked (`_check`)
This file: the root, `RetoolConfig`, and the checks that read several sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from retool_cli.config.data import (
    BenchmarkConfig,
    ColumnsConfig,
    DataConfig,
    DataSource,
    DecontamConfig,
    EvalConfig,
    OverlapRule,
    PassRateConfig,
    ShardConfig,
    SplitPart,
    SyntheticConfig,
)
from retool_cli.config.environment import (
    DEFAULT_SYSTEM_PROMPT,
    Isolation,
    ProtocolConfig,
    ProtocolName,
    RewardConfig,
    RewardControl,
    RewardFunction,
    SandboxConfig,
    TemplatePolicy,
)
from retool_cli.config.fields import _check, doc
from retool_cli.config.policy import (
    Dtype,
    ModelConfig,
    RolloutConfig,
    RolloutEngine,
    RolloutLoop,
    RolloutPlacement,
)
from retool_cli.config.training import (
    Advantage,
    FsdpSharding,
    KLEstimator,
    LossAgg,
    RolloutCorrection,
    Schedule,
    SFTConfig,
    TrainerConfig,
)

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "Advantage",
    "BenchmarkConfig",
    "ColumnsConfig",
    "DataConfig",
    "DataSource",
    "DecontamConfig",
    "Dtype",
    "EvalConfig",
    "FsdpSharding",
    "Isolation",
    "KLEstimator",
    "LossAgg",
    "ModelConfig",
    "OverlapRule",
    "PassRateConfig",
    "ProtocolConfig",
    "ProtocolName",
    "RetoolConfig",
    "RewardConfig",
    "RewardControl",
    "RewardFunction",
    "RolloutConfig",
    "RolloutCorrection",
    "RolloutEngine",
    "RolloutLoop",
    "RolloutPlacement",
    "SFTConfig",
    "SandboxConfig",
    "Schedule",
    "ShardConfig",
    "SplitPart",
    "SyntheticConfig",
    "TemplatePolicy",
    "TrainerConfig",
    "doc",
    "plain_values",
]


SEPARATE_ONLY = ("engine_processes", "engine_threads", "engine_restarts", "weight_bucket_mb")  # rollout keys


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
                self.rollout.loop is not RolloutLoop["async"],  # auto: turns with partial rollouts (agent.loop_of)
                "rollout.loop",
                f"{self.rollout.loop.value}: partial rollouts (rollout.partial) switch a batch's weights once its "
                "trajectories got that far, which the turns loop's rounds keep apart; use rollout.loop=turns (or auto, "
                "which takes turns with partial rollouts)",
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

    def idle_overlap_settings(self) -> list[str]:
        """Notes on the overlap keys (rollout.engine_*, weight_bucket_mb, partial_turns) set away from their
        defaults in a run where they do nothing: a user who typed rollout.engine_processes=2 on a colocated run
        learns why nothing changed. Notes, not errors: a recipe may set them for a placement the command line
        then overrides."""
        r, defaults = self.rollout, RolloutConfig()
        separate = self.trainer.max_staleness >= 1 and r.placement is RolloutPlacement.separate
        needs = {key: "rollout.placement=separate (and trainer.max_staleness >= 1)" for key in SEPARATE_ONLY}
        needs["partial_turns"] = "rollout.partial=true"
        applies = {key: separate for key in SEPARATE_ONLY} | {"partial_turns": r.partial}
        return [
            f"rollout.{key}={getattr(r, key)} does nothing here: it applies with {needs[key]}"
            for key in needs
            if self.command == "train" and not applies[key] and getattr(r, key) != getattr(defaults, key)
        ]

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


def plain_values(config: RetoolConfig) -> dict[str, Any]:
    """The config as plain, resolved values (enums as their names): what a run key digests and what records keep
    (a checkpoint's, prepare's manifest)."""
    from omegaconf import OmegaConf

    return cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(config), resolve=True, enum_to_str=True))
