"""retool copy-recipe: a shipped recipe (conf/recipe/) copied out for editing, used with --config-dir."""

from __future__ import annotations

from pathlib import Path

from retool_cli.compose import RECIPES_DIR
from retool_cli.errors import ConfigError
from retool_cli.files import atomic_open


def run(name: str, to: Path, new_name: str | None) -> Path:
    """Copy recipe `name` to to/recipe/(new_name or name).yaml (never over an existing file); the file written."""
    source = RECIPES_DIR / f"{name}.yaml"
    if not source.is_file():
        available = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
        raise ConfigError(f"no recipe {name!r}; shipped recipes: {available}")
    target = to / "recipe" / f"{new_name or name}.yaml"
    if target.exists():
        raise ConfigError(f"{target} exists; choose another --to or --as")
    with atomic_open(target) as handle:
        handle.write(source.read_text())
    print(f"wrote {target}\nuse it: retool train --config-dir {to} recipe={new_name or name}")
    return target
