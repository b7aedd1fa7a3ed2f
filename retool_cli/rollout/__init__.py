"""Generation engines (hf, vllm) and the multi-turn agent loop producing Trajectory objects."""

from __future__ import annotations

from typing import Any

from retool_cli.config import Engine, RetoolConfig


def build_engine(cfg: RetoolConfig, model: Any, tokenizer: Any) -> Any:
    """The rollout engine of `rollout.engine`; vLLM is imported only when selected."""
    if cfg.rollout.engine is Engine.vllm:
        from retool_cli.modeling import model_path
        from retool_cli.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path(cfg.model), dtype=vllm_dtype(cfg), seed=cfg.seed,
            gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
            sleep_mode=cfg.rollout.vllm_enable_sleep_mode, max_model_len=cfg.model.max_context_tokens,
        )  # fmt: skip
    from retool_cli.modeling import resolve_dtype
    from retool_cli.rollout.hf_engine import HFEngine

    device = next(model.parameters()).device
    dtype = None if cfg.rollout.dtype == "auto" else resolve_dtype(cfg.rollout.dtype, device, "rollout.dtype")
    return HFEngine(model, tokenizer, dtype)


def vllm_dtype(cfg: RetoolConfig) -> str:
    """vLLM's dtype: `rollout.dtype`, else `model.dtype`; `auto` is bfloat16 (vLLM runs on CUDA, where auto means
    bf16), not the dtype a checkpoint was saved in (mixed-precision training saves fp32 weights)."""
    dtype = cfg.model.dtype if cfg.rollout.dtype == "auto" else cfg.rollout.dtype
    return "bfloat16" if dtype == "auto" else dtype
