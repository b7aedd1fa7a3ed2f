"""Fixtures the unit tests share: the tiny model's tokenizer and a real sandbox (a module may define its own)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from retool_cli.config import Isolation, SandboxConfig
from retool_cli.env.sandbox import Sandbox
from retool_cli.model.tiny import tiny_model_path


@pytest.fixture(scope="session")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(scope="session")
def sandbox():
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=2, timeout_s=5)) as box:
        yield box
