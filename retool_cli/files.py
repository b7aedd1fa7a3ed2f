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
    os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; give the file the usual permissions
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


def umask() -> int:
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
    with `cut_torn_tail` cut off the file, so that a resumed run appends after whole lines (a last line that
    lacks its newline is cut too: the appender writes it with one, and the next row would join it); a bad line
    before the last is an error naming its file and line."""
    path = Path(path)
    if not path.exists():
        return []
    rows, ends = [], [0, 0]  # where the last two rows end
    for _, end, row in iter_jsonl_log(path):
        rows.append(row)
        ends = [ends[1], end]
    if cut_torn_tail:
        with open(path, "rb") as handle:
            handle.seek(max(0, ends[1] - 1))
            if rows and handle.read(1) != b"\n":
                rows.pop()
                ends = [0, ends[0]]
        if ends[1] < path.stat().st_size:
            with open(path, "r+b") as handle:
                handle.truncate(ends[1])
    return rows


def iter_jsonl_log(path: str | Path) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(start, end, row) for each row of a JSONL log, with its byte offsets in the file, read a line at a time
    (a log of any size in little memory). Blank lines are passed over, a torn last line is skipped, a bad line
    before the last is an error naming its file and line."""
    with open(path, "rb") as handle:
        start, line_no, line = 0, 1, handle.readline()
        while line:
            following = handle.readline()
            try:
                row = json.loads(line) if line.strip() else None
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                if not following:
                    return
                raise DataError(f"{path}:{line_no}: {_what_is_wrong(exc)}") from None
            if row is not None and not isinstance(row, dict):
                raise DataError(f"{path}:{line_no}: expected a JSON object")
            if row is not None:
                yield start, start + len(line), row
            start, line_no, line = start + len(line), line_no + 1, following


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file; a line that is not UTF-8 is an error naming the file, the line
    and the column (the default decoder names neither)."""
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                yield line_no, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}:{line_no}: {_what_is_wrong(exc)}") from None


def read_text(path: str | Path) -> str:
    """A whole UTF-8 text file; bytes that are not UTF-8 are an error naming the file and line."""
    return "".join(line for _, line in text_lines(path))


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a parquet file; a file that is not parquet (empty, cut short, another format) is an error
    naming it."""
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as exc:
        size = Path(path).stat().st_size
        raise DataError(
            f"{path}: not a readable parquet file ({size} bytes: {str(exc).splitlines()[0]}); was it copied whole?"
        ) from None


def _what_is_wrong(exc: ValueError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start : exc.start + 1].hex()
        column = len(exc.object[: exc.start].decode("utf-8", errors="replace")) + 1
        return f"not UTF-8 text (byte 0x{bad} at column {column}); save the file as UTF-8"
    assert isinstance(exc, json.JSONDecodeError)
    return f"malformed JSON ({exc.msg})"


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
