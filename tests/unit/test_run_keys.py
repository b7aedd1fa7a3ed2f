"""The run key: what a run is, so that the same command continues it, and what it is not (run_keys.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retool_cli.config import RetoolConfig, RolloutPlacement
from retool_cli.errors import ConfigError
from retool_cli.run_keys import (
    KEY_FILE,
    KEYED_FILE,
    NOT_THE_EXPERIMENT,
    config_key,
    find_resumable,
    restore_records,
    run_records,
    training_record,
    write_key,
)

# a value other than the default for each key that is not the experiment
OTHER_VALUES = {
    "trainer.nproc": 2,
    "trainer.nnodes": 2,
    "trainer.node_rank": 1,
    "trainer.master_addr": "10.0.0.2",
    "trainer.master_port": 29700,
    "trainer.collective_timeout_s": 60.0,
    "trainer.fsdp": True,
    "trainer.fsdp_sharding": "hybrid",
    "trainer.save_on_signal": True,
    "trainer.stop_timeout_s": 5.0,
    "trainer.resume": False,
    "trainer.save_every": 7,
    "trainer.keep_last": 9,
    "trainer.tensorboard": True,
    "trainer.wandb_project": "elsewhere",
    "rollout.vllm_tensor_parallel_size": 2,
    "rollout.placement": RolloutPlacement.separate,
    "rollout.engine_processes": 2,
    "rollout.engine_threads": 3,
    "rollout.engine_restarts": 5,
    "rollout.weight_bucket_mb": 8.0,
    "rollout.engine_timeout_s": 7200.0,
    "sft.resume": False,
    "sft.save_every": 9,
}
# and for some that are: what is sampled, how it is trained, what data
EXPERIMENT_VALUES = {
    "trainer.lr": 1e-3,
    "trainer.max_staleness": 1,
    "trainer.pack_sequences": True,
    "rollout.partial": True,
    "rollout.partial_turns": 2,
    "rollout.trajectory_timeout_s": 60.0,  # a deadline stops trajectories: it changes what is trained on
    "sandbox.timeout_s": 3.0,
    "seed": 1,
}


def with_value(dotted: str, value: object) -> RetoolConfig:
    cfg = RetoolConfig()
    *sections, name = dotted.split(".")
    owner = cfg
    for section in sections:
        owner = getattr(owner, section)
    assert hasattr(owner, name), dotted
    setattr(owner, name, value)
    return cfg


def test_what_only_lays_out_bounds_or_logs_a_run_leaves_its_key() -> None:
    assert {f"{s}.{k}" for s, keys in NOT_THE_EXPERIMENT.items() for k in keys} == set(OTHER_VALUES)
    default = config_key(RetoolConfig())
    for dotted, value in OTHER_VALUES.items():
        assert config_key(with_value(dotted, value)) == default, dotted
    for dotted, value in EXPERIMENT_VALUES.items():
        assert config_key(with_value(dotted, value)) != default, dotted


def unfinished_run(folder: Path, cfg: RetoolConfig) -> None:
    folder.mkdir(exist_ok=True)
    write_key(folder, config_key(cfg))
    (folder / "metrics.jsonl").write_text("{}\n")


def test_a_folder_of_another_config_is_refused_naming_the_values_that_differ(tmp_path: Path) -> None:
    unfinished_run(tmp_path, with_value("trainer.lr", 1e-3))
    other = with_value("trainer.lr", 1e-4)
    other.rollout.partial, other.trainer.max_staleness = True, 1
    with pytest.raises(ConfigError) as refused:
        find_resumable(tmp_path, config_key(other), tmp_path, "final.txt", "metrics.jsonl")
    said = str(refused.value)
    expected = "rollout.partial: False there, True here; trainer.lr: 0.001 there, 0.0001 here; "
    assert f"({expected}trainer.max_staleness: 0 there, 1 here)" in said, said
    # a folder written before run_key.json: the two keys, as before
    (tmp_path / KEYED_FILE).unlink()
    with pytest.raises(ConfigError, match=f"{KEY_FILE}: [0-9a-f]{{16}}, this run: {config_key(other)}"):
        find_resumable(tmp_path, config_key(other), tmp_path, "final.txt", "metrics.jsonl")


def test_retrained_starting_weights_are_named_as_such(tmp_path: Path) -> None:
    weights = tmp_path / "ckpt"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"weights")
    cfg = with_value("trainer.init_from", str(weights))
    unfinished_run(tmp_path / "run", cfg)
    (weights / "model.safetensors").write_bytes(b"retrained")
    with pytest.raises(ConfigError, match=r"other weights \(the weights it starts from \(retrained since\?\)\)"):
        find_resumable(tmp_path / "run", config_key(cfg), tmp_path, "final.txt", "metrics.jsonl")


def test_a_refused_command_puts_back_the_records_of_the_run_a_folder_holds(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("lr: 0.001\n")
    (tmp_path / "provenance.json").write_text('{"git": "abc"}\n')
    records = run_records(tmp_path)
    assert set(records) == {".hydra/config.yaml", "provenance.json"}
    (tmp_path / ".hydra" / "config.yaml").write_text("lr: 0.0001\n")  # what Hydra writes for the next command
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- trainer.lr=0.0001\n")
    (tmp_path / "provenance.json").write_text('{"git": "def"}\n')
    restore_records(tmp_path, records)
    assert (tmp_path / ".hydra" / "config.yaml").read_text() == "lr: 0.001\n"
    assert (tmp_path / "provenance.json").read_text() == '{"git": "abc"}\n'
    # a command that took the folder (its key written) made the records its own: they stay
    (tmp_path / "provenance.json").write_text('{"git": "def"}\n')
    write_key(tmp_path, "k" * 16)
    restore_records(tmp_path, records)
    assert (tmp_path / "provenance.json").read_text() == '{"git": "def"}\n'


def test_a_run_resumed_on_another_layout_keeps_its_setting(tmp_path: Path) -> None:
    """A resume under other values of what is not the experiment rewrites the run's Hydra config; the setting by
    which a report groups the run's checkpoints (training_record) stays, and a changed experiment value moves it."""
    from omegaconf import OmegaConf

    def setting(dotted: str, value: object) -> str | None:
        run = tmp_path / f"{dotted}={value}"
        (run / ".hydra").mkdir(parents=True)
        (run / "checkpoints" / "step_2").mkdir(parents=True)
        OmegaConf.save(OmegaConf.structured(with_value(dotted, value)), run / ".hydra" / "config.yaml")
        record = training_record(run / "checkpoints" / "step_2")
        assert record is not None
        return record["setting"]

    base = setting("seed", 0)
    assert setting("rollout.placement", RolloutPlacement.separate) == base
    assert setting("trainer.nproc", 2) == base
    assert setting("seed", 3) == base  # a seed sweep's runs share it too
    assert setting("trainer.max_staleness", 1) != base


def test_a_checkpoint_copied_out_of_its_run_keeps_its_setting_and_seed(tmp_path: Path) -> None:
    """The checkpoint's own record holds the config it was trained with: out of its run folder (no .hydra beside
    it) the setting and seed are the same as in it, and those of another seed's run share the setting."""
    import shutil

    from retool_cli.checkpoint_paths import record_of, write_record

    def checkpoint(run: str, seed: int) -> Path:
        folder = tmp_path / run / "checkpoints" / "step_5"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        cfg = with_value("seed", seed)
        cfg.command = "train"
        write_record(folder, {"step": 5, **record_of(cfg)})
        return folder

    in_run = training_record(checkpoint("a", 1))
    copied = tmp_path / "elsewhere" / "my_checkpoint"
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step_5", copied)
    out_of_it = training_record(copied)
    assert in_run is not None and out_of_it is not None and in_run["setting"] is not None
    assert (out_of_it["setting"], out_of_it["seed"]) == (in_run["setting"], in_run["seed"]) == (in_run["setting"], 1)
    other_seed = training_record(checkpoint("b", 2))
    assert other_seed is not None and (other_seed["setting"], other_seed["seed"]) == (in_run["setting"], 2)
    assert training_record(tmp_path / "elsewhere") is None  # no checkpoint of ours
