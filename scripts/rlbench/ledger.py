"""The submission ledger's record and the reference harness's view of it.

The ledger (grader/ledger.jsonl) keeps one entry per request to POST /submit, with our own
fields beside the reference harness's. The reference harness (RD-Agent AutoRL-Bench) records a
submission in the workspace's scores.json only when it got as far as an evaluation: requests it
answers with a plain 400 (no model_path, a path outside the workspace, an unknown GPU) leave no
entry there. `is_submission` draws that same line, and `reference_entry` gives an entry the
fields and meanings the reference writes, so scores.json, the /submit response and the paper's
process metrics all count and read submissions as the paper does.

Field meanings shared with the reference (same names, same meaning):
    submission_id     1-based, in arrival order
    timestamp         ISO 8601 local time when the submission's evaluation finished
    model_path        as the agent sent it
    score             0-100; 0.0 when the submission could not be scored (refused, failed)
    baseline_score    the base model's score
    improvement       score - baseline_score (negative for a failed submission, as the reference)
    elapsed_seconds   how long that submission's evaluation took, seconds
    error             why it could not be scored (absent when it was)
Our own fields: status (scored | cached | failed | refused | grader_error), reason (a stable
refusal code), repeat_of (the submission_id whose result a resubmission of the same path and
weights repeats), submitted_at / responded_at (unix seconds), since_start_s, cached,
fingerprint, resolved_path, gpu, eval_seconds, n, correct, provenance.
"""

from __future__ import annotations

from datetime import datetime

# Refusal codes of requests the reference answers with 400 and never records: not submissions.
REQUEST_ERRORS = frozenset({"malformed_request", "outside_workspace", "invalid_gpu", "deadline_passed"})
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


def iso_timestamp(unix_seconds: float) -> str:
    """The reference's timestamp format: datetime.now().isoformat() (local time, no offset)."""
    return datetime.fromtimestamp(unix_seconds).isoformat()


def is_submission(entry: dict) -> bool:
    """True for entries the reference harness would record in scores.json.

    Not recorded there: requests it answers with a 400, and a resubmission of a path whose
    unchanged weights were already scored (its cache returns the earlier result; `repeat_of`
    names that entry). Identical weights under a new path are a new submission there too.
    """
    return entry.get("reason") not in REQUEST_ERRORS and not entry.get("repeat_of")


def is_scored(entry: dict) -> bool:
    """True when the entry's score is an evaluation of the submitted weights."""
    return entry.get("status") in SCORED


def reference_entry(entry: dict) -> dict:
    """An entry as the reference writes it to scores.json: `error` only when there is one."""
    record = {k: entry.get(k) for k in REFERENCE_FIELDS}
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
