"""Prompts longer than rollout.max_prompt_tokens: dropped from training (counted), never silently all."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from retool_cli.config import ProtocolConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.protocol import build_protocol, drop_overlong_prompts, overlong_prompts
from retool_cli.errors import DataError
from retool_cli.model.tiny import tiny_model_path


def test_overlong_prompts_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    protocol = build_protocol(ProtocolConfig(), AutoTokenizer.from_pretrained(tiny_model_path()))
    short = [MathExample(f"s{i}", f"What is {i} + 1?", str(i + 1), "t") for i in range(3)]
    long = [MathExample("l0", "What is " + " + ".join(["1"] * 200) + "?", "200", "t")]
    limit = max(len(protocol.prompt_ids(ex.question)) for ex in short)
    assert overlong_prompts(protocol, short + long, limit) == long
    with caplog.at_level("WARNING"):
        kept = drop_overlong_prompts(short + long, protocol, limit)
    assert kept == short and "dropped 1 of 4" in caplog.text
    with pytest.raises(DataError, match="every training question"):
        drop_overlong_prompts(long, protocol, limit)
