"""Training precision: AdamW updates fp32 weights unless the user asks otherwise; vLLM samples in bf16."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from retool_cli.config import RetoolConfig, RolloutEngine
from retool_cli.errors import ConfigError
from retool_cli.model.precision import Precision, resolve_precision


def config(**model) -> RetoolConfig:
    cfg = RetoolConfig()
    return replace(cfg, model=replace(cfg.model, **model))


def with_engine(cfg: RetoolConfig, engine: RolloutEngine, fsdp: bool = False, dtype: str = "auto") -> RetoolConfig:
    rollout = replace(cfg.rollout, engine=engine, dtype=dtype)
    return replace(cfg, rollout=rollout, trainer=replace(cfg.trainer, fsdp=fsdp))


CPU = torch.device("cpu")


def test_auto_on_a_cpu_trains_fp32_as_configured(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        for training in (False, True):
            assert resolve_precision(config(device="cpu", dtype="auto"), training) == Precision(
                CPU, torch.float32, False, torch.float32
            )
    assert not caplog.records


def test_bf16_autocast_is_a_training_setting() -> None:
    cfg = config(device="cpu")
    cfg = replace(cfg, trainer=replace(cfg.trainer, bf16_autocast=True))
    assert resolve_precision(cfg, training=True).bf16_autocast
    assert not resolve_precision(cfg).bf16_autocast  # sampling commands run no training forward


@pytest.mark.parametrize(
    "engine, fsdp, sampling",
    [
        (RolloutEngine.hf, False, torch.bfloat16),
        (RolloutEngine.hf, True, torch.float32),  # FSDP2: the hf engine shares the fp32 policy
        (RolloutEngine.vllm, False, torch.bfloat16),
        (RolloutEngine.vllm, True, torch.bfloat16),
    ],
)
def test_auto_on_cuda_is_mixed_precision(monkeypatch, engine: RolloutEngine, fsdp: bool, sampling) -> None:
    # Only the device lookup is faked: the function under test reads the config and torch.cuda.is_available.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = with_engine(config(device="auto", dtype="auto"), engine, fsdp)
    assert resolve_precision(cfg, training=True) == Precision(torch.device("cuda"), torch.float32, True, sampling)
    # sampling commands (eval): auto is bf16 weights, nothing autocast
    assert resolve_precision(cfg) == Precision(torch.device("cuda"), torch.bfloat16, False, torch.bfloat16)


def test_explicit_bf16_training_is_kept_but_warned_about(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        precision = resolve_precision(config(device="cpu", dtype="bfloat16"), training=True)
    assert precision == Precision(CPU, torch.bfloat16, False, torch.bfloat16)
    assert any("model.dtype=bfloat16" in r.getMessage() and "are lost" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cuda", [False, True])
def test_lora_keeps_the_frozen_base_as_configured(monkeypatch, caplog, cuda: bool) -> None:
    """Only the adapters train, and peft keeps them in fp32 over a bf16 base: no fp32 base, no warning."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    for dtype in ("auto", "bfloat16"):
        cfg = config(device="auto", dtype=dtype, lora_rank=8)
        with caplog.at_level(logging.WARNING):
            assert resolve_precision(cfg, training=True) == resolve_precision(cfg)
    assert not caplog.records


@pytest.mark.parametrize(
    "cuda, model_dtype, rollout_dtype, expected",
    [
        (True, "auto", "auto", torch.bfloat16),
        (False, "auto", "auto", torch.float32),
        (True, "float32", "auto", torch.float32),
        (True, "auto", "float16", torch.float16),
        (False, "bfloat16", "auto", torch.bfloat16),
    ],
)
def test_vllm_samples_in(monkeypatch, cuda: bool, model_dtype: str, rollout_dtype: str, expected) -> None:
    """vLLM's dtype: rollout.dtype, else model.dtype; auto is bfloat16 on CUDA (not the fp32 a mixed-precision
    checkpoint was saved in), float32 on its CPU build."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    cfg = with_engine(config(dtype=model_dtype), RolloutEngine.vllm, dtype=rollout_dtype)
    assert resolve_precision(cfg).sampling == expected


def test_a_dtype_setting_is_read_by_the_loader_and_the_hf_engine(tokenizer) -> None:
    """The one Precision decides what load_model loads and what the hf engine samples with."""
    from retool_cli.model.loading import load_model
    from retool_cli.rollout import build_engine

    cfg = with_engine(config(device="cpu", dtype="bfloat16"), RolloutEngine.hf, dtype="float32")
    precision = resolve_precision(cfg)
    model = load_model(cfg.model, precision)
    assert next(model.parameters()).dtype == torch.bfloat16
    engine = build_engine(cfg, precision, model, tokenizer)
    assert engine.model is not model and next(engine.model.parameters()).dtype == torch.float32


def test_fsdp_refuses_only_the_hf_engines_weight_copy() -> None:
    cfg = RetoolConfig()
    trainer = replace(cfg.trainer, fsdp=True)
    replace(cfg, trainer=trainer, rollout=replace(cfg.rollout, engine=RolloutEngine.vllm, dtype="bfloat16"))  # fine
    with pytest.raises(ConfigError, match="trainer.fsdp"):
        replace(cfg, trainer=trainer, rollout=replace(cfg.rollout, engine=RolloutEngine.hf, dtype="bfloat16"))


def test_building_the_tiny_model_leaves_the_runs_random_streams_alone(tmp_path, monkeypatch) -> None:
    """The tiny model is built on first use and cached: a run that builds it must go on exactly as one that
    finds it cached (a LoRA init after it drew different numbers: same seed, different results)."""
    import random

    import numpy as np

    from retool_cli.model.tiny import tiny_model_path

    monkeypatch.setenv("RETOOL_CACHE", str(tmp_path))

    def draws() -> tuple:
        return torch.rand(3).tolist(), random.random(), float(np.random.rand())

    after = []
    for _ in ("built", "cached"):
        torch.manual_seed(7)
        random.seed(7)
        np.random.seed(7)
        tiny_model_path()
        after.append(draws())
    assert after[0] == after[1]
