"""Durable JSON and JSON-lines files: records that other tools read must never be half-written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator


def write_json(path: Path, data: Any, durable: bool = True) -> None:
    """Write JSON atomically (temp file + rename), so readers never see a partial file.

    durable: fsync before the rename, so the file survives a crash of the machine, not only of the
    process. Files derived from a record that is itself fsync'd (the agent's view of the ledger,
    rewritten on every request) pass False: they stay atomic, and an fsync per request would make
    a flood of requests cost a disk flush each.

    The grader writes into agent-writable workspaces: the temporary file gets a fresh random name
    and is created exclusively (mkstemp: O_CREAT|O_EXCL), so a symlink the agent planted under a
    predictable name can never redirect the write outside, and the rename replaces a symlink at
    `path` itself rather than the file it points to.
    """
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", durable=durable)


def write_text(path: Path, text: str, durable: bool = True, mode: int = 0o644) -> None:
    """Write text atomically, as write_json does (for JSON the caller has already encoded); the
    file gets permissions `mode`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # mkstemp creates 0600; records are meant to be read
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def encoded_list(items: list[str], indent: int = 2) -> str:
    """A JSON array of already-encoded values, one per line, indented by `indent` (what json.dumps
    with indent would give for the array, its items kept on one line each).

    Encoding a long list with indent goes through json's pure-Python encoder; callers that
    rewrite a growing list on every request encode each item once (json.dumps, the C encoder)
    and join the lines here, which costs a string copy, not an encoding of the whole list."""
    if not items:
        return "[]"
    pad = " " * indent
    return f"[\n{pad}  " + f",\n{pad}  ".join(items) + f"\n{pad}]"


def read_json(path: Path) -> Any:
    with open(path) as handle:
        return json.load(handle)


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record and fsync before returning: an acknowledged record survives a crash.

    The line is whole or absent: if the write or the fsync fails (a full disk writes part of the
    line, then refuses the rest), the file is truncated back to its length before the append and
    the OSError is raised, so the caller must not acknowledge the record. A torn tail that an
    earlier crash left (bytes after the last newline: never an acknowledged record) is cut off
    first, so that the new line never glues onto it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        start = _whole_lines_length(fd)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, start)
                os.fsync(fd)
            except OSError as exc:  # the next append cuts the torn tail off (see above)
                print(f"append_jsonl: could not truncate {path} back to {start} bytes: {exc}", file=sys.stderr)
            raise
    finally:
        os.close(fd)


def _whole_lines_length(fd: int, block: int = 1 << 16) -> int:
    """The file's length up to and including its last newline; a torn tail after it is truncated."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        chunk = os.pread(fd, min(block, end), end - min(block, end))
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = end - len(chunk) + newline + 1
            break
        end -= len(chunk)
    if end < size:
        print(f"append_jsonl: cutting a torn last line ({size - end} bytes, never acknowledged) off", file=sys.stderr)
        os.ftruncate(fd, end)
    return end


def write_jsonl(path: Path, records: Iterable[dict]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            count += 1
    return count


def read_jsonl(path: Path) -> Iterator[dict]:
    """The records of a JSON-lines file, one per non-blank line.

    A last line without its newline that is not valid JSON is a torn append (a crash or a full disk
    in the middle of a write: never an acknowledged record): it is skipped with a warning on stderr.
    Any other line that is not JSON is corruption, and raises ValueError naming the line."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                if not line.endswith(b"\n"):  # only the last line can lack one
                    print(f"read_jsonl: {path}: skipping a torn last line {number} ({len(line)} bytes): {exc}", file=sys.stderr)
                    return
                raise ValueError(
                    f"{path}: line {number} is not valid JSON ({exc}); only a torn last line is skipped: "
                    "the file is corrupt in the middle, restore it from a copy or repair that line by hand"
                ) from None
            yield record


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
