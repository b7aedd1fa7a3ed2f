"""Every repository path named in the code, comments and docs exists (and `file.py:name` names something in it):
a renamed or moved file must not leave pointers to where it was."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "retool_cli"
# A path counts when it starts at a folder of this repository, of the package, or at ../shared/; paths into other
# projects (trl/..., vllm/...) and into run folders (outputs/..., RUN/...) are not this repository's.
PATH = re.compile(r"(?<![\w./-])((?:\.\./shared/|[A-Za-z_][\w.-]*/)[\w./-]*[\w-])(?::(\w+))?")
DOCUMENT_NAMES = {"README", "DESIGN", "LICENSE"}
SUFFIXES = (".py", ".md", ".yaml", ".jinja", ".jsonl", ".json", ".sh", ".png", ".js", ".css", ".html", ".toml")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    keep = (".py", ".md", ".yaml", ".toml", ".sh", ".js", ".css")
    own = Path(__file__).resolve()  # its examples name paths that do not exist, on purpose
    files = [ROOT / f for f in listed.stdout.split() if f.endswith(keep) or f in ("Makefile", ".ci/run")]
    return [f for f in files if f.is_file() and f.resolve() != own]  # (a deleted file not yet staged is gone)


def _roots() -> set[str]:
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in (".git", ".venv", "outputs")}
    return tops | {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}


def named_paths(text: str, roots: set[str]) -> list[tuple[str, str | None]]:
    """(path, name after a colon or None) for each repository path in `text`."""
    found = []
    for match in PATH.finditer(text):
        path, name = match.group(1).rstrip("."), match.group(2)
        first = path.split("/")[0]
        if not (path.startswith("../shared/") or first in roots):
            continue
        parts = [part for part in re.split(r"[/.]", path) if len(part) > 1]
        if any((part.isupper() and part not in DOCUMENT_NAMES) or part in ("...", "*") for part in parts):
            continue  # a placeholder: conf/recipe/NAME.yaml, commands/CMD.py
        if not path.endswith(SUFFIXES):
            continue  # a metric's name (rollout/turns), not a file
        found.append((path, name))
    return found


def _resolve(path: str, source: Path) -> Path | None:
    if path.startswith("../shared/"):
        return ROOT.parent / path[3:]
    for base in (ROOT, PACKAGE, source.parent):
        if (base / path).exists():
            return base / path
    return None


def test_every_repository_path_named_exists() -> None:
    roots = _roots()
    shared = (ROOT.parent / "shared").is_dir()
    missing = []
    for source in _tracked_text_files():
        for path, name in named_paths(source.read_text(errors="ignore"), roots):
            if path.startswith("../shared/") and not shared:
                continue  # a checkout without shared/ beside it
            target = _resolve(path, source)
            if target is None or not target.exists():
                missing.append(f"{source.relative_to(ROOT)}: {path}")
            elif name and target.is_file() and not re.search(rf"\b{name}\b", target.read_text(errors="ignore")):
                missing.append(f"{source.relative_to(ROOT)}: {path}:{name} (no {name} in it)")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_scan_finds_paths_and_skips_placeholders_and_other_projects() -> None:
    roots = {"retool_cli", "rl", "conf", "docs"}
    text = (
        "see rl/logprobs.py:sequence_logprobs and retool_cli/nowhere.py, conf/recipe/NAME.yaml, trl/trainer/x.py, "
        "outputs/smoke/report.html, ../shared/DESIGN.md."
    )
    assert named_paths(text, roots) == [
        ("rl/logprobs.py", "sequence_logprobs"),
        ("retool_cli/nowhere.py", None),
        ("../shared/DESIGN.md", None),
    ]
    assert _resolve("retool_cli/nowhere.py", PACKAGE / "cli.py") is None
    assert _resolve("rl/logprobs.py", PACKAGE / "cli.py") == PACKAGE / "rl" / "logprobs.py"
