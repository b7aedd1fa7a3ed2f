"""What a checkpoint knows about itself (retool_cli/checkpoint_paths.py) and how a command starts from one
(runtime.from_checkpoint): complete or not, named by the file; the model, tokenizer and protocol it was
trained with, and a typed value that contradicts them refused naming both."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from retool_cli.checkpoint_paths import (
    RECORD,
    latest_checkpoint,
    problem_with,
    record_of,
    resolve_checkpoint,
    write_record,
)
from retool_cli.config import ModelConfig, ProtocolConfig, ProtocolName, RetoolConfig, TrainerConfig
from retool_cli.errors import ConfigError
from retool_cli.runtime import from_checkpoint


def fake_checkpoint(run: Path, step: int, config: RetoolConfig) -> Path:
    folder = run / "checkpoints" / f"step_{step}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 1000)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "trainer_state.pt").write_bytes(b"s" * 100)
    write_record(folder, {"step": step, **record_of(config)})
    return folder


def trained(protocol: ProtocolName = ProtocolName.chat_tool, model: str = "Org/Base-7B") -> RetoolConfig:
    return RetoolConfig(
        command="sft",
        model=ModelConfig(name_or_path=model, tokenizer_class="PreTrainedTokenizerFast"),
        protocol=ProtocolConfig(name=protocol, system_prompt="trained prompt"),
    )


def test_the_record_lists_every_file_and_a_cut_short_or_missing_one_makes_it_incomplete(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first, second = fake_checkpoint(run, 1, trained()), fake_checkpoint(run, 2, trained())
    record = json.loads((second / RECORD).read_text())
    assert record["files"]["model.safetensors"] == 1000 and RECORD not in record["files"]
    assert record["base_model"] == "Org/Base-7B" and record["protocol"]["name"] == "chat_tool"
    assert problem_with(second) is None and latest_checkpoint(run) == second
    (second / "model.safetensors").write_bytes(b"w" * 10)  # a copy cut short
    assert "model.safetensors has 10 bytes, the checkpoint wrote 1000" in str(problem_with(second))
    warnings: list[str] = []
    assert latest_checkpoint(run, lambda *a: warnings.append(a[0] % a[1:])) == first  # resume falls back
    assert warnings == [f"passing over the incomplete checkpoint step_2: {problem_with(second)}"]
    with pytest.raises(ConfigError, match=r"^ckpt=.*step_2: an incomplete checkpoint: .*model.safetensors has 10"):
        resolve_checkpoint(str(second), "ckpt")
    (first / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"^trainer.init_from=.*step_2: .*model.safetensors has 10 bytes"):
        resolve_checkpoint(str(run), "trainer.init_from")  # nothing complete left: the latest's problem named


def test_a_checkpoint_brings_its_model_tokenizer_and_protocol_when_nothing_is_typed(tmp_path: Path) -> None:
    folder = fake_checkpoint(tmp_path / "sft", 3, trained())
    for command, key in (("eval", "ckpt"), ("train", "trainer.init_from")):
        config = RetoolConfig(command=command, ckpt=str(tmp_path / "sft"))
        if command == "train":
            config = replace(config, ckpt=None, trainer=TrainerConfig(init_from=str(tmp_path / "sft")))
        adopted = from_checkpoint(config, typed={key, "recipe"})
        assert adopted.model.name_or_path == str(folder)  # weights and tokenizer files: the checkpoint's
        assert adopted.model.tokenizer_class == "PreTrainedTokenizerFast"
        assert adopted.protocol.name is ProtocolName.chat_tool and adopted.protocol.system_prompt == "trained prompt"
    # its own checkpoints name the model it descends from, not the checkpoint it started at
    assert record_of(adopted)["base_model"] == "Org/Base-7B"


@pytest.mark.parametrize("typed", ["protocol", "protocol.system_prompt"])
def test_a_typed_protocol_that_contradicts_the_checkpoint_is_refused_naming_both(tmp_path: Path, typed: str) -> None:
    fake_checkpoint(tmp_path / "sft", 3, trained())
    config = RetoolConfig(command="eval", ckpt=str(tmp_path / "sft"))
    with pytest.raises(
        ConfigError, match=rf"^{typed} contradicts ckpt=.*trained with protocol=chat_tool .*protocol.name"
    ):
        from_checkpoint(config, typed={typed})
    on_purpose = replace(config, protocol=ProtocolConfig(override_checkpoint=True))
    assert from_checkpoint(on_purpose, typed={typed}).protocol.name is ProtocolName.retool_tags
    same = replace(config, protocol=trained().protocol)
    assert from_checkpoint(same, typed={"protocol"}).protocol == trained().protocol  # agreeing: fine


def test_a_typed_model_that_contradicts_the_checkpoint_is_refused_naming_both(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path / "sft", 3, trained(model="Org/Base-7B"))
    config = RetoolConfig(command="eval", ckpt=str(tmp_path / "sft"), model=ModelConfig(name_or_path="tiny"))
    with pytest.raises(ConfigError, match=r"^model.name_or_path=tiny contradicts ckpt=.*trained from Org/Base-7B"):
        from_checkpoint(config, typed={"model.name_or_path"})
    agreeing = replace(config, model=ModelConfig(name_or_path="Org/Base-7B"))
    assert from_checkpoint(agreeing, typed={"model.name_or_path"}).model.name_or_path.endswith("step_3")
