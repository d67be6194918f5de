"""The files the grader keeps in the agent's workspace: timer.sh, run_meta.json, scores.json, submissions.json.

They carry the reference harness's fields with the reference's meanings (see rlbench.recording.ledger);
our own fields sit beside them. They are derived from the fsync'd ledger: rewritten atomically but
without fsync, only when they change, from entries encoded once, and submissions.json lists the last
SUBMISSIONS_SHOWN requests, so that a flood of requests costs each one about the same.

They are best-effort copies of the grader's own records: the agent may put anything in their place
(a directory, a link, a FIFO, a read-only directory). A write never follows what is there (a fresh
temporary file renamed over the name: jsonio.write_text), and one that fails is logged and retried
at the next change, never raised: nothing the agent does to its workspace stops the grader.
"""

from __future__ import annotations

import bisect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlbench.fileio.jsonio import encoded_list, write_text
from rlbench.recording.ledger import is_submission, reference_entry

# Ledger fields the agent never gets back (they stay in grader/ledger.jsonl). error_detail: a
# failure's full story, which may quote the held-out split (rlbench.evaluation.request). final: the
# submission's numbers on the final part of the split (scoring.feedback split; grader.grading). task_records: a
# multi-task submission's per-task private records (each task's `final`, its timings; grader.targets).
PRIVATE_FIELDS = ("fingerprint", "resolved_path", "provenance", "error_detail", "eval_timing", "final", "task_records")
# submissions.json lists this many of the most recent requests (its totals count them all): it is
# rewritten on every request, and must not cost more the more requests there were. (The agent's
# INSTRUCTIONS, rlbench.agent_run.workspace, give this number.)
SUBMISSIONS_SHOWN = 1000

# bash and date only: it must run inside the sandbox. Output as the reference's CLI wrappers print it.
TIMER_SCRIPT = """\
#!/bin/bash
# Time left in this run; the deadline was fixed when the run started (unix seconds).
# Prints "Remaining: H:MM", or "Timer expired!" once the deadline has passed.
deadline={deadline}
left=$(( deadline - $(date +%s) ))
if (( left > 0 )); then
    printf 'Remaining: %d:%02d\\n' $(( left / 3600 )) $(( left % 3600 / 60 ))
else
    echo 'Timer expired!'
fi
"""


def _whole(seconds: float) -> int | float:
    """Seconds as an int when whole (the reference writes ints), else unchanged."""
    return int(seconds) if float(seconds).is_integer() else seconds


def reference_run_meta(
    start_time: float, timeout_s: float, deadline: float, last_submit_time: int | None, end_time: int | None
) -> dict:
    """run_meta.json as the reference writes it (int unix seconds; end_time null while running)."""
    return {
        "start_time": int(start_time),
        "timeout_s": _whole(timeout_s),
        "last_submit_time": last_submit_time,
        "end_time": end_time,
        "deadline": deadline,  # ours: the exact deadline, unix seconds
    }


def write_timer(workspace: Path, deadline: float) -> None:
    """timer.sh: the time left in the run, as the reference's CLI wrappers print it (written as
    the other files are: never through a link planted at its name)."""
    write_text(workspace / "timer.sh", TIMER_SCRIPT.format(deadline=int(deadline)), durable=False, mode=0o755)


def public(entry: dict, *also: str) -> dict:
    """A ledger entry as the agent gets it back: without PRIVATE_FIELDS, nor the fields named in `also`."""
    return {k: v for k, v in entry.items() if k not in PRIVATE_FIELDS and k not in also}


class AgentFiles:
    """The agent's view of the recorded entries and the files written from it (run_meta.json,
    scores.json, submissions.json).

    The view is kept up to date as each entry is recorded (entries never change once recorded), so
    that no request costs a pass over all the others."""

    def __init__(self, workspace: Path, baseline_score: float):
        self.workspace = workspace
        self.baseline_score = baseline_score
        self._views: dict[int, _View] = {}
        self._request_ids: list[int] = []  # recorded requests' ids, ascending
        self._submission_ids: list[int] = []  # those that are submissions (scores.json), ascending
        self._submission_lines: list[str] = []  # their scores.json entries as JSON text, in the same order
        self.reference_best: dict | None = None  # ledger.reference_best of the recorded entries
        self._versions = {"scores.json": 0, "submissions.json": 0, "run_meta.json": 0}  # content changes
        self._written: dict[str, int] = {}  # the version of each agent file last written
        self._failing: dict[str, str] = {}  # file -> the error its last write failed with (logged once)

    @property
    def submissions(self) -> int:
        """How many of the recorded entries are submissions (scores.json's entries, the totals)."""
        return len(self._submission_ids)

    def write(self, run_meta: Callable[[], dict], best: dict | None) -> None:
        """run_meta.json, scores.json and submissions.json, each when it changed since last written.

        Not fsync'd (the ledger is; these are derived from it), atomic all the same. scores.json
        is the reference's: every submission, in order; submissions.json lists the most recent
        SUBMISSIONS_SHOWN requests, with totals over all of them. run_meta: the grader's
        run_meta.json content (asked for only when it changed); best: the grader's own best.
        A file that cannot be written (the agent put a directory in its place, or made the
        workspace read-only) is logged, left for the next write, and never stops the others."""
        files = {
            "run_meta.json": lambda: json.dumps(run_meta(), indent=2, sort_keys=True) + "\n",
            "scores.json": lambda: encoded_list(self._submission_lines, 0) + "\n",
            "submissions.json": lambda: self._submissions_json(best),
        }
        for name, text in files.items():
            version = self._versions[name]
            if self._written.get(name) != version:
                try:
                    write_text(self.workspace / name, text(), durable=False)
                except OSError as exc:
                    if self._failing.get(name) != str(exc):
                        print(f"grader: could not update the agent's {name} (retried at the next change): {exc}", file=sys.stderr)
                    self._failing[name] = str(exc)
                    continue
                self._failing.pop(name, None)
                self._written[name] = version

    def _submissions_json(self, best: dict | None) -> str:
        shown = self._request_ids[-SUBMISSIONS_SHOWN:]
        head = {
            "baseline_score": self.baseline_score,
            "best": public(best) if best else None,
            "total_submissions": len(self._submission_ids),
            "requests": len(self._request_ids),
            "submissions_shown": len(shown),  # the most recent requests; older ones are in the totals only
        }
        listed = encoded_list([self._views[i].public_json for i in shown], 2)
        return json.dumps(head, indent=2, sort_keys=True)[:-2] + f',\n  "submissions": {listed}\n}}\n'

    def changed(self, *names: str) -> None:
        """Mark the named files as changed (all of them when none is named): the next write() rewrites them."""
        for name in names or tuple(self._versions):
            self._versions[name] += 1

    def add(self, entry: dict, best_too: bool = True) -> None:
        """Index a recorded entry (index) and give it the totals over all those recorded: `best`
        (the reference's; never null, as the reference never answers "best": null) and `total_submissions`."""
        self.index(entry)
        if best_too and self.reference_best is not None:
            entry["best"] = dict(self.reference_best)
        entry["total_submissions"] = self.submissions

    def index(self, entry: dict) -> None:
        """Add a recorded entry (or its replacement) to the agent's view: its scores.json and
        submissions.json forms, encoded once, the ordered ids, the reference's best."""
        sid = entry["submission_id"]
        old = self._views.get(sid)
        reference = reference_entry(entry) if is_submission(entry) else None
        self._views[sid] = _View(
            reference=reference,
            reference_json=_encode(reference) if reference is not None else "",
            public_json=_encode(public(entry, "best", "total_submissions")),
        )
        if old is None:
            bisect.insort(self._request_ids, sid)
        was_submission = old is not None and old.reference is not None
        at = bisect.bisect_left(self._submission_ids, sid)
        if reference is not None and not was_submission:
            self._submission_ids.insert(at, sid)
            self._submission_lines.insert(at, self._views[sid].reference_json)
        elif reference is not None:
            self._submission_lines[at] = self._views[sid].reference_json
        elif was_submission:
            del self._submission_ids[at], self._submission_lines[at]
        if was_submission:  # a replaced entry may have been the best: rare, so recomputed
            self.reference_best = None
            for i in self._submission_ids:
                self.reference_best = _better(self._views[i].reference, self.reference_best)
        elif reference is not None:
            self.reference_best = _better(reference, self.reference_best)
        self.changed("submissions.json", *(["scores.json"] if reference is not None or was_submission else []))

    def forget(self, sid: int) -> None:
        """Take an indexed entry out of the view again (its ledger line could not be written): the
        view is as if it had never been indexed."""
        old = self._views.pop(sid, None)
        if old is None:
            return
        del self._request_ids[bisect.bisect_left(self._request_ids, sid)]
        if old.reference is not None:
            at = bisect.bisect_left(self._submission_ids, sid)
            del self._submission_ids[at], self._submission_lines[at]
            self.reference_best = None  # rare (a full disk): recomputed
            for i in self._submission_ids:
                self.reference_best = _better(self._views[i].reference, self.reference_best)
        self.changed("submissions.json", *(["scores.json"] if old.reference is not None else []))


@dataclass
class _View:
    """One recorded entry as the agent sees it: its scores.json entry (None when it is not a
    submission) and that entry and its submissions.json entry as JSON text, encoded once."""

    reference: dict | None
    reference_json: str
    public_json: str


def _encode(value: object) -> str:
    """One value as compact JSON text (the C encoder), keys sorted as write_json sorts them."""
    return json.dumps(value, sort_keys=True, default=str)


def _better(candidate: dict, best: dict | None) -> dict:
    """ledger.reference_best one entry at a time: the highest score, the first submission on a tie."""
    if best is None:
        return candidate
    score, best_score = candidate.get("score") or 0.0, best.get("score") or 0.0
    if score > best_score or (score == best_score and candidate["submission_id"] < best["submission_id"]):
        return candidate
    return best
