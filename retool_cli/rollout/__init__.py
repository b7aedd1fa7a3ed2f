"""Generation engines (hf, vllm) and the multi-turn agent loop producing Trajectory objects."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from retool_cli.config import RetoolConfig, RolloutEngine
from retool_cli.interfaces import Engine
from retool_cli.model.precision import Precision


def build_engine(
    cfg: RetoolConfig,
    precision: Precision,
    model: Any,
    tokenizer: Any,
    weights: str | None = None,
    own_copy: bool = False,
) -> Engine:
    """The rollout engine of `rollout.engine`, sampling in `precision.sampling`; vLLM is imported only when
    selected. vLLM loads `weights` (a checkpoint folder or hub id; default `model.name_or_path`): the policy's
    architecture and tokenizer. A trainer then syncs the policy's own weights into it before the first rollout.
    `own_copy`: the hf engine samples from a copy of `model` (which the trainer may update meanwhile), not from it."""
    if cfg.rollout.engine is RolloutEngine.vllm:
        from retool_cli.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(**vllm_arguments(cfg, precision, weights), tokenizer=tokenizer)
    from retool_cli.rollout.hf_engine import HFEngine

    return HFEngine(model, tokenizer, precision.sampling, accelerate=cfg.model.accelerate, own_copy=own_copy)


def vllm_arguments(cfg: RetoolConfig, precision: Precision, weights: str | None = None) -> dict[str, Any]:
    """VLLMEngine's arguments from the config but the tokenizer: the policy's architecture and tokenizer from
    `weights` (default `model.name_or_path`)."""
    from retool_cli.model.loading import model_path

    r = cfg.rollout
    return {
        "model_path": model_path(replace(cfg.model, name_or_path=weights or cfg.model.name_or_path)),
        "dtype": precision.sampling,
        "seed": cfg.seed,
        "max_model_len": cfg.context_tokens(),
        "gpu_memory_utilization": r.vllm_gpu_memory_utilization,
        "sleep_mode": r.vllm_enable_sleep_mode,
        "kv_cache_gib": r.vllm_kv_cache_gib,
        "batch_invariant": r.vllm_batch_invariant,
        "enforce_eager": r.vllm_enforce_eager,
        "tensor_parallel_size": r.vllm_tensor_parallel_size,
    }
