"""Training precision: AdamW updates fp32 weights unless the user asks otherwise; vLLM samples in bf16."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from retool_cli.config import RetoolConfig, RolloutEngine
from retool_cli.errors import ConfigError
from retool_cli.rollout import vllm_dtype
from retool_cli.runtime import training_precision


def config(**model) -> RetoolConfig:
    cfg = RetoolConfig()
    return replace(cfg, model=replace(cfg.model, **model))


def with_engine(cfg: RetoolConfig, engine: RolloutEngine) -> RetoolConfig:
    return replace(cfg, rollout=replace(cfg.rollout, engine=engine))


def test_auto_on_a_cpu_trains_fp32_as_configured(caplog) -> None:
    cfg = config(device="cpu", dtype="auto")
    with caplog.at_level(logging.WARNING):
        assert training_precision(cfg) == cfg
    assert not caplog.records


@pytest.mark.parametrize(
    "engine, fsdp, rollout_dtype",
    [
        (RolloutEngine.hf, False, "bfloat16"),
        (RolloutEngine.hf, True, "auto"),
        (RolloutEngine.vllm, False, "bfloat16"),
        (RolloutEngine.vllm, True, "bfloat16"),
    ],
)
def test_auto_on_cuda_is_mixed_precision(monkeypatch, engine: RolloutEngine, fsdp: bool, rollout_dtype: str) -> None:
    # Only the device lookup is faked: the function under test reads the config and torch.cuda.is_available.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = with_engine(config(device="auto", dtype="auto"), engine)
    resolved = training_precision(replace(cfg, trainer=replace(cfg.trainer, fsdp=fsdp)))
    assert resolved.model.dtype == "float32"
    assert resolved.trainer.bf16_autocast
    # sampling stays in bf16: vLLM's own, the hf engine's bf16 copy (sharing the fp32 policy under FSDP2)
    assert resolved.rollout.dtype == rollout_dtype


def test_explicit_bf16_training_is_kept_but_warned_about(caplog) -> None:
    cfg = config(device="cpu", dtype="bfloat16")
    with caplog.at_level(logging.WARNING):
        assert training_precision(cfg) == cfg
    assert any("model.dtype=bfloat16" in r.getMessage() and "are lost" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cuda", [False, True])
def test_lora_keeps_the_frozen_base_as_configured(monkeypatch, caplog, cuda: bool) -> None:
    """Only the adapters train, and peft keeps them in fp32 over a bf16 base: no fp32 base, no warning."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    for dtype in ("auto", "bfloat16"):
        cfg = config(device="auto", dtype=dtype, lora_rank=8)
        with caplog.at_level(logging.WARNING):
            assert training_precision(cfg) == cfg
    assert not caplog.records


@pytest.mark.parametrize(
    "cuda, model_dtype, rollout_dtype, expected",
    [
        (True, "auto", "auto", "bfloat16"),
        (False, "auto", "auto", "float32"),
        (True, "float32", "auto", "float32"),
        (True, "auto", "float16", "float16"),
        (False, "bfloat16", "auto", "bfloat16"),
    ],
)
def test_vllm_dtype(monkeypatch, cuda: bool, model_dtype: str, rollout_dtype: str, expected: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    cfg = config(dtype=model_dtype)
    assert vllm_dtype(replace(cfg, rollout=replace(cfg.rollout, dtype=rollout_dtype))) == expected


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
