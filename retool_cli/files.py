"""Atomic file writes, the append-only JSONL logs the commands keep (samples, metrics, rollouts), hashing: an
output file is either complete or absent, never half-written; a log loses at most the line being written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from retool_cli.errors import DataError


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary sibling of `path`; rename it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_open(path) as handle:
        json.dump(obj, handle, indent=2, ensure_ascii=False, sort_keys=False)
        handle.write("\n")


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def append_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Append rows to a JSONL log and fsync: on disk before the run goes on."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl_log(path: str | Path, cut_torn_tail: bool = False) -> list[dict[str, Any]]:
    """The rows of a JSONL log ([] when absent). A torn last line (a run killed in mid-write) is skipped, and
    with `cut_torn_tail` cut off the file, so that a resumed run appends after whole lines; a bad line before
    the last is an error naming its file and line."""
    path = Path(path)
    if not path.exists():
        return []
    rows, good_bytes = [], 0
    with open(path, "rb") as handle:
        lines = handle.readlines()
    for line_no, line in enumerate(lines, start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError as exc:
            if line_no == len(lines):
                break
            raise DataError(f"{path}:{line_no}: malformed JSON ({exc.msg})") from None
        if row is not None and not isinstance(row, dict):
            raise DataError(f"{path}:{line_no}: expected a JSON object")
        rows += [row] if row is not None else []
        good_bytes += len(line)
    if cut_torn_tail and good_bytes < path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(good_bytes)
    return rows


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
