"""`rollout.engine=vllm`: a thin adapter over vLLM's offline `LLM` (optional extra: pip install -e ".[vllm]").

Written against vLLM's public API of the 0.10/0.11 series: `vllm.LLM(model, dtype, seed,
gpu_memory_utilization, enable_sleep_mode, worker_extension_cls)`, `LLM.generate` with
`TokensPrompt(prompt_token_ids=...)` and one `SamplingParams` per request (`max_tokens`, `stop`,
`include_stop_str_in_output`, `logprobs=0`, `seed`), `LLM.collective_rpc` to reach the workers,
`LLM.sleep(level=1)` / `LLM.wake_up()`, and `distributed_executor_backend="external_launcher"` for one
engine per torchrun process (as TRL's colocate mode builds it, trl/generation/vllm_generation.py). It
is imported only when selected; it cannot run on a machine without a GPU, and is not exercised by the
CPU test suite.

Token-in, token-out: prompts go in as ids, the sampled ids and their logprobs come back as they were.
The logprobs are vLLM's default ("raw", before temperature; the hf engine's are after it): trajectories
record them, the trainer recomputes its own.
"""

from __future__ import annotations

from typing import Any

import torch

from retool_cli.errors import ConfigError
from retool_cli.modeling import resolve_dtype
from retool_cli.rollout.hf_engine import Generation, Sampling


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(
            "rollout.engine=vllm needs vLLM, which is not installed here: pip install -e '.[vllm]' on a CUDA "
            "machine, or use rollout.engine=hf"
        ) from exc
    return vllm


class WeightSyncExtension:
    """Mixed into vLLM's worker (worker_extension_cls): receives the trainer's weights in place."""

    def load_named_tensors(self, named_tensors: list[tuple[str, Any]]) -> int:
        self.model_runner.model.load_weights(weights=named_tensors)  # type: ignore[attr-defined]
        return len(named_tensors)


class VLLMEngine:
    def __init__(self, model_path: str, dtype: str, seed: int, gpu_memory_utilization: float, sleep_mode: bool,
                 max_model_len: int) -> None:  # fmt: skip
        vllm = _import_vllm()
        self._vllm = vllm
        self.sleep_mode = sleep_mode
        self.dtype = resolve_dtype(dtype, torch.device("cuda"), "rollout.dtype")  # what weight syncs send
        self.llm = vllm.LLM(
            model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=sleep_mode, max_model_len=max_model_len, enable_prefix_caching=True,
            worker_extension_cls=f"{__name__}.WeightSyncExtension", **_per_process_engine(),
        )  # fmt: skip

    def generate(self, prompts: list[list[int]], max_new_tokens: list[int], stop_strings: list[str],
                 sampling: Sampling) -> list[Generation]:  # fmt: skip
        from vllm.inputs import TokensPrompt

        params = [
            self._vllm.SamplingParams(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                max_tokens=budget, stop=stop_strings or None, include_stop_str_in_output=True, logprobs=0,
                seed=sampling.seed + i,  # per-request seed: the same request samples the same tokens
            )
            for i, budget in enumerate(max_new_tokens)
        ]  # fmt: skip
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        return [_to_generation(out.outputs[0]) for out in outputs]

    def update_weights(self, policy: Any) -> None:
        """After an optimizer step: copy the trainer's weights into the engine, without a restart (a LoRA
        policy's adapters merged in, under the base model's names; an FSDP2 policy's shards gathered)."""
        from retool_cli.distributed import weight_chunks
        from retool_cli.modeling import is_lora, merged_state_dict

        state = merged_state_dict(policy) if is_lora(policy) else policy.state_dict()
        for chunk in weight_chunks(state.items(), self.dtype):  # in the engine's dtype, ~1 GiB at a time
            self.llm.collective_rpc("load_named_tensors", args=(chunk,))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def sleep(self) -> None:
        if self.sleep_mode:
            self.llm.sleep(level=1)  # frees KV cache and offloads weights while the trainer uses the GPU

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()


def _per_process_engine() -> dict[str, Any]:
    """Under torchrun (`trainer.nproc` > 1) each training process gets its own engine on its own GPU: vLLM
    runs inside the process that torchrun's RANK / LOCAL_RANK / WORLD_SIZE describe ("external_launcher",
    as TRL's colocate mode does) instead of starting a worker that would take the first visible GPU in
    every process."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return {"distributed_executor_backend": "external_launcher"}
    return {}


def _to_generation(completion: Any) -> Generation:
    ids = list(completion.token_ids)
    logprobs = [entry[token].logprob for token, entry in zip(ids, completion.logprobs or [], strict=False)]
    if completion.finish_reason == "length":
        finish = "length"
    else:  # "stop": stop_reason is the stop string that matched, or None / a token id for EOS
        finish = "stop" if isinstance(completion.stop_reason, str) else "eos"
    return Generation(ids, logprobs + [0.0] * (len(ids) - len(logprobs)), finish)
