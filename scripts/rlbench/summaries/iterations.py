"""The per-iteration records of a run: one per recorded submission (an iteration of train -> submit).

summary.jsonl holds one record per recorded submission with the fields of the reference's summary
skill (core/skill.md): iteration, timestamp, duration_s, status, exit_code, score, improvement,
train_type, failure_type; our extra fields use other names.
"""

from __future__ import annotations

from pathlib import Path

from rlbench.recording.ledger import is_scored, iso_timestamp
from rlbench.summaries.agent_code import key_configuration
from rlbench.summaries.failures import iteration_failure
from rlbench.summaries.routes import train_type
from rlbench.summaries.submissions import entry_score, finished_at, snapshot_code_dir

# The reference's iteration status values (skill.md: 成功 / 失败).
SUCCESS, FAILED = "success", "failed"
# summary.jsonl leaves out our long-text fields (the reference keeps it to quantifiable fields).
JSONL_OMITTED = ("error", "key_config", "key_code_lines", "snippet", "code_diff", "diff_against")


def _iso(entry: dict) -> str | None:
    stamp = entry.get("timestamp")
    if isinstance(stamp, str):
        return stamp
    finished = finished_at(entry)
    return None if finished is None else iso_timestamp(finished)


def iterations(
    submissions: list[dict],
    *,
    grader_dir: Path,
    workspace: Path,
    base_model: str | None,
    baseline_score: float | None,
    baseline_fingerprint: str | None,
    start_time: float | None,
    exit_code: int | None,
    level: str | None = None,
) -> list[dict]:
    """One record per recorded submission (an iteration of train -> submit).

    Reference fields (core/skill.md rule 9): iteration (1-based); timestamp (the submission's ISO
    timestamp, when its evaluation finished); duration_s (int seconds since the previous iteration
    ended, the first since run start); status (success: evaluated, failed: not); exit_code (the
    agent's exit code, on the last iteration only: its own commands are not observed); score (0.0
    when not evaluated); improvement (score - baseline); train_type; failure_type. Ours: refusal
    (the grader's refusal code), submission_id, model_path, grader_status, best_so_far,
    best_iteration, valid_so_far, eval_seconds, since_start_s, error, key_config."""
    records, previous, best, best_iteration, valid_so_far = [], start_time, None, None, 0
    for index, entry in enumerate(submissions, start=1):
        score = entry_score(entry)
        if best is None or score > best:
            best, best_iteration = score, index
        valid_so_far += score > 0
        code_dir = snapshot_code_dir(grader_dir, entry)
        label = train_type(
            entry, code_dir, baseline_fingerprint=baseline_fingerprint, workspace=workspace, base_model=base_model
        )
        finished = finished_at(entry)
        improvement = entry.get("improvement")
        if improvement is None and baseline_score is not None:
            improvement = round(score - baseline_score, 4)
        records.append(
            {
                "iteration": index,
                "timestamp": _iso(entry),
                "duration_s": int(finished - previous) if finished is not None and previous is not None else None,
                "status": SUCCESS if is_scored(entry) else FAILED,
                "exit_code": exit_code if index == len(submissions) else None,
                "score": score,
                "improvement": improvement,
                "train_type": label,
                "failure_type": iteration_failure(entry, label, baseline_score, level),
                "refusal": entry.get("reason") if entry.get("status") == "refused" else None,
                "submission_id": entry.get("submission_id"),
                "model_path": entry.get("model_path"),
                "grader_status": entry.get("status"),
                "best_so_far": best,
                "best_iteration": best_iteration,
                "valid_so_far": valid_so_far,
                "eval_seconds": entry.get("elapsed_seconds"),
                "since_start_s": entry.get("since_start_s"),
                "error": entry.get("error"),
                "key_config": key_configuration(code_dir),
            }
        )
        previous = finished if finished is not None else previous
    return records


def jsonl_record(record: dict) -> dict:
    """A summary.jsonl line: the record without its long-text fields."""
    return {k: v for k, v in record.items() if k not in JSONL_OMITTED}
