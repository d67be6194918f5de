"""The grader's ledger entries as the reference reads them: the recorded submissions, their scores and
finish times, whether one is the base model, and the code snapshot kept for one.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rlbench.recording.ledger import is_submission


def recorded_submissions(ledger: list[dict]) -> list[dict]:
    """The entries the reference would record in scores.json, in ledger (= completion) order."""
    return [e for e in ledger if is_submission(e) and not e.get("pending")]


def entry_score(entry: dict) -> float:
    """The entry's score as the reference records it: 0.0 when it could not be scored."""
    score = entry.get("score")
    return 0.0 if score is None else float(score)


def finished_at(entry: dict) -> float | None:
    """Unix time when the entry's evaluation finished: the instant its ISO `timestamp` names.

    `responded_at` is that instant as unix seconds, exact and free of the ISO string's missing
    time zone; ledgers without it fall back to parsing the ISO `timestamp`."""
    responded = entry.get("responded_at")
    if isinstance(responded, (int, float)):
        return float(responded)
    stamp = entry.get("timestamp")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            return None
    return None


def resolves_to(model_path: object, workspace: Path, target: Path) -> bool:
    """Whether model_path names target. The reference resolves model_path with Path.resolve(),
    i.e. against the harness's current directory, so a relative path ("models/...") never matches
    there although the agent, working in the workspace, meant the workspace's directory; we resolve
    relative paths against the workspace, which is what the reference means."""
    if not isinstance(model_path, str) or not model_path:
        return False
    path = Path(model_path)
    try:
        return (path if path.is_absolute() else Path(workspace) / path).resolve() == Path(target).resolve()
    except (OSError, ValueError):
        return False


def is_base_path(entry: dict, workspace: Path, base_model: str | None) -> bool:
    """The submission's model_path is the workspace's base model directory (models/<hf_id>).

    The grader's `resolved_path` (model_path resolved in the workspace, relative to it) says the
    same and survives a run directory that moved after the run."""
    if not base_model:
        return False
    if entry.get("resolved_path") is not None and Path(entry["resolved_path"]) == Path(base_model):
        return True
    return resolves_to(entry.get("model_path"), workspace, Path(workspace) / base_model)


def is_base_weights(entry: dict, baseline_fingerprint: str | None) -> bool:
    """The submitted weights are the base model's, wherever they were saved (output/v1...)."""
    return baseline_fingerprint is not None and entry.get("fingerprint") == baseline_fingerprint


def snapshot_code_dir(grader_dir: Path, entry: dict) -> Path | None:
    """grader/snapshots/NNNN/code, the agent's code when this submission was made (the grader
    deletes NNNN/model for non-best entries but keeps the code)."""
    submission_id = entry.get("submission_id")
    if not isinstance(submission_id, int):
        return None
    path = Path(grader_dir) / "snapshots" / f"{submission_id:04d}" / "code"
    return path if path.is_dir() else None
