"""What the commands that sample (eval, filter-pass-rate, train) open before their loop, built in one place:
the checkpoint applied to the config, the run folder (a fresh one or the unfinished run of the same config),
and a Runtime (tokenizer, tool protocol, engine, code runner, judge) opened by one `with`, closed together."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from retool_cli.config import Engine as EngineName
from retool_cli.config import ProtocolName, RetoolConfig
from retool_cli.env.reward import Verifier
from retool_cli.env.sandbox import Sandbox
from retool_cli.eval.sampling import resolve_checkpoint
from retool_cli.interfaces import CodeRunner, Engine, ToolProtocol
from retool_cli.rollout import build_engine
from retool_cli.runs import find_resumable, write_key


def with_checkpoint(config: RetoolConfig) -> RetoolConfig:
    """`ckpt=` (a checkpoint, or a training run folder's latest) becomes the model to load."""
    if not config.ckpt:
        return config
    return replace(config, model=replace(config.model, name_or_path=str(resolve_checkpoint(config.ckpt))))


def run_folder(config: RetoolConfig, run_dir: Path, key: str, finished: str, progress: str = "samples.jsonl") -> Path:
    """Where this run writes: `run_dir`, or the unfinished run of the same config key under outputs/COMMAND
    (no `finished` file yet, some `progress` file), which it then continues. Tagged with the key."""
    out_dir = find_resumable(run_dir, key, Path.cwd() / "outputs" / config.command, finished, progress)
    write_key(out_dir, key)
    return out_dir


@dataclass
class Runtime:
    tokenizer: Any
    protocol: ToolProtocol
    engine: Engine
    sandbox: CodeRunner | None  # None with protocol=none (no tool to run)
    judge: Verifier


@contextlib.contextmanager
def open_runtime(
    config: RetoolConfig, tokenizer: Any, protocol: ToolProtocol, policy: Any = None, weights: str | None = None
) -> Iterator[Runtime]:
    """The engine (sampling from `policy`; for a command that only samples, the model is loaded here, and vLLM
    loads `weights` itself), the sandbox when the protocol calls tools, and the judge's worker processes."""
    if policy is None and config.rollout.engine is not EngineName.vllm:
        from retool_cli.model.loading import load_model

        policy = load_model(config.model).eval()
    engine = build_engine(config, policy, tokenizer, weights=weights)
    with contextlib.ExitStack() as stack:
        use_tool = config.protocol.name is not ProtocolName.none
        sandbox = stack.enter_context(Sandbox(config.sandbox)) if use_tool else None
        judge = stack.enter_context(Verifier(config.reward.judge_timeout_s, config.reward.judge_workers))
        yield Runtime(tokenizer, protocol, engine, sandbox, judge)
