"""The submission ledger's record and the reference harness's view of it.

The ledger (grader/ledger.jsonl) keeps one entry per request to POST /submit, with our own
fields beside the reference harness's. The reference harness (RD-Agent AutoRL-Bench) records a
submission in the workspace's scores.json only when it got as far as an evaluation: requests it
answers with a plain 400 (no model_path, a path outside the workspace, an unknown GPU) leave no
entry there. `is_submission` draws that same line, and `reference_entry` gives an entry the
fields and meanings the reference writes, so scores.json, the /submit response and the paper's
process metrics all count and read submissions as the paper does.

Where the line falls for requests the reference never saw:
    invalid_path      a model_path the OS cannot represent (a NUL byte, a lone surrogate, a name
                      or path over the file system's limits). The reference checks that the path
                      exists, and for such a path that check is simply False (os.path.exists
                      swallows the error), so it records it as a submission of a nonexistent
                      path, like missing_path: both are submissions here too, scored 0.0.
    request_too_large a body over the grader's size limit: no model_path could be read, as for
                      a malformed request, so it is a request error, not a submission.
    grader_error      the grader itself failed (an evaluation process killed, a bug): not the
                      agent's doing and answered "submit again", so never a submission; it
                      stays in the ledger (status grader_error, retryable true) for audits.

Field meanings shared with the reference (same names, same meaning):
    submission_id     1-based, in arrival order
    timestamp         ISO 8601 local time when the submission's evaluation finished
    model_path        as the agent sent it (stored_model_path: lone surrogates backslash-escaped,
                      cut at MODEL_PATH_MAX_CHARS with a note, a non-string as its JSON text), so
                      the ledger, scores.json and every response are valid UTF-8 JSON
    score             0-100; 0.0 when the submission could not be scored (refused, failed)
    baseline_score    the base model's score
    improvement       score - baseline_score (negative for a failed submission, as the reference)
    elapsed_seconds   how long that submission's evaluation took, seconds
    error             why it could not be scored (absent when it was)
Our own fields: status (scored | cached | failed | refused | grader_error), reason (a stable
refusal code), retryable (true on grader_error: the same request may succeed), repeat_of (the
submission_id whose result a resubmission of the same path and weights repeats), submitted_at /
responded_at (unix seconds), since_start_s, cached, fingerprint, resolved_path, gpu,
eval_seconds, n, primary_metric, metrics (the evaluation's metrics dict: numbers and labels
only, tasks.base.public_metrics), provenance, error_detail (a failure's full story, the evaluation's log
tail: it may quote the held-out split, so the agent never gets it back; grader.visible.PRIVATE_FIELDS),
eval_timing (private too: the evaluation's phase_seconds, setup / loading / generating / scoring,
and its worker: mode warm | fresh, reused, startup_s; rlbench.evaluation.workers). The fingerprint is sha256
over the checkpoint's manifest (grader.fingerprint.FINGERPRINT_TAG).

A multi-task run's entries (grader.targets) also carry `task` (what the request asked for: "all" or a task
name), `tasks` (per task evaluated: score, baseline_score, improvement, primary_metric, metrics, n, cached) and
`summary`; their score, baseline_score and improvement are the mean over `tasks`. Each task's private records
(its final-split numbers, timings) are under `task_records`. task_view gives one task's view of such a ledger,
read like a single-task run's.
"""

from __future__ import annotations

import json
import math
from datetime import datetime

# Refusal codes of requests the reference answers with 400 and never records: not submissions.
REQUEST_ERRORS = frozenset(
    {"malformed_request", "outside_workspace", "invalid_gpu", "deadline_passed", "request_too_large", "unknown_task"}
)
# The status of a request the grader itself failed on: never the agent's submission.
GRADER_ERROR = "grader_error"
# PATH_MAX: a usable model_path is never cut; a longer one is kept only as a bounded reminder.
MODEL_PATH_MAX_CHARS = 4096
NON_STRING_MAX_CHARS = 200
# Statuses of entries whose score is a real evaluation of the submitted weights.
SCORED = frozenset({"scored", "cached"})
REFERENCE_FIELDS = (
    "submission_id",
    "timestamp",
    "model_path",
    "score",
    "baseline_score",
    "improvement",
    "elapsed_seconds",
)


# A multi-task run's fields of an entry that scores.json carries too (what was asked for, each task's numbers).
MULTI_FIELDS = ("task", "tasks")
# The fields task_view takes from a multi-task entry's `tasks[<task>]` to the top level.
TASK_NUMBERS = ("score", "baseline_score", "improvement", "primary_metric", "metrics", "n", "chat_template")


def task_view(entries: list[dict], task: str) -> list[dict]:
    """One task's view of a multi-task run's ledger, shaped like a single-task run's entries: the submissions
    evaluated on that task with that task's numbers at the top level (status cached when its result for this task
    came from the cache), its private final-split record as `final`; the requests that asked for it (or for every
    task) and were refused or failed; and the requests refused before their task was read. Submission ids are
    kept. Entries of a single-task ledger (no `tasks`) are returned unchanged when they concern the task."""
    view = []
    for entry in entries:
        tasks = entry.get("tasks")
        if isinstance(tasks, dict):
            if task not in tasks:
                continue
            numbers = tasks[task]
            record = (entry.get("task_records") or {}).get(task) or {}
            projected = {k: v for k, v in entry.items() if k not in ("tasks", "task_records", "summary", "final")}
            projected.update({k: numbers[k] for k in TASK_NUMBERS if k in numbers})
            projected["cached"] = bool(numbers.get("cached"))
            if is_scored(entry):
                projected["status"] = "cached" if projected["cached"] else "scored"
            projected.pop("eval_seconds", None)
            projected.pop("eval_timing", None)
            projected.update(record)
            view.append(projected)
        elif entry.get("task") in (None, "all", task):
            view.append(entry)
    return view


def iso_timestamp(unix_seconds: float) -> str:
    """The reference's timestamp format: datetime.now().isoformat() (local time, no offset)."""
    return datetime.fromtimestamp(unix_seconds).isoformat()


def is_submission(entry: dict) -> bool:
    """True for entries the reference harness would record in scores.json.

    Not recorded there: requests it answers with a 400, and a resubmission of a path whose
    unchanged weights were already scored (its cache returns the earlier result; `repeat_of`
    names that entry). Identical weights under a new path are a new submission there too.
    Nor is a grader error: the grader, not the agent, failed, and the agent is told to resubmit.
    """
    return (
        entry.get("reason") not in REQUEST_ERRORS
        and not entry.get("repeat_of")
        and entry.get("status") != GRADER_ERROR
    )


def is_scored(entry: dict) -> bool:
    """True when the entry's score is an evaluation of the submitted weights."""
    return entry.get("status") in SCORED


def reference_entry(entry: dict) -> dict:
    """An entry as the reference writes it to scores.json: `error` only when there is one."""
    record = {k: entry.get(k) for k in REFERENCE_FIELDS}
    for key in MULTI_FIELDS:  # a multi-task run's (absent in a single-task run: the reference's entry exactly)
        if key in entry:
            record[key] = entry[key]
    if entry.get("error"):
        record["error"] = entry["error"]
    return record


def reference_view(entries: list[dict]) -> list[dict]:
    """scores.json as the reference writes it: every submission, in order."""
    return [reference_entry(e) for e in entries if is_submission(e) and not e.get("pending")]


def reference_best(entries: list[dict]) -> dict | None:
    """The reference's `best`: the first entry with the highest score among the submissions."""
    view = reference_view(entries)
    return max(view, key=lambda e: e.get("score") or 0.0) if view else None


def safe_text(text: str, limit: int | None = None) -> str:
    """text as valid UTF-8: lone surrogates (which JSON can carry but UTF-8 cannot) written as
    backslash escapes (\\ud800), and cut at `limit` characters with a note saying how much was cut."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(safe) > limit:
        safe = f"{safe[:limit]}... [{len(safe) - limit} more characters not shown]"
    return safe


def stored_model_path(value: object) -> str | None:
    """The model_path to store and echo: a string as sent (made safe, bounded); None when absent;
    any other JSON value as its JSON text, cut short (it is refused: only the type matters)."""
    if value is None:
        return None
    if isinstance(value, str):
        return safe_text(value, MODEL_PATH_MAX_CHARS)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return safe_text(text, NON_STRING_MAX_CHARS)


def json_safe(value: object) -> object:
    """A copy of value that strict JSON and UTF-8 accept: strings through safe_text, non-finite
    floats (NaN, Infinity: Python writes them, JSON has no such values) as None."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {safe_text(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
