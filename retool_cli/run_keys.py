"""Resuming by running the same command again: a run folder is tagged with a key of its config, and a new
run of an identical config continues the latest unfinished folder with that key (eval, train, filter)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from retool_cli.config import RetoolConfig
from retool_cli.errors import ConfigError
from retool_cli.files import atomic_open

log = logging.getLogger(__name__)
KEY_FILE = "run_key.txt"
LAYOUT_KEYS = (
    "nproc",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "collective_timeout_s",
    "fsdp",
    "fsdp_sharding",
    "save_on_signal",  # how a stop ends the run, and whether it continues one, not what it computes
    "stop_timeout_s",
    "resume",
)


def _plain(cfg: RetoolConfig) -> dict[str, Any]:
    """The config as plain, resolved values (enums as their names)."""
    return cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True))


def config_key(cfg: RetoolConfig) -> str:
    """Identifies a run: runs of identical configs may continue each other's unfinished work. The weights it
    starts from count too: a checkpoint retrained at the same path is another run's."""
    keep = _plain(cfg)
    keep.pop("eval", None)  # how it runs (batching aside) does not change what it measures
    # The layout (nodes, processes, sharding, the engine's span) is not the experiment: every node computes the
    # same key, and a checkpoint (whole weights, whole optimizer state) resumes on another layout.
    for key in LAYOUT_KEYS:
        keep["trainer"].pop(key, None)
    keep["sft"].pop("resume", None)
    keep["rollout"].pop("vllm_tensor_parallel_size", None)
    keep["questions_per_batch"] = cfg.eval.questions_per_batch  # ...but the chunking changes the seeds
    keep["weights"] = [weights_fingerprint(p) for p in (cfg.model.name_or_path, cfg.trainer.init_from) if p]
    return _digest(keep, 16)


def weights_fingerprint(path: str) -> list[Any]:
    """Name, size and modification time of a local model's weight files (a run folder: its latest checkpoint's);
    [] for a hub id. Cheap at any model size (no hashing of the weights)."""
    from retool_cli.checkpoint_paths import latest_checkpoint

    folder = Path(path)
    if (folder / "checkpoints").is_dir():
        folder = latest_checkpoint(folder) or folder
    files = sorted(p for pattern in ("*.safetensors", "*.bin") for p in folder.glob(pattern)) if folder.is_dir() else []
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def find_resumable(
    run_dir: Path, key: str, search_root: Path, finished: str = "results.json", progress: str = "samples.jsonl"
) -> Path:
    """The folder to write into: this one, or the latest unfinished run (no `finished` file, some `progress`
    file) of the same config key under `search_root` (train: metrics.jsonl / final.txt)."""
    if (run_dir / progress).exists():
        stored = (run_dir / KEY_FILE).read_text().strip() if (run_dir / KEY_FILE).exists() else key
        if stored != key:  # continuing would mix two runs' results in one folder
            raise ConfigError(
                f"{run_dir} holds an unfinished run of another config or other weights ({KEY_FILE}: {stored}, "
                f"this run's: {key}): give this run another hydra.run.dir, or turn resume off to start over there"
            )
        return run_dir
    candidates = [
        p.parent
        for p in search_root.rglob(KEY_FILE)
        if p.read_text().strip() == key
        and not (p.parent / finished).exists()
        and (p.parent / progress).exists()
        and p.parent != run_dir
    ]
    if not candidates:
        return run_dir
    latest = max(candidates, key=lambda p: (p / progress).stat().st_mtime)
    with atomic_open(run_dir / "resumed_into.txt") as handle:
        handle.write(f"{latest}\n")
    log.info("resuming the unfinished run in %s", latest)
    return latest


def write_key(out_dir: Path, key: str) -> None:
    """Atomically: the processes of a distributed run read it while rank 0 writes it (a plain write_text
    truncates first, and a reader can find it empty)."""
    with atomic_open(out_dir / KEY_FILE) as handle:
        handle.write(key + "\n")


def _digest(container: dict, length: int = 12) -> str:
    """A short sha256 of a config as JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(container, sort_keys=True, default=str).encode()).hexdigest()[:length]


def training_record(checkpoint: Path | None) -> dict | None:
    """The training run a checkpoint comes from: its folder, seed and setting (its Hydra config without the
    seed: the runs of a seed sweep share it). None for a model that is no training checkpoint of ours."""
    if checkpoint is None or checkpoint.parent.name != "checkpoints":
        return None
    run = checkpoint.parent.parent
    saved = run / ".hydra" / "config.yaml"
    if not saved.is_file():
        return {"run": str(run), "seed": None, "setting": None}
    config = OmegaConf.load(saved)
    try:
        container = cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
    except Exception:  # an interpolation that only resolves inside Hydra: compare the unresolved text
        container = cast(dict[str, Any], OmegaConf.to_container(config, resolve=False))
    seed = container.pop("seed", None)
    return {"run": str(run), "seed": seed, "setting": _digest(container)}


def setting_key(cfg: RetoolConfig, training: dict | None) -> str:
    """What an eval measures, seeds aside: runs that differ only in their seed (and the training seed of the
    checkpoint they evaluate) share it, so a report can put them together as one result with a spread."""
    keep = _plain(cfg)
    for key in ("seed", "ckpt", "eval"):
        keep.pop(key, None)
    if training is not None and training["setting"] is not None:  # the same training setting, any seed or step
        keep["model"]["name_or_path"] = training["setting"]
    return _digest(keep)
