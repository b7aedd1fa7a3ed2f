"""Every config key carries its own documentation, declared with its field (config.doc), and `--help` reads it
from there: no key without help, no help shared by two keys, none read from comments."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil

from retool_cli import config
from retool_cli.help import COMMANDS, field_docs, render


def _sections() -> list[type]:
    return [c for _, c in inspect.getmembers(config, inspect.isclass) if dataclasses.is_dataclass(c)]


def test_every_field_declares_its_help_with_the_field() -> None:
    for section in _sections():
        for f in dataclasses.fields(section):
            help_text = f.metadata.get("help", "")
            assert len(help_text.split()) >= 2, f"{section.__name__}.{f.name}: no help declared with config.doc"


def test_every_key_has_help_of_its_own() -> None:
    docs = field_docs()
    assert len(docs) > 150 and "trainer.lr" in docs and "benchmark.data.path" in docs  # nested sections too
    by_text: dict[str, list[str]] = {}
    for key, text in docs.items():
        by_text.setdefault(text, []).append(key)
    # the same field reached twice (data.path and benchmark.data.path are one DataConfig field) may repeat;
    # two different fields may not share a text
    shared = {t: keys for t, keys in by_text.items() if len({k.split(".")[-1] for k in keys}) > 1}
    assert not shared, shared


def test_no_field_is_documented_by_a_comment_instead() -> None:
    """A comment on or just above a field is the old way, and help would not show it: config/ has none."""
    for module in [
        config,
        *(importlib.import_module(m.name) for m in pkgutil.iter_modules(config.__path__, "retool_cli.config.")),
    ]:
        no_field_comments(inspect.getsource(module))


def no_field_comments(source: str) -> None:
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(d, ast.Name) and d.id == "dataclass" for d in node.decorator_list
        ):
            for item in node.body:
                if isinstance(item, ast.AnnAssign):
                    around = lines[item.lineno - 2 : item.end_lineno]
                    assert not any(line.strip().startswith("#") or "  # " in line for line in around), (
                        f"{node.name}.{ast.unparse(item.target)}: document it with config.doc(..., help)"
                    )


def test_help_shows_each_key_with_its_own_text() -> None:
    docs = field_docs()
    for command, spec in COMMANDS.items():
        text = " ".join(render(command).split())
        for key in spec.keys:
            assert f"{key} {' '.join(docs[key].split())}" in text, (command, key)
