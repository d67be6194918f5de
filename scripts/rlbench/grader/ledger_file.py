"""grader/ledger.jsonl on disk: each line whole or absent, and lines the disk refused written later.

A request is acknowledged only once its line is fsync'd (rlbench.fileio.jsonio.append_jsonl, which
truncates a partial line back). When the disk refuses a line (full), the grader answers that request
as a grader error (503, retryable) and queues the grader error's own line here: the queued lines are
written, oldest first, before any later line, so that every id ever answered ends up in the ledger
with the status it was answered with, and no later line can overtake a refused one.
"""

from __future__ import annotations

import errno
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from rlbench.fileio.jsonio import append_jsonl
from rlbench.grader.visible import AgentFiles

# A full disk or quota: retrying at once would only hold the grader's lock longer.
NOT_RETRIED = frozenset({errno.ENOSPC, errno.EDQUOT})


class LedgerFile:
    """The ledger of one run, started empty; `waiting` holds the lines the disk refused (oldest first)."""

    def __init__(self, path: Path):
        if path.exists() and path.stat().st_size:
            raise RuntimeError(f"{path} holds an earlier attempt's submissions; archive it first")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()  # an empty ledger is a record too: no submission was made
        self.path = path
        self.waiting: list[dict] = []

    def append(self, entry: dict, attempts: int = 3) -> None:
        """One line, whole or not at all, retried a few times: a transient I/O error must not fail
        the request. A full disk is not retried. Raises OSError when the line is not written."""
        for attempt in range(1, attempts + 1):
            try:
                append_jsonl(self.path, entry)
                return
            except OSError as exc:
                if attempt == attempts or exc.errno in NOT_RETRIED:
                    raise
                traceback.print_exc(file=sys.stderr)
                time.sleep(0.1 * attempt)

    def write_waiting(self, views: AgentFiles, after: Callable[[dict], None]) -> None:
        """The waiting lines, oldest first, each added to the agent's view (`views`) as it is
        written and handed to `after`; raises OSError (that line still waiting) while the disk refuses."""
        while self.waiting:
            entry = self.waiting[0]
            views.add(entry)
            try:
                self.append(entry)
            except BaseException:
                views.forget(entry["submission_id"])
                raise
            self.waiting.pop(0)
            after(entry)

    def try_waiting(self, views: AgentFiles, after: Callable[[dict], None]) -> None:
        """write_waiting, a refusal logged instead of raised: the lines wait for the next try."""
        try:
            self.write_waiting(views, after)
        except OSError as exc:
            print(f"grader: {len(self.waiting)} ledger line(s) wait for the disk to take them: {exc}", file=sys.stderr)
