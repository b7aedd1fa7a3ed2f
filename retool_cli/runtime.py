"""What the commands open before their loop, built in one place: the values a config leaves to the run
resolved once, before anything reads them (`ckpt=` as the model to load, each process's device; the
precision is model/precision.py's), the run folder (a fresh one or the unfinished run
of the same config), and a Runtime (tokenizer, tool protocol, engine, code runner, judge) opened by one
`with`, closed together. Core code below the commands takes the config as it leaves here and never rewrites it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from retool_cli import run_lock
from retool_cli.checkpoint_paths import protocol_of, read_record, resolve_checkpoint, same_model
from retool_cli.config import ProtocolConfig, ProtocolName, RetoolConfig, RolloutEngine
from retool_cli.env.reward import Verifier
from retool_cli.env.sandbox import Sandbox
from retool_cli.env.tools import CodeInterpreter
from retool_cli.errors import ConfigError
from retool_cli.interfaces import Runtime, Tool, ToolProtocol
from retool_cli.model.precision import Precision
from retool_cli.rl.distributed import barrier
from retool_cli.rollout import build_engine
from retool_cli.run_keys import find_resumable, write_key

log = logging.getLogger(__name__)


def from_checkpoint(config: RetoolConfig, typed: set[str] | None = None) -> RetoolConfig:
    """The checkpoint a command starts from (`ckpt=` in eval and filter-pass-rate, `trainer.init_from` in train;
    a run folder: its latest complete one) becomes the model, with the tokenizer, chat template and protocol it
    was trained with. A model or protocol typed on the command line (`typed`: the keys and groups typed there,
    default: this Hydra job's) that contradicts the checkpoint is an error naming both; one that comes from a
    recipe or a default gives way to the checkpoint."""
    key, value = ("trainer.init_from", config.trainer.init_from) if config.command == "train" else ("ckpt", config.ckpt)
    if not value:
        return config
    typed = typed_keys() if typed is None else typed
    folder = resolve_checkpoint(value, key)
    record = read_record(folder) or {}
    model, trained_from = config.model, record.get("base_model")
    if trained_from and "model.name_or_path" in typed and not same_model(model.name_or_path, trained_from):
        raise ConfigError(
            f"model.name_or_path={model.name_or_path} contradicts {key}={value}, which was trained from "
            f"{trained_from}: leave model.name_or_path out (the checkpoint's own weights, tokenizer and chat "
            "template are used)"
        )
    if trained_from and not same_model(model.name_or_path, trained_from):
        log.info("%s: a checkpoint of %s (model.name_or_path=%s set aside)", key, trained_from, model.name_or_path)
    model = replace(
        model, name_or_path=str(folder), tokenizer_class=model.tokenizer_class or record.get("tokenizer_class")
    )
    return replace(config, model=model, protocol=checkpoint_protocol(config, record, key, value, typed))


def checkpoint_protocol(
    config: RetoolConfig, record: dict[str, Any], key: str, value: str, typed: set[str]
) -> ProtocolConfig:
    """The protocol to run a checkpoint under: the one it was trained with, unless protocol.override_checkpoint."""
    trained, ours = protocol_of(record), config.protocol
    if trained is None or ours.override_checkpoint or replace(trained, override_checkpoint=False) == ours:
        return ours
    typed_here = sorted(k for k in typed if k == "protocol" or k.startswith("protocol."))
    if typed_here:
        differ = [f.name for f in fields(ours) if getattr(ours, f.name) != getattr(trained, f.name)]
        raise ConfigError(
            f"{typed_here[0]} contradicts {key}={value}, trained with protocol={trained.name.value} (differing: "
            f"protocol.{', protocol.'.join(differ)}): leave it out to run the checkpoint as trained, or set "
            "protocol.override_checkpoint=true to run it under this one on purpose"
        )
    log.info("%s: running under the protocol it was trained with (protocol=%s)", key, trained.name.value)
    return trained


def typed_keys() -> set[str]:
    """The keys and config groups typed on this Hydra job's command line ({} outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        overrides = HydraConfig.get().overrides.task
    except ValueError:
        return set()
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def for_this_process(config: RetoolConfig, rank: int, size: int) -> RetoolConfig:
    """The config as this process runs it: under several processes its own device (each sandbox claims its own
    snippet uids, env/sandbox.py)."""
    if size > 1 and torch.cuda.is_available():
        config = replace(config, model=replace(config.model, device=f"cuda:{torch.cuda.current_device()}"))
    return config


def run_folder(
    config: RetoolConfig,
    run_dir: Path,
    key: str,
    finished: str,
    progress: str = "samples.jsonl",
    *,
    resume: bool = True,
    outputs: tuple[str, ...] = (),
) -> Path:
    """Where this run writes, tagged with the key. Resuming: `run_dir` when it holds an unfinished run of this
    config, else the unfinished run of the same config key under outputs/COMMAND (no `finished` file yet, some
    `progress` file), which it then continues. Not resuming: `run_dir`, emptied of the `outputs` a previous run
    left there (files or folders, by name): a rerun with resume off starts over instead of appending to them.
    Under torchrun only rank 0 removes or writes anything, and claims the folder (run_lock: one writer each; a
    folder a live run holds is refused, also as the unfinished run to continue)."""
    rank0 = os.environ.get("RANK", "0") == "0"
    run_lock.claim(run_dir, config.command)
    if resume:
        out_dir = find_resumable(run_dir, key, Path.cwd() / "outputs" / config.command, finished, progress)
        run_lock.claim(out_dir, config.command)
    else:
        out_dir = run_dir
        if rank0:
            start_over(run_dir, outputs)
    if rank0:
        write_key(out_dir, key)
    return out_dir


def start_over(run_dir: Path, outputs: tuple[str, ...]) -> None:
    """Remove what a previous run wrote into `run_dir` (its `outputs`, by name)."""
    removed = []
    for name in outputs:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(name)
    if removed:
        log.warning("starting over in %s (resume off): removed the previous run's %s", run_dir, ", ".join(removed))


@contextlib.contextmanager
def open_runtime(
    config: RetoolConfig,
    precision: Precision,
    tokenizer: Any,
    protocol: ToolProtocol,
    policy: Any = None,
    weights: str | None = None,
) -> Iterator[Runtime]:
    """The engine (sampling from `policy`; for a command that only samples, the model is loaded here, and vLLM
    loads `weights` itself), the tools when the protocol calls them (the code interpreter, over the sandbox), and the
    judge's worker processes. On the way out, once every process of the run got there, the engine is shut down:
    vLLM's takes its distributed groups (and the run's, which it shares across processes) down with it, where left
    to its finalizer at the interpreter's exit it found them gone and printed a traceback after every run of
    several processes. (An exception leaves it to the finalizer: a process that failed does not wait for the
    others.)"""
    if policy is None and config.rollout.engine is not RolloutEngine.vllm:
        from retool_cli.model.loading import load_model

        policy = load_model(config.model, precision).eval()
    engine = build_engine(config, precision, policy, tokenizer, weights=weights)
    with contextlib.ExitStack() as stack:
        use_tool = config.protocol.name is not ProtocolName.none
        tools: list[Tool] = []
        if use_tool:
            sandbox = stack.enter_context(Sandbox(config.sandbox))
            tools.append(CodeInterpreter(sandbox, tokenizer, config.rollout))
        judge = stack.enter_context(Verifier(config.reward.judge_timeout_s, config.reward.judge_workers))
        yield Runtime(tokenizer, protocol, engine, tools, judge)
    barrier()  # vLLM across processes: no process tears the groups down while another still uses them
    close = getattr(engine, "close", None)  # vLLM's; the hf engine holds nothing to shut down
    if close is not None:
        close()
