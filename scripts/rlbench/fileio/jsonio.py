"""Durable JSON and JSON-lines files: records that other tools read must never be half-written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
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


def write_text(path: Path, text: str, durable: bool = True) -> None:
    """Write text atomically, as write_json does (for JSON the caller has already encoded)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; records are meant to be read
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
    """Append one record and fsync before returning: an acknowledged record survives a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


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
    with open(path) as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
