"""How a command's config is composed: the typed schema registered with Hydra, and a command line that beats
the recipe. The schema itself (keys, types, defaults, checks) is `config/`."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from retool_cli.config import RetoolConfig
from retool_cli.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parent


def _conf_dir() -> Path:
    """conf/ at the repository root (a checkout or an editable install); inside the package once installed
    from a wheel (pyproject maps the package retool_cli.conf to conf/)."""
    checkout = PACKAGE_DIR.parent / "conf"
    return checkout if (checkout / "command_defaults.yaml").is_file() else PACKAGE_DIR / "conf"


CONF_DIR = _conf_dir()
RECIPES_DIR = CONF_DIR / "recipe"  # a Hydra group: recipe=NAME


def register_configs() -> None:
    """Register the typed schema (recipes are the conf/recipe group, found by Hydra like any other group)."""
    _command_line_groups_after_recipe()
    ConfigStore.instance().store(name="retool_schema", node=RetoolConfig)


def _command_line_groups_after_recipe() -> None:
    """Make a config group chosen on the command line beat the recipe, as a value typed there does.

    A recipe is a `_global_` config merged after the groups of a command's defaults list, so in
    `retool eval recipe=dapo_smoke rollout=vllm` the recipe's `rollout.engine: hf` would overwrite the
    option the user chose (and `benchmark=aime24` would keep the recipe's 8 samples at temperature 1).
    Hydra has no setting for that order; this moves the options chosen on the command line (and what they
    include) to the end of each composed defaults list, after the recipe. Values typed on the command line
    are applied after every default, as always. Precedence, lowest first: schema defaults, the command's
    default groups, the recipe (with the groups it picks), groups chosen on the command line, values typed
    on the command line. Installed once, around Hydra 1.3's `create_defaults_list` (pinned: <1.4); it applies
    to runs, sweeps (each job's composition), `--cfg` and the compose API alike."""
    import hydra._internal.config_loader_impl as loader

    if getattr(loader.create_defaults_list, "retool_order", False):
        return
    original = loader.create_defaults_list

    def create_defaults_list(
        repo: Any, config_name: str | None, overrides_list: list, prepend_hydra: bool, skip_missing: bool
    ) -> Any:
        result = original(
            repo=repo,
            config_name=config_name,
            overrides_list=overrides_list,
            prepend_hydra=prepend_hydra,
            skip_missing=skip_missing,
        )
        choices = result.overrides.known_choices
        chosen = {
            o.key_or_group
            for o in overrides_list
            if o.key_or_group in choices and o.key_or_group != "recipe" and not o.is_hydra_override()
        }
        if not chosen or not choices.get("recipe"):
            return result
        moved = {d.config_path for d in result.defaults if d.override_key in chosen}
        while True:  # and the configs those options include
            more = {d.config_path for d in result.defaults if d.parent in moved} - moved
            if not more:
                break
            moved |= more
        result.defaults = [d for d in result.defaults if d.config_path not in moved] + [
            d for d in result.defaults if d.config_path in moved
        ]
        return result

    create_defaults_list.retool_order = True  # type: ignore[attr-defined]
    loader.create_defaults_list = create_defaults_list


def to_config(cfg: DictConfig) -> RetoolConfig:
    """Resolve and convert the composed DictConfig; runs every cross-field check. A key the schema does not
    have is refused like a typo: Hydra lets `+section.key=value` add one, and a recipe may carry one."""
    unknown = list(unknown_keys(cfg, RetoolConfig))
    if unknown:
        raise ConfigError(f"{'; '.join(unknown)}; `retool {cfg.get('command', 'COMMAND')} --help` lists the keys")
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except ConfigError as exc:
        raise ConfigError(_where(str(exc), cfg)) from None


def _where(message: str, cfg: DictConfig) -> str:
    """A data section's check names `data.KEY`; when it was `benchmark.data` that failed, say so."""
    benchmark_data = cfg.get("benchmark", {}).get("data") if message.startswith("data.") else None
    if benchmark_data is None:
        return message
    try:
        OmegaConf.to_object(cfg.data)
    except ConfigError:
        return message  # the `data` section itself
    try:
        OmegaConf.to_object(benchmark_data)
    except ConfigError as exc:
        if str(exc) == message:
            return f"benchmark.{message}"
    return message


def unknown_keys(node: DictConfig, schema: type, prefix: str = "") -> Iterator[str]:
    """`key: not a config key (did you mean ...?)` for each key of `node` (and of its sections) the schema lacks."""
    hints = typing.get_type_hints(schema)
    for key in list(node):
        name = f"{prefix}{key}"
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else f" ({prefix or 'the config'} has no such key)"
            yield f"{name}: not a config key{hint}"
            continue
        section = _dataclass_in(hints[key])
        value = node._get_node(key)
        if section is not None and isinstance(value, DictConfig) and not value._is_none():
            yield from unknown_keys(value, section, f"{name}.")


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass of a field typed `Section` or `Section | None`, else None."""
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate) and isinstance(candidate, type):
            return candidate
    return None
