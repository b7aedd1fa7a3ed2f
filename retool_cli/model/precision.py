"""What a process computes in, decided once: `resolve_precision` turns `model.dtype`, `rollout.dtype`,
`trainer.bf16_autocast` and the device into one `Precision` that loading, the trainer and both engines read.
Nothing else resolves `auto`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from retool_cli.config import Dtype, RetoolConfig, RolloutEngine
from retool_cli.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = {Dtype.float32: torch.float32, Dtype.bfloat16: torch.bfloat16, Dtype.float16: torch.float16}


@dataclass(frozen=True)
class Precision:
    """The dtypes of one process's run."""

    device: torch.device  # where the policy lives (model.device resolved)
    weights: torch.dtype  # the policy's parameters as loaded (in training: what AdamW updates)
    bf16_autocast: bool  # training forward passes: matmuls in bfloat16 over `weights` (mixed precision)
    sampling: torch.dtype  # what the engine generates with: vLLM's dtype; hf: a cast copy where it differs

    def __str__(self) -> str:
        name = str(self.weights).removeprefix("torch.")
        autocast = " under bf16 autocast" if self.bf16_autocast else ""
        return f"{name} weights{autocast} on {self.device}, sampling in {str(self.sampling).removeprefix('torch.')}"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={name} but CUDA is not available here; use model.device=cpu or auto")
    return torch.device(name)


def dtype_on(name: Dtype | str, device: torch.device) -> torch.dtype:
    """A dtype setting on `device`: auto = bfloat16 on CUDA, float32 on CPU."""
    if name == Dtype.auto:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[Dtype(name)]


def resolve_precision(config: RetoolConfig, training: bool = False) -> Precision:
    """The precision of a command: sampling only (eval, filter-pass-rate: `auto` = bf16 on CUDA) or training
    (`sft`, `train`). AdamW must update fp32 weights: an update smaller than half a weight's bfloat16 spacing
    rounds away, and at RL learning rates (1e-6) that is almost every update (measured: 1% of a bf16 layer's
    weights moved in 20 steps at lr 1e-6, all of an fp32 one). So in training `model.dtype=auto` on CUDA is
    fp32 weights under bf16 autocast, and with `rollout.dtype=auto` the engine still samples in bfloat16
    (vLLM in its own dtype; hf from a bf16 copy, except under FSDP2, which shares the fp32 policy). An
    explicit bfloat16/float16 `model.dtype` trains those weights as they are, with a warning. LoRA keeps the
    frozen base in `model.dtype` (peft keeps the adapters in fp32). vLLM, which runs on its own platform, takes
    `auto` there: bfloat16 where CUDA is, float32 on its CPU build."""
    model, rollout = config.model, config.rollout
    device = resolve_device(model.device)
    weights, autocast = dtype_on(model.dtype, device), config.trainer.bf16_autocast and training
    mixed = training and not model.lora_rank and model.dtype == Dtype.auto and device.type == "cuda"
    if mixed:
        log.info("model.dtype=auto on CUDA: training fp32 weights under bf16 autocast (mixed precision)")
        weights, autocast = torch.float32, True
    elif training and not model.lora_rank and weights != torch.float32:
        log.warning(
            "model.dtype=%s: training updates %s weights directly; AdamW steps smaller than half a weight's "
            "spacing in %s are lost (at RL learning rates, most of them). For mixed precision use "
            "model.dtype=float32 trainer.bf16_autocast=true (what model.dtype=auto picks on CUDA).",
            *[Dtype(model.dtype).value] * 3,
        )
    vllm = rollout.engine is RolloutEngine.vllm
    if rollout.dtype != Dtype.auto:
        sampling = DTYPES[Dtype(rollout.dtype)]
    elif mixed and (vllm or not config.trainer.fsdp):
        sampling = torch.bfloat16  # sample in bf16 (hf: a copy; not with FSDP2 yet)
    elif vllm and model.dtype == Dtype.auto:
        sampling = dtype_on(Dtype.auto, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    else:
        sampling = weights
    return Precision(device, weights, autocast, sampling)
