"""Checks that run before Hydra composes or writes anything, and the words for what the disk refuses.

Hydra reads the config files and creates the run folder before a command's code runs; a malformed YAML file or
an output folder on a read-only disk would fail inside Hydra with a traceback (and a half-made folder). These
checks say the same in one line naming the file. `disk_problem` turns a full or read-only disk met later, by
any write of any library, into one line that says so. The standard library only: it runs before the imports.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from retool_cli.errors import ConfigError

_CONFIG_DIR_FLAGS = ("-cd", "--config-dir")


def config_dirs(argv: list[str]) -> list[Path]:
    """The config folders a command line adds (`--config-dir DIR`, `-cd DIR`, `--config-dir=DIR`)."""
    dirs = []
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in _CONFIG_DIR_FLAGS:
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            dirs.append(Path(value))
    return dirs


def check_config_files(argv: list[str]) -> None:
    """Every YAML file of the shipped config folder and of the folders the command line adds parses; a file
    that does not is named with its line and column (Hydra would print a parser traceback)."""
    import yaml

    from retool_cli.compose import CONF_DIR

    for folder in [CONF_DIR, *config_dirs(argv)]:
        if not folder.is_dir():
            raise ConfigError(f"--config-dir {folder}: no such folder")
        for path in sorted(folder.rglob("*.yaml")):
            try:
                yaml.safe_load(path.read_text(encoding="utf-8"))
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
                problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
                raise ConfigError(f"{where}: malformed YAML ({problem})") from None
            except UnicodeDecodeError:
                raise ConfigError(f"{path}: not UTF-8 text; save it as UTF-8") from None


def check_writable(argv: list[str], command: str) -> None:
    """The folder the run will write in (a typed `hydra.run.dir`, else ./outputs/COMMAND) can be created and
    written: a read-only disk, a folder without write permission or a full disk is refused before Hydra makes
    anything there."""
    typed = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    target = Path(typed[-1]) if typed else Path.cwd() / "outputs" / command
    existing = target.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"hydra.run.dir={target}: {existing} is a file, not a folder")
    where = f"hydra.run.dir={target}" if typed else f"the run folder {target}"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise ConfigError(f"{where}: {existing} is on a read-only file system; pick a writable hydra.run.dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: no permission to write in {existing}; pick a writable hydra.run.dir")
    if shutil.disk_usage(existing).free == 0:
        raise ConfigError(f"{where}: no space left on the device holding {existing}; free some and run again")


_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_REFUSED = {errno.EROFS: "a read-only file system", errno.EACCES: "no permission", errno.EPERM: "not permitted"}
_NEARLY_FULL = 16 << 20  # bytes free under which a failed write is most likely the full disk


def disk_problem(exc: BaseException, run_dir: Path) -> str | None:
    """One line for a failure the disk caused: full (or over quota) or refusing writes; None for anything else.
    Libraries that write through C (torch.save, safetensors) raise their own errors without errno, so a
    failure while the run folder's disk is nearly full is reported as the full disk it most likely is."""
    if isinstance(exc, OSError) and exc.errno in _FULL:
        return (
            f"No space left on device writing {exc.filename or run_dir}: free space there (df -h {run_dir}), then "
            "run the command again"
        )
    if isinstance(exc, OSError) and exc.errno in _REFUSED and exc.filename:
        return f"{exc.filename}: {_REFUSED[exc.errno]} to write there ({exc.strerror}); pick a writable hydra.run.dir"
    folder = run_dir.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < _NEARLY_FULL:
        return (
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} -- the disk holding {folder} is "
            f"full ({free >> 10} KiB free; No space left on device): free space, then run the command again"
        )
    return None
