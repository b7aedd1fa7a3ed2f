"""The `retool` command: a Typer app whose subcommands hand their arguments to `hydra.main`.

Typer gives the subcommand list and `retool --help`; Hydra owns everything after the subcommand
name (overrides, -m multirun, --cfg, --hydra-help, launchers), so sweeps and Slurm launchers work as in
any Hydra app. `retool COMMAND --help` is ours (command_help, help.py): the command's main keys with
their values as composed under the overrides typed, its config groups, examples.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from retool_cli import __version__, stops  # stops: the standard library only
from retool_cli.help import COMMANDS  # each Hydra command's one-line summary, also the first line of its --help

log = logging.getLogger("retool")

# Hydra flags, and whether each takes a value ("?" = optional value from a fixed set).
_HYDRA_FLAGS: dict[str, str | None] = {
    "-m": None, "--multirun": None, "-h": None, "--help": None, "--hydra-help": None, "--version": None,
    "--resolve": None, "--shell-completion": None, "-sc": "1", "--run": None, "-r": None,
    "-c": "1", "--cfg": "1", "-p": "1", "--package": "1", "-cp": "1", "--config-path": "1",
    "-cn": "1", "--config-name": "1", "-cd": "1", "--config-dir": "1", "--experimental-rerun": "1",
    "--info": "?",
}  # fmt: skip
_INFO_CHOICES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def hydra_argv(args: list[str]) -> list[str]:
    """Move Hydra's flags (with their values) before the overrides: Hydra's argparse takes the
    overrides as one positional list, so `a=1 -m b=2` would otherwise fail."""
    flags: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        kind = _HYDRA_FLAGS.get(name, "") if arg.startswith("-") else ""
        if kind == "":
            overrides.append(arg)
        elif kind == "1" and "=" not in arg and i + 1 < len(args):
            flags += [arg, args[i + 1]]
            i += 1
        elif kind == "?" and i + 1 < len(args) and args[i + 1] in _INFO_CHOICES:
            flags += [arg, args[i + 1]]
            i += 1
        else:
            flags.append(arg)
        i += 1
    return flags + overrides


def run_hydra_command(command: str, module: str, args: list[str]) -> None:
    """Compose `conf/<command>.yaml` with the overrides, convert it to the typed config, call `module`'s `run`
    (imported once the config is known good: a mistake in it is said in a second, before torch loads)."""
    import importlib

    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

    from retool_cli import preflight, run_lock
    from retool_cli.compose import CONF_DIR, register_configs, to_config
    from retool_cli.errors import Resumable, RetoolError
    from retool_cli.files import write_json
    from retool_cli.provenance import provenance
    from retool_cli.run_keys import restore_records

    def task(cfg: DictConfig) -> None:
        route_library_logs()
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        if Path(os.path.abspath(run_dir)) != typed_dir:  # a sweep's job or a dated folder: new, nothing to keep
            records.clear()
        overrides = list(hydra_cfg.overrides.task)  # this job's own (a sweep's jobs differ)
        try:
            config = to_config(cfg)
            stops.install(config.trainer.stop_timeout_s)  # again for a job a launcher (submitit) runs elsewhere
            stops.set_resume_hint(resume_command(command, overrides, run_dir, cfg))
            with run_lock.holding():  # the run folders this command claims, released at its end
                if not joins_a_run(command, overrides):
                    run_lock.check(run_dir)  # before anything is written there: one writer per folder
                if command != "train":  # train claims where it knows which process writes (rl/launch.py)
                    run_lock.claim(run_dir, command)
                record = provenance(config, [command, *args])
                record["overrides"] = overrides
                write_json(run_dir / "provenance.json", record)
                importlib.import_module(module).run(config, run_dir)
        except (RetoolError, OmegaConfBaseException) as exc:
            # Bad input, not a bug: one clear message, no traceback, non-zero exit, no empty run folder left, and
            # a folder of an earlier run described as before.
            log.error("%s", str(exc).strip())
            if kept_after_failure(run_dir, records) and isinstance(exc, Resumable):
                say_how_to_resume(command, overrides, run_dir, cfg)
            raise SystemExit(1) from None
        except stops.Stopped as stop:
            restore_records(run_dir, records)
            stopped(stop, command, overrides, run_dir, cfg)
        except Exception as exc:
            kept = kept_after_failure(run_dir, records)  # whatever the failure
            message = preflight.disk_problem(exc, run_dir)
            if message is None:
                raise  # a bug: Hydra prints where
            log.error("%s", message)
            if kept:  # what it wrote before the disk filled up is kept: resumed, not started over
                say_how_to_resume(command, overrides, run_dir, cfg)
            raise SystemExit(1) from None

    register_configs()
    if "--help" in args or "-h" in args:
        print(command_help(command, [a for a in args if not a.startswith("-")]), end="")
        return
    _quiet_libraries()
    argv = hydra_argv(args)
    try:
        preflight.check_config_files(argv)
        if not {"-m", "--multirun"} & set(argv):
            preflight.check_writable(argv, command)
    except RetoolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    joins = joins_a_run(command, argv)
    if not {"-m", "--multirun"} & set(argv) and not joins:
        run_lock.refuse_if_busy(argv)
    typed_dir, records = typed_folder_records(argv, joins)
    sys.argv = [f"retool {command}", *argv]
    hydra.main(config_path=str(CONF_DIR), config_name=command, version_base="1.3")(task)()


def typed_folder_records(argv: list[str], joins: bool) -> tuple[Path | None, dict[str, bytes]]:
    """The folder typed as hydra.run.dir, and what describes the run it already holds, read before Hydra writes
    this job's config over it (none by a rank or a later node: they share the first process's folder)."""
    from retool_cli.run_keys import run_records

    typed = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    if not typed:
        return None, {}
    folder = Path(os.path.abspath(typed[-1]))
    return folder, run_records(folder) if os.environ.get("RANK", "0") == "0" and not joins else {}


def kept_after_failure(run_dir: Path, records: dict[str, bytes]) -> bool:
    """After a failure: the records of the run the folder held before put back (run_keys.restore_records), a
    folder of bookkeeping alone removed; whether the folder is kept (it holds output)."""
    from retool_cli.run_keys import restore_records

    restore_records(run_dir, records)
    return not discard_if_empty(run_dir)


def joins_a_run(command: str, overrides: list[str]) -> bool:
    """A `retool train` of a node after the first: it shares node 0's run folder (and node 0 holds it)."""
    import os

    from retool_cli.rl.launch import later_node

    return command == "train" and later_node(overrides, os.environ)


# The key that turns resuming on (a bool), per command that resumes.
_RESUME_KEYS = {"train": "trainer.resume", "sft": "sft.resume", "eval": "eval.resume"}


def resume_command(command: str, overrides: list[str], run_dir: Path, cfg: Any) -> str:
    """The command line that continues this run: the same one, with resume turned on where the config turned it
    off, and the folder the run writes in (a run that resumed another's folder: that one)."""
    import shlex

    from omegaconf import OmegaConf

    kept = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    if command in _RESUME_KEYS:
        key = _RESUME_KEYS[command]
        if OmegaConf.select(cfg, key) is not True:
            kept = [o for o in kept if o.split("=", 1)[0].lstrip("+~") != key] + [f"{key}=true"]
    resumed = run_dir / "resumed_into.txt"
    folder = Path(resumed.read_text().strip()) if resumed.is_file() else run_dir
    return shlex.join(["retool", command, *kept, f"hydra.run.dir={folder}"])


def say_how_to_resume(command: str, overrides: list[str], run_dir: Path, cfg: Any) -> None:
    """After a failure the run can continue from (errors.Resumable, a full disk): the command that resumes it. A
    process of a run that `retool train` launched leaves it to the launcher."""
    if stops.REPORT_ENV not in os.environ:
        log.error("to resume, run: %s", resume_command(command, overrides, run_dir, cfg))


def stopped(stop: stops.Stopped, command: str, overrides: list[str], run_dir: Path, cfg: Any) -> None:
    """A stop signal ended the command: its one line on how to resume, the exit status of that signal. A process
    of a run that `retool train` launched (torchrun's ranks) reports to the launcher instead, which says it."""
    import os

    report = os.environ.get(stops.REPORT_ENV)
    if report:
        if os.environ.get("RANK", "0") == "0":
            Path(report).write_text(stop.name)
        stops.exit_quietly(0)  # the launcher reports the stop (and torchrun prints no failure of its own)
    if discard_if_empty(run_dir):
        log.error("stopped by %s before anything was written; run the same command again", stop.name)
        raise SystemExit(stop.exit_code)
    log.error("stopped by %s; to resume, run: %s", stop.name, resume_command(command, overrides, run_dir, cfg))
    raise SystemExit(stop.exit_code)


def command_help(command: str, overrides: list[str]) -> str:
    """The command's help, with its keys' values as composed under the overrides given (none if they fail)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from retool_cli.compose import CONF_DIR
    from retool_cli.help import COMMANDS, render

    values: dict[str, object] = {}
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=command, overrides=overrides)
        for key in COMMANDS[command].keys:
            value = OmegaConf.select(cfg, key, default="-")
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            values[key] = getattr(value, "value", value)  # an enum as the text one types
    except Exception as exc:  # an override that does not compose: the help without values, and why
        log.warning("(values not shown: %s)", str(exc).splitlines()[0])
    return render(command, values)


# What a run folder holds before its command has produced anything.
_BOOKKEEPING = {".hydra", "run_key.txt", "run_key.json", "resumed_into.txt", "provenance.json", ".retool.lock"}


def discard_if_empty(run_dir: Path) -> bool:
    """Remove a run folder that holds only Hydra's and our bookkeeping (a run that failed on bad input before
    writing anything), and its date folder if that is left empty. A folder with any output is kept."""
    import shutil

    here = Path.cwd().resolve()
    if not run_dir.is_dir() or run_dir.resolve() in (here, *here.parents):  # hydra.run.dir=. stays
        return False
    names = {p.name for p in run_dir.iterdir()}
    if not names <= _BOOKKEEPING | {f.name for f in run_dir.glob("*.log")}:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    if run_dir.resolve().is_relative_to(here / "outputs"):  # Hydra's outputs/CMD/DATE, when this was its only run
        with contextlib.suppress(OSError):
            run_dir.parent.rmdir()
    return True


# Libraries whose warnings reach the user through our log (once each), not through handlers of their own.
_LIBRARIES = ("huggingface_hub", "datasets", "transformers", "urllib3", "filelock", "fsspec", "torch")


class _OncePerMessage(logging.Filter):
    """A library's warning once: the hub's retries repeat one message with other numbers (`Retrying in 2s
    [Retry 2/5]`), and every new rank or engine repeats its start-up notes."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] not in _LIBRARIES:
            return True
        shape = re.sub(r"\d+", "N", record.getMessage())
        if shape in self.seen:
            return False
        self.seen.add(shape)
        return True


def route_library_logs() -> None:
    """Each library message once, in our log. The hub and `datasets` add a stderr handler of their own when they
    are imported (later, lazily) while also passing their records on to ours: every warning would print twice.
    Their loggers take no handler here."""
    for name in ("huggingface_hub", "datasets"):
        library = logging.getLogger(name)
        library.handlers.clear()
        library.addHandler = lambda handler: None  # type: ignore[method-assign,assignment]
        library.propagate = True
    once = _OncePerMessage()
    for handler in logging.getLogger().handlers:
        handler.addFilter(once)


def _quiet_libraries() -> None:
    """Our own progress display only: no per-file bars or warnings from transformers, datasets, the hub.
    Environment variables rather than imports, so that commands that never load a model start fast."""
    import os

    for key, value in {
        "TOKENIZERS_PARALLELISM": "false",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_CONFIGURE_LOGGING": "0",  # vLLM logs through our log, filtered (rollout/vllm_engine.py)
        "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10's notes (vLLM's NUMA binding on CPU); failures still raise
    }.items():
        os.environ.setdefault(key, value)


app = typer.Typer(
    name="retool",
    help="ReTool experiment suite: RL of tool-integrated math reasoning. "
    "Each subcommand takes Hydra overrides, e.g. `retool prepare recipe=dapo_smoke seed=1`; "
    "`retool <command> --help` shows its main keys (composed values, docs), config groups and examples.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_HYDRA_COMMAND: dict[str, Any] = {
    "context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
    "add_help_option": False,  # --help reaches run_hydra_command, which prints command_help (not Typer's)
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"retool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Subcommands below; each takes Hydra overrides."""


@app.command("prepare", help=COMMANDS["prepare"].what, **_HYDRA_COMMAND)
def prepare(ctx: typer.Context) -> None:
    run_hydra_command("prepare", "retool_cli.commands.prepare", ctx.args)


@app.command("decontaminate", help=COMMANDS["decontaminate"].what, **_HYDRA_COMMAND)
def decontaminate(ctx: typer.Context) -> None:
    run_hydra_command("decontaminate", "retool_cli.commands.decontaminate", ctx.args)


@app.command("filter-pass-rate", help=COMMANDS["filter-pass-rate"].what, **_HYDRA_COMMAND)
def filter_pass_rate(ctx: typer.Context) -> None:
    run_hydra_command("filter-pass-rate", "retool_cli.commands.filter_pass_rate", ctx.args)


@app.command("filter-merge")
def filter_merge(
    shards: Annotated[list[Path], typer.Argument(help="shard run folders (or a sweep folder holding them)")],
    out: Annotated[Path, typer.Option(help="where the merged files go")],
    low: Annotated[float, typer.Option(help="keep pass rate > low")] = 0.0,
    high: Annotated[float, typer.Option(help="keep pass rate < high")] = 1.0,
) -> None:
    """Join the shards of `retool filter-pass-rate -m shard.index=...` into one filtered file."""
    from retool_cli.commands.filter_pass_rate import merge

    _run_or_exit(merge, shards, out, low, high)


@app.command("sft", help=COMMANDS["sft"].what, **_HYDRA_COMMAND)
def sft(ctx: typer.Context) -> None:
    run_hydra_command("sft", "retool_cli.commands.sft", ctx.args)


@app.command("train", help=COMMANDS["train"].what, **_HYDRA_COMMAND)
def train(ctx: typer.Context) -> None:
    run_hydra_command("train", "retool_cli.commands.train", ctx.args)


@app.command("eval", help=COMMANDS["eval"].what, **_HYDRA_COMMAND)
def eval_(ctx: typer.Context) -> None:
    run_hydra_command("eval", "retool_cli.commands.eval", ctx.args)


@app.command("eval-report")
def eval_report(
    runs: Annotated[
        list[Path], typer.Argument(metavar="RUN", help="eval run folders, or folders to search for results.json")
    ],
    out: Annotated[
        Path | None, typer.Option(help="where report.md and report.png go (default: the first folder)")
    ] = None,
) -> None:
    """Compare eval runs (e.g. the jobs of `retool eval -m ckpt=A,B,C`): a markdown table and a plot."""
    from retool_cli.commands import eval_report as command

    _run_or_exit(command.run, runs, out)


@app.command("report")
def report(
    runs: Annotated[
        list[Path],
        typer.Argument(metavar="RUN_OR_SWEEP", help="run folders (train, eval, sft...) or folders holding them"),
    ],
    out: Annotated[Path | None, typer.Option(help="where report.html goes (default: the first folder)")] = None,
    compare: Annotated[
        list[Path] | None, typer.Option(help="two eval run folders to compare (give it twice; default: the first two)")
    ] = None,
    max_trajectories: Annotated[
        int, typer.Option(help="trajectories in the page, shared by the runs (whole problems, seeded)")
    ] = 2000,
    max_chars: Annotated[int, typer.Option(help="characters kept of each trajectory (cut in the middle)")] = 8000,
) -> None:
    """One self-contained report.html: provenance, curves, eval results, a trajectory browser, a comparison."""
    from retool_cli.commands import report as command

    if compare is not None and len(compare) != 2:
        raise typer.BadParameter("give --compare twice: two eval run folders", param_hint="--compare")
    if compare is not None and compare[0].resolve() == compare[1].resolve():
        raise typer.BadParameter(f"{compare[0]} given twice: compare two different runs", param_hint="--compare")
    if max_trajectories < 1:
        raise typer.BadParameter(f"{max_trajectories}: must be >= 1", param_hint="--max-trajectories")
    if max_chars < 1000:
        raise typer.BadParameter(f"{max_chars}: must be >= 1000", param_hint="--max-chars")
    _run_or_exit(command.run, runs, out, compare, max_trajectories, max_chars)


@app.command("copy-recipe")
def copy_recipe(
    name: Annotated[str, typer.Argument(help="a shipped recipe (see `retool train --help` for the list)")],
    to: Annotated[Path, typer.Option(help="config folder to copy into (as DIR/recipe/NAME.yaml)")] = Path("conf"),
    new_name: Annotated[str | None, typer.Option("--as", help="the copy's recipe name (default: NAME)")] = None,
) -> None:
    """Copy a shipped recipe out for editing; use it with `retool COMMAND --config-dir DIR recipe=NAME`."""
    from retool_cli.commands import copy_recipe as command

    _run_or_exit(command.run, name, to, new_name)


def _run_or_exit(run: Callable, *args: Any) -> None:
    """A command that is not a Hydra app: its errors (bad input) as one line on stderr and exit status 1."""
    from retool_cli.errors import RetoolError

    try:
        run(*args)
    except RetoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    stops.install()
    _quiet_libraries()  # before any command module imports torch (c10 reads its log level once, at load)
    try:
        app()
    except stops.Stopped as stop:  # a command outside Hydra's (report, eval-report, ...): its output is atomic
        log.error("stopped by %s", stop.name)
        exit_past_abandoned_work(stop.exit_code)
    except SystemExit as done:
        if done.code not in (0, None):
            exit_past_abandoned_work(done.code if isinstance(done.code, int) else 1)
        raise


def exit_past_abandoned_work(code: int) -> NoReturn:
    """A command that failed or was stopped may leave the overlapped sampler's threads in the middle of a batch
    (rl/overlap.py abandons them). The interpreter's teardown under a thread inside torch's C++ aborts the process
    ("terminate called without an active exception", exit 134) after the command said why it ended: then the exit
    skips the teardown (logs and streams flushed), as a stopping process does (stops.exit_quietly)."""
    if any(thread.name.startswith("retool-sampler") and thread.is_alive() for thread in threading.enumerate()):
        stops.exit_quietly(code)
    raise SystemExit(code)
