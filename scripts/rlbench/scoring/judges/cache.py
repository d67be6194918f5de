"""On-disk judgment cache: one small JSON file per judged prompt, written by atomic rename.

A pairwise key (`cache_key`) is the sha256 of (judge identity, rendered messages, the two outputs,
replicate index); a free-text key (`text_cache_key`, Judge.ask) is the sha256 of (judge's backend,
model and decoding, the prompt's purpose, its messages, max_tokens, replicate index). So a rerun of
the same evaluation asks the judge nothing, while another judge, prompt, decoding setting or
replicate asks again. The two kinds of key hash differently shaped payloads and never collide. Files are never rewritten in place: a writer puts the record in a private
temporary file in the same directory and renames it over the key's path, so concurrent evaluations
(several grader submissions, a baseline and a final evaluation) can share one directory; two writers
of one key both write a valid record and the last rename wins.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def cache_key(identity: dict, messages: list[dict], output_1: str, output_2: str, replicate: int | None) -> str:
    """The hex key of one judge call (replicate None: a deterministic judge, whose repeats agree)."""
    payload = {
        "judge": identity,
        "messages": messages,
        "output_1": output_1,
        "output_2": output_2,
        "replicate": replicate,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def text_cache_key(identity: dict, purpose: str, messages: list[dict], max_tokens: int, replicate: int | None) -> str:
    """The hex key of one free-text prompt (Judge.ask): `identity` is {backend, model, decoding};
    `purpose` names what the answer is for (e.g. "deepsearchqa-autorater"), so two tasks asking the
    same text for different ends keep apart; replicate None: a deterministic judge."""
    payload = {
        "judge": identity,
        "purpose": purpose,
        "messages": messages,
        "max_tokens": max_tokens,
        "replicate": replicate,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class JudgmentCache:
    """Records by key under `root/<key[:2]>/<key>.json`."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        """The stored record, or None (absent, or unreadable: then it is judged again and rewritten)."""
        try:
            return json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, record: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:8]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle, ensure_ascii=False)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
