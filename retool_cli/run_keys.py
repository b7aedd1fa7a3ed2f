"""Resuming by running the same command again: a run folder is tagged with a key of its config (run_key.txt;
the values it digests in run_key.json), and a new run of an identical config continues the latest unfinished
folder with that key (eval, train, filter). What only lays out, bounds or logs a run is not in the key, and a
command refused at a folder (another config, bad input) puts back the folder's records of the run it holds."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from retool_cli.config import RetoolConfig, plain_values
from retool_cli.errors import ConfigError
from retool_cli.files import atomic_open

log = logging.getLogger(__name__)
KEY_FILE = "run_key.txt"
KEYED_FILE = "run_key.json"  # beside it: the values the key digests, so that a refusal can say which differ
# What is not the experiment: how the run is laid out and bounded in time, and where it logs. The numbers do not
# depend on these (tests/cli/test_overlap.py: the same run colocated or separate, with 1 or 2 engine processes),
# so a run resumes under other values: on another layout, or with the longer engine timeout that an
# EngineTimeout's message advises, or checkpoints more or less often.
NOT_THE_EXPERIMENT = {
    "trainer": (
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
        "save_every",
        "keep_last",
        "tensorboard",
        "wandb_project",
    ),
    "rollout": (
        "vllm_tensor_parallel_size",
        "placement",
        "engine_processes",
        "engine_threads",
        "engine_restarts",
        "weight_bucket_mb",
        "engine_timeout_s",
    ),
    "sft": ("resume", "save_every"),
}
_keyed: dict[str, dict[str, Any]] = {}  # key -> the values it digests (config_key), for write_key
_claimed: set[Path] = set()  # run folders this process has tagged with its key (write_key)


def config_key(cfg: RetoolConfig) -> str:
    """Identifies a run: runs of identical configs may continue each other's unfinished work. The weights it
    starts from count too: a checkpoint retrained at the same path is another run's."""
    keep = plain_values(cfg)
    keep.pop("eval", None)  # how it runs (batching aside) does not change what it measures
    # The layout (nodes, processes, sharding, the engine's span and placement) is not the experiment: every node
    # computes the same key, and a checkpoint (whole weights, whole optimizer state) resumes on another layout.
    _drop_layout(keep)
    keep["questions_per_batch"] = cfg.eval.questions_per_batch  # ...but the chunking changes the seeds
    keep["weights"] = [weights_fingerprint(p) for p in (cfg.model.name_or_path, cfg.trainer.init_from) if p]
    key = _digest(keep, 16)
    _keyed[key] = keep
    return key


def _drop_layout(values: dict[str, Any]) -> None:
    """Remove from config values (plain, nested) what is not the experiment."""
    for section, keys in NOT_THE_EXPERIMENT.items():
        for key in keys:
            if isinstance(values.get(section), dict):
                values[section].pop(key, None)


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
                f"{run_dir} holds an unfinished run of another config or other weights "
                f"({_differences(run_dir, key) or f'{KEY_FILE}: {stored}, this run: {key}'}): give this run "
                "another hydra.run.dir, or turn resume off to start over there"
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
    """Tag the folder with the key, and beside it the values the key digests. Atomically: the processes of a
    distributed run read it while rank 0 writes it (a plain write_text truncates first, and a reader can find it
    empty)."""
    if key in _keyed:
        with atomic_open(out_dir / KEYED_FILE) as handle:
            json.dump(_keyed[key], handle, sort_keys=True, indent=1, default=str)
    with atomic_open(out_dir / KEY_FILE) as handle:
        handle.write(key + "\n")
    _claimed.add(out_dir.resolve())


def _differences(run_dir: Path, key: str) -> str:
    """The values by which this run's config differs from that of the run in `run_dir`, as `key: X there, Y here`
    ('' when either side's values are unknown: a folder from before KEYED_FILE)."""
    stored = run_dir / KEYED_FILE
    if key not in _keyed or not stored.is_file():
        return ""
    try:
        there = json.loads(stored.read_text())
    except (OSError, ValueError):
        return ""
    here = json.loads(json.dumps(_keyed[key], default=str))  # as the file holds them (tuples as lists, ...)
    there, here = _flat(there), _flat(here)
    differing = []
    for name in sorted(there.keys() | here.keys()):
        if there.get(name, "-") == here.get(name, "-"):
            continue
        if name == "weights":  # their files' names, sizes and times
            differing.append("the weights it starts from (retrained since?)")
        else:
            differing.append(f"{name}: {there.get(name, '-')!r} there, {here.get(name, '-')!r} here")
    return "; ".join(differing)


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config values as {dotted.key: value}."""
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


RECORDS = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "provenance.json")


def run_records(run_dir: Path) -> dict[str, bytes]:
    """What describes the run a folder holds (Hydra's config and overrides, provenance.json), read before a new
    command's Hydra job writes its own over them."""
    return {name: (run_dir / name).read_bytes() for name in RECORDS if (run_dir / name).is_file()}


def restore_records(run_dir: Path, records: dict[str, bytes]) -> None:
    """Put back the records of the run a folder holds, unless this command took the folder (write_key): a
    command refused there (another config, bad input) leaves the folder describing the run whose checkpoints and
    metrics it holds (training_record and the report read them)."""
    if not records or run_dir.resolve() in _claimed or not run_dir.is_dir():
        return
    for name, data in records.items():
        if (run_dir / name).is_file() and (run_dir / name).read_bytes() == data:
            continue
        (run_dir / name).parent.mkdir(exist_ok=True)
        with atomic_open(run_dir / name, "wb") as handle:
            handle.write(data)


def _digest(container: dict, length: int = 12) -> str:
    """A short sha256 of a config as JSON (keys sorted)."""
    return hashlib.sha256(json.dumps(container, sort_keys=True, default=str).encode()).hexdigest()[:length]


def training_record(checkpoint: Path | None) -> dict | None:
    """The training run a checkpoint comes from: its folder, seed and setting (its config without the seed and
    what is not the experiment: the runs of a seed sweep share it), from the config the checkpoint records (one
    copied out of its run folder keeps them), else its run's Hydra config. None for a model that is no training
    checkpoint of ours."""
    from retool_cli.checkpoint_paths import read_record

    if checkpoint is None:
        return None
    in_run = checkpoint.parent.name == "checkpoints"
    recorded = (read_record(checkpoint) or {}).get("config") if checkpoint.is_dir() else None
    if isinstance(recorded, dict):
        container = dict(recorded)
    elif not in_run:
        return None
    elif (checkpoint.parent.parent / ".hydra" / "config.yaml").is_file():
        container = _hydra_config(checkpoint.parent.parent / ".hydra" / "config.yaml")
    else:
        return {"run": str(checkpoint.parent.parent), "seed": None, "setting": None}
    run = checkpoint.parent.parent if in_run else checkpoint
    seed = container.pop("seed", None)
    _drop_layout(container)  # a run resumed on another layout rewrote its Hydra config: the same setting
    return {"run": str(run), "seed": seed, "setting": _digest(container)}


def _hydra_config(saved: Path) -> dict[str, Any]:
    config = OmegaConf.load(saved)
    try:
        return cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
    except Exception:  # an interpolation that only resolves inside Hydra: compare the unresolved text
        return cast(dict[str, Any], OmegaConf.to_container(config, resolve=False))


def setting_key(cfg: RetoolConfig, training: dict | None) -> str:
    """What an eval measures, seeds aside: runs that differ only in their seed (and the training seed of the
    checkpoint they evaluate) share it, so a report can put them together as one result with a spread."""
    keep = plain_values(cfg)
    for key in ("seed", "ckpt", "eval"):
        keep.pop(key, None)
    _drop_layout(keep)
    if training is not None and training["setting"] is not None:  # the same training setting, any seed or step
        keep["model"]["name_or_path"] = training["setting"]
    return _digest(keep)
