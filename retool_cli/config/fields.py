"""How a config field is declared (`doc`: with its documentation) and checked (`_check`: an error that
names the key)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field
from typing import Any

from retool_cli.errors import ConfigError


def doc(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None) -> Any:
    """A config field with its documentation, declared together: `retool COMMAND --help` shows `help` (help.py).
    `factory` makes a mutable default (a list, a dict, a nested section) per instance."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")
